// test_tent.cc — GoogleTest suite for include/tent.hpp over build/libtent.so.
//
// Every test ends with a process-wide leak check (TearDown): a fresh probe
// engine must be the only live handle in the process. Tests that need the
// example programs (cpp_examples/target, initiator) find them in
// $TENT_CPP_EXAMPLES (set by the Makefile) or next to this binary's
// ../cpp_examples.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <mutex>
#include <thread>
#include <typeinfo>
#include <vector>

#include "example_util.hpp"
#include "tent.hpp"

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

// ---- Helpers ------------------------------------------------------------------

uint64_t live_process_handles() {
  tent::Engine probe;
  return probe.stats().process_handles - 1;  // minus the probe itself
}

class Tent : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_EQ(live_process_handles(), 0u) << "a test leaked a handle (engine, region, segment or batch)";
  }
};

// All of an engine's counts that must be back at zero after a failed setup.
void expect_clean(const tent::Engine &e, const char *where) {
  tent::Stats s = e.stats();
  EXPECT_EQ(s.regions, 0u) << where;
  EXPECT_EQ(s.registered_bytes, 0u) << where;
  EXPECT_EQ(s.reservations, 0u) << where;
  EXPECT_EQ(s.handles, 0u) << where;
  EXPECT_EQ(s.segments, 0u) << where;
  EXPECT_EQ(s.batches, 0u) << where;
  EXPECT_EQ(s.requests_in_flight, 0u) << where;
  EXPECT_EQ(s.allocations, 0u) << where;
}

std::string examples_dir() {
  if (const char *d = std::getenv("TENT_CPP_EXAMPLES")) {
    return d;
  }
  return example::self_dir() + "/../cpp_examples";
}

// Expects `fn` to throw exactly ErrorOf<S> with a message from the library.
template <tent::Status S, class Fn>
tent::Error expect_error(Fn &&fn, const char *context) {
  try {
    fn();
  } catch (const tent::ErrorOf<S> &e) {
    EXPECT_EQ(e.code(), S);
    EXPECT_EQ(e.status(), static_cast<tent_status>(S));
    EXPECT_FALSE(e.message().empty()) << "no library message for " << e.what();
    EXPECT_EQ(e.context(), context);
    EXPECT_NE(std::string(e.what()).find(tent::status_name(S)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(e.message()), std::string::npos) << e.what();
    return e;
  } catch (const tent::Error &e) {
    ADD_FAILURE() << "threw " << e.what() << ", want " << tent::status_name(S);
    return e;
  }
  ADD_FAILURE() << "did not throw, want " << tent::status_name(S);
  return tent::Error(S, "");
}

// ---- Versions and codes ---------------------------------------------------------

TEST_F(Tent, VersionCheck) {
  EXPECT_NO_THROW(tent::check_version());
  try {
    tent::check_version(TENT_ABI_VERSION + 1);
    ADD_FAILURE() << "no throw";
  } catch (const tent::VersionMismatchError &e) {
    EXPECT_EQ(e.code(), tent::Status::version_mismatch);
    EXPECT_NE(e.message().find("ABI"), std::string::npos) << e.message();
  }
  tent::Version v = tent::library_version();
  EXPECT_EQ(v.major, static_cast<uint32_t>(TENT_VERSION_MAJOR));
  EXPECT_EQ(v.minor, static_cast<uint32_t>(TENT_VERSION_MINOR));
}

// Every code the library knows has an enumerator and its own class.
TEST_F(Tent, EveryLibraryCodeHasAClass) {
  int known = 0;
  for (tent_status c = -1; c >= -200; c--) {
    if (std::string(tent_status_str(c)) == "unknown status") {
      continue;
    }
    known++;
    tent::Status s = static_cast<tent::Status>(c);
    ASSERT_NE(tent::status_name(s), nullptr) << "tent.hpp has no enumerator for status " << c;
    try {
      tent::throw_error(c, "m", "ctx");
    } catch (const tent::Error &e) {
      EXPECT_EQ(e.code(), s);
      EXPECT_EQ(e.message(), "m");
      EXPECT_NE(typeid(e), typeid(tent::Error)) << "status " << c << " has no subclass";
    }
  }
  EXPECT_EQ(known, 22);
  EXPECT_STREQ(tent::status_name(tent::Status::overlap), "TENT_ERR_OVERLAP");
  EXPECT_EQ(tent::status_name(static_cast<tent::Status>(-1000)), nullptr);
  try {
    tent::throw_error(-1000, "m");
  } catch (const tent::Error &e) {
    EXPECT_EQ(typeid(e), typeid(tent::Error));
    EXPECT_EQ(e.status(), -1000);
  }
  EXPECT_STREQ(tent::to_string(tent::Status::ok), "success");
  EXPECT_STREQ(tent::to_string(tent::Transport::tcp), "tcp");
}

// ---- Errors carry the right code and the library's message ----------------------

TEST_F(Tent, ErrorsCarryCodeAndMessage) {
  tent::Engine e;
  std::vector<char> buf(1 << 16);
  tent::Region r = e.register_memory(buf.data(), 4096);

  tent::Error overlap = expect_error<tent::Status::overlap>(
      [&] { (void)e.register_memory(buf.data() + 2048, 4096); }, "tent_register");
  // The message was captured at throw time: later calls do not change it.
  std::string msg = overlap.message();
  (void)e.stats();
  EXPECT_EQ(overlap.message(), msg);
  EXPECT_STREQ(tent_last_error(), "");

  expect_error<tent::Status::already_registered>([&] { (void)e.register_memory(buf.data(), 4096); },
                                                 "tent_register");
  expect_error<tent::Status::invalid_argument>([&] { (void)e.register_memory(nullptr, 4096); }, "tent_register");
  expect_error<tent::Status::invalid_argument>([&] { (void)e.register_memory(buf.data() + 8192, 0); },
                                               "tent_register");
  expect_error<tent::Status::invalid_argument>(
      [&] { (void)e.register_memory(buf.data() + 8192, 16, tent::remote_rw, "floppy:0"); }, "tent_register");
  expect_error<tent::Status::invalid_argument>(
      [&] { (void)e.register_memory(buf.data() + 8192, 16, 0x80); }, "tent_register");
  expect_error<tent::Status::invalid_argument>(
      [&] { (void)e.register_batch({{buf.data() + 8192, 64, nullptr}, {buf.data() + 8200, 64, nullptr}}); },
      "tent_register_batch");
  expect_error<tent::Status::not_found>([] { tent::Engine bad(tent::EngineOptions().transports("carrier-pigeon")); },
                                        "tent_engine_create");
  expect_error<tent::Status::invalid_argument>([] { tent::Engine bad(tent::EngineOptions().transports("")); },
                                               "tent_engine_create");
  expect_error<tent::Status::not_found>([&] { e.uninstall("carrier-pigeon"); }, "tent_uninstall");
  expect_error<tent::Status::transport>([&] { (void)e.open_segment("127.0.0.1:1"); }, "tent_segment_open");
  // A handle that is not a region of this engine.
  tent::Region bogus = tent::Region::adopt(e.native(), reinterpret_cast<tent_region *>(uintptr_t{0xdead}), nullptr, 0);
  expect_error<tent::Status::invalid_handle>([&] { bogus.unregister(); }, "tent_unregister");
  EXPECT_TRUE(bogus);  // a failed unregister keeps the handle
  (void)bogus.release();
  {
    tent::Region tmp = e.register_memory(buf.data() + 8192, 64);
    tent::Region other = std::move(tmp);
    EXPECT_FALSE(tmp);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(e.stats().regions, 2u);
  }
  EXPECT_EQ(e.stats().regions, 1u);
}

TEST_F(Tent, NotFoundForATransportThatIsNotInstalled) {
  tent::Engine a(tent::EngineOptions().transports("tcp"));
  tent::Engine b(tent::EngineOptions().transports("tcp"));
  std::vector<char> src(4096, 's'), dst(4096);
  tent::Region rs = a.register_memory(src.data(), src.size());
  tent::Region rd = b.register_memory(dst.data(), dst.size());
  tent::Segment peer = a.open_segment(b.name());
  tent::Request w = tent::write_to(peer, tent::remote_address(dst.data()), src.data(), src.size());
  expect_error<tent::Status::not_found>([&] { (void)a.transfer({w}, tent::TransferOptions().transport("local")); },
                                        "tent_transfer_sync");
  tent::Outcome out = a.transfer({w}, tent::TransferOptions().transport("tcp"));
  EXPECT_TRUE(out.ok()) << out.message;
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].transport, tent::Transport::tcp);
  EXPECT_EQ(out.bytes(), 4096u);
  EXPECT_EQ(dst, src);
}

// ---- Logging ----------------------------------------------------------------------

TEST_F(Tent, LogSinkSeesTransportChoiceAndTeardown) {
  std::mutex mu;
  std::vector<std::pair<int, std::string>> lines;
  bool busy_inside = false;
  tent::set_log_level(tent::LogLevel::debug);
  EXPECT_EQ(tent::log_level(), tent::LogLevel::debug);
  tent::set_log_sink([&](int level, std::string_view line) {
    std::lock_guard<std::mutex> g(mu);
    lines.emplace_back(level, std::string(line));
    if (lines.size() == 1) {
      try {
        tent::set_log_sink(nullptr);
      } catch (const tent::BusyError &) {
        busy_inside = true;
      }
    }
    if (lines.size() == 2) {
      throw std::runtime_error("a sink that throws must not take the process down");
    }
  });
  std::string peer_name;
  {
    tent::Engine a(tent::EngineOptions().transports("tcp"));
    tent::Engine b(tent::EngineOptions().transports("tcp"));
    peer_name = b.name();
    std::vector<char> src(4096, 's'), dst(4096);
    tent::Region rs = a.register_memory(src.data(), src.size());
    tent::Region rd = b.register_memory(dst.data(), dst.size());
    tent::Segment peer = a.open_segment(b.name());
    tent::Outcome out = a.transfer({tent::write_to(peer, tent::remote_address(dst.data()), src.data(), src.size())});
    EXPECT_TRUE(out.ok()) << out.message;
  }
  tent::set_log_sink(nullptr);  // the lambda's captures may go now
  tent::set_log_level(tent::LogLevel::warn);
  std::lock_guard<std::mutex> g(mu);
  auto has = [&](int level, std::initializer_list<const char *> parts) {
    return std::any_of(lines.begin(), lines.end(), [&](const std::pair<int, std::string> &l) {
      return l.first == level && std::all_of(parts.begin(), parts.end(), [&](const char *p) {
               return l.second.find(p) != std::string::npos;
             });
    });
  };
  std::string peer = "peer=" + peer_name;
  EXPECT_TRUE(has(TENT_LOG_DEBUG, {"msg=\"transport chosen\"", peer.c_str(), "transport=tcp"}));
  EXPECT_TRUE(has(TENT_LOG_DEBUG, {"msg=\"transport uninstalled\"", "transport=tcp"}));
  EXPECT_TRUE(has(TENT_LOG_INFO, {"msg=\"engine closed\""}));
  EXPECT_TRUE(busy_inside) << "set_log_sink inside a sink throws BusyError";
  size_t seen = lines.size();
  { tent::Engine quiet; }
  EXPECT_EQ(lines.size(), seen) << "the sink is not called after set_log_sink(nullptr)";
}

TEST_F(Tent, LogLevelBadValue) {
  expect_error<tent::Status::invalid_argument>([] { tent::set_log_level(static_cast<tent::LogLevel>(9)); },
                                               "tent_log_set_level");
}

// ---- Move semantics, release, reset ---------------------------------------------

TEST_F(Tent, RegionMoveAndRelease) {
  tent::Engine e;
  std::vector<char> buf(1 << 16);
  tent::Region a = e.register_memory(buf.data(), 1024);
  tent::Region b = e.register_memory(buf.data() + 1024, 1024);
  EXPECT_EQ(a.addr(), buf.data());
  EXPECT_EQ(a.size(), 1024u);
  EXPECT_EQ(a.info().len, 1024u);
  EXPECT_EQ(a.info().flags, tent::remote_rw);

  tent::Region c(std::move(a));  // move-construct: a is empty
  EXPECT_FALSE(a);
  EXPECT_EQ(a.native(), nullptr);
  EXPECT_EQ(a.addr(), nullptr);
  EXPECT_TRUE(c);
  EXPECT_EQ(e.stats().regions, 2u);

  c = std::move(b);  // move-assign unregisters what c held
  EXPECT_FALSE(b);
  EXPECT_EQ(e.stats().regions, 1u);
  EXPECT_EQ(c.addr(), buf.data() + 1024);
  tent::Region again = e.register_memory(buf.data(), 1024);  // the first range is free again
  again.reset();
  again.reset();  // twice: no-op
  again.unregister();  // empty: no-op
  EXPECT_EQ(e.stats().regions, 1u);

  tent_region *raw = c.release();  // hand the handle on
  EXPECT_FALSE(c);
  EXPECT_EQ(e.stats().regions, 1u);
  EXPECT_EQ(tent_unregister(e.native(), raw), TENT_OK);
  EXPECT_EQ(tent_unregister(e.native(), raw), TENT_ERR_INVALID_HANDLE);  // double destroy is detected

  tent::Region explicit_ = e.register_memory(buf.data() + 4096, 64);
  explicit_.unregister();
  EXPECT_FALSE(explicit_);
  expect_clean(e, "after the regions");
}

TEST_F(Tent, RegionBatchMoveAndRelease) {
  tent::Engine e;
  std::vector<char> buf(1 << 16);
  tent::RegionBatch a = e.register_batch({{buf.data(), 1024, "cpu"}, {buf.data() + 1024, 1024, nullptr}});
  tent::RegionBatch b = e.register_batch({{buf.data() + 4096, 512, nullptr}});
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(e.stats().regions, 3u);
  tent::RegionBatch c(std::move(a));
  EXPECT_FALSE(a);
  EXPECT_EQ(a.size(), 0u);
  c = std::move(b);  // unregisters the two
  EXPECT_FALSE(b);
  EXPECT_EQ(e.stats().regions, 1u);
  EXPECT_EQ(c.desc(0).addr, buf.data() + 4096);
  std::vector<tent_region *> raw = c.release();
  ASSERT_EQ(raw.size(), 1u);
  EXPECT_EQ(e.stats().regions, 1u);
  EXPECT_EQ(tent_unregister_batch(e.native(), raw.data(), raw.size()), TENT_OK);
  c.reset();  // empty: no-op
  tent::RegionBatch d = e.register_batch({{buf.data(), 64, nullptr}, {buf.data() + 64, 64, nullptr}});
  d.unregister();
  EXPECT_TRUE(d.empty());
  expect_clean(e, "after the batches");
}

// One stale handle in a RegionBatch does not keep the others registered.
TEST_F(Tent, RegionBatchDestructorFallsBackToOneByOne) {
  tent::Engine e;
  std::vector<char> buf(1 << 16);
  {
    tent::RegionBatch a = e.register_batch({{buf.data(), 64, nullptr}, {buf.data() + 64, 64, nullptr}});
    ASSERT_EQ(tent_unregister(e.native(), a.native(0)), TENT_OK);  // behind the owner's back
    EXPECT_EQ(e.stats().regions, 1u);
  }
  expect_clean(e, "after the batch");
}

TEST_F(Tent, AllocationMoveAndFree) {
  tent::Engine e;
  tent::Allocation a = e.alloc(1 << 16);
  ASSERT_NE(a.data(), nullptr);
  std::memset(a.data(), 7, a.size());
  EXPECT_EQ(a.info().len, uint64_t{1} << 16);
  tent::Allocation b = e.alloc(4096, "cpu", tent::remote_read);
  EXPECT_EQ(e.stats().allocations, 2u);
  // An allocation is released with tent_free, not tent_unregister.
  tent::Region alias = tent::Region::adopt(e.native(), a.native(), a.data(), a.size());
  expect_error<tent::Status::invalid_argument>([&] { alias.unregister(); }, "tent_unregister");
  (void)alias.release();
  tent::Allocation c(std::move(a));
  EXPECT_FALSE(a);
  EXPECT_EQ(a.data(), nullptr);
  c = std::move(b);  // frees the first
  EXPECT_EQ(e.stats().allocations, 1u);
  c.free();
  EXPECT_FALSE(c);
  c.free();  // empty: no-op
  expect_error<tent::Status::unsupported>([&] { (void)e.alloc(4096, "cuda:0"); }, "tent_alloc");
  expect_clean(e, "after the allocations");
}

TEST_F(Tent, SegmentBatchEngineMove) {
  tent::Engine peer_engine;
  std::vector<char> dst(4096), src(4096, 'x');
  tent::Region rd = peer_engine.register_memory(dst.data(), dst.size());

  tent::Engine e;
  tent::Region rs = e.register_memory(src.data(), src.size());
  tent::Segment s = e.open_segment(peer_engine.name());
  EXPECT_EQ(s.name(), peer_engine.name());
  tent::Segment s2 = std::move(s);
  EXPECT_FALSE(s);
  EXPECT_TRUE(s.name().empty());
  EXPECT_EQ(e.stats().segments, 1u);

  tent::Batch b = e.submit({tent::write_to(s2, tent::remote_address(dst.data()), src.data(), src.size())});
  EXPECT_EQ(b.size(), 1u);
  tent::Batch b2 = std::move(b);
  EXPECT_FALSE(b);
  EXPECT_EQ(b.size(), 0u);
  tent::Outcome out = b2.wait();
  EXPECT_TRUE(out) << out.message;
  EXPECT_EQ(out.requests.at(0).transport, tent::Transport::local);
  EXPECT_FALSE(out.requests.at(0).retried());
  EXPECT_FALSE(out.requests.at(0).staged());  // host memory: never staged
  std::optional<tent::Outcome> again = b2.poll();  // a finished batch stays valid
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->ok());
  EXPECT_EQ(e.stats().batches, 1u);
  b2 = tent::Batch();  // move-assign destroys the old batch
  EXPECT_EQ(e.stats().batches, 0u);
  EXPECT_EQ(dst, src);

  // A moved-from batch: calls on it are errors, not crashes.
  expect_error<tent::Status::invalid_handle>([&] { (void)b.poll(); }, "tent_batch_status");

  // Engine: moved-from is empty; move-assign destroys the old engine.
  tent::Engine moved = std::move(e);
  EXPECT_FALSE(e);
  EXPECT_EQ(moved.stats().segments, 1u);
  tent_engine *old = moved.native();
  moved = tent::Engine();
  tent_stats st;
  std::memset(&st, 0, sizeof st);
  st.size = sizeof st;
  EXPECT_EQ(tent_engine_stats(old, &st), TENT_ERR_INVALID_HANDLE);
  // The children outlived their engine: their destructors are harmless.
  EXPECT_EQ(tent_segment_close(old, s2.native()), TENT_ERR_INVALID_HANDLE);
}

TEST_F(Tent, EngineReleaseAdoptDestroy) {
  tent::Engine e;
  tent_engine *raw = e.release();
  EXPECT_FALSE(e);
  tent::Engine back = tent::Engine::adopt(raw);
  EXPECT_EQ(back.native(), raw);
  back.destroy();
  EXPECT_FALSE(back);
  back.reset();  // empty: no-op
  EXPECT_EQ(tent_engine_destroy(raw), TENT_ERR_INVALID_HANDLE);  // destroyed exactly once
}

// Children destroyed after their engine (the wrong order) do not crash.
TEST_F(Tent, ChildrenOutlivingTheEngine) {
  std::vector<char> buf(1 << 16);
  tent::Region r;
  tent::RegionBatch rb;
  tent::Allocation a;
  tent::Segment s;
  {
    tent::Engine e;
    r = e.register_memory(buf.data(), 64);
    rb = e.register_batch({{buf.data() + 64, 64, nullptr}});
    a = e.alloc(4096);
    s = e.open_segment(e.name());
  }
  EXPECT_TRUE(r);
  expect_error<tent::Status::invalid_handle>([&] { r.unregister(); }, "tent_unregister");
}

// ---- Scope and Guard ---------------------------------------------------------------

TEST_F(Tent, ScopeReleasesInReverseOrder) {
  std::vector<int> order;
  {
    tent::Scope s;
    s.defer([&] { order.push_back(1); });
    s.defer([&] { order.push_back(2); });
    tent::Scope moved = std::move(s);
    EXPECT_TRUE(s.empty());
    moved.defer([&] { order.push_back(3); });
    moved.defer([] { throw std::runtime_error("swallowed"); });
    EXPECT_EQ(moved.size(), 4u);
  }
  EXPECT_EQ(order, (std::vector<int>{3, 2, 1}));

  tent::Engine e;
  std::vector<char> buf(1 << 16);
  tent::Scope s;
  std::vector<tent::Region *> held;
  for (int i = 0; i < 8; i++) {
    held.push_back(&s.hold(e.register_memory(buf.data() + i * 1024, 1024)));
  }
  EXPECT_EQ(held[3]->addr(), buf.data() + 3 * 1024);  // references stay valid
  tent::Scope other = std::move(s);
  EXPECT_EQ(held[7]->addr(), buf.data() + 7 * 1024);  // ... also when the scope moves
  EXPECT_EQ(e.stats().regions, 8u);
  s = std::move(other);  // move-assign: s was empty
  EXPECT_EQ(e.stats().regions, 8u);
  s.reset();
  EXPECT_EQ(e.stats().regions, 0u);
}

TEST_F(Tent, GuardRunsUnlessCommitted) {
  int undone = 0;
  {
    tent::Guard g([&] { undone++; });
  }
  EXPECT_EQ(undone, 1);
  {
    tent::Guard g([&] { undone++; });
    g.commit();
    EXPECT_TRUE(g.committed());
  }
  EXPECT_EQ(undone, 1);
  {
    tent::Guard g([&] { undone++; });
    g.rollback();
    g.rollback();
  }
  EXPECT_EQ(undone, 2);
  {
    tent::Guard g([]() -> void { throw std::runtime_error("swallowed in the destructor"); });
  }
  try {
    tent::Guard g([&] { undone++; });
    throw std::runtime_error("half-way");
  } catch (const std::runtime_error &) {
  }
  EXPECT_EQ(undone, 3);
}

// ---- An exception at every step of a multi-step setup -----------------------------

// The setup: register kRegions regions one by one, register kBatch more in
// one call, open the peer's segment, submit a batch over all of them, wait.
// Steps are numbered 1..kSteps. With Failure::injected, step k succeeds and
// then the code throws; with Failure::library, step k itself fails in the
// library (an overlap, a segment that does not answer, an unregistered
// local address, an out-of-range remote address).
constexpr int kRegions = 4, kBatch = 3;
constexpr int kSteps = kRegions + 4;  // + batch, segment, submit, wait
enum class Failure { injected, library };

struct Injected : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct World {
  tent::Engine peer_engine;
  std::vector<char> remote = std::vector<char>(64 << 10);
  tent::Region remote_region = peer_engine.register_memory(remote.data(), remote.size());
  tent::Engine engine = tent::Engine(tent::EngineOptions().transports("tcp"));
  std::vector<char> local = std::vector<char>(64 << 10, 'l');
  static constexpr size_t kBlock = 4096;
  char *block(int i) { return local.data() + static_cast<size_t>(i) * kBlock; }
};

// The setup with owners composed as locals and returned in a struct.
struct KvSetup {
  std::vector<tent::Region> regions;
  tent::RegionBatch batch_regions;
  tent::Segment peer;
  tent::Batch batch;
};

KvSetup setup_composed(World &w, int fail_at, Failure how) {
  auto injected = [&](int k) {
    if (k == fail_at && how == Failure::injected) {
      throw Injected("injected after step " + std::to_string(k));
    }
  };
  auto broken = [&](int k) { return k == fail_at && how == Failure::library; };
  KvSetup s;
  int k = 1;
  for (int i = 0; i < kRegions; i++, k++) {
    // Broken: the previous block again, shifted by half a block: an overlap.
    char *addr = broken(k) && i > 0 ? w.block(i - 1) + World::kBlock / 2 : w.block(i);
    s.regions.push_back(w.engine.register_memory(addr, broken(k) && i == 0 ? 0 : World::kBlock));
    injected(k);
  }
  std::vector<tent::RegionDesc> descs;
  for (int i = 0; i < kBatch; i++) {
    descs.push_back({w.block(kRegions + i), World::kBlock, nullptr});
  }
  if (broken(k)) {
    descs.push_back({w.block(0), 16, nullptr});  // overlaps region 0: nothing of the batch stays
  }
  s.batch_regions = w.engine.register_batch(descs);
  injected(k++);
  s.peer = w.engine.open_segment(broken(k) ? "127.0.0.1:1" : w.peer_engine.name());
  injected(k++);
  std::vector<tent::Request> reqs;
  for (int i = 0; i < kRegions + kBatch; i++) {
    uint64_t remote = tent::remote_address(w.remote.data()) + static_cast<uint64_t>(i) * World::kBlock;
    reqs.push_back(tent::write_to(s.peer, remote, w.block(i), World::kBlock));
  }
  if (broken(k)) {
    reqs.push_back(tent::write_to(s.peer, tent::remote_address(w.remote.data()), w.block(12), 16));  // unregistered
  }
  if (broken(k + 1)) {
    reqs.push_back(tent::write_to(s.peer, tent::remote_address(w.remote.data()) + w.remote.size() - 8, w.block(0), 16));
  }
  s.batch = w.engine.submit(reqs, tent::TransferOptions().timeout(5s));
  injected(k++);
  s.batch.wait().check();  // a failed request becomes an exception here
  injected(k++);
  EXPECT_EQ(k, kSteps + 1);
  return s;
}

// The same steps held in a tent::Scope.
tent::Scope setup_scoped(World &w, int fail_at, Failure how) {
  auto injected = [&](int k) {
    if (k == fail_at && how == Failure::injected) {
      throw Injected("injected after step " + std::to_string(k));
    }
  };
  auto broken = [&](int k) { return k == fail_at && how == Failure::library; };
  tent::Scope scope;
  int k = 1;
  for (int i = 0; i < kRegions; i++, k++) {
    char *addr = broken(k) && i > 0 ? w.block(i - 1) + World::kBlock / 2 : w.block(i);
    scope.hold(w.engine.register_memory(addr, broken(k) && i == 0 ? 0 : World::kBlock));
    injected(k);
  }
  std::vector<tent::RegionDesc> descs;
  for (int i = 0; i < kBatch; i++) {
    descs.push_back({w.block(kRegions + i), World::kBlock, nullptr});
  }
  if (broken(k)) {
    descs.push_back({w.block(0), 16, nullptr});
  }
  scope.hold(w.engine.register_batch(descs));
  injected(k++);
  tent::Segment &peer = scope.hold(w.engine.open_segment(broken(k) ? "127.0.0.1:1" : w.peer_engine.name()));
  injected(k++);
  std::vector<tent::Request> reqs;
  for (int i = 0; i < kRegions + kBatch; i++) {
    uint64_t remote = tent::remote_address(w.remote.data()) + static_cast<uint64_t>(i) * World::kBlock;
    reqs.push_back(tent::write_to(peer, remote, w.block(i), World::kBlock));
  }
  if (broken(k)) {
    reqs.push_back(tent::write_to(peer, tent::remote_address(w.remote.data()), w.block(12), 16));
  }
  if (broken(k + 1)) {
    reqs.push_back(tent::write_to(peer, tent::remote_address(w.remote.data()) + w.remote.size() - 8, w.block(0), 16));
  }
  tent::Batch &batch = scope.hold(w.engine.submit(reqs, tent::TransferOptions().timeout(5s)));
  injected(k++);
  batch.wait().check();
  injected(k++);
  return scope;
}

// The exception the library raises when step k itself fails.
tent::Status library_failure(int k) {
  if (k == 1) {
    return tent::Status::invalid_argument;  // zero length
  }
  if (k <= kRegions + 1) {
    return tent::Status::overlap;
  }
  if (k == kRegions + 2) {
    return tent::Status::transport;  // connection refused
  }
  if (k == kRegions + 3) {
    return tent::Status::not_registered;  // a local range that is not registered
  }
  return tent::Status::out_of_range;  // the remote range runs past the peer's region
}

struct StepCase {
  int fail_at;
  Failure how;
  bool scoped;
};

std::string step_name(const ::testing::TestParamInfo<StepCase> &p) {
  return std::string(p.param.scoped ? "Scope" : "Composed") +
         (p.param.how == Failure::injected ? "_ThrowAfterStep" : "_LibraryFailsStep") +
         std::to_string(p.param.fail_at);
}

class EveryStep : public ::testing::TestWithParam<StepCase> {
 protected:
  void TearDown() override { EXPECT_EQ(live_process_handles(), 0u); }
};

TEST_P(EveryStep, ReleasesExactlyWhatWasDone) {
  const StepCase c = GetParam();
  World w;
  tent::Stats peer_before = w.peer_engine.stats();
  try {
    if (c.scoped) {
      tent::Scope s = setup_scoped(w, c.fail_at, c.how);
    } else {
      KvSetup s = setup_composed(w, c.fail_at, c.how);
    }
    ADD_FAILURE() << "the setup did not fail at step " << c.fail_at;
  } catch (const Injected &) {
    EXPECT_EQ(c.how, Failure::injected);
  } catch (const tent::Error &e) {
    EXPECT_EQ(c.how, Failure::library) << e.what();
    EXPECT_EQ(e.code(), library_failure(c.fail_at)) << e.what();
    EXPECT_FALSE(e.message().empty());
  }
  expect_clean(w.engine, "after the failed setup");
  tent::Stats peer_after = w.peer_engine.stats();
  EXPECT_EQ(peer_after.regions, peer_before.regions);
  EXPECT_EQ(peer_after.reservations, 0u);
  // Everything can be done again: nothing stays reserved.
  if (c.scoped) {
    tent::Scope s = setup_scoped(w, 0, Failure::injected);
    EXPECT_EQ(w.engine.stats().regions, static_cast<uint64_t>(kRegions + kBatch));
  } else {
    KvSetup s = setup_composed(w, 0, Failure::injected);
    EXPECT_EQ(w.engine.stats().regions, static_cast<uint64_t>(kRegions + kBatch));
  }
  expect_clean(w.engine, "after the successful setup was released");
}

std::vector<StepCase> all_steps() {
  std::vector<StepCase> v;
  for (bool scoped : {false, true}) {
    for (Failure how : {Failure::injected, Failure::library}) {
      for (int k = 1; k <= kSteps; k++) {
        v.push_back({k, how, scoped});
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Setup, EveryStep, ::testing::ValuesIn(all_steps()), step_name);

// ---- Batches: outcomes, failures as values ---------------------------------------------

TEST_F(Tent, FailedRequestsAreOutcomesNotExceptions) {
  tent::Engine peer_engine;
  std::vector<char> remote(4096);
  tent::Region rr = peer_engine.register_memory(remote.data(), remote.size(), tent::remote_read);
  tent::Engine e(tent::EngineOptions().transports("tcp"));
  std::vector<char> local(8192, 'x');
  tent::Region rl = e.register_memory(local.data(), local.size());
  tent::Segment peer = e.open_segment(peer_engine.name());
  uint64_t base = tent::remote_address(remote.data());

  // Past the end of the peer's region.
  tent::Outcome out = e.transfer({tent::read_from(peer, base + 4000, local.data(), 200)});
  EXPECT_FALSE(out);
  EXPECT_EQ(out.status, tent::Status::out_of_range);
  EXPECT_FALSE(out.message.empty());
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].status, tent::Status::out_of_range);
  expect_error<tent::Status::out_of_range>([&] { out.check(); }, "batch");

  // The peer registered the memory read-only: a WRITE is refused, the READ next to it succeeds.
  tent::Batch b = e.submit({tent::read_from(peer, base, local.data(), 100),
                            tent::write_to(peer, base, local.data() + 100, 100)});
  tent::Outcome both = b.wait();
  EXPECT_EQ(both.status, tent::Status::permission_denied) << both.message;
  EXPECT_EQ(both.requests.at(0).status, tent::Status::ok);
  EXPECT_EQ(both.requests.at(1).status, tent::Status::permission_denied);
  EXPECT_EQ(remote[0], 0);

  // Bad input fails the call: nothing submitted, an exception.
  expect_error<tent::Status::invalid_argument>([&] { (void)e.submit({tent::read_from(peer, base, local.data(), 0)}); },
                                               "tent_transfer");
  std::vector<char> unregistered(64);
  expect_error<tent::Status::not_registered>(
      [&] { (void)e.transfer({tent::read_from(peer, base, unregistered.data(), 64)}); }, "tent_transfer_sync");
  expect_error<tent::Status::invalid_argument>([&] { (void)e.submit(std::vector<tent::Request>{}); }, "tent_transfer");
  EXPECT_EQ(e.stats().batches, 1u);
}

// ---- Notifications ---------------------------------------------------------------------

TEST_F(Tent, Notifications) {
  tent::Engine a, b;
  tent::Segment to_b = a.open_segment(b.name());
  EXPECT_FALSE(b.notify_recv(0ms));  // nothing yet: nullopt, not an exception
  std::string big(5000, 'n');
  big[10] = '\0';  // bytes, not a C string
  a.notify_send(to_b, "hello");
  a.notify_send(to_b, big);
  std::optional<tent::Notification> n = b.notify_recv(5s);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->message, "hello");
  EXPECT_EQ(n->from, a.name());
  n = b.notify_recv(5s);  // larger than the first buffer: grown and retried
  ASSERT_TRUE(n);
  EXPECT_EQ(n->message, big);
  auto t0 = steady_clock::now();
  EXPECT_FALSE(b.notify_recv(50ms));
  EXPECT_GE(steady_clock::now() - t0, 40ms);
}

// ---- Stats JSON ------------------------------------------------------------------------

TEST_F(Tent, Transports) {
  tent::Engine e;
  std::vector<std::string> t = e.transports();
  EXPECT_NE(std::find(t.begin(), t.end(), "tcp"), t.end()) << e.stats_json();
  EXPECT_NE(std::find(t.begin(), t.end(), "local"), t.end()) << e.stats_json();
  EXPECT_TRUE(e.has_transport("tcp"));
  EXPECT_FALSE(e.has_transport("carrier-pigeon"));
  tent::Engine only_tcp(tent::EngineOptions().transports("tcp"));
  EXPECT_EQ(only_tcp.transports(), std::vector<std::string>{"tcp"});
  // The order asked for is the order requests try them; an uninstalled
  // transport leaves the list.
  tent::Engine two(tent::EngineOptions().transports("tcp,local"));
  EXPECT_EQ(two.transports(), (std::vector<std::string>{"tcp", "local"}));
  two.uninstall("local");
  EXPECT_EQ(two.transports(), std::vector<std::string>{"tcp"});
  two.uninstall_all();
  EXPECT_TRUE(two.transports().empty());
  EXPECT_NE(tent::topology_json().find("\"gpus\""), std::string::npos);
}

// ---- Concurrency: one registration wins -------------------------------------------------

TEST_F(Tent, ConcurrentOverlappingRegistrations) {
  tent::Engine e;
  std::vector<char> buf(1 << 20);
  for (int round = 0; round < 50; round++) {
    std::atomic<int> ok{0}, rejected{0}, other{0};
    std::vector<tent::Region> winners(4);
    std::vector<std::thread> ts;
    for (int i = 0; i < 4; i++) {
      ts.emplace_back([&, i] {
        try {
          winners[static_cast<size_t>(i)] = e.register_memory(buf.data() + i * 1024, 8192);
          ok++;
        } catch (const tent::OverlapError &) {
          rejected++;
        } catch (const tent::Error &) {
          other++;
        }
      });
    }
    for (std::thread &t : ts) {
      t.join();
    }
    EXPECT_EQ(ok.load(), 1);
    EXPECT_EQ(rejected.load(), 3);
    EXPECT_EQ(other.load(), 0);
    EXPECT_EQ(e.stats().regions, 1u);
  }
  expect_clean(e, "after the rounds");
}

// ---- Faults inside the library -------------------------------------------------------------

// The library turns a fault on a bad pointer into InvalidArgumentError (Go's
// SetPanicOnFault). Under AddressSanitizer this needs Go's SIGSEGV handler
// to run, not ASan's: see tests/cpp/README.md (allow_user_segv_handler).
TEST_F(Tent, BadPointerIsAnErrorNotACrash) {
  tent::Engine e;
  void *page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  std::vector<char> buf(64);
  tent_region *r = nullptr;
  EXPECT_EQ(tent_register(e.native(), buf.data(), buf.size(), static_cast<const char *>(page), tent::remote_rw, &r),
            TENT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tent_last_error()).find("invalid memory"), std::string::npos) << tent_last_error();
  // Through the C++ API: the descriptors point at an unreadable page.
  expect_error<tent::Status::invalid_argument>(
      [&] { (void)e.register_memory(buf.data(), buf.size(), tent::remote_rw, static_cast<const char *>(page)); },
      "tent_register");
  munmap(page, 4096);
  expect_clean(e, "after the faults");
}

// ---- Forked children ---------------------------------------------------------------------

TEST_F(Tent, ForkedChildGetsForkedError) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = 1;
    try {
      tent::Engine e;
    } catch (const tent::ForkedError &) {
      rc = 0;
    } catch (...) {
      rc = 2;
    }
    _exit(rc);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
}

// ---- Deadlines: a peer that accepts and never answers --------------------------------------

// A raw TCP server that accepts connections and never says a word.
class SilentServer {
 public:
  SilentServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
      throw std::runtime_error("silent server");
    }
    port_ = ntohs(a.sin_port);
  }
  ~SilentServer() { close(fd_); }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST_F(Tent, OpeningASilentPeerTimesOut) {
  SilentServer silent;
  tent::Engine e(tent::EngineOptions().timeout(500ms));
  auto t0 = steady_clock::now();
  try {
    (void)e.open_segment(silent.addr());
    ADD_FAILURE() << "opened a segment on a server that never answers";
  } catch (const tent::TimeoutError &err) {
    EXPECT_NE(err.message().find("handshake"), std::string::npos) << err.what();
  } catch (const tent::Error &err) {
    ADD_FAILURE() << err.what();
  }
  EXPECT_LT(steady_clock::now() - t0, 500ms + 2s);
  expect_clean(e, "after the timeout");
}

// ---- A Batch destroyed in flight --------------------------------------------------------------

// True when every thread of pid is stopped (state T in /proc/pid/task/*/stat).
bool all_threads_stopped(pid_t pid) {
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR *d = opendir(dir.c_str());
  if (d == nullptr) {
    return false;
  }
  bool stopped = true;
  while (dirent *ent = readdir(d)) {
    if (ent->d_name[0] == '.') {
      continue;
    }
    FILE *f = std::fopen((dir + "/" + ent->d_name + "/stat").c_str(), "r");
    if (f == nullptr) {
      continue;
    }
    char buf[512] = {0};
    size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    const char *paren = std::strrchr(buf, ')');  // "pid (comm) S ..."
    if (n == 0 || paren == nullptr || (paren[2] != 'T' && paren[2] != 't')) {
      stopped = false;
    }
  }
  closedir(d);
  return stopped;
}

struct TargetProcess {
  // SIGSTOP, and wait until the kernel has stopped every thread.
  void stop() {
    child.signal(SIGSTOP);
    auto until = steady_clock::now() + 5s;
    while (!all_threads_stopped(child.pid()) && steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_TRUE(all_threads_stopped(child.pid())) << "the target did not stop";
  }

  example::Child child;
  std::string segment;
  uint64_t addr = 0;
  size_t len = 0;
  explicit TargetProcess(size_t size, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {examples_dir() + "/target", "--size", std::to_string(size), "--idle-seconds",
                                     "20"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    child = example::Child(argv);
    std::map<std::string, std::string> kv = child.read_header(20s);
    segment = kv.at("segment");
    addr = example::parse_u64(kv.at("addr"));
    len = static_cast<size_t>(example::parse_u64(kv.at("len")));
  }
};

// A peer process with a secret: a wrong or missing secret is AuthError,
// the right one opens the segment and moves data.
TEST_F(Tent, AuthErrorForAWrongSecret) {
  TargetProcess target(4096, {"--secret", "right"});
  tent::Engine wrong(tent::EngineOptions().secret("wrong"));
  tent::Engine none;
  expect_error<tent::Status::auth>([&] { (void)wrong.open_segment(target.segment); }, "tent_segment_open");
  expect_error<tent::Status::auth>([&] { (void)none.open_segment(target.segment); }, "tent_segment_open");
  expect_clean(wrong, "after the refused handshake");
  tent::Engine right(tent::EngineOptions().secret(std::string("right")));
  std::vector<char> local(4096);
  tent::Region r = right.register_memory(local.data(), local.size());
  tent::Segment s = right.open_segment(target.segment);
  EXPECT_TRUE(right.transfer({tent::read_from(s, target.addr, local.data(), local.size())}).ok());
}

// The target process is stopped (SIGSTOP) with a READ of its buffer in
// flight over established TCP connections. ~Batch must cancel and return
// well within the deadline + grace, the engine's counts go back to their
// baseline, and the library never writes into the local buffer afterwards.
TEST_F(Tent, BatchDestroyedInFlight) {
  TargetProcess target(4u << 20);
  tent::Engine e(tent::EngineOptions().transports("tcp"));
  std::vector<char> local(target.len);
  tent::Region region = e.register_memory(local.data(), local.size());
  tent::Segment peer = e.open_segment(target.segment);
  // Warm up: the data connections are established and work.
  ASSERT_TRUE(e.transfer({tent::read_from(peer, target.addr, local.data(), target.len)}).checked().ok());
  tent::Stats baseline = e.stats();

  target.stop();
  const auto deadline = 3s;
  std::optional<tent::Batch> batch;
  batch.emplace(e.submit({tent::read_from(peer, target.addr, local.data(), target.len)},
                         tent::TransferOptions().timeout(deadline)));
  EXPECT_FALSE(batch->poll()) << "a READ from a stopped process finished";
  std::optional<tent::Outcome> early = batch->wait(100ms);
  EXPECT_FALSE(early) << "a READ from a stopped process finished: " << tent::status_name(early->status) << " "
                      << early->message;
  EXPECT_EQ(e.stats().batches, baseline.batches + 1);

  auto t0 = steady_clock::now();
  batch.reset();  // ~Batch: tent_batch_destroy cancels and waits
  auto took = steady_clock::now() - t0;
  EXPECT_LT(took, deadline + 2s + 1s) << "~Batch took longer than the deadline plus the grace period";
  std::printf("    ~Batch returned after %.1f ms (deadline %lld ms)\n",
              std::chrono::duration<double, std::milli>(took).count(),
              static_cast<long long>(std::chrono::milliseconds(deadline).count()));
  tent::Stats after = e.stats();
  EXPECT_EQ(after.batches, baseline.batches);
  EXPECT_EQ(after.requests_in_flight, 0u);

  // Nothing pins the region any more, and nothing writes into the buffer
  // once the target runs again and answers the canceled READ.
  region.unregister();
  std::memset(local.data(), 0xAB, local.size());
  target.child.signal(SIGCONT);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(std::all_of(local.begin(), local.end(), [](char c) { return c == static_cast<char>(0xAB); }))
      << "the library wrote into the buffer after ~Batch returned";
  peer.reset();
  expect_clean(e, "after the canceled batch");
  e.reset();
}

// The engine is destroyed while a batch is in flight (wrong order): the
// batch fails with ClosedError or CanceledError, and its destructor is harmless.
TEST_F(Tent, EngineDestroyedUnderABatch) {
  TargetProcess target(1u << 20);
  tent::Engine e(tent::EngineOptions().transports("tcp"));
  std::vector<char> local(target.len);
  tent::Region region = e.register_memory(local.data(), local.size());
  tent::Segment peer = e.open_segment(target.segment);
  ASSERT_TRUE(e.transfer({tent::read_from(peer, target.addr, local.data(), target.len)}).ok());
  target.stop();
  tent::Batch b = e.submit({tent::read_from(peer, target.addr, local.data(), target.len)},
                           tent::TransferOptions().timeout(3s));
  auto t0 = steady_clock::now();
  e.reset();
  EXPECT_LT(steady_clock::now() - t0, 6s);
  // Its handle died with the engine.
  expect_error<tent::Status::invalid_handle>([&] { (void)b.poll(); }, "tent_batch_status");
  target.child.signal(SIGCONT);
}

// ---- The two-process example ------------------------------------------------------------------

std::string run_to_end(example::Child &c, int *rc) {
  std::string out;
  auto deadline = steady_clock::now() + 60s;
  while (steady_clock::now() < deadline) {
    std::optional<std::string> line = c.read_line(1s);
    if (!line) {
      std::optional<int> st = c.wait(0ms);
      if (st) {
        while (std::optional<std::string> rest = c.read_line(100ms)) {
          out += *rest + "\n";
        }
        *rc = WIFEXITED(*st) ? WEXITSTATUS(*st) : 128 + WTERMSIG(*st);
        return out;
      }
      continue;
    }
    out += *line + "\n";
  }
  *rc = c.finish(0ms);
  return out;
}

TEST_F(Tent, TwoProcessExampleSpawnsItsTarget) {
  example::Child initiator({examples_dir() + "/initiator"});
  int rc = -1;
  std::string out = run_to_end(initiator, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("tcp  ok"), std::string::npos) << out;
  EXPECT_NE(out.find("target: verified tcp ok"), std::string::npos) << out;
  EXPECT_NE(out.find("initiator: PASS"), std::string::npos) << out;
  std::printf("%s", out.c_str());
}

TEST_F(Tent, TwoProcessExampleWithArguments) {
  TargetProcess target(1u << 20);
  example::Child initiator({examples_dir() + "/initiator", target.segment, example::hex(target.addr),
                            std::to_string(target.len)});
  int rc = -1;
  std::string out = run_to_end(initiator, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("tcp  ok"), std::string::npos) << out;
  EXPECT_EQ(target.child.finish(10s), 0) << "the target did not verify and quit";
}

}  // namespace
