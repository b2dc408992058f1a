// sweep.cc — the C++ twin of the Python sweep (bench/sweep/sweep.py): the same
// flags, the same control protocol, the same JSON lines, but the hot loop is
// the raw C ABI (tent_transfer, tent_batch_wait, tent_batch_status,
// tent_batch_destroy) with no language layer in between. tent.hpp owns the
// setup (engine, memory, segments) so that every exit releases it.
//
//   sweep [--role both|initiator|target] [--target NAME] [--listen ADDR]
//         [--transport local,shm,tcp[,shm:register]] [--target-mem alloc,register]
//         [--op write,read] [--block-size 4K,64K | 4K-64M[/2]] [--batch 128] [--threads 1]
//         [--duration 2] [--bytes SIZE] [--span 256M] [--check] [--timeout 120] [--streams N]
//         [--json [FILE]] [--plot PNG] [--progress|--no-progress] [--no-limits]
//         [--iperf3-seconds 3] [--memcpy-seconds 0.3] [--idle-seconds N]
//
// Roles: both (default) spawns this program as the target on this machine;
// the local transport gets a target engine on a thread of this process.
// The control channel is tent's notifications ("tb1 ID COMMAND ARGS",
// answered "tb1 ID ok key=value ..." or "tb1 ID err MESSAGE"), so a C++
// initiator drives a Python target (sweep.py --role target) and back.
//
// Per point: GB/s (1e9 B/s), requests/s, batch latency (submit to
// tent_batch_wait returning) avg/p50/p99/p99.9/max, and per request the batch
// latency divided by its requests (amortized). --check fills the source with
// a fresh pattern and compares CRC-32s after the point. Limits in the same
// run: single-thread memcpy at each block size (std::memcpy, best round) and
// one iperf3 stream over loopback before and after; local and shm figures are
// shown as a fraction of memcpy, tcp of iperf3. --plot is sweep.py's:
// `sweep.py --from-json FILE --plot out.png` draws what --json wrote.
// Exit status: 0 if every point ran (and checked), 1 otherwise, 2 bad usage.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "example_util.hpp"
#include "tent.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::string;
using std::vector;

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- sizes and lists ------------------------------------------------------------

uint64_t parse_size(const string &text) {
  string t;
  for (char c : text) t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  size_t end = t.find_first_not_of("0123456789.");
  string num = t.substr(0, end), unit = end == string::npos ? "" : t.substr(end);
  static const std::map<string, uint64_t> units = {{"", 1},          {"b", 1},          {"k", 1ull << 10},
                                                   {"kb", 1ull << 10}, {"kib", 1ull << 10}, {"m", 1ull << 20},
                                                   {"mb", 1ull << 20}, {"mib", 1ull << 20}, {"g", 1ull << 30},
                                                   {"gb", 1ull << 30}, {"gib", 1ull << 30}};
  auto it = units.find(unit);
  if (num.empty() || it == units.end()) throw Usage("bad size '" + text + "'");
  double v = std::stod(num) * static_cast<double>(it->second);
  if (v <= 0) throw Usage("size must be positive: '" + text + "'");
  return static_cast<uint64_t>(v);
}

vector<string> split(const string &s, char sep = ',') {
  vector<string> out;
  std::stringstream ss(s);
  string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

vector<uint64_t> parse_sizes(const string &s) {
  vector<uint64_t> out;
  for (const string &part : split(s)) {
    size_t dash = part.find('-');
    if (dash == string::npos) {
      out.push_back(parse_size(part));
      continue;
    }
    string rng = part, step;
    size_t slash = part.find('/');
    if (slash != string::npos) {
      rng = part.substr(0, slash);
      step = part.substr(slash + 1);
    }
    uint64_t lo = parse_size(rng.substr(0, dash)), hi = parse_size(rng.substr(dash + 1));
    uint64_t f = step.empty() ? 4 : std::stoull(step);
    if (f < 2 || hi < lo) throw Usage("bad size range '" + part + "'");
    for (uint64_t v = lo; v <= hi; v *= f) out.push_back(v);
  }
  if (out.empty()) throw Usage("no sizes in '" + s + "'");
  return out;
}

vector<int> parse_ints(const string &s) {
  vector<int> out;
  for (const string &x : split(s)) {
    int v = std::stoi(x);
    if (v <= 0) throw Usage("need positive integers: '" + s + "'");
    out.push_back(v);
  }
  if (out.empty()) throw Usage("no numbers in '" + s + "'");
  return out;
}

string size_label(uint64_t n) {
  const std::pair<const char *, int> units[] = {{"G", 30}, {"M", 20}, {"K", 10}};
  for (auto [u, shift] : units) {
    if (n >= (1ull << shift) && n % (1ull << shift) == 0) return std::to_string(n >> shift) + u;
  }
  return std::to_string(n);
}

string fmt_us(double us) {
  char b[32];
  if (us >= 1e6) std::snprintf(b, sizeof b, "%.2fs", us / 1e6);
  else if (us >= 1e4) std::snprintf(b, sizeof b, "%.1fms", us / 1e3);
  else if (us >= 1e3) std::snprintf(b, sizeof b, "%.2fms", us / 1e3);
  else if (us >= 100) std::snprintf(b, sizeof b, "%.0fus", us);
  else std::snprintf(b, sizeof b, "%.1fus", us);
  return b;
}

struct Stats {
  double avg = 0, p50 = 0, p99 = 0, p999 = 0, max = 0;
};

Stats percentiles(vector<double> xs) {  // seconds in, microseconds out
  Stats s;
  if (xs.empty()) return s;
  std::sort(xs.begin(), xs.end());
  size_t n = xs.size();
  auto rank = [&](double q) {
    long k = static_cast<long>(std::ceil(q * static_cast<double>(n))) - 1;
    k = std::max(0L, std::min(static_cast<long>(n) - 1, k));
    return xs[static_cast<size_t>(k)] * 1e6;
  };
  double sum = 0;
  for (double x : xs) sum += x;
  s.avg = sum / static_cast<double>(n) * 1e6;
  s.p50 = rank(0.50);
  s.p99 = rank(0.99);
  s.p999 = rank(0.999);
  s.max = xs.back() * 1e6;
  return s;
}

string json_str(const string &s) {
  string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else o += c;
  }
  return o + "\"";
}

string json_num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

string json_stats(const Stats &s) {
  return "{\"avg\": " + json_num(s.avg) + ", \"p50\": " + json_num(s.p50) + ", \"p99\": " + json_num(s.p99) +
         ", \"p999\": " + json_num(s.p999) + ", \"max\": " + json_num(s.max) + "}";
}

// ---- memory: a fast fill pattern and CRC-32 ---------------------------------------

constexpr size_t kChunk = 1u << 20, kShifts = 1u << 16;

const vector<unsigned char> &pattern_base() {
  static const vector<unsigned char> base = [] {
    vector<unsigned char> b(kChunk + kShifts);
    std::random_device rd;
    std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd());
    for (size_t i = 0; i < b.size(); i += 8) {
      uint64_t x = g();
      std::memcpy(b.data() + i, &x, std::min<size_t>(8, b.size() - i));
    }
    return b;
  }();
  return base;
}

void fill(void *addr, size_t len, uint64_t seed) {
  const unsigned char *base = pattern_base().data();
  unsigned char *p = static_cast<unsigned char *>(addr);
  for (size_t i = 0, off = 0; off < len; i++, off += kChunk) {
    size_t shift = static_cast<size_t>((seed * 2654435761ull + i * 4099ull) % kShifts);
    std::memcpy(p + off, base + shift, std::min(kChunk, len - off));
  }
}

uint32_t crc32(const void *data, size_t len) {  // zlib's CRC-32, slicing by 8
  static uint32_t t[8][256];
  static std::once_flag once;
  std::call_once(once, [] {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
      for (int k = 1; k < 8; k++) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
    }
  });
  const unsigned char *p = static_cast<const unsigned char *>(data);
  uint32_t c = 0xFFFFFFFFu;
  while (len >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][hi & 0xff] ^
        t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len--) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// An anonymous mapping (RAII).
class Mapping {
 public:
  explicit Mapping(size_t size) : size_(size) {
    p_ = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p_ == MAP_FAILED) throw std::system_error(errno, std::generic_category(), "mmap");
  }
  ~Mapping() { munmap(p_, size_); }
  Mapping(const Mapping &) = delete;
  Mapping &operator=(const Mapping &) = delete;
  char *data() const { return static_cast<char *>(p_); }

 private:
  void *p_;
  size_t size_;
};

// Target or initiator memory of one kind: "alloc" (tent_alloc, memfd) or
// "register" (an anonymous mapping, registered). Members release in reverse.
struct Memory {
  string kind;
  size_t size = 0;
  std::unique_ptr<Mapping> map;
  tent::Region region;
  tent::Allocation alloc;
  char *addr = nullptr;

  Memory(tent::Engine &e, const string &k, size_t n) : kind(k), size(n) {
    if (k == "alloc") {
      alloc = e.alloc(n);
      addr = static_cast<char *>(alloc.data());
    } else if (k == "register") {
      map = std::make_unique<Mapping>(n);
      region = e.register_memory(map->data(), n);
      addr = map->data();
    } else {
      throw Usage("unknown memory kind '" + k + "' (alloc, register)");
    }
    fill(addr, n, 0);  // every page touched before the run
  }
  ~Memory() {
    region.reset();
    alloc.reset();
  }
};

// ---- the target ---------------------------------------------------------------------

const char *kProto = "tb1";

std::map<string, string> parse_kv(const string &s) {
  std::map<string, string> kv;
  for (const string &w : split(s, ' ')) {
    size_t eq = w.find('=');
    kv[w.substr(0, eq)] = eq == string::npos ? "" : w.substr(eq + 1);
  }
  return kv;
}

class TargetServer {
 public:
  explicit TargetServer(tent::Engine &e) : e_(e) {}
  std::atomic<bool> stop{false};

  string handle(const vector<string> &w) {
    const string &cmd = w.at(0);
    if (cmd == "hello") {
      string ts;
      for (const string &t : e_.transports()) ts += (ts.empty() ? "" : ",") + t;
      return "ok pid=" + std::to_string(getpid()) + " impl=c++ transports=" + ts +
             " version=" + tent_version_string();
    }
    if (cmd == "buf") {
      const string &kind = w.at(1);
      size_t size = std::stoull(w.at(2));
      auto it = bufs_.find(kind);
      if (it == bufs_.end() || it->second->size < size) {
        if (it != bufs_.end()) bufs_.erase(it);
        it = bufs_.emplace(kind, std::make_unique<Memory>(e_, kind, size)).first;
      }
      return "ok addr=" + std::to_string(tent::remote_address(it->second->addr)) +
             " size=" + std::to_string(it->second->size);
    }
    if (cmd == "fill" || cmd == "crc") {
      auto it = bufs_.find(w.at(1));
      if (it == bufs_.end()) return "err no " + w.at(1) + " buffer";
      Memory &m = *it->second;
      uint64_t a = std::stoull(w.at(2)), n = std::stoull(w.at(3));
      if (cmd == "fill") {
        if (n == 0 || n > m.size) return "err length outside the buffer";
        fill(m.addr, n, a);
        return "ok crc=" + std::to_string(crc32(m.addr, n));
      }
      if (n == 0 || a + n > m.size) return "err range outside the buffer";
      return "ok crc=" + std::to_string(crc32(m.addr + a, n));
    }
    if (cmd == "free") {
      bufs_.erase(w.at(1));
      return "ok";
    }
    if (cmd == "quit") {
      stop = true;
      return "ok";
    }
    return "err unknown command " + cmd;
  }

  void serve(double idle_seconds, pid_t parent) {
    std::map<string, tent::Segment> peers;
    double idle_since = now_s();
    while (!stop) {
      std::optional<tent::Notification> n = e_.notify_recv(milliseconds(250));
      if (!n) {
        if (parent > 0 && getppid() != parent) {
          std::fprintf(stderr, "sweep target: the parent process is gone; exiting\n");
          break;
        }
        if (idle_seconds > 0 && now_s() - idle_since > idle_seconds) {
          std::fprintf(stderr, "sweep target: idle for %g s; exiting\n", idle_seconds);
          break;
        }
        continue;
      }
      idle_since = now_s();
      vector<string> w = split(n->message, ' ');
      if (w.size() < 3 || w[0] != kProto) continue;
      string reply;
      try {
        reply = handle(vector<string>(w.begin() + 2, w.end()));
      } catch (const std::exception &ex) {
        reply = string("err ") + ex.what();
        std::replace(reply.begin(), reply.end(), '\n', ' ');
      }
      auto it = peers.find(n->from);
      if (it == peers.end()) it = peers.emplace(n->from, e_.open_segment(n->from)).first;
      e_.notify_send(it->second, string(kProto) + " " + w[1] + " " + reply);
    }
    bufs_.clear();
  }

 private:
  tent::Engine &e_;
  std::map<string, std::unique_ptr<Memory>> bufs_;
};

class TargetClient {
 public:
  TargetClient(tent::Engine &e, const string &name, example::Child *proc, string where)
      : e_(e), name(name), proc(proc), where(std::move(where)), seg(e.open_segment(name)) {
    std::map<string, string> hello = call("hello");
    impl = hello["impl"];
  }

  std::map<string, string> call(const string &cmd, double timeout = 60) {
    uint64_t id = ++next_id_;
    e_.notify_send(seg, string(kProto) + " " + std::to_string(id) + " " + cmd);
    double deadline = now_s() + timeout;
    for (;;) {
      double left = deadline - now_s();
      if (left <= 0) throw std::runtime_error("the target " + name + " did not answer '" + cmd + "'" + exit_note());
      std::optional<tent::Notification> n = e_.notify_recv(milliseconds(static_cast<long>(std::min(left, 1.0) * 1e3)));
      if (!n) {
        if (proc && proc->pid() > 0 && proc->wait(milliseconds(0))) {
          throw std::runtime_error("the target process exited" + exit_note());
        }
        continue;
      }
      vector<string> w = split(n->message, ' ');
      if (w.size() < 3 || w[0] != kProto || w[1] != std::to_string(id)) continue;
      string rest;
      for (size_t i = 3; i < w.size(); i++) rest += (i > 3 ? " " : "") + w[i];
      if (w[2] == "ok") return parse_kv(rest);
      throw std::runtime_error("target: " + rest);
    }
  }

  string exit_note() {
    if (!proc) return "";
    if (proc->pid() > 0) {
      std::optional<int> st = proc->wait(milliseconds(0));
      if (!st) return "";
      status_ = *st;
    }
    if (!status_) return "";
    if (WIFSIGNALED(*status_)) return string(" (target killed by signal ") + strsignal(WTERMSIG(*status_)) + ")";
    return " (target exit status " + std::to_string(WEXITSTATUS(*status_)) + ")";
  }

  void close() {
    try {
      if (!proc || proc->pid() > 0) call("quit", 10);
    } catch (const std::exception &) {
    }
    if (proc && proc->pid() > 0) proc->finish(milliseconds(10000));
  }

  tent::Engine &e_;
  string name, impl;
  example::Child *proc;
  string where;
  tent::Segment seg;

 private:
  uint64_t next_id_ = 0;
  std::optional<int> status_;
};

// ---- options ------------------------------------------------------------------------------

struct Options {
  string role = "both", target, listen;
  double idle_seconds = 0;
  pid_t parent_pid = 0;
  vector<string> transport = {"shm", "tcp"}, target_mem = {"alloc"}, op = {"WRITE"};
  vector<uint64_t> block = {64 << 10};
  vector<int> batch = {128}, threads = {1};
  double duration = 2.0, timeout = 120.0, iperf3_seconds = 3.0, memcpy_seconds = 0.3;
  uint64_t bytes = 0, span = 256ull << 20;
  bool check = false, limits = true;
  int progress = -1;  // -1: if stderr is a TTY
  uint32_t streams = 0;
  string json, plot;
  vector<string> argv;
};

Options parse(int argc, char **argv) {
  Options o;
  vector<string> args;  // "--flag=value" becomes "--flag", "value"
  for (int i = 1; i < argc; i++) {
    string a = argv[i];
    o.argv.push_back(a);
    size_t eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != string::npos) {
      args.push_back(a.substr(0, eq));
      args.push_back(a.substr(eq + 1));
    } else {
      args.push_back(a);
    }
  }
  size_t n = args.size();
  auto val = [&](size_t &i) -> string {
    if (i + 1 >= n) throw Usage(args[i] + " needs a value");
    return args[++i];
  };
  for (size_t i = 0; i < n; i++) {
    const string &a = args[i];
    if (a == "--role") o.role = val(i);
    else if (a == "--target") o.target = val(i);
    else if (a == "--listen") o.listen = val(i);
    else if (a == "--idle-seconds") o.idle_seconds = std::stod(val(i));
    else if (a == "--parent-pid") o.parent_pid = static_cast<pid_t>(std::stol(val(i)));
    else if (a == "--transport") o.transport = split(val(i));
    else if (a == "--target-mem") o.target_mem = split(val(i));
    else if (a == "--op") {
      o.op.clear();
      for (string s : split(val(i))) {
        for (char &c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        if (s != "READ" && s != "WRITE") throw Usage("ops are read and/or write");
        o.op.push_back(s);
      }
    } else if (a == "--block-size") o.block = parse_sizes(val(i));
    else if (a == "--batch") o.batch = parse_ints(val(i));
    else if (a == "--threads") o.threads = parse_ints(val(i));
    else if (a == "--duration") o.duration = std::stod(val(i));
    else if (a == "--bytes") o.bytes = parse_size(val(i));
    else if (a == "--span") o.span = parse_size(val(i));
    else if (a == "--check") o.check = true;
    else if (a == "--timeout") o.timeout = std::stod(val(i));
    else if (a == "--streams") o.streams = static_cast<uint32_t>(std::stoul(val(i)));
    else if (a == "--json") o.json = (i + 1 < n && (args[i + 1] == "-" || args[i + 1].rfind("--", 0) != 0)) ? args[++i] : "-";
    else if (a == "--plot") o.plot = val(i);
    else if (a == "--progress") o.progress = 1;
    else if (a == "--no-progress") o.progress = 0;
    else if (a == "--no-limits") o.limits = false;
    else if (a == "--iperf3-seconds") o.iperf3_seconds = std::stod(val(i));
    else if (a == "--memcpy-seconds") o.memcpy_seconds = std::stod(val(i));
    else if (a == "-h" || a == "--help") throw Usage("");
    else throw Usage("unknown argument '" + a + "'");
  }
  if (o.role != "both" && o.role != "initiator" && o.role != "target") throw Usage("--role is both, initiator or target");
  return o;
}

tent::EngineOptions engine_options(const Options &o, const string &listen = "") {
  tent::EngineOptions eo;
  eo.timeout(milliseconds(static_cast<long>(o.timeout * 1e3)));
  if (!listen.empty()) eo.listen_addr(listen);
  if (o.streams) eo.tcp_streams(o.streams);
  if (const char *s = std::getenv("TENT_BENCH_SECRET"); s && *s) eo.secret(s);
  return eo;
}

// ---- machine and limits ---------------------------------------------------------------------

struct Machine {
  long nproc = 0;
  string cpu, kernel, host;
};

Machine machine() {
  Machine m;
  m.nproc = sysconf(_SC_NPROCESSORS_ONLN);
  std::ifstream f("/proc/cpuinfo");
  for (string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) == 0) {
      m.cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  utsname u{};
  if (uname(&u) == 0) {
    m.kernel = u.release;
    m.host = u.nodename;
  }
  return m;
}

string loadavg_json() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return "[]";
  char b[64];
  std::snprintf(b, sizeof b, "[%.2f, %.2f, %.2f]", l[0], l[1], l[2]);
  return b;
}

double memcpy_gbps(uint64_t block, uint64_t span, double seconds) {
  span = std::max(span, block);
  Mapping src(span), dst(span);
  fill(src.data(), span, 1);
  fill(dst.data(), span, 2);
  uint64_t slots = span / block;
  uint64_t passes = std::max<uint64_t>(1, (16ull << 20) / (slots * block));
  double best = 0, end = now_s() + seconds;
  for (int rounds = 0; rounds < 3 || now_s() < end; rounds++) {
    double t0 = now_s();
    for (uint64_t p = 0; p < passes; p++) {
      for (uint64_t s = 0; s < slots; s++) std::memcpy(dst.data() + s * block, src.data() + s * block, block);
    }
    double dt = now_s() - t0;
    best = std::max(best, static_cast<double>(passes * slots * block) / dt / 1e9);
    asm volatile("" ::: "memory");
  }
  return best;
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

string which(const string &exe) {
  const char *path = std::getenv("PATH");
  for (const string &d : split(path ? path : "/usr/bin:/bin", ':')) {
    string p = d + "/" + exe;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// One iperf3 stream over loopback; GB/s, or nullopt with why in note.
std::optional<double> iperf3_gbps(double seconds, string &note) {
  string exe = which("iperf3");
  if (exe.empty()) {
    note = "iperf3 not found on PATH (apt-get install iperf3): tcp figures have no limit to compare with";
    return std::nullopt;
  }
  seconds = std::max(1.0, std::round(seconds));  // iperf3 -t takes whole seconds (0 would mean forever)
  int port = free_port();
  example::Child server({exe, "-s", "-1", "-B", "127.0.0.1", "-p", std::to_string(port)});
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", seconds);
  for (int attempt = 0; attempt < 50; attempt++) {
    string cmd = exe + " -c 127.0.0.1 -p " + std::to_string(port) + " -t " + secs + " -P 1 -J 2>&1";
    FILE *f = popen(cmd.c_str(), "r");
    if (!f) break;
    string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    int rc = pclose(f);
    size_t at = out.find("\"sum_received\"");
    if (rc == 0 && at != string::npos) {
      size_t b = out.find("\"bits_per_second\"", at);
      if (b != string::npos) {
        note = string("iperf3 -c 127.0.0.1 -P 1 -t ") + secs;
        return std::stod(out.substr(out.find(':', b) + 1)) / 8e9;
      }
    }
    if (out.find("refused") == string::npos) {
      size_t e = out.find("\"error\"");
      note = "iperf3 failed: " + (e != string::npos ? out.substr(e, 200) : out.substr(0, 200));
      return std::nullopt;
    }
    usleep(100000);
  }
  note = "iperf3 failed: the server did not start";
  return std::nullopt;
}

// ---- the sweep ---------------------------------------------------------------------------------

struct Point {
  string transport, mem, op;
  uint64_t block;
  int batch, threads;
  string label() const {
    return transport + "/" + mem + " " + op + " " + size_label(block) + " b" + std::to_string(batch) + " t" +
           std::to_string(threads);
  }
  string key_json() const {
    return "\"transport\": " + json_str(transport) + ", \"mem\": " + json_str(mem) + ", \"op\": " + json_str(op) +
           ", \"block_size\": " + std::to_string(block) + ", \"batch\": " + std::to_string(batch) +
           ", \"threads\": " + std::to_string(threads);
  }
};

vector<Point> expand(const Options &o) {
  vector<std::pair<string, string>> combos;
  for (const string &entry : o.transport) {
    size_t c = entry.find(':');
    string t = entry.substr(0, c);
    if (t != "local" && t != "shm" && t != "tcp") throw Usage("unknown transport '" + t + "' (local, shm, tcp)");
    vector<string> mems = c == string::npos ? o.target_mem : vector<string>{entry.substr(c + 1)};
    for (const string &m : mems) {
      if (m != "alloc" && m != "register") throw Usage("unknown memory kind '" + m + "' (alloc, register)");
      if (std::find(combos.begin(), combos.end(), std::make_pair(t, m)) == combos.end()) combos.emplace_back(t, m);
    }
  }
  vector<Point> pts;
  for (auto &[t, m] : combos)
    for (const string &op : o.op)
      for (uint64_t b : o.block)
        for (int n : o.batch)
          for (int th : o.threads) pts.push_back({t, m, op, b, n, th});
  return pts;
}

struct Result {
  Point p;
  bool ok = false;
  string error, check, crash;
  vector<string> problems;
  uint64_t span = 0, batches = 0, bytes = 0;
  double secs = 0, gbps = 0, rps = 0;
  Stats batch_us, req_us;
  std::set<string> served;
  uint64_t retried = 0;
  string where, limit_kind;
  double limit = 0;
};

class Progress {
 public:
  Progress(size_t total, bool on) : total_(total), on_(on), t0_(now_s()) {}
  size_t done = 0;
  void show(const string &label, bool force = false) {
    if (!on_) return;
    std::lock_guard<std::mutex> g(mu_);
    double now = now_s();
    if (!force && now - last_ < 0.2) return;
    last_ = now;
    double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1;
    string bar(static_cast<size_t>(frac * 24), '#');
    bar.resize(24, ' ');
    string line = "\r[" + bar + "] " + std::to_string(done) + "/" + std::to_string(total_) + " " + label;
    if (done > 0 && done < total_) {
      line += " eta " + std::to_string(static_cast<long>((now - t0_) / static_cast<double>(done) *
                                                          static_cast<double>(total_ - done))) + "s";
    }
    size_t pad = width_ > line.size() ? width_ - line.size() : 0;
    width_ = line.size();
    std::fprintf(stderr, "%s%s", line.c_str(), string(pad, ' ').c_str());
    std::fflush(stderr);
  }
  void finish() {
    if (on_ && width_) std::fprintf(stderr, "\r%s\r", string(width_, ' ').c_str());
  }

 private:
  size_t total_;
  bool on_;
  double t0_, last_ = 0;
  size_t width_ = 0;
  std::mutex mu_;
};

class Runner {
 public:
  Runner(const Options &o, tent::Engine &e) : o_(o), e_(e) {}
  ~Runner() { close(); }

  void close() {
    for (auto &[k, tc] : targets_) tc->close();
    targets_.clear();
    if (inproc_server_) {
      inproc_server_->stop = true;
      if (inproc_thread_.joinable()) inproc_thread_.join();
      inproc_server_.reset();
      inproc_engine_.reset();
    }
    child_.reset();
    local_.reset();
  }

  TargetClient &target_for(const string &transport) {
    string key = transport == "local" ? "inproc" : "remote";
    auto it = targets_.find(key);
    if (it != targets_.end()) return *it->second;
    std::unique_ptr<TargetClient> tc;
    if (key == "inproc") {
      inproc_engine_ = std::make_unique<tent::Engine>(engine_options(o_));
      inproc_server_ = std::make_unique<TargetServer>(*inproc_engine_);
      inproc_thread_ = std::thread([this] { inproc_server_->serve(0, 0); });
      tc = std::make_unique<TargetClient>(e_, inproc_engine_->name(), nullptr, "in-process");
    } else if (o_.role == "initiator") {
      tc = std::make_unique<TargetClient>(e_, o_.target, nullptr, o_.target);
    } else {
      vector<string> argv = {example::self_dir() + "/sweep", "--role", "target", "--timeout", json_num(o_.timeout),
                             "--idle-seconds", "120", "--parent-pid", std::to_string(getpid())};
      if (o_.streams) argv.insert(argv.end(), {"--streams", std::to_string(o_.streams)});
      child_ = std::make_unique<example::Child>(argv);
      std::optional<string> line = child_->read_line(milliseconds(60000));
      if (!line) throw std::runtime_error("the target process did not start");
      size_t at = line->find("\"segment\": \"");
      if (at == string::npos) throw std::runtime_error("the target printed: " + *line);
      at += 12;
      string seg = line->substr(at, line->find('"', at) - at);
      tc = std::make_unique<TargetClient>(e_, seg, child_.get(), "pid " + std::to_string(child_->pid()));
    }
    return *targets_.emplace(key, std::move(tc)).first->second;
  }

  TargetClient *remote() {
    auto it = targets_.find("remote");
    return it == targets_.end() ? nullptr : it->second.get();
  }
  void drop_remote() {
    targets_.erase("remote");
    remote_bufs_.clear();
  }

  uint64_t remote_buf(TargetClient &tc, const string &kind, uint64_t size) {
    auto key = std::make_pair(tc.name, kind);
    auto it = remote_bufs_.find(key);
    if (it == remote_bufs_.end() || it->second.second < size) {
      std::map<string, string> r = tc.call("buf " + kind + " " + std::to_string(size));
      it = remote_bufs_.insert_or_assign(key, std::make_pair(std::stoull(r["addr"]), std::stoull(r["size"]))).first;
    }
    return it->second.first;
  }

  Memory &local_buf(uint64_t size) {
    if (!local_ || local_->size < size) {
      local_.reset();
      local_ = std::make_unique<Memory>(e_, "register", size);
    }
    return *local_;
  }

  // One batch, waited for; with check, the transports that served it.
  void one(const vector<tent_request> &reqs, size_t n, const string &transport, std::set<string> *served,
           uint64_t *retried) {
    tent_transfer_options opts = TENT_TRANSFER_OPTIONS_INIT;
    opts.timeout_ms = static_cast<uint64_t>(o_.timeout * 1e3);
    opts.transport = transport.c_str();
    tent_batch *b = nullptr;
    tent_status st = tent_transfer(e_.native(), reqs.data(), n, &opts, &b);
    if (st != TENT_OK) throw std::runtime_error(string("tent_transfer: ") + tent_status_str(st) + ": " + tent_last_error());
    st = tent_batch_wait(b, -1);
    string err = st == TENT_OK ? "" : string(tent_status_str(st)) + ": " + tent_last_error();
    if (st == TENT_OK && served) {
      vector<tent_request_status> s(n);
      size_t done = 0;
      tent_batch_status(b, s.data(), n, &done);
      for (const tent_request_status &x : s) {
        served->insert(tent_transport_name(x.transport));
        if (x.flags & TENT_STATUS_RETRIED) ++*retried;
      }
    }
    tent_batch_destroy(b);
    if (!err.empty()) throw std::runtime_error("batch: " + err);
  }

  Result run_point(const Point &p, Progress &prog) {
    Result r;
    r.p = p;
    uint64_t span = std::max(std::min(o_.span, p.block * static_cast<uint64_t>(p.batch) * static_cast<uint64_t>(p.threads)), p.block);
    TargetClient &tc = target_for(p.transport);
    uint64_t remote = remote_buf(tc, p.mem, span);
    Memory &local = local_buf(span);
    uint64_t slots = std::max<uint64_t>(1, span / p.block);
    uint64_t cov = std::min<uint64_t>(slots, static_cast<uint64_t>(p.batch) * static_cast<uint64_t>(p.threads)) * p.block;
    uint32_t opcode = p.op == "WRITE" ? TENT_OP_WRITE : TENT_OP_READ;
    std::optional<uint32_t> want;
    if (o_.check) {
      seed_++;
      if (p.op == "WRITE") {
        fill(local.addr, cov, seed_);
        want = crc32(local.addr, cov);
      } else {
        want = static_cast<uint32_t>(std::stoul(tc.call("fill " + p.mem + " " + std::to_string(seed_) + " " +
                                                        std::to_string(cov))["crc"]));
      }
    }
    vector<vector<tent_request>> reqs(static_cast<size_t>(p.threads));
    for (int t = 0; t < p.threads; t++) {
      for (int i = 0; i < p.batch; i++) {
        uint64_t off = ((static_cast<uint64_t>(t) * static_cast<uint64_t>(p.batch) + static_cast<uint64_t>(i)) % slots) * p.block;
        reqs[static_cast<size_t>(t)].push_back(
            tent_request{opcode, 0, local.addr + off, tc.seg.native(), remote + off, p.block});
      }
    }
    size_t nwarm = static_cast<size_t>(std::max<uint64_t>(1, std::min<uint64_t>(static_cast<uint64_t>(p.batch), (64ull << 20) / p.block)));
    one(reqs[0], nwarm, p.transport, &r.served, &r.retried);

    std::mutex mu;
    vector<vector<double>> lat(static_cast<size_t>(p.threads));
    uint64_t total = 0, batches = 0;
    bool stop = false;
    vector<string> errors;
    const uint64_t per_batch = p.block * static_cast<uint64_t>(p.batch);
    double t0 = now_s(), end = t0 + o_.duration;
    auto worker = [&](int tid) {
      bool first = true;
      try {
        for (;;) {
          std::set<string> s;
          uint64_t rt = 0;
          double t1 = now_s();
          one(reqs[static_cast<size_t>(tid)], static_cast<size_t>(p.batch), p.transport, first ? &s : nullptr, &rt);
          double t2 = now_s();
          lat[static_cast<size_t>(tid)].push_back(t2 - t1);
          std::lock_guard<std::mutex> g(mu);
          if (first) {
            r.served.insert(s.begin(), s.end());
            r.retried += rt;
            first = false;
          }
          total += per_batch;
          batches++;
          if (stop || t2 >= end || (o_.bytes && total >= o_.bytes)) {
            stop = true;
            return;
          }
          if (tid == 0) {
            char b[48];
            std::snprintf(b, sizeof b, " %.2f GB/s", static_cast<double>(total) / (t2 - t0) / 1e9);
            prog.show(p.label() + b);
          }
        }
      } catch (const std::exception &ex) {
        std::lock_guard<std::mutex> g(mu);
        stop = true;
        errors.push_back(ex.what());
      }
    };
    if (p.threads == 1) {
      worker(0);
    } else {
      vector<std::thread> ths;
      for (int t = 0; t < p.threads; t++) ths.emplace_back(worker, t);
      for (std::thread &th : ths) th.join();
    }
    r.secs = now_s() - t0;
    if (!errors.empty()) throw std::runtime_error(errors[0]);
    one(reqs[0], static_cast<size_t>(p.batch), p.transport, &r.served, &r.retried);
    vector<double> all, per_req;
    for (auto &v : lat) all.insert(all.end(), v.begin(), v.end());
    for (double x : all) per_req.push_back(x / p.batch);
    r.span = span;
    r.batches = batches;
    r.bytes = total;
    r.gbps = static_cast<double>(total) / r.secs / 1e9;
    r.rps = static_cast<double>(batches * static_cast<uint64_t>(p.batch)) / r.secs;
    r.batch_us = percentiles(all);
    r.req_us = percentiles(per_req);
    r.where = tc.where;
    r.ok = true;
    if (r.served != std::set<string>{p.transport}) {
      string s;
      for (const string &x : r.served) s += (s.empty() ? "" : ",") + x;
      r.problems.push_back("served by " + s + ", not " + p.transport);
    }
    if (r.retried) r.problems.push_back(std::to_string(r.retried) + " requests retried on another transport");
    if (want) {
      uint32_t got = p.op == "WRITE"
                         ? static_cast<uint32_t>(std::stoul(tc.call("crc " + p.mem + " 0 " + std::to_string(cov))["crc"]))
                         : crc32(local.addr, cov);
      char b[64];
      std::snprintf(b, sizeof b, "crc32 %08x != %08x", got, *want);
      r.check = got == *want ? "ok" : b;
      if (got != *want) r.problems.push_back("checksum: " + r.check);
    }
    return r;
  }

 private:
  const Options &o_;
  tent::Engine &e_;
  std::map<string, std::unique_ptr<TargetClient>> targets_;
  std::map<std::pair<string, string>, std::pair<uint64_t, uint64_t>> remote_bufs_;
  std::unique_ptr<Memory> local_;
  std::unique_ptr<tent::Engine> inproc_engine_;
  std::unique_ptr<TargetServer> inproc_server_;
  std::thread inproc_thread_;
  std::unique_ptr<example::Child> child_;
  uint64_t seed_ = static_cast<uint64_t>(time(nullptr)) & 0xFFFF;
};

string result_json(const Result &r) {
  if (!r.ok) {
    return "{\"type\": \"error\", " + r.p.key_json() + ", \"error\": " + json_str(r.error) +
           (r.crash.empty() ? "" : ", \"target_crash\": " + json_str(r.crash)) + "}";
  }
  string served;
  for (const string &s : r.served) served += (served.empty() ? "" : ", ") + json_str(s);
  string j = "{\"type\": \"point\", " + r.p.key_json() + ", \"span\": " + std::to_string(r.span) +
             ", \"batches\": " + std::to_string(r.batches) +
             ", \"requests\": " + std::to_string(r.batches * static_cast<uint64_t>(r.p.batch)) +
             ", \"bytes\": " + std::to_string(r.bytes) + ", \"seconds\": " + json_num(r.secs) +
             ", \"gbps\": " + json_num(r.gbps) + ", \"requests_per_s\": " + json_num(r.rps) +
             ", \"batch_us\": " + json_stats(r.batch_us) + ", \"request_us\": " + json_stats(r.req_us) +
             ", \"served_by\": [" + served + "], \"retried\": " + std::to_string(r.retried) +
             ", \"target\": " + json_str(r.where);
  if (!r.check.empty()) j += ", \"check\": " + json_str(r.check);
  if (r.limit > 0) {
    j += ", \"limit\": {\"kind\": " + json_str(r.limit_kind) + ", \"gbps\": " + json_num(r.limit) +
         ", \"fraction\": " + json_num(r.gbps / r.limit) + "}";
  }
  if (!r.problems.empty()) {
    string ps;
    for (const string &s : r.problems) ps += (ps.empty() ? "" : ", ") + json_str(s);
    j += ", \"problems\": [" + ps + "]";
  }
  return j + "}";
}

void print_table(FILE *f, const vector<Result> &rs) {
  char head[512];
  std::snprintf(head, sizeof head,
                "%-13s %-5s %6s %5s %3s %7s %13s %9s | %9s %8s %8s %8s | %8s %8s %8s %8s | check", "transport", "op",
                "block", "batch", "thr", "GB/s", "of limit", "req/s", "batch avg", "p50", "p99", "p999", "req avg",
                "p50", "p99", "p999");
  std::fprintf(f, "%s\n%s\n", head, string(std::strlen(head), '-').c_str());
  for (const Result &r : rs) {
    string name = r.p.transport + "/" + r.p.mem;
    if (!r.ok) {
      std::fprintf(f, "%-13s %-5s %6s %5d %3d FAILED: %s\n", name.c_str(), r.p.op.c_str(), size_label(r.p.block).c_str(),
                   r.p.batch, r.p.threads, r.error.c_str());
      continue;
    }
    char frac[32] = "-";
    if (r.limit > 0) std::snprintf(frac, sizeof frac, "%5.1f%% %s", r.gbps / r.limit * 100, r.limit_kind.c_str());
    string chk = r.check.empty() ? "-" : r.check;
    if (!r.problems.empty()) {
      chk.clear();
      for (const string &s : r.problems) chk += (chk.empty() ? "" : "; ") + s;
    }
    std::fprintf(f, "%-13s %-5s %6s %5d %3d %7.3f %13s %9.0f | %9s %8s %8s %8s | %8s %8s %8s %8s | %s\n", name.c_str(),
                 r.p.op.c_str(), size_label(r.p.block).c_str(), r.p.batch, r.p.threads, r.gbps, frac, r.rps,
                 fmt_us(r.batch_us.avg).c_str(), fmt_us(r.batch_us.p50).c_str(), fmt_us(r.batch_us.p99).c_str(),
                 fmt_us(r.batch_us.p999).c_str(), fmt_us(r.req_us.avg).c_str(), fmt_us(r.req_us.p50).c_str(),
                 fmt_us(r.req_us.p99).c_str(), fmt_us(r.req_us.p999).c_str(), chk.c_str());
  }
}

int target_main(const Options &o) {
  tent::Engine engine(engine_options(o, o.listen));
  TargetServer server(engine);
  string ts;
  for (const string &t : engine.transports()) ts += (ts.empty() ? "" : ", ") + json_str(t);
  std::printf("{\"segment\": %s, \"pid\": %d, \"transports\": [%s], \"impl\": \"c++\", \"version\": \"%s\"}\n",
              json_str(engine.name()).c_str(), static_cast<int>(getpid()), ts.c_str(), tent_version_string());
  std::fflush(stdout);
  server.serve(o.idle_seconds, o.parent_pid);
  return 0;
}

int initiator_main(const Options &o) {
  if (o.role == "initiator" && o.target.empty()) throw Usage("--role initiator needs --target NAME");
  vector<Point> pts = expand(o);
  bool progress = o.progress < 0 ? isatty(STDERR_FILENO) : o.progress == 1;
  FILE *out = nullptr;
  if (!o.json.empty()) {
    out = o.json == "-" ? stdout : std::fopen(o.json.c_str(), "w");
    if (!out) throw std::system_error(errno, std::generic_category(), "open " + o.json);
  }
  FILE *screen = o.json == "-" ? stderr : stdout;
  auto emit = [&](const string &j) {
    if (out) {
      std::fprintf(out, "%s\n", j.c_str());
      std::fflush(out);
    }
  };
  Machine m = machine();
  char date[64];
  time_t tnow = time(nullptr);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S%z", localtime(&tnow));
  string load_start = loadavg_json();
  string argv_json;
  for (const string &a : o.argv) argv_json += (argv_json.empty() ? "" : ", ") + json_str(a);
  emit("{\"type\": \"meta\", \"tool\": \"sweep\", \"impl\": \"c++\", \"version\": " + json_str(tent_version_string()) +
       ", \"date\": " + json_str(date) + ", \"machine\": {\"nproc\": " + std::to_string(m.nproc) +
       ", \"cpu\": " + json_str(m.cpu) + ", \"kernel\": " + json_str(m.kernel) + ", \"hostname\": " + json_str(m.host) +
       "}, \"load_start\": " + load_start + ", \"argv\": [" + argv_json + "]}");

  std::map<uint64_t, double> memcpy_lim;
  vector<double> iperf;
  vector<string> notes;
  vector<Result> results;
  int failures = 0, crashes = 0;
  bool want_tcp = false;
  std::set<uint64_t> copy_blocks;
  int max_batch = *std::max_element(o.batch.begin(), o.batch.end());
  for (const Point &p : pts) {
    want_tcp |= p.transport == "tcp";
    if (p.transport != "tcp") copy_blocks.insert(p.block);
  }
  auto run_iperf = [&](const char *when) {
    string note;
    std::optional<double> g = iperf3_gbps(o.iperf3_seconds, note);
    emit(string("{\"type\": \"limit\", \"kind\": \"iperf3\", \"when\": \"") + when + "\", \"gbps\": " +
         (g ? json_num(*g) : "null") + ", \"note\": " + json_str(note) + "}");
    if (g) iperf.push_back(*g);
    else notes.push_back(note);
  };
  {
    tent::Engine engine(engine_options(o));
    Runner runner(o, engine);
    if (o.limits) {
      for (uint64_t b : copy_blocks) {
        double g = memcpy_gbps(b, std::max(std::min(o.span, b * static_cast<uint64_t>(max_batch)), b), o.memcpy_seconds);
        memcpy_lim[b] = g;
        emit("{\"type\": \"limit\", \"kind\": \"memcpy\", \"block_size\": " + std::to_string(b) +
             ", \"gbps\": " + json_num(g) + ", \"how\": \"std::memcpy, 1 thread\"}");
      }
      if (want_tcp) run_iperf("before");
    }
    Progress prog(pts.size(), progress);
    for (const Point &p : pts) {
      prog.show(p.label(), true);
      Result r;
      try {
        r = runner.run_point(p, prog);
        if (!r.problems.empty()) failures++;
      } catch (const std::exception &ex) {
        r.p = p;
        r.ok = false;
        r.error = ex.what();
        failures++;
        if (TargetClient *tc = runner.remote()) {
          string note = tc->exit_note();
          if (!note.empty()) {
            r.crash = note.substr(2, note.size() - 3);
            crashes++;
            runner.drop_remote();
          }
        }
      }
      results.push_back(r);
      prog.done++;
    }
    prog.finish();
    if (o.limits && want_tcp && !which("iperf3").empty()) run_iperf("after");
  }
  double iperf_mean = 0;
  for (double v : iperf) iperf_mean += v / static_cast<double>(iperf.size());
  for (Result &r : results) {
    if (!r.ok) continue;
    if (r.p.transport == "tcp" && iperf_mean > 0) {
      r.limit_kind = "iperf3";
      r.limit = iperf_mean;
    } else if (r.p.transport != "tcp" && memcpy_lim.count(r.p.block)) {
      r.limit_kind = "memcpy";
      r.limit = memcpy_lim[r.p.block];
    }
  }
  for (const Result &r : results) emit(result_json(r));
  string iperf_json;
  for (double v : iperf) iperf_json += (iperf_json.empty() ? "" : ", ") + json_num(v);
  emit("{\"type\": \"summary\", \"points\": " + std::to_string(results.size()) + ", \"failures\": " +
       std::to_string(failures) + ", \"target_crashes\": " + std::to_string(crashes) + ", \"load_end\": " +
       loadavg_json() + ", \"limits\": {\"iperf3\": [" + iperf_json + "]}}");
  if (out && out != stdout) std::fclose(out);

  std::fprintf(screen, "sweep %s (c++) %s | %ld cpus, %s, kernel %s | load %s -> %s\n", tent_version_string(), date,
               m.nproc, m.cpu.c_str(), m.kernel.c_str(), load_start.c_str(), loadavg_json().c_str());
  if (!memcpy_lim.empty()) {
    string s;
    for (auto &[b, g] : memcpy_lim) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "%s%s %.2f", s.empty() ? "" : ", ", size_label(b).c_str(), g);
      s += buf;
    }
    std::fprintf(screen, "limit memcpy (1 thread, GB/s): %s\n", s.c_str());
  }
  if (!iperf.empty()) {
    string s;
    for (double v : iperf) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.3f", s.empty() ? "" : ", ", v);
      s += buf;
    }
    std::fprintf(screen, "limit iperf3 (loopback, 1 stream, GB/s): %s (mean %.3f)\n", s.c_str(), iperf_mean);
  }
  for (const string &n : notes) std::fprintf(screen, "note: %s\n", n.c_str());
  print_table(screen, results);
  if (failures) {
    std::fprintf(screen, "sweep: %d of %zu points failed%s\n", failures, results.size(),
                 crashes ? (" (" + std::to_string(crashes) + " target crashes)").c_str() : "");
  }
  if (!o.plot.empty()) {
    std::fprintf(stderr, "--plot %s: plotting is sweep.py's (matplotlib): run with --json FILE, then "
                         "`sweep.py --from-json FILE --plot %s`\n", o.plot.c_str(), o.plot.c_str());
  }
  return failures ? 1 : 0;
}

const char *kUsage =
    "usage: sweep [--role both|initiator|target] [--target NAME] [--listen ADDR]\n"
    "             [--transport local,shm,tcp[,shm:register]] [--target-mem alloc,register]\n"
    "             [--op write,read] [--block-size 4K,64K|4K-64M[/2]] [--batch 128] [--threads 1]\n"
    "             [--duration 2] [--bytes SIZE] [--span 256M] [--check] [--timeout 120] [--streams N]\n"
    "             [--json [FILE]] [--plot PNG] [--progress|--no-progress] [--no-limits]\n"
    "             [--iperf3-seconds 3] [--memcpy-seconds 0.3] [--idle-seconds N]\n"
    "The C++ twin of bench/sweep/sweep.py; see the top of bench/sweep/sweep.cc.\n";

}  // namespace

int main(int argc, char **argv) {
  try {
    Options o = parse(argc, argv);
    if (o.role == "target") return target_main(o);
    return initiator_main(o);
  } catch (const Usage &u) {
    if (*u.what()) std::fprintf(stderr, "sweep: %s\n", u.what());
    std::fprintf(stderr, "%s", kUsage);
    return *u.what() ? 2 : 0;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "sweep: %s\n", e.what());
    return 1;
  }
}
