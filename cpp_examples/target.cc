// target.cc — the passive side of the two-process example (see initiator.cc).
//
//   target [--size BYTES] [--transports LIST] [--secret S] [--idle-seconds N]
//
// Allocates a buffer with tent_alloc (host memory that same-host peers can
// also map: the shm transport), fills it with a pattern and prints, one per
// line on stdout:
//
//   segment 127.0.0.1:40123      the name initiators pass to open_segment
//   addr 0x7f0c2a000000          the buffer's address in this process
//   len 4194304
//   checksum 0x...               FNV-1a of the buffer as it is now
//   transports local,tcp         what this engine has installed
//   ready
//
// Then it serves notifications until "quit" (or N idle seconds, or until its
// parent is gone):
//
//   verify LABEL CHECKSUM   recomputes the buffer's checksum (the data of the
//                           batch that carried the notification has all
//                           arrived) and answers "ok LABEL" or
//                           "bad LABEL GOT" to the sender
//   quit                    exits: 0 if every verification matched, else 1
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>

#include "example_util.hpp"
#include "tent.hpp"

namespace {

int serve(size_t size, const std::string &transports, const std::string &secret, int idle_seconds) {
  tent::EngineOptions opts;
  if (!secret.empty()) {
    opts.secret(secret);  // initiators must prove the same secret
  }
  if (!transports.empty()) {
    opts.transports(transports);
  }
  tent::Engine engine(opts);
  tent::Allocation buf = engine.alloc(size, "cpu", tent::remote_rw);
  example::fill_pattern(buf.data(), buf.size(), 1);

  std::string installed;
  for (const std::string &t : engine.transports()) {
    installed += (installed.empty() ? "" : ",") + t;
  }
  std::printf("segment %s\naddr %s\nlen %zu\nchecksum %s\ntransports %s\nready\n", engine.name().c_str(),
              example::hex(tent::remote_address(buf.data())).c_str(), buf.size(),
              example::hex(example::checksum(buf.data(), buf.size())).c_str(), installed.c_str());
  std::fflush(stdout);

  pid_t parent = getppid();
  std::map<std::string, tent::Segment> peers;  // answer channels, opened on first use
  int bad = 0, idle = 0;
  for (;;) {
    std::optional<tent::Notification> n = engine.notify_recv(std::chrono::seconds(1));
    if (!n) {
      if (++idle >= idle_seconds || getppid() != parent) {
        std::fprintf(stderr, "target: no initiator (idle %d s); exiting\n", idle);
        return 3;
      }
      continue;
    }
    idle = 0;
    std::istringstream in(n->message);
    std::string verb, label, sum;
    in >> verb >> label >> sum;
    if (verb == "quit") {
      std::printf("quit %s\n", bad == 0 ? "ok" : "bad");
      return bad == 0 ? 0 : 1;
    }
    if (verb != "verify") {
      std::fprintf(stderr, "target: unknown message \"%s\" from %s\n", n->message.c_str(), n->from.c_str());
      continue;
    }
    uint64_t got = example::checksum(buf.data(), buf.size());
    bool ok = example::hex(got) == sum;
    bad += ok ? 0 : 1;
    std::printf("verified %s %s\n", label.c_str(), ok ? "ok" : "BAD");
    std::fflush(stdout);
    auto it = peers.find(n->from);
    if (it == peers.end()) {
      it = peers.emplace(n->from, engine.open_segment(n->from)).first;
    }
    engine.notify_send(it->second, (ok ? "ok " : "bad ") + label + (ok ? "" : " " + example::hex(got)));
  }
}

}  // namespace

int main(int argc, char **argv) {
  size_t size = 4u << 20;
  std::string transports, secret;
  int idle_seconds = 60;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--size" && i + 1 < argc) {
      size = static_cast<size_t>(example::parse_u64(argv[++i]));
    } else if (a == "--transports" && i + 1 < argc) {
      transports = argv[++i];
    } else if (a == "--secret" && i + 1 < argc) {
      secret = argv[++i];
    } else if (a == "--idle-seconds" && i + 1 < argc) {
      idle_seconds = static_cast<int>(example::parse_u64(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--size BYTES] [--transports LIST] [--secret S] [--idle-seconds N]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    return serve(size, transports, secret, idle_seconds);
  } catch (const tent::Error &e) {
    std::fprintf(stderr, "target: %s\n", e.what());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "target: %s\n", e.what());
  }
  return 1;
}
