// guard.cc — release on failure. A setup of several steps (register N KV
// blocks, open the peer's segment, submit the batch) holds each step in an
// RAII owner, so a throw half-way releases exactly what was done, in
// reverse order; returning the owners hands them on (the "commit").
// The engine's counts prove it: after every failure they are back to zero.
//
//   build/cpp_examples/guard
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tent.hpp"

namespace {

// Owners in acquisition order: members are destroyed in reverse order, so
// the batch is canceled before the segment closes and the blocks go last.
struct KvTransfer {
  tent::RegionBatch blocks;
  tent::Segment peer;
  tent::Batch batch;
};

void step(int k, int fail_after, const char *what) {
  std::printf("    step %d: %s\n", k, what);
  if (k == fail_after) {
    throw std::runtime_error("injected failure after step " + std::to_string(k));
  }
}

// Writes nblocks blocks of `pool` to the peer. Throws after step
// `fail_after` (0: never).
KvTransfer start(tent::Engine &engine, std::vector<char> &pool, size_t nblocks, const std::string &peer_name,
                 uint64_t remote, int fail_after) {
  size_t block = pool.size() / nblocks;
  std::vector<tent::RegionDesc> descs;
  for (size_t i = 0; i < nblocks; i++) {
    descs.push_back({pool.data() + i * block, block, "cpu"});
  }
  tent::RegionBatch blocks = engine.register_batch(descs);  // all or none
  step(1, fail_after, "registered the blocks");
  tent::Segment peer = engine.open_segment(peer_name);  // a throw here unregisters the blocks
  step(2, fail_after, "opened the peer's segment");
  std::vector<tent::Request> reqs;
  for (size_t i = 0; i < nblocks; i++) {
    reqs.push_back(tent::write_to(peer, remote + i * block, descs[i].addr, block));
  }
  tent::Batch batch = engine.submit(reqs);  // a throw here closes the segment, then unregisters
  step(3, fail_after, "submitted the batch");
  return {std::move(blocks), std::move(peer), std::move(batch)};  // commit: hand everything on
}

// The same with tent::Scope, for steps known only at run time, and a
// tent::Guard for a step that is not a tent object (a published key).
tent::Scope start_scoped(tent::Engine &engine, std::vector<char> &pool, size_t nblocks,
                         std::map<std::string, size_t> &published, int fail_after) {
  tent::Scope scope;
  size_t block = pool.size() / nblocks;
  for (size_t i = 0; i < nblocks; i++) {
    scope.hold(engine.register_memory(pool.data() + i * block, block));
  }
  step(1, fail_after, "registered the blocks one by one");
  published["kv/blocks"] = nblocks;
  tent::Guard unpublish([&published]() noexcept { published.erase("kv/blocks"); });
  step(2, fail_after, "published them");
  scope.defer([&published]() noexcept { published.erase("kv/blocks"); });  // teardown, later
  unpublish.commit();                                                        // the scope owns it now
  step(3, fail_after, "handed the key to the scope");
  return scope;
}

bool clean(const tent::Engine &engine, const char *when) {
  tent::Stats s = engine.stats();
  std::printf("  %-34s regions=%llu reservations=%llu segments=%llu batches=%llu handles=%llu\n", when,
              static_cast<unsigned long long>(s.regions), static_cast<unsigned long long>(s.reservations),
              static_cast<unsigned long long>(s.segments), static_cast<unsigned long long>(s.batches),
              static_cast<unsigned long long>(s.handles));
  return s.regions == 0 && s.reservations == 0 && s.segments == 0 && s.batches == 0 && s.handles == 0;
}

}  // namespace

int main() {
  try {
    bool ok = true;
    tent::Engine target;  // the peer, in this process (the local transport)
    std::vector<char> dest(1 << 20);
    tent::Region dest_region = target.register_memory(dest.data(), dest.size());

    tent::Engine engine;
    std::vector<char> pool(1 << 20, 'k');
    const size_t nblocks = 8;
    for (int fail_after = 1; fail_after <= 4; fail_after++) {
      std::printf("start(), failing after step %d:\n", fail_after);
      try {
        KvTransfer t = start(engine, pool, nblocks, target.name(), tent::remote_address(dest.data()), fail_after);
        tent::Outcome out = t.batch.wait();
        std::printf("    done: %s, %llu bytes\n", tent::to_string(out.status),
                    static_cast<unsigned long long>(out.bytes()));
        ok = ok && out.ok();
      } catch (const std::exception &e) {
        std::printf("    caught: %s\n", e.what());
      }
      ok = clean(engine, "after it, the engine holds:") && ok;
    }

    std::printf("start(), with a segment that cannot be opened:\n");
    try {
      KvTransfer t = start(engine, pool, nblocks, "127.0.0.1:1", 0, 0);
    } catch (const tent::Error &e) {
      std::printf("    caught tent::Error %s: %s\n", tent::status_name(e.code()), e.message().c_str());
    }
    ok = clean(engine, "after it, the engine holds:") && ok;

    std::map<std::string, size_t> published;
    for (int fail_after = 1; fail_after <= 4; fail_after++) {
      std::printf("start_scoped(), failing after step %d:\n", fail_after);
      try {
        tent::Scope s = start_scoped(engine, pool, nblocks, published, fail_after);
        std::printf("    done: the scope holds %zu steps\n", s.size());
      } catch (const std::exception &e) {
        std::printf("    caught: %s\n", e.what());
      }
      std::printf("    published keys: %zu\n", published.size());
      ok = clean(engine, "after it, the engine holds:") && published.empty() && ok;
    }
    std::printf("guard: %s\n", ok ? "nothing leaked" : "LEAKED");
    return ok ? 0 : 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "guard: %s\n", e.what());
    return 1;
  }
}
