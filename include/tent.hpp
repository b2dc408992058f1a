/*
 * tent.hpp — header-only C++17 RAII helpers over tent.h (libtent.so).
 *
 *   #include "tent.hpp"          // includes tent.h; link with -ltent
 *
 *   tent::Engine engine(tent::EngineOptions().transports("tcp"));
 *   tent::Region region = engine.register_memory(buf, len);         // RW by default
 *   tent::Segment peer = engine.open_segment("127.0.0.1:4711");
 *   tent::Outcome out = engine.transfer({tent::write_to(peer, remote, buf, len)});
 *   out.check();                                                    // throws on failure
 *
 * Everything is in namespace tent; everything is inline; nothing here keeps
 * global state. The C header (tent.h) stays the contract: every class is a
 * thin owner of one C handle, and native()/release() hand the handle out.
 *
 * Ownership
 * ---------
 * Engine, Region, RegionBatch, Allocation, Segment and Batch are move-only
 * owners of one library handle (RegionBatch: of N). Their destructors are
 * noexcept and release the handle with its one C release call
 * (tent_engine_destroy, tent_unregister, tent_unregister_batch, tent_free,
 * tent_segment_close, tent_batch_destroy). A moved-from owner is empty
 * (operator bool is false, native() is nullptr) and its destructor does
 * nothing; move-assignment releases what the target held first. release()
 * gives the handle up without releasing it (the caller now owns it);
 * reset() releases it now. Where releasing can fail in a way the caller may
 * want to see (tent_unregister returning BUSY, tent_batch_destroy returning
 * TIMEOUT), an explicit throwing call exists: Region::unregister(),
 * RegionBatch::unregister(), Allocation::free(), Batch::destroy(),
 * Engine::destroy(); destructors swallow the status (the engine still
 * releases everything when it is destroyed).
 *
 * Children (regions, segments, batches) keep the engine's native handle,
 * not a reference to the Engine object. Destroy them before the engine.
 * If the engine goes first, their destructors are harmless: the engine
 * already released them, and the library reports the stale handle as
 * TENT_ERR_INVALID_HANDLE (handles are never reused), which is ignored.
 *
 * Release on failure (the registration guard)
 * -------------------------------------------
 * A multi-step setup holds every step in an owner, so an exception or an
 * early return half-way releases exactly what was done, in reverse order:
 *
 *   struct Transfer {          // members are destroyed in reverse order:
 *     tent::RegionBatch regions;     //   3. regions unregistered
 *     tent::Segment peer;            //   2. segment closed
 *     tent::Batch batch;             //   1. batch canceled and waited for
 *   };
 *   Transfer start(tent::Engine& e, ...) {
 *     auto regions = e.register_batch(descs);   // all-or-nothing
 *     auto peer = e.open_segment(name);         // throws -> regions released
 *     auto batch = e.submit(reqs);              // throws -> peer, regions released
 *     return {std::move(regions), std::move(peer), std::move(batch)};  // commit
 *   }
 *
 * tent::Scope does the same for a number of steps known only at run time
 * (a LIFO of owners and cleanup actions; move the Scope out to hand
 * everything on), and tent::Guard undoes one non-tent step unless
 * commit() is reached. Declare owners in the order they were acquired:
 * a Batch must go before the regions its requests use, or unregistering
 * them waits for the batch (up to the engine's unregister timeout).
 *
 * Errors and expected outcomes
 * ----------------------------
 * A failed call throws tent::Error (a std::runtime_error) carrying code()
 * (tent::Status), status() (the raw tent_status), message() (the library's
 * tent_last_error(), captured at throw time) and context() (the C function).
 * Each code has its own class, generated from tent.h: catch
 * tent::OverlapError, tent::NotFoundError, ... (tent::ErrorOf<Status::X>).
 * Expected outcomes are values, not exceptions:
 *   - Batch::poll() and Batch::wait(timeout) return std::optional<Outcome>:
 *     std::nullopt while requests are still running (the wait timed out);
 *   - an Outcome whose requests failed (remote range, permission,
 *     transport, deadline) is returned, not thrown: per-request statuses are
 *     data. Outcome::check() throws the first failure's Error if you want it.
 *   - Engine::notify_recv(timeout) returns std::nullopt when no message came.
 * Throwing is reserved for calls that did not do what was asked: bad input,
 * stale handles, an overlap, a segment that cannot be opened, ...
 *
 * A Batch destroyed while in flight
 * ---------------------------------
 * ~Batch() calls tent_batch_destroy, which cancels the requests still
 * running and waits until no transport holds them — bounded by the batch
 * deadline plus a grace period (2 s). After it returns the library never
 * reads or writes the local memory of those requests, so the buffers (and
 * the regions) may be released next, even if the peer never answers.
 *
 * Thread safety
 * -------------
 * The library is thread-safe; so are calls on a const or non-const owner
 * from several threads, as long as no thread moves, resets or destroys the
 * owner at the same time (the owners themselves are not synchronized).
 *
 * Versions
 * --------
 * Constructing an Engine first checks tent_abi_version() against the
 * TENT_ABI_VERSION this header was compiled with and throws
 * VersionMismatchError on a mismatch (tent::check_version()).
 * In a process forked after libtent was loaded, every call throws
 * ForkedError.
 */
#ifndef TENT_HPP
#define TENT_HPP

#include "tent.h"

#if !defined(__cplusplus) || (__cplusplus < 201703L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 201703L))
#error "tent.hpp needs C++17 or later"
#endif

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace tent {

// ---- Status codes -----------------------------------------------------------

// The list below is generated from tent.h (tests/cpp/gen_status.sh; `make
// test-cpp` checks that it is current).
// BEGIN GENERATED by tests/cpp/gen_status.sh from tent.h -- do not edit
#define TENT_HPP_ERROR_CODES(X) \
  X(invalid_argument, TENT_ERR_INVALID_ARGUMENT, InvalidArgumentError) \
  X(invalid_handle, TENT_ERR_INVALID_HANDLE, InvalidHandleError) \
  X(overlap, TENT_ERR_OVERLAP, OverlapError) \
  X(already_registered, TENT_ERR_ALREADY_REGISTERED, AlreadyRegisteredError) \
  X(not_registered, TENT_ERR_NOT_REGISTERED, NotRegisteredError) \
  X(busy, TENT_ERR_BUSY, BusyError) \
  X(out_of_range, TENT_ERR_OUT_OF_RANGE, OutOfRangeError) \
  X(permission_denied, TENT_ERR_PERMISSION_DENIED, PermissionDeniedError) \
  X(not_found, TENT_ERR_NOT_FOUND, NotFoundError) \
  X(unsupported, TENT_ERR_UNSUPPORTED, UnsupportedError) \
  X(transport, TENT_ERR_TRANSPORT, TransportError) \
  X(timeout, TENT_ERR_TIMEOUT, TimeoutError) \
  X(closed, TENT_ERR_CLOSED, ClosedError) \
  X(no_memory, TENT_ERR_NO_MEMORY, NoMemoryError) \
  X(internal, TENT_ERR_INTERNAL, InternalError) \
  X(forked, TENT_ERR_FORKED, ForkedError) \
  X(auth, TENT_ERR_AUTH, AuthError) \
  X(protocol, TENT_ERR_PROTOCOL, ProtocolError) \
  X(buffer_too_small, TENT_ERR_BUFFER_TOO_SMALL, BufferTooSmallError) \
  X(canceled, TENT_ERR_CANCELED, CanceledError) \
  X(name_in_use, TENT_ERR_NAME_IN_USE, NameInUseError) \
  X(version_mismatch, TENT_ERR_VERSION_MISMATCH, VersionMismatchError) \
  /* end of TENT_HPP_ERROR_CODES */
// END GENERATED

// A tent_status as an enum: ok, pending, and one enumerator per TENT_ERR_*.
enum class Status : tent_status {
  ok = TENT_OK,
  pending = TENT_PENDING,
#define TENT_HPP_ENUMERATOR(name, macro, cls) name = (macro),
  TENT_HPP_ERROR_CODES(TENT_HPP_ENUMERATOR)
#undef TENT_HPP_ENUMERATOR
};

// The C macro's name ("TENT_ERR_OVERLAP"), or "TENT_OK", "TENT_PENDING",
// or nullptr for a value tent.h does not define.
constexpr const char *status_name(Status s) noexcept {
  switch (s) {
    case Status::ok:
      return "TENT_OK";
    case Status::pending:
      return "TENT_PENDING";
#define TENT_HPP_NAME_CASE(name, macro, cls) \
  case Status::name:                         \
    return #macro;
      TENT_HPP_ERROR_CODES(TENT_HPP_NAME_CASE)
#undef TENT_HPP_NAME_CASE
  }
  return nullptr;
}

// The library's fixed description (tent_status_str).
inline const char *to_string(Status s) noexcept {
  return tent_status_str(static_cast<tent_status>(s));
}

// ---- Errors -----------------------------------------------------------------

// Every failure of a tent call. what() is
// "<context>: <TENT_ERR_NAME> (<description>): <library message>".
class Error : public std::runtime_error {
 public:
  Error(Status code, std::string message, std::string context = std::string())
      : std::runtime_error(format(code, message, context)),
        code_(code),
        message_(std::move(message)),
        context_(std::move(context)) {}

  // The status as an enum (compare with Status::overlap, ...).
  Status code() const noexcept { return code_; }
  // The raw tent_status (negative).
  tent_status status() const noexcept { return static_cast<tent_status>(code_); }
  // tent_last_error() at the time of the failure ("" if the library gave none).
  const std::string &message() const noexcept { return message_; }
  // The C function that failed ("tent_register"), or what the wrapper checked.
  const std::string &context() const noexcept { return context_; }

 private:
  static std::string format(Status code, const std::string &message, const std::string &context) {
    std::string s = context.empty() ? std::string() : context + ": ";
    const char *name = status_name(code);
    s += name != nullptr ? name : "TENT_ERR_" + std::to_string(static_cast<tent_status>(code));
    s += " (";
    s += to_string(code);
    s += ")";
    if (!message.empty()) {
      s += ": ";
      s += message;
    }
    return s;
  }

  Status code_;
  std::string message_;
  std::string context_;
};

// One class per code: catch (const tent::ErrorOf<tent::Status::overlap> &)
// or, the same, catch (const tent::OverlapError &).
template <Status S>
class ErrorOf final : public Error {
 public:
  static constexpr Status value = S;
  explicit ErrorOf(std::string message, std::string context = std::string())
      : Error(S, std::move(message), std::move(context)) {}
};

#define TENT_HPP_ERROR_ALIAS(name, macro, cls) using cls = ErrorOf<Status::name>;
TENT_HPP_ERROR_CODES(TENT_HPP_ERROR_ALIAS)
#undef TENT_HPP_ERROR_ALIAS

// Throws the Error subclass for `status` (which must be negative) with the
// given message. Unknown codes throw a plain tent::Error.
[[noreturn]] inline void throw_error(tent_status status, std::string message,
                                     std::string context = std::string()) {
  switch (status) {
#define TENT_HPP_THROW_CASE(name, macro, cls) \
  case macro:                                 \
    throw cls(std::move(message), std::move(context));
    TENT_HPP_ERROR_CODES(TENT_HPP_THROW_CASE)
#undef TENT_HPP_THROW_CASE
    default:
      throw Error(static_cast<Status>(status), std::move(message), std::move(context));
  }
}

namespace detail {

// Call right after the C call, before any other tent call on this thread:
// tent_last_error() explains the most recent failure only.
inline tent_status check(tent_status st, const char *context) {
  if (st < 0) {
    throw_error(st, tent_last_error(), context);
  }
  return st;
}

// A timeout in milliseconds for the C API: negative stays -1 ("default").
inline int64_t to_ms(std::chrono::milliseconds t) noexcept {
  return t.count() < 0 ? -1 : static_cast<int64_t>(t.count());
}

// Calls fill(buf, cap, &len) with a growing std::string until it fits.
template <class Fill>
std::string read_string(Fill fill, const char *context, size_t initial = 256) {
  std::string buf(initial, '\0');
  for (int tries = 0;; tries++) {
    size_t len = 0;
    tent_status st = fill(&buf[0], buf.size(), &len);
    if (st == TENT_ERR_BUFFER_TOO_SMALL && tries < 8) {
      buf.assign(len + 1 > buf.size() * 2 ? len + 1 : buf.size() * 2, '\0');
      continue;
    }
    check(st, context);
    buf.resize(len);
    return buf;
  }
}

}  // namespace detail

// ---- Versions ---------------------------------------------------------------

struct Version {
  uint32_t major, minor, patch;
};

// The library's version (tent_version()).
inline Version library_version() noexcept {
  uint32_t v = tent_version();
  return Version{v >> 16, (v >> 8) & 0xffu, v & 0xffu};
}

// The version this header belongs to.
constexpr Version header_version() noexcept {
  return Version{TENT_VERSION_MAJOR, TENT_VERSION_MINOR, TENT_VERSION_PATCH};
}

// Throws VersionMismatchError unless library_abi (by default the loaded
// library's tent_abi_version()) is the TENT_ABI_VERSION of this header.
// Engine's constructor calls it.
inline void check_version(uint32_t library_abi = tent_abi_version()) {
  if (library_abi != TENT_ABI_VERSION) {
    throw VersionMismatchError("libtent.so " + std::string(tent_version_string()) + " has ABI " +
                                   std::to_string(library_abi) + ", but tent.hpp was compiled against ABI " +
                                   std::to_string(TENT_ABI_VERSION) + " (tent.h " +
                                   std::to_string(TENT_VERSION_MAJOR) + "." +
                                   std::to_string(TENT_VERSION_MINOR) + "." +
                                   std::to_string(TENT_VERSION_PATCH) + ")",
                               "tent_abi_version");
  }
}

// ---- Logging ----------------------------------------------------------------

// Log levels (TENT_LOG_*), least severe first.
enum class LogLevel : int {
  debug = TENT_LOG_DEBUG,
  info = TENT_LOG_INFO,
  warn = TENT_LOG_WARN,
  error = TENT_LOG_ERROR,
  off = TENT_LOG_OFF,
};

// Sets the process-wide level (tent_log_set_level).
inline void set_log_level(LogLevel level) {
  detail::check(tent_log_set_level(static_cast<int>(level)), "tent_log_set_level");
}

// The process-wide level (tent_log_get_level).
inline LogLevel log_level() noexcept { return static_cast<LogLevel>(tent_log_get_level()); }

// Receives one log line: a TENT_LOG_* level and the line, which is valid
// only during the call (copy it to keep it).
using LogSink = std::function<void(int level, std::string_view line)>;

namespace detail {

struct LogSinkSlot {
  std::mutex mu;                 // one set_log_sink at a time
  std::unique_ptr<LogSink> sink;  // what the library calls, until replaced
};

// Never destroyed: library threads may still log during static destruction.
inline LogSinkSlot &log_sink_slot() {
  static LogSinkSlot *slot = new LogSinkSlot;
  return *slot;
}

// Set while this thread runs a sink.
inline bool &in_log_sink() {
  thread_local bool inside = false;
  return inside;
}

inline void log_trampoline(int level, const char *msg, void *user) noexcept {
  in_log_sink() = true;
  try {
    (*static_cast<LogSink *>(user))(level, std::string_view(msg));
  } catch (...) {
    // An exception must never unwind into the library.
  }
  in_log_sink() = false;
}

}  // namespace detail

// Sends the library's log lines to sink (tent_log_set_callback); an empty
// sink restores stderr (or TENT_LOG_FILE). The sink is called on whichever
// thread logs, one line at a time, and must not call tent: there every tent
// call, set_log_sink included, throws BusyError. Exceptions it throws are
// swallowed. When set_log_sink returns, the previous sink is not running
// and is destroyed.
inline void set_log_sink(LogSink sink) {
  if (detail::in_log_sink()) {
    throw BusyError("set_log_sink called from inside a log sink", "tent_log_set_callback");
  }
  detail::LogSinkSlot &slot = detail::log_sink_slot();
  std::lock_guard<std::mutex> lock(slot.mu);
  std::unique_ptr<LogSink> next = sink ? std::make_unique<LogSink>(std::move(sink)) : nullptr;
  detail::check(tent_log_set_callback(next ? &detail::log_trampoline : nullptr, next.get()),
                "tent_log_set_callback");
  slot.sink = std::move(next);  // the library never calls the old one again
}

// ---- Small types ------------------------------------------------------------

// Registration flags: what remote peers may do with the memory.
inline constexpr uint32_t remote_read = TENT_REMOTE_READ;
inline constexpr uint32_t remote_write = TENT_REMOTE_WRITE;
inline constexpr uint32_t remote_rw = TENT_REMOTE_READ | TENT_REMOTE_WRITE;

enum class Transport : uint32_t {
  none = TENT_TRANSPORT_NONE,
  local = TENT_TRANSPORT_LOCAL,
  shm = TENT_TRANSPORT_SHM,
  tcp = TENT_TRANSPORT_TCP,
  cuda = TENT_TRANSPORT_CUDA,
  rdma = TENT_TRANSPORT_RDMA,
};

// "none", "local", "shm", "tcp", "cuda", "rdma" or "unknown" (tent_transport_name).
inline const char *to_string(Transport t) noexcept {
  return tent_transport_name(static_cast<uint32_t>(t));
}

using Stats = tent_stats;           // tent_engine_stats: counts for leak checks
using RegionInfo = tent_region_info;
using RegionDesc = tent_region_desc;  // {addr, len, location (NULL = detect)}
using Request = tent_request;         // build with read_from / write_to

// What happened to one request of a batch.
struct RequestStatus {
  Status status = Status::pending;  // pending, ok or the request's error
  Transport transport = Transport::none;  // the transport that served (or last tried) it
  uint64_t bytes = 0;               // bytes transferred
  uint32_t flags = 0;               // TENT_STATUS_*
  uint16_t nic = 0;                 // with has_nic(): the first local NIC that carried it
  uint16_t nics = 0;                // with has_nic(): how many local NICs carried it

  bool ok() const noexcept { return status == Status::ok; }
  bool retried() const noexcept { return (flags & TENT_STATUS_RETRIED) != 0; }
  bool staged() const noexcept { return (flags & TENT_STATUS_STAGED) != 0; }
  bool has_nic() const noexcept { return (flags & TENT_STATUS_NIC) != 0; }
};

// A finished batch: every request has its final status.
struct Outcome {
  Status status = Status::ok;          // ok, or the first failed request's code
  std::string message;                 // the library's message for that failure
  std::vector<RequestStatus> requests; // one per request, in submission order

  bool ok() const noexcept { return status == Status::ok; }
  explicit operator bool() const noexcept { return ok(); }

  // Throws the Error for the first failure (context "batch"); no-op if ok.
  void check() const {
    if (!ok()) {
      throw_error(static_cast<tent_status>(status), message, "batch");
    }
  }
  const Outcome &checked() const & {
    check();
    return *this;
  }
  Outcome checked() && {
    check();
    return std::move(*this);
  }

  uint64_t bytes() const noexcept {
    uint64_t n = 0;
    for (const RequestStatus &r : requests) {
      n += r.bytes;
    }
    return n;
  }
};

// A notification received from a peer.
struct Notification {
  std::string message;  // the bytes sent (may contain NULs)
  std::string from;     // the sender's segment name
};

// ---- Options ----------------------------------------------------------------

// A builder over tent_engine_options; unset fields keep the library's
// defaults. native() points into this object: keep it alive while the
// returned struct is used. (Plain strings with "set" flags rather than
// std::optional<std::string>: GCC 12 reports a false -Wmaybe-uninitialized
// for the latter under -fsanitize, which would break users' -Werror builds.)
class EngineOptions {
 public:
  EngineOptions &name(std::string v) { return set(kName, std::move(v)); }
  EngineOptions &listen_addr(std::string v) { return set(kListenAddr, std::move(v)); }
  EngineOptions &metadata(std::string v) { return set(kMetadata, std::move(v)); }
  EngineOptions &metadata_prefix(std::string v) { return set(kMetadataPrefix, std::move(v)); }
  // Comma-separated, in preference order ("local,shm,tcp").
  EngineOptions &transports(std::string v) { return set(kTransports, std::move(v)); }
  EngineOptions &secret(std::string_view bytes) { return set(kSecret, std::string(bytes)); }
  EngineOptions &timeout(std::chrono::milliseconds t) {
    timeout_ms_ = static_cast<uint64_t>(t.count() < 0 ? 0 : t.count());
    return *this;
  }
  EngineOptions &unregister_timeout(std::chrono::milliseconds t) {
    unregister_timeout_ms_ = static_cast<uint64_t>(t.count() < 0 ? 0 : t.count());
    return *this;
  }
  EngineOptions &tcp_streams(uint32_t n) {
    tcp_streams_ = n;
    return *this;
  }

  tent_engine_options native() const noexcept {
    tent_engine_options o;
    std::memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.name = get(kName);
    o.listen_addr = get(kListenAddr);
    o.metadata = get(kMetadata);
    o.metadata_prefix = get(kMetadataPrefix);
    o.transports = get(kTransports);
    if (get(kSecret) != nullptr) {
      o.secret = str_[kSecret].data();
      o.secret_len = str_[kSecret].size();
    }
    o.timeout_ms = timeout_ms_;
    o.unregister_timeout_ms = unregister_timeout_ms_;
    o.tcp_streams = tcp_streams_;
    return o;
  }

 private:
  enum Field { kName, kListenAddr, kMetadata, kMetadataPrefix, kTransports, kSecret, kFields };
  EngineOptions &set(Field f, std::string v) {
    str_[f] = std::move(v);
    set_ |= 1u << f;
    return *this;
  }
  const char *get(Field f) const noexcept { return (set_ & (1u << f)) != 0 ? str_[f].c_str() : nullptr; }

  std::string str_[kFields];
  uint32_t set_ = 0;
  uint64_t timeout_ms_ = 0, unregister_timeout_ms_ = 0;
  uint32_t tcp_streams_ = 0;
};

// A builder over tent_transfer_options (same lifetime rule as EngineOptions).
class TransferOptions {
 public:
  // The batch deadline; 0 = the engine's default.
  TransferOptions &timeout(std::chrono::milliseconds t) {
    timeout_ms_ = static_cast<uint64_t>(t.count() < 0 ? 0 : t.count());
    return *this;
  }
  // Delivered to each target segment after all of the batch's data arrived.
  TransferOptions &notify(std::string_view msg) {
    notify_ = std::string(msg);
    has_notify_ = true;
    return *this;
  }
  // "local", "shm", "tcp", "cuda"; unset = automatic. A transport that is
  // not installed fails the submission with NotFoundError.
  TransferOptions &transport(std::string name) {
    transport_ = std::move(name);
    has_transport_ = true;
    return *this;
  }

  tent_transfer_options native() const noexcept {
    tent_transfer_options o;
    std::memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.timeout_ms = timeout_ms_;
    if (has_notify_) {
      o.notify = notify_.data();
      o.notify_len = notify_.size();
    }
    o.transport = has_transport_ ? transport_.c_str() : nullptr;
    return o;
  }

 private:
  uint64_t timeout_ms_ = 0;
  std::string notify_, transport_;
  bool has_notify_ = false, has_transport_ = false;
};

// ---- Deleters (each calls the one C release of its handle) ------------------

namespace detail {

struct EngineDeleter {
  void operator()(tent_engine *e) const noexcept { (void)tent_engine_destroy(e); }
};
// RegionDeleter and FreeDeleter also name their C call (close, close_name)
// for OwnedRegion's throwing release.
struct RegionDeleter {
  static constexpr const char *close_name = "tent_unregister";
  static tent_status close(tent_engine *e, tent_region *r) noexcept { return tent_unregister(e, r); }
  tent_engine *engine = nullptr;
  void operator()(tent_region *r) const noexcept { (void)close(engine, r); }
};
struct FreeDeleter {
  static constexpr const char *close_name = "tent_free";
  static tent_status close(tent_engine *e, tent_region *r) noexcept { return tent_free(e, r); }
  tent_engine *engine = nullptr;
  void operator()(tent_region *r) const noexcept { (void)close(engine, r); }
};
struct SegmentDeleter {
  tent_engine *engine = nullptr;
  void operator()(tent_segment *s) const noexcept { (void)tent_segment_close(engine, s); }
};
struct BatchDeleter {
  void operator()(tent_batch *b) const noexcept { (void)tent_batch_destroy(b); }
};

// What Region and Allocation share: a tent_region handle owned with Deleter
// (tent_unregister or tent_free) and the range of memory it covers. They
// inherit it privately and publish its members with using-declarations.
template <class Deleter>
class OwnedRegion {
 public:
  OwnedRegion() noexcept = default;  // empty
  OwnedRegion(OwnedRegion &&o) noexcept
      : h_(std::move(o.h_)), addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  OwnedRegion &operator=(OwnedRegion &&o) noexcept {  // releases what this held
    if (this != &o) {
      h_ = std::move(o.h_);
      addr_ = std::exchange(o.addr_, nullptr);
      len_ = std::exchange(o.len_, 0);
    }
    return *this;
  }
  ~OwnedRegion() = default;

  void *addr() const noexcept { return addr_; }
  size_t size() const noexcept { return len_; }
  tent_region *native() const noexcept { return h_.get(); }
  tent_engine *engine() const noexcept { return h_.get_deleter().engine; }
  explicit operator bool() const noexcept { return h_ != nullptr; }

  // Asks the library what is registered (tent_region_get_info).
  RegionInfo info() const {
    RegionInfo i;
    std::memset(&i, 0, sizeof i);
    i.size = sizeof i;
    check(tent_region_get_info(engine(), native(), &i), "tent_region_get_info");
    return i;
  }

  // Gives up ownership: the handle stays registered (or allocated); the
  // caller releases it with Deleter's C call.
  [[nodiscard]] tent_region *release() noexcept {
    addr_ = nullptr;
    len_ = 0;
    return h_.release();
  }
  // Releases now, ignoring errors (the destructor does the same).
  void reset() noexcept {
    h_.reset();
    addr_ = nullptr;
    len_ = 0;
  }

 protected:
  OwnedRegion(tent_engine *e, tent_region *r, void *addr, size_t len) noexcept
      : h_(r, Deleter{e}), addr_(addr), len_(len) {}

  // Releases now with Deleter's C call and throws on failure; then (e.g.
  // on BusyError) the owner keeps the handle.
  void close() {
    if (!h_) {
      return;
    }
    check(Deleter::close(engine(), h_.get()), Deleter::close_name);
    (void)release();
  }

 private:
  std::unique_ptr<tent_region, Deleter> h_;
  void *addr_ = nullptr;
  size_t len_ = 0;
};

}  // namespace detail

class Engine;

// ---- Region -----------------------------------------------------------------

// One registered range of caller memory (tent_register); unregistered by
// the destructor. The memory must outlive the Region.
class [[nodiscard]] Region : private detail::OwnedRegion<detail::RegionDeleter> {
  using Base = detail::OwnedRegion<detail::RegionDeleter>;

 public:
  Region() noexcept = default;  // empty
  // Moves leave the source empty; move-assignment unregisters what this held.

  // Takes ownership of a handle from tent_register on `engine`.
  static Region adopt(tent_engine *engine, tent_region *region, void *addr, size_t len) noexcept {
    return Region(engine, region, addr, len);
  }

  using Base::addr;
  using Base::size;
  using Base::native;
  using Base::engine;
  using Base::operator bool;
  using Base::info;  // asks the library what is registered (tent_region_get_info)

  // release(): gives up ownership: the handle stays registered; the caller
  // releases it with tent_unregister.
  using Base::release;
  // reset(): unregisters now, ignoring errors (the destructor does the same).
  using Base::reset;
  // Unregisters now and throws on failure. On BusyError (transfers still
  // use the region after the unregister timeout) the Region keeps it.
  void unregister() { close(); }

 private:
  friend class Engine;
  Region(tent_engine *e, tent_region *r, void *addr, size_t len) noexcept : Base(e, r, addr, len) {}
};

// ---- RegionBatch ------------------------------------------------------------

// N regions registered in one all-or-nothing call (tent_register_batch) and
// unregistered together (tent_unregister_batch) by the destructor.
class [[nodiscard]] RegionBatch {
 public:
  RegionBatch() noexcept = default;  // empty
  RegionBatch(RegionBatch &&o) noexcept
      : engine_(std::exchange(o.engine_, nullptr)), regions_(std::move(o.regions_)), descs_(std::move(o.descs_)) {
    o.regions_.clear();
    o.descs_.clear();
  }
  RegionBatch &operator=(RegionBatch &&o) noexcept {
    if (this != &o) {
      reset();
      engine_ = std::exchange(o.engine_, nullptr);
      regions_.swap(o.regions_);
      descs_.swap(o.descs_);
    }
    return *this;
  }
  RegionBatch(const RegionBatch &) = delete;
  RegionBatch &operator=(const RegionBatch &) = delete;
  ~RegionBatch() { reset(); }

  size_t size() const noexcept { return regions_.size(); }
  bool empty() const noexcept { return regions_.empty(); }
  explicit operator bool() const noexcept { return !regions_.empty(); }
  tent_region *native(size_t i) const { return regions_.at(i); }
  const std::vector<tent_region *> &natives() const noexcept { return regions_; }
  // The i-th registered range (location as passed, may be NULL).
  const RegionDesc &desc(size_t i) const { return descs_.at(i); }
  tent_engine *engine() const noexcept { return engine_; }

  // Gives up ownership of every handle (the caller unregisters them).
  [[nodiscard]] std::vector<tent_region *> release() noexcept {
    std::vector<tent_region *> out;
    out.swap(regions_);
    descs_.clear();
    engine_ = nullptr;
    return out;
  }
  // Unregisters all now, ignoring errors: tent_unregister_batch, and if
  // that refuses the set because a handle in it is stale (released behind
  // the owner's back, or the engine is gone), each one alone, so one stale
  // handle cannot keep the others registered. (Not on BusyError: that would
  // wait out the unregister timeout once per region.)
  void reset() noexcept {
    if (!regions_.empty()) {
      tent_status st = tent_unregister_batch(engine_, regions_.data(), regions_.size());
      if (st == TENT_ERR_INVALID_HANDLE || st == TENT_ERR_INVALID_ARGUMENT) {
        for (tent_region *r : regions_) {
          (void)tent_unregister(engine_, r);
        }
      }
    }
    regions_.clear();
    descs_.clear();
    engine_ = nullptr;
  }
  // Unregisters all now, all or none; throws on failure (the batch keeps
  // them, e.g. on BusyError).
  void unregister() {
    if (regions_.empty()) {
      return;
    }
    detail::check(tent_unregister_batch(engine_, regions_.data(), regions_.size()), "tent_unregister_batch");
    (void)release();
  }

 private:
  friend class Engine;
  RegionBatch(tent_engine *e, std::vector<tent_region *> regions, std::vector<RegionDesc> descs) noexcept
      : engine_(e), regions_(std::move(regions)), descs_(std::move(descs)) {}

  tent_engine *engine_ = nullptr;
  std::vector<tent_region *> regions_;
  std::vector<RegionDesc> descs_;
};

// ---- Allocation ---------------------------------------------------------------

// Memory allocated and registered by the library (tent_alloc): host memory
// same-host peers can map (shm), or GPU memory. Freed by the destructor.
class [[nodiscard]] Allocation : private detail::OwnedRegion<detail::FreeDeleter> {
  using Base = detail::OwnedRegion<detail::FreeDeleter>;

 public:
  Allocation() noexcept = default;
  // Moves leave the source empty; move-assignment frees what this held.

  void *data() const noexcept { return addr(); }
  template <class T>
  T *as() const noexcept {
    return static_cast<T *>(addr());
  }
  using Base::size;
  using Base::native;
  using Base::engine;
  using Base::operator bool;
  using Base::info;

  // release(): gives up ownership (the caller releases it with tent_free).
  using Base::release;
  // reset(): frees now, ignoring errors (the destructor does the same).
  using Base::reset;
  // Frees now; throws on failure (BusyError: the Allocation keeps it).
  void free() { close(); }

 private:
  friend class Engine;
  Allocation(tent_engine *e, tent_region *r, void *data, size_t size) noexcept : Base(e, r, data, size) {}
};

// ---- Segment ----------------------------------------------------------------

// An open peer segment (tent_segment_open); closed by the destructor.
class [[nodiscard]] Segment {
 public:
  Segment() noexcept = default;
  Segment(Segment &&o) noexcept : h_(std::move(o.h_)), name_(std::move(o.name_)) { o.name_.clear(); }
  Segment &operator=(Segment &&o) noexcept {
    if (this != &o) {
      h_ = std::move(o.h_);
      name_ = std::move(o.name_);
      o.name_.clear();
    }
    return *this;
  }
  ~Segment() = default;

  static Segment adopt(tent_engine *engine, tent_segment *segment, std::string name = std::string()) noexcept {
    return Segment(engine, segment, std::move(name));
  }

  const std::string &name() const noexcept { return name_; }
  tent_segment *native() const noexcept { return h_.get(); }
  tent_engine *engine() const noexcept { return h_.get_deleter().engine; }
  explicit operator bool() const noexcept { return h_ != nullptr; }

  [[nodiscard]] tent_segment *release() noexcept {
    name_.clear();
    return h_.release();
  }
  void reset() noexcept {
    h_.reset();
    name_.clear();
  }

 private:
  friend class Engine;
  Segment(tent_engine *e, tent_segment *s, std::string name) noexcept
      : h_(s, detail::SegmentDeleter{e}), name_(std::move(name)) {}

  std::unique_ptr<tent_segment, detail::SegmentDeleter> h_;
  std::string name_;
};

// ---- Requests -----------------------------------------------------------------

// READ len bytes at remote_addr in the peer's segment into local.
inline Request read_from(const Segment &peer, uint64_t remote_addr, void *local, uint64_t len) noexcept {
  Request r;
  std::memset(&r, 0, sizeof r);
  r.opcode = TENT_OP_READ;
  r.local_addr = local;
  r.segment = peer.native();
  r.remote_addr = remote_addr;
  r.length = len;
  return r;
}

// WRITE len bytes from local to remote_addr in the peer's segment. (The C
// struct has no const; the library only reads local for a WRITE.)
inline Request write_to(const Segment &peer, uint64_t remote_addr, const void *local, uint64_t len) noexcept {
  Request r;
  std::memset(&r, 0, sizeof r);
  r.opcode = TENT_OP_WRITE;
  r.local_addr = const_cast<void *>(local);
  r.segment = peer.native();
  r.remote_addr = remote_addr;
  r.length = len;
  return r;
}

// A remote address as the integer tent_request wants.
inline uint64_t remote_address(const void *p) noexcept {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
}

namespace detail {

inline RequestStatus to_request_status(const tent_request_status &s) noexcept {
  RequestStatus r;
  r.status = static_cast<Status>(s.status);
  r.transport = static_cast<Transport>(s.transport);
  r.bytes = s.bytes;
  r.flags = s.flags;
  if (s.flags & TENT_STATUS_NIC) {
    r.nic = s.nic;
    r.nics = s.nics;
  }
  return r;
}

inline Outcome make_outcome(tent_status st, std::string message, const std::vector<tent_request_status> &raw) {
  Outcome o;
  o.status = st < 0 ? static_cast<Status>(st) : Status::ok;
  o.message = std::move(message);
  o.requests.reserve(raw.size());
  for (const tent_request_status &s : raw) {
    o.requests.push_back(to_request_status(s));
  }
  return o;
}

}  // namespace detail

// ---- Batch --------------------------------------------------------------------

// Submitted requests (tent_transfer). The destructor calls
// tent_batch_destroy: requests still in flight are canceled and waited for
// (bounded by the deadline + 2 s), so the library never touches their local
// memory after the Batch is gone.
class [[nodiscard]] Batch {
 public:
  Batch() noexcept = default;
  Batch(Batch &&o) noexcept : h_(std::move(o.h_)), n_(std::exchange(o.n_, 0)) {}
  Batch &operator=(Batch &&o) noexcept {
    if (this != &o) {
      h_ = std::move(o.h_);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~Batch() = default;

  static Batch adopt(tent_batch *batch, size_t requests) noexcept { return Batch(batch, requests); }

  size_t size() const noexcept { return n_; }
  tent_batch *native() const noexcept { return h_.get(); }
  explicit operator bool() const noexcept { return h_ != nullptr; }

  // std::nullopt while any request is running; the Outcome once all have
  // finished. Does not block. Throws only if the call fails (stale handle).
  std::optional<Outcome> poll() const {
    std::vector<tent_request_status> raw(n_);
    size_t completed = std::numeric_limits<size_t>::max();  // untouched if the call failed
    tent_status st = tent_batch_status(h_.get(), raw.data(), raw.size(), &completed);
    if (st == TENT_PENDING) {
      return std::nullopt;
    }
    if (st < 0 && completed == std::numeric_limits<size_t>::max()) {
      detail::check(st, "tent_batch_status");
    }
    return detail::make_outcome(st, st < 0 ? tent_last_error() : "", raw);
  }

  // Waits up to `timeout` (negative: the batch's own deadline). std::nullopt
  // if requests are still running when the wait ends; it never throws for
  // that, nor for failed requests (see Outcome::check()).
  std::optional<Outcome> wait(std::chrono::milliseconds timeout) const {
    (void)tent_batch_wait(h_.get(), detail::to_ms(timeout));  // poll() gives the verdict
    return poll();
  }

  // Waits until every request has finished (at the latest at the batch's
  // deadline, when the library fails what is left with TimeoutError).
  Outcome wait() const {
    std::optional<Outcome> o = wait(std::chrono::milliseconds(-1));
    if (!o) {
      throw TimeoutError("requests still running after the batch's deadline", "tent_batch_wait");
    }
    return std::move(*o);
  }

  // Gives up ownership (the caller releases it with tent_batch_destroy).
  [[nodiscard]] tent_batch *release() noexcept {
    n_ = 0;
    return h_.release();
  }
  // Cancels what is in flight, waits (bounded) and releases; ignores errors.
  void reset() noexcept {
    h_.reset();
    n_ = 0;
  }
  // Like reset(), but throws TimeoutError if a transport still held requests
  // past their deadline (their local regions stay pinned until it lets go).
  // The handle is released either way.
  void destroy() {
    n_ = 0;
    tent_batch *b = h_.release();
    detail::check(tent_batch_destroy(b), "tent_batch_destroy");
  }

 private:
  friend class Engine;
  Batch(tent_batch *b, size_t n) noexcept : h_(b), n_(n) {}

  std::unique_ptr<tent_batch, detail::BatchDeleter> h_;
  size_t n_ = 0;
};

// ---- Engine -------------------------------------------------------------------

class [[nodiscard]] Engine {
 public:
  // Creates an engine (tent_engine_create) after checking the library's ABI.
  explicit Engine(const EngineOptions &opts = EngineOptions()) {
    check_version();
    tent_engine_options o = opts.native();
    tent_engine *e = nullptr;
    detail::check(tent_engine_create(&o, &e), "tent_engine_create");
    h_.reset(e);
  }
  static Engine create(const EngineOptions &opts = EngineOptions()) { return Engine(opts); }
  // Takes ownership of a handle from tent_engine_create.
  static Engine adopt(tent_engine *engine) noexcept { return Engine(engine, adopt_tag{}); }

  Engine(Engine &&) noexcept = default;
  Engine &operator=(Engine &&) noexcept = default;  // destroys what this held
  ~Engine() = default;

  tent_engine *native() const noexcept { return h_.get(); }
  explicit operator bool() const noexcept { return h_ != nullptr; }
  [[nodiscard]] tent_engine *release() noexcept { return h_.release(); }
  // Destroys the engine now, ignoring errors.
  void reset() noexcept { h_.reset(); }
  // Destroys the engine now; throws if releasing reported an error (the
  // handle is gone either way).
  void destroy() {
    tent_engine *e = h_.release();
    detail::check(tent_engine_destroy(e), "tent_engine_destroy");
  }

  // The segment name peers pass to open_segment.
  std::string name() const {
    tent_engine *e = native();
    return detail::read_string(
        [e](char *buf, size_t cap, size_t *len) { return tent_engine_name(e, buf, cap, len); },
        "tent_engine_name", 128);
  }

  Stats stats() const {
    Stats s;
    std::memset(&s, 0, sizeof s);
    s.size = sizeof s;
    detail::check(tent_engine_stats(native(), &s), "tent_engine_stats");
    return s;
  }

  // The engine's counts and each transport's resource counts, as JSON.
  std::string stats_json() const {
    tent_engine *e = native();
    return detail::read_string(
        [e](char *buf, size_t cap, size_t *len) { return tent_engine_stats_json(e, buf, cap, len); },
        "tent_engine_stats_json", 2048);
  }

  // The installed transports in preference order (tent_engine_transports).
  std::vector<std::string> transports() const {
    tent_engine *e = native();
    std::string list = detail::read_string(
        [e](char *buf, size_t cap, size_t *len) { return tent_engine_transports(e, buf, cap, len); },
        "tent_engine_transports", 64);
    std::vector<std::string> out;
    for (size_t start = 0; start < list.size();) {
      size_t comma = list.find(',', start);
      if (comma == std::string::npos) {
        comma = list.size();
      }
      out.push_back(list.substr(start, comma - start));
      start = comma + 1;
    }
    return out;
  }
  bool has_transport(std::string_view name) const {
    for (const std::string &t : transports()) {
      if (t == name) {
        return true;
      }
    }
    return false;
  }

  // tent_uninstall: one transport by name (NotFoundError if not installed).
  void uninstall(const std::string &transport) {
    detail::check(tent_uninstall(native(), transport.c_str()), "tent_uninstall");
  }
  void uninstall_all() { detail::check(tent_uninstall(native(), nullptr), "tent_uninstall"); }

  // Registers [addr, addr+len) (tent_register). location: "cpu", "cpu:N",
  // "cuda:N", or nullptr to detect. Throws OverlapError,
  // AlreadyRegisteredError, BusyError, InvalidArgumentError, ...
  Region register_memory(void *addr, size_t len, uint32_t flags = remote_rw, const char *location = nullptr) {
    tent_region *r = nullptr;
    detail::check(tent_register(native(), addr, len, location, flags, &r), "tent_register");
    return Region(native(), r, addr, len);
  }

  // Registers every range, all or none (tent_register_batch).
  RegionBatch register_batch(std::vector<RegionDesc> descs, uint32_t flags = remote_rw) {
    std::vector<tent_region *> out(descs.size(), nullptr);
    detail::check(tent_register_batch(native(), descs.data(), descs.size(), flags, out.data()),
                  "tent_register_batch");
    return RegionBatch(native(), std::move(out), std::move(descs));
  }

  // Allocates and registers size bytes (tent_alloc).
  Allocation alloc(size_t size, const char *location = "cpu", uint32_t flags = remote_rw) {
    void *addr = nullptr;
    tent_region *r = nullptr;
    detail::check(tent_alloc(native(), size, location, flags, &addr, &r), "tent_alloc");
    return Allocation(native(), r, addr, size);
  }

  // Opens a peer's segment (tent_segment_open); the engine's own name opens
  // itself. Throws NotFoundError, TimeoutError, AuthError, TransportError, ...
  Segment open_segment(const std::string &name) {
    tent_segment *s = nullptr;
    detail::check(tent_segment_open(native(), name.c_str(), &s), "tent_segment_open");
    return Segment(native(), s, name);
  }

  // Submits requests and returns at once (tent_transfer). Bad input throws
  // with nothing submitted; remote failures show in the Outcome.
  Batch submit(const Request *requests, size_t n, const TransferOptions &opts = TransferOptions()) {
    tent_transfer_options o = opts.native();
    tent_batch *b = nullptr;
    detail::check(tent_transfer(native(), requests, n, &o, &b), "tent_transfer");
    return Batch(b, n);
  }
  Batch submit(const std::vector<Request> &requests, const TransferOptions &opts = TransferOptions()) {
    return submit(requests.data(), requests.size(), opts);
  }
  Batch submit(std::initializer_list<Request> requests, const TransferOptions &opts = TransferOptions()) {
    return submit(requests.begin(), requests.size(), opts);
  }

  // Submits, waits (up to the deadline) and releases (tent_transfer_sync).
  // Bad input throws; failed requests are reported in the Outcome.
  Outcome transfer(const Request *requests, size_t n, const TransferOptions &opts = TransferOptions()) {
    tent_transfer_options o = opts.native();
    const tent_status unset = std::numeric_limits<tent_status>::min();
    tent_request_status init;
    std::memset(&init, 0, sizeof init);
    init.status = unset;  // still unset after the call: nothing was submitted
    std::vector<tent_request_status> raw(n, init);
    tent_status st = tent_transfer_sync(native(), requests, n, &o, raw.data());
    if (st < 0 && (raw.empty() || raw[0].status == unset)) {
      detail::check(st, "tent_transfer_sync");
    }
    return detail::make_outcome(st, st < 0 ? tent_last_error() : "", raw);
  }
  Outcome transfer(const std::vector<Request> &requests, const TransferOptions &opts = TransferOptions()) {
    return transfer(requests.data(), requests.size(), opts);
  }
  Outcome transfer(std::initializer_list<Request> requests, const TransferOptions &opts = TransferOptions()) {
    return transfer(requests.begin(), requests.size(), opts);
  }

  // Sends msg (at most 65536 bytes) to the segment's engine.
  void notify_send(const Segment &to, std::string_view msg) {
    detail::check(tent_notify_send(native(), to.native(), msg.data(), msg.size()), "tent_notify_send");
  }

  // The oldest notification, waiting up to timeout (negative: the engine's
  // default timeout); std::nullopt if none came in time.
  std::optional<Notification> notify_recv(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    std::string msg(1024, '\0'), from(128, '\0');
    for (int tries = 0;; tries++) {
      size_t len = 0;
      tent_status st = tent_notify_recv(native(), detail::to_ms(timeout), &msg[0], msg.size(), &len, &from[0],
                                        from.size());
      if (st == TENT_ERR_TIMEOUT) {
        return std::nullopt;
      }
      if (st == TENT_ERR_BUFFER_TOO_SMALL && tries < 8) {  // the message stays queued: grow, retry
        if (len > msg.size()) {
          msg.assign(len, '\0');
        } else {
          from.assign(from.size() * 4, '\0');
        }
        continue;
      }
      detail::check(st, "tent_notify_recv");
      msg.resize(len);
      from.resize(std::strlen(from.c_str()));
      return Notification{std::move(msg), std::move(from)};
    }
  }

 private:
  struct adopt_tag {};
  Engine(tent_engine *e, adopt_tag) noexcept : h_(e) {}

  std::unique_ptr<tent_engine, detail::EngineDeleter> h_;
};

// The GPU topology (NVML) as JSON; "gpus": [] without a GPU.
inline std::string topology_json() {
  return detail::read_string([](char *buf, size_t cap, size_t *len) { return tent_topology_json(buf, cap, len); },
                             "tent_topology_json", 1024);
}

// ---- Release on failure -------------------------------------------------------

// Undoes one step unless commit() is reached: the seeds' registration guard
// for steps that are not tent owners (publishing a key, a side table, ...).
//
//   directory.add(key);
//   tent::Guard unpublish([&]() noexcept { directory.erase(key); });
//   ... more steps that may throw ...
//   unpublish.commit();
//
// The action runs in the destructor; an exception it throws is swallowed.
template <class F>
class [[nodiscard]] Guard {
 public:
  explicit Guard(F undo) noexcept(std::is_nothrow_move_constructible<F>::value) : undo_(std::move(undo)) {}
  Guard(Guard &&o) noexcept(std::is_nothrow_move_constructible<F>::value)
      : undo_(std::move(o.undo_)), active_(std::exchange(o.active_, false)) {}
  Guard(const Guard &) = delete;
  Guard &operator=(const Guard &) = delete;
  Guard &operator=(Guard &&) = delete;
  ~Guard() { rollback(); }

  // The step is kept: the undo action will not run.
  void commit() noexcept { active_ = false; }
  bool committed() const noexcept { return !active_; }
  // Runs the undo action now (once).
  void rollback() noexcept {
    if (active_) {
      active_ = false;
      try {
        undo_();
      } catch (...) {  // a destructor must not throw
      }
    }
  }

 private:
  F undo_;
  bool active_ = true;
};

// A stack of owners and cleanup actions, released in reverse order when the
// Scope is destroyed or reset() — whether the setup finished or threw
// half-way. Moving the Scope out of a function hands everything on.
//
//   tent::Scope s;
//   for (auto &d : descs) regions.push_back(&s.hold(e.register_memory(d.addr, d.len)));
//   tent::Segment &peer = s.hold(e.open_segment(name));
//   s.defer([&] { log("torn down"); });
//   tent::Batch &b = s.hold(e.submit(reqs));
//   return s;
//
// hold() returns a reference to the owner inside the Scope; it stays valid
// until the Scope releases it (moving the Scope keeps it valid).
class [[nodiscard]] Scope {
 public:
  Scope() noexcept = default;
  Scope(Scope &&o) noexcept : steps_(std::move(o.steps_)) { o.steps_.clear(); }
  Scope &operator=(Scope &&o) noexcept {
    if (this != &o) {
      reset();
      steps_.swap(o.steps_);
    }
    return *this;
  }
  Scope(const Scope &) = delete;
  Scope &operator=(const Scope &) = delete;
  ~Scope() { reset(); }

  // Moves an owner (Region, Batch, ... or any movable object whose
  // destructor releases something) into the Scope.
  template <class T>
  T &hold(T &&owner) {
    static_assert(!std::is_lvalue_reference<T>::value, "move the owner into the Scope: hold(std::move(x))");
    static_assert(std::is_nothrow_destructible<T>::value, "an owner's destructor must be noexcept");
    // If either of the next two throws (std::bad_alloc), owner has not been
    // moved from: the caller still holds it and releases it while unwinding.
    steps_.reserve(steps_.size() + 1);
    auto step = std::make_unique<Held<T>>(std::move(owner));
    T &ref = step->value;
    steps_.push_back(std::move(step));  // cannot throw after reserve()
    return ref;
  }

  // Runs fn when the Scope is released (in reverse order with the owners).
  // If recording it fails (std::bad_alloc), fn runs at once and the
  // exception propagates, so the step is never forgotten.
  template <class F>
  void defer(F fn) {
    try {
      steps_.reserve(steps_.size() + 1);
      steps_.push_back(std::make_unique<Deferred<F>>(std::move(fn)));
    } catch (...) {
      try {
        fn();
      } catch (...) {
      }
      throw;
    }
  }

  size_t size() const noexcept { return steps_.size(); }
  bool empty() const noexcept { return steps_.empty(); }

  // Releases everything now, last step first.
  void reset() noexcept {
    while (!steps_.empty()) {
      steps_.pop_back();  // the step's destructor releases it
    }
  }

 private:
  struct Step {
    virtual ~Step() = default;
  };
  template <class T>
  struct Held final : Step {
    explicit Held(T &&v) : value(std::move(v)) {}
    T value;
  };
  template <class F>
  struct Deferred final : Step {
    explicit Deferred(F f) : fn(std::move(f)) {}
    ~Deferred() override {
      try {
        fn();
      } catch (...) {
      }
    }
    F fn;
  };

  std::vector<std::unique_ptr<Step>> steps_;
};

}  // namespace tent

#endif  // TENT_HPP
