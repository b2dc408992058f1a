// header_check.cc — include/tent.hpp compiles cleanly as C++17 and as C++20
// with -Wall -Wextra -Werror -pedantic (plus -Wshadow -Wconversion
// -Wsign-conversion -Wold-style-cast -Wnon-virtual-dtor: users compile the
// header with their own flags), every owner has the promised shape, and
// every inline function is instantiated once (so a template that does not
// compile fails here, not in a user's build). tent.h itself is checked as
// C11 and C++17 by tests/c/header_check.c; the Makefile also builds that
// file as C++20.
#include "tent.hpp"

#include <cstdio>
#include <type_traits>

namespace {

template <class T>
constexpr bool is_owner() {
  return std::is_nothrow_destructible<T>::value && std::is_nothrow_move_constructible<T>::value &&
         std::is_nothrow_move_assignable<T>::value && !std::is_copy_constructible<T>::value &&
         !std::is_copy_assignable<T>::value;
}

static_assert(is_owner<tent::Engine>(), "Engine is a move-only owner");
static_assert(is_owner<tent::Region>(), "Region is a move-only owner");
static_assert(is_owner<tent::RegionBatch>(), "RegionBatch is a move-only owner");
static_assert(is_owner<tent::Allocation>(), "Allocation is a move-only owner");
static_assert(is_owner<tent::Segment>(), "Segment is a move-only owner");
static_assert(is_owner<tent::Batch>(), "Batch is a move-only owner");
static_assert(is_owner<tent::Scope>(), "Scope is a move-only owner");
static_assert(std::is_nothrow_destructible<tent::Guard<void (*)()>>::value, "Guard's destructor is noexcept");
static_assert(!std::is_copy_constructible<tent::Guard<void (*)()>>::value, "Guard is not copyable");
// Owners have no default-constructed engine hidden inside: empty is cheap.
static_assert(std::is_nothrow_default_constructible<tent::Region>::value, "empty Region");
static_assert(std::is_nothrow_default_constructible<tent::Batch>::value, "empty Batch");

static_assert(std::is_base_of<std::runtime_error, tent::Error>::value, "Error is a std::runtime_error");
static_assert(std::is_base_of<tent::Error, tent::OverlapError>::value, "per-code classes derive from Error");
static_assert(std::is_same<tent::OverlapError, tent::ErrorOf<tent::Status::overlap>>::value, "aliases");
static_assert(static_cast<tent_status>(tent::Status::ok) == TENT_OK, "ok");
static_assert(static_cast<tent_status>(tent::Status::pending) == TENT_PENDING, "pending");
static_assert(static_cast<tent_status>(tent::Status::version_mismatch) == TENT_ERR_VERSION_MISMATCH, "codes");
static_assert(tent::status_name(tent::Status::overlap)[9] == 'O', "status_name is constexpr");
static_assert(tent::header_version().major == TENT_VERSION_MAJOR, "header_version");

// Every function of the header, instantiated (never called).
[[maybe_unused]] void instantiate_everything(tent::Engine &e, void *p, size_t n) {
  tent::Region r = e.register_memory(p, n);
  tent::RegionBatch rb = e.register_batch({{p, n, nullptr}}, tent::remote_read);
  tent::Allocation a = e.alloc(n, "cpu", tent::remote_write);
  tent::Segment s = e.open_segment(e.name());
  tent::Batch b = e.submit({tent::read_from(s, tent::remote_address(p), a.data(), n)},
                           tent::TransferOptions().timeout(std::chrono::seconds(1)).transport("tcp").notify("x"));
  tent::Outcome o = e.transfer({tent::write_to(s, 0, a.as<const char>(), n)});
  o.check();
  std::optional<tent::Outcome> po = b.poll();
  po = b.wait(std::chrono::milliseconds(5));
  o = b.wait();
  std::printf("%s %s %llu %d %zu %zu %s %s\n", tent::to_string(o.status), tent::to_string(tent::Transport::tcp),
              static_cast<unsigned long long>(o.bytes()), static_cast<int>(o.requests.at(0).retried()),
              r.size() + rb.size(), a.size(), s.name().c_str(), e.stats_json().c_str());
  (void)r.info();
  (void)a.info();
  (void)e.stats();
  (void)e.has_transport("shm");
  (void)tent::topology_json();
  e.notify_send(s, "hello");
  std::optional<tent::Notification> nt = e.notify_recv(std::chrono::milliseconds(0));
  e.uninstall("tcp");
  e.uninstall_all();
  tent::Scope scope;
  tent::Region &held = scope.hold(std::move(r));
  scope.defer([&held]() noexcept { (void)held; });
  tent::Guard g([]() noexcept {});
  g.commit();
  b.destroy();
  r.unregister();
  rb.unregister();
  a.free();
  (void)s.release();
  tent::Engine adopted = tent::Engine::adopt(e.release());
  adopted.destroy();
  tent::Engine created = tent::Engine::create(tent::EngineOptions()
                                                  .name("n")
                                                  .listen_addr("127.0.0.1:0")
                                                  .metadata("p2p")
                                                  .metadata_prefix("/tent")
                                                  .transports("tcp")
                                                  .secret("s")
                                                  .timeout(std::chrono::seconds(1))
                                                  .unregister_timeout(std::chrono::seconds(1))
                                                  .tcp_streams(2));
  created.reset();
}

}  // namespace

int main() {
  int failed = 0;
  tent::check_version();
  try {
    tent::check_version(TENT_ABI_VERSION + 1);
    failed++;
  } catch (const tent::VersionMismatchError &) {
  }
  tent::Version v = tent::library_version();
  if (v.major != TENT_VERSION_MAJOR || v.minor != TENT_VERSION_MINOR) {
    failed++;
  }
  std::printf("header_check (tent.hpp, C++%ld): %d failed\n", (__cplusplus / 100) % 100, failed);
  return failed != 0;
}
