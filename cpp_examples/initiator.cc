// initiator.cc — the active side of the two-process example: reads and
// writes a target's buffer over every available transport and checks the
// data with checksums.
//
//   initiator                                  spawns ./target (next to this
//                                              program) and uses what it prints
//   initiator SEGMENT ADDR LEN [CHECKSUM]      a target started elsewhere
//
// For each transport, "tcp" then "shm":
//   - skipped with a message if the engine's stats JSON does not list it,
//     or if a request hinted to it fails with NotFoundError/UnsupportedError
//     (the transport exists but cannot serve this peer);
//   1. READ the whole target buffer; its checksum must be the target's;
//   2. WRITE a new pattern in 4 requests of one batch, with the notification
//      "verify LABEL CHECKSUM" attached: the library delivers it after all
//      of the batch's data arrived; the target checks and answers "ok LABEL";
//   3. READ it back into a second buffer and compare.
// Every request must report the transport it was hinted to.
// Exit status: 0 if every transport that ran passed (and, when spawned, the
// target exited 0), 1 otherwise.
#include <algorithm>
#include <cstdio>
#include <map>
#include <cstring>
#include <string>
#include <vector>

#include "example_util.hpp"
#include "tent.hpp"

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

struct Peer {
  std::string segment;
  uint64_t addr = 0;
  size_t len = 0;
  std::optional<uint64_t> checksum;
};

struct Failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void expect_transport(const tent::Outcome &out, const std::string &transport, const char *what) {
  out.check();  // throws the tent::Error of the first failed request
  for (const tent::RequestStatus &r : out.requests) {
    if (transport != tent::to_string(r.transport)) {
      throw Failed(std::string(what) + ": served by " + tent::to_string(r.transport) + ", not " + transport);
    }
  }
}

// One round over one transport. Returns the checksum now in the target.
uint64_t round_trip(tent::Engine &engine, tent::Segment &peer, const Peer &p, uint64_t expect,
                    const std::string &transport, uint64_t seed) {
  std::vector<char> local(p.len), back(p.len);
  // Both buffers are registered for the round only; released on any throw.
  tent::RegionBatch regions = engine.register_batch({{local.data(), local.size(), "cpu"}, {back.data(), back.size(), "cpu"}});
  tent::TransferOptions hint;
  hint.transport(transport).timeout(seconds(10));

  auto t0 = std::chrono::steady_clock::now();
  tent::Outcome out = engine.transfer({tent::read_from(peer, p.addr, local.data(), p.len)}, hint);
  expect_transport(out, transport, "read");
  uint64_t got = example::checksum(local.data(), local.size());
  if (got != expect) {
    throw Failed("read: checksum " + example::hex(got) + ", the target has " + example::hex(expect));
  }

  example::fill_pattern(local.data(), local.size(), seed);
  uint64_t sum = example::checksum(local.data(), local.size());
  std::vector<tent::Request> writes;
  size_t chunk = (p.len + 3) / 4;
  for (size_t off = 0; off < p.len; off += chunk) {
    size_t n = std::min(chunk, p.len - off);
    writes.push_back(tent::write_to(peer, p.addr + off, local.data() + off, n));
  }
  tent::TransferOptions with_notify = hint;
  with_notify.notify("verify " + transport + " " + example::hex(sum));
  tent::Batch batch = engine.submit(writes, with_notify);
  expect_transport(batch.wait(), transport, "write");
  std::optional<tent::Notification> answer = engine.notify_recv(seconds(10));
  if (!answer) {
    throw Failed("write: the target did not answer the verification");
  }
  if (answer->message != "ok " + transport) {
    throw Failed("write: the target answered \"" + answer->message + "\"");
  }

  expect_transport(engine.transfer({tent::read_from(peer, p.addr, back.data(), p.len)}, hint), transport,
                   "read back");
  if (example::checksum(back.data(), back.size()) != sum) {
    throw Failed("read back: checksum differs from what was written");
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%-4s ok: read %zu B, wrote %zu B in %zu requests, verified by the target, read back; "
              "checksum %s (%.1f ms)\n",
              transport.c_str(), p.len, p.len, writes.size(), example::hex(sum).c_str(), secs * 1e3);
  return sum;
}

int run(const Peer &p) {
  tent::Engine engine;
  std::vector<std::string> installed = engine.transports();
  tent::Segment peer = engine.open_segment(p.segment);
  std::printf("initiator: engine %s, target %s, buffer %s (%zu bytes)\n", engine.name().c_str(),
              p.segment.c_str(), example::hex(p.addr).c_str(), p.len);

  uint64_t expect = 0;
  if (p.checksum) {
    expect = *p.checksum;
  } else {  // a target started by hand without its checksum: take it on trust
    std::vector<char> tmp(p.len);
    tent::Region r = engine.register_memory(tmp.data(), tmp.size());
    engine.transfer({tent::read_from(peer, p.addr, tmp.data(), p.len)}).check();
    expect = example::checksum(tmp.data(), tmp.size());
  }

  int failures = 0, ran = 0;
  uint64_t seed = 100;
  for (const char *name : {"tcp", "shm"}) {
    const std::string transport = name;
    if (std::find(installed.begin(), installed.end(), transport) == installed.end()) {
      std::string list;
      for (const std::string &t : installed) {
        list += (list.empty() ? "" : ",") + t;
      }
      std::printf("%-4s skipped: not installed in this libtent (its stats JSON lists: %s)\n", transport.c_str(),
                  list.c_str());
      continue;
    }
    try {
      expect = round_trip(engine, peer, p, expect, transport, seed++);
      ran++;
    } catch (const tent::NotFoundError &e) {
      std::printf("%-4s skipped: %s\n", transport.c_str(), e.what());
    } catch (const tent::UnsupportedError &e) {
      std::printf("%-4s skipped: %s\n", transport.c_str(), e.what());
    } catch (const std::exception &e) {
      std::printf("%-4s FAILED: %s\n", transport.c_str(), e.what());
      failures++;
    }
  }
  engine.notify_send(peer, "quit");
  if (ran == 0) {
    std::printf("initiator: no transport could reach the target\n");
    return 1;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    Peer p;
    example::Child target;
    if (argc == 1) {
      std::string path = example::self_dir() + "/target";
      target = example::Child({path, "--idle-seconds", "30"});
      std::map<std::string, std::string> kv = target.read_header(seconds(20));
      p.segment = kv.at("segment");
      p.addr = example::parse_u64(kv.at("addr"));
      p.len = static_cast<size_t>(example::parse_u64(kv.at("len")));
      p.checksum = example::parse_u64(kv.at("checksum"));
      std::printf("initiator: spawned %s (pid %d)\n", path.c_str(), static_cast<int>(target.pid()));
    } else if (argc == 4 || argc == 5) {
      p.segment = argv[1];
      p.addr = example::parse_u64(argv[2]);
      p.len = static_cast<size_t>(example::parse_u64(argv[3]));
      if (argc == 5) {
        p.checksum = example::parse_u64(argv[4]);
      }
    } else {
      std::fprintf(stderr, "usage: %s [SEGMENT ADDR LEN [CHECKSUM]]\n", argv[0]);
      return 2;
    }
    int rc = run(p);
    if (target.pid() > 0) {
      int trc = target.finish(seconds(10));
      while (std::optional<std::string> line = target.read_line(milliseconds(100))) {
        std::printf("  target: %s\n", line->c_str());
      }
      std::printf("initiator: target exited with %d\n", trc);
      if (trc != 0) {
        rc = 1;
      }
    }
    std::printf("initiator: %s\n", rc == 0 ? "PASS" : "FAIL");
    return rc;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "initiator: %s\n", e.what());
    return 1;
  }
}
