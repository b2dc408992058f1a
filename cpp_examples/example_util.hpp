// example_util.hpp — small helpers shared by the C++ examples and tests:
// a checksum, a deterministic fill pattern, and a child process whose
// stdout is read line by line (an RAII owner: the destructor kills and reaps
// a child that is still running).
#ifndef TENT_EXAMPLE_UTIL_HPP
#define TENT_EXAMPLE_UTIL_HPP

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

extern char **environ;

namespace example {

// FNV-1a, 64 bits.
inline uint64_t checksum(const void *data, size_t len) {
  const unsigned char *p = static_cast<const unsigned char *>(data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Fills len bytes with a pattern that depends on seed (xorshift64*).
inline void fill_pattern(void *data, size_t len, uint64_t seed) {
  unsigned char *p = static_cast<unsigned char *>(data);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < len; i++) {
    if (i % 8 == 0) {
      x ^= x >> 12;
      x ^= x << 25;
      x ^= x >> 27;
    }
    p[i] = static_cast<unsigned char>((x * 0x2545f4914f6cdd1dull) >> (8 * (i % 8)));
  }
}

inline std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

inline uint64_t parse_u64(const std::string &s) {
  size_t end = 0;
  unsigned long long v = std::stoull(s, &end, 0);
  if (end != s.size()) {
    throw std::invalid_argument("not a number: " + s);
  }
  return static_cast<uint64_t>(v);
}

// A child process with its stdout on a pipe. Move-only; the destructor
// kills (SIGKILL) and reaps a child that was not waited for.
class Child {
 public:
  Child() = default;
  // Starts argv[0] (a path) with argv; stdin is /dev/null, stderr inherited.
  explicit Child(const std::vector<std::string> &argv) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      throw std::system_error(errno, std::generic_category(), "pipe2");
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    std::vector<char *> args;
    for (const std::string &a : argv) {
      args.push_back(const_cast<char *>(a.c_str()));
    }
    args.push_back(nullptr);
    pid_t pid = -1;
    int err = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (err != 0) {
      close(fds[0]);
      throw std::system_error(err, std::generic_category(), "posix_spawn " + argv.at(0));
    }
    pid_ = pid;
    out_ = fds[0];
  }
  Child(Child &&o) noexcept
      : pid_(std::exchange(o.pid_, -1)), out_(std::exchange(o.out_, -1)), buf_(std::move(o.buf_)) {}
  Child &operator=(Child &&o) noexcept {
    if (this != &o) {
      kill_and_reap();
      pid_ = std::exchange(o.pid_, -1);
      out_ = std::exchange(o.out_, -1);
      buf_ = std::move(o.buf_);
    }
    return *this;
  }
  Child(const Child &) = delete;
  Child &operator=(const Child &) = delete;
  ~Child() { kill_and_reap(); }

  pid_t pid() const noexcept { return pid_; }

  // The next line of the child's stdout (without '\n'); std::nullopt at EOF
  // or when timeout passes.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      if (out_ < 0) {
        return std::nullopt;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return std::nullopt;
      }
      pollfd p{out_, POLLIN, 0};
      int r = ::poll(&p, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) {
        continue;
      }
      if (r <= 0) {
        return std::nullopt;
      }
      char tmp[4096];
      ssize_t n = ::read(out_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) {
        continue;
      }
      if (n <= 0) {
        close(out_);
        out_ = -1;
        continue;
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }

  // Reads "key value" lines until a line "ready"; returns the pairs.
  std::map<std::string, std::string> read_header(std::chrono::milliseconds timeout) {
    std::map<std::string, std::string> kv;
    for (;;) {
      std::optional<std::string> line = read_line(timeout);
      if (!line) {
        throw std::runtime_error("the child exited or stayed silent before printing \"ready\"");
      }
      if (*line == "ready") {
        return kv;
      }
      size_t sp = line->find(' ');
      if (sp != std::string::npos) {
        kv[line->substr(0, sp)] = line->substr(sp + 1);
      }
    }
  }

  void signal(int sig) const {
    if (pid_ > 0) {
      ::kill(pid_, sig);
    }
  }

  // Waits for the exit, up to timeout; returns the wait status, or
  // std::nullopt if it is still running.
  std::optional<int> wait(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0) {
      int st = 0;
      pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        pid_ = -1;  // its stdout stays readable: read_line() drains it
        return st;
      }
      if (r < 0 && errno != EINTR) {
        pid_ = -1;
        return std::nullopt;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return std::nullopt;
      }
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, nullptr);
    }
    return std::nullopt;
  }

  // Waits up to timeout, then kills; returns the exit code (128+signal if
  // killed by a signal).
  int finish(std::chrono::milliseconds timeout) {
    std::optional<int> st = wait(timeout);
    if (!st) {
      kill_and_reap();
      return 128 + SIGKILL;
    }
    if (WIFEXITED(*st)) {
      return WEXITSTATUS(*st);
    }
    return 128 + WTERMSIG(*st);
  }

 private:
  void close_out() noexcept {
    if (out_ >= 0) {
      close(out_);
      out_ = -1;
    }
  }
  void kill_and_reap() noexcept {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);  // also ends a stopped (SIGSTOP) child
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    close_out();
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
};

// The directory of the running executable ("" if unknown).
inline std::string self_dir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) {
    return "";
  }
  std::string p(buf, static_cast<size_t>(n));
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? "" : p.substr(0, slash);
}

}  // namespace example

#endif  // TENT_EXAMPLE_UTIL_HPP
