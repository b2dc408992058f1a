/*
 * shim.c — the public functions of include/tent.h.
 *
 * Each function that enters Go: clears the thread's last error, fails fast
 * in a forked child (the Go runtime does not survive fork), turns handle
 * pointers into integer ids and every other pointer into an integer
 * address, and calls its Go export (tentgo_*). Go never forms or stores a
 * caller's pointer as a pointer: it reads and writes caller memory, handle
 * out-parameters included, with fault-guarded copies (capi/cmem.go).
 *
 * The functions that never fail (versions, status texts, the last error,
 * transport names) are plain C and never touch the last error, so that
 * printf("%s: %s", tent_status_str(st), tent_last_error()) is safe in any
 * argument evaluation order.
 *
 * To add a function: write tentgo_<name> in Go (see capi/doc.go) and a
 * wrapper here following tent_register.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"
#include "_cgo_export.h"

_Static_assert(sizeof(void *) == sizeof(uint64_t), "tent handles are 64-bit ids stored in pointers");

#define ID(h) ((uint64_t)(uintptr_t)(h))

/* ---- Last error -------------------------------------------------------- */

/* err_msg is what tent_last_error returns (NULL means ""): err_buf, or a
 * static message. err_buf grows as needed and is freed at thread exit
 * through err_key's destructor. */
static __thread const char *err_msg;
static __thread char *err_buf;
static __thread size_t err_cap;
static pthread_key_t err_key;
static int err_key_ok;

/* Runs at thread exit; resets the pointers in case a later destructor
 * calls into tent on this thread. */
static void free_err(void *p) {
  free(p);
  err_buf = NULL;
  err_cap = 0;
  err_msg = NULL;
}

static const char oom_msg[] = "tent: out of memory while recording the error message";

void tentshim_set_error(const char *msg, size_t len) {
  if (len > TENTSHIM_MAX_ERROR) {
    len = TENTSHIM_MAX_ERROR;
  }
  if (err_cap < len + 1) {
    size_t want = err_cap ? err_cap : 256;
    while (want < len + 1) {
      want *= 2;
    }
    char *p = realloc(err_buf, want);
    if (p == NULL) {
      err_msg = oom_msg;
      return;
    }
    if (err_key_ok) {
      pthread_setspecific(err_key, p);
    }
    err_buf = p;
    err_cap = want;
  }
  if (len > 0) {
    memcpy(err_buf, msg, len);
  }
  err_buf[len] = '\0';
  err_msg = err_buf;
}

const char *tent_last_error(void) { return err_msg ? err_msg : ""; }

/* ---- Fork detection ---------------------------------------------------- */

static atomic_int forked;

static const char forked_msg[] =
    "tent: this process was forked after libtent was loaded, and the Go runtime inside "
    "libtent does not survive fork(): no tent call works in the child. Create engines "
    "after exec instead, e.g. start workers with multiprocessing's \"spawn\" or "
    "\"forkserver\" method (multiprocessing.set_start_method(\"spawn\")).";

static void on_fork_child(void) { atomic_store(&forked, 1); }

int tentshim_forked(void) { return atomic_load_explicit(&forked, memory_order_relaxed); }

__attribute__((constructor)) static void tentshim_init(void) {
  pthread_atfork(NULL, NULL, on_fork_child);
  err_key_ok = pthread_key_create(&err_key, free_err) == 0;
}

/* ---- Log callbacks ---------------------------------------------------- */

/* Nonzero while this thread runs a tent_log_fn. Log lines are delivered one
 * at a time under a lock, and most tent calls may log: a call from inside
 * the callback would wait for that lock forever, so it fails instead. */
static __thread int in_log_callback;

static const char in_log_callback_msg[] =
    "tent: called from inside a tent_log_fn callback; a log callback must not call tent "
    "functions (except tent_log_get_level, tent_last_error and the plain lookups)";

void tentshim_call_log(uintptr_t fn, int level, const char *msg, uintptr_t user) {
  /* The line may be logged inside a tent call on this very thread: what
   * the callback does to the last error (a BUSY) must not leak into it. */
  const char *saved = err_msg;
  in_log_callback++;
  ((tent_log_fn)fn)(level, msg, (void *)user);
  in_log_callback--;
  err_msg = saved;
}

/* Every function that may enter Go starts with ENTER(). */
#define ENTER()                                                  \
  do {                                                           \
    err_msg = NULL;                                              \
    if (atomic_load_explicit(&forked, memory_order_relaxed)) {   \
      err_msg = forked_msg;                                      \
      return TENT_ERR_FORKED;                                    \
    }                                                            \
    if (in_log_callback) {                                       \
      err_msg = in_log_callback_msg;                             \
      return TENT_ERR_BUSY;                                      \
    }                                                            \
  } while (0)

/* ---- Versioning and status (plain C) ------------------------------------ */

#define STR_(x) #x
#define STR(x) STR_(x)

uint32_t tent_version(void) { return TENT_VERSION; }

uint32_t tent_abi_version(void) { return TENT_ABI_VERSION; }

const char *tent_version_string(void) {
  return STR(TENT_VERSION_MAJOR) "." STR(TENT_VERSION_MINOR) "." STR(TENT_VERSION_PATCH);
}

/* Must equal status.Table (capi's Go tests check it). */
static const struct {
  tent_status code;
  const char *text;
} status_texts[] = {
    {TENT_OK, "success"},
    {TENT_PENDING, "operation still in progress"},
    {TENT_ERR_INVALID_ARGUMENT, "invalid argument"},
    {TENT_ERR_INVALID_HANDLE, "invalid, stale or foreign handle"},
    {TENT_ERR_OVERLAP, "memory overlaps a registered or in-flight region"},
    {TENT_ERR_ALREADY_REGISTERED, "exactly this memory is already registered"},
    {TENT_ERR_NOT_REGISTERED, "memory is not registered"},
    {TENT_ERR_BUSY, "resource is busy"},
    {TENT_ERR_OUT_OF_RANGE, "range lies outside the registered memory"},
    {TENT_ERR_PERMISSION_DENIED, "permission denied"},
    {TENT_ERR_NOT_FOUND, "not found"},
    {TENT_ERR_UNSUPPORTED, "not supported"},
    {TENT_ERR_TRANSPORT, "transport error"},
    {TENT_ERR_TIMEOUT, "deadline exceeded"},
    {TENT_ERR_CLOSED, "closed or uninstalled"},
    {TENT_ERR_NO_MEMORY, "out of memory"},
    {TENT_ERR_INTERNAL, "internal error"},
    {TENT_ERR_FORKED, "called in a process forked after libtent was loaded"},
    {TENT_ERR_AUTH, "authentication failed"},
    {TENT_ERR_PROTOCOL, "malformed or unexpected message from a peer"},
    {TENT_ERR_BUFFER_TOO_SMALL, "output buffer too small"},
    {TENT_ERR_CANCELED, "canceled"},
    {TENT_ERR_NAME_IN_USE, "name already in use"},
    {TENT_ERR_VERSION_MISMATCH, "incompatible version"},
};

const char *tent_status_str(tent_status status) {
  for (size_t i = 0; i < sizeof status_texts / sizeof status_texts[0]; i++) {
    if (status_texts[i].code == status) {
      return status_texts[i].text;
    }
  }
  return "unknown status";
}

const char *tent_transport_name(uint32_t transport) {
  switch (transport) {
    case TENT_TRANSPORT_NONE:
      return "none";
    case TENT_TRANSPORT_LOCAL:
      return "local";
    case TENT_TRANSPORT_SHM:
      return "shm";
    case TENT_TRANSPORT_TCP:
      return "tcp";
    case TENT_TRANSPORT_CUDA:
      return "cuda";
    case TENT_TRANSPORT_RDMA:
      return "rdma";
  }
  return "unknown";
}

/* ---- Logging ----------------------------------------------------------- */

tent_status tent_log_set_level(int level) {
  ENTER();
  return tentgo_log_set_level(level);
}

int tent_log_get_level(void) {
  /* Lock-free in Go, so safe inside a callback; a forked child logs
   * nothing. */
  if (atomic_load_explicit(&forked, memory_order_relaxed)) {
    return TENT_LOG_OFF;
  }
  return tentgo_log_get_level();
}

tent_status tent_log_set_callback(tent_log_fn fn, void *user) {
  ENTER();
  return tentgo_log_set_callback((uintptr_t)fn, (uintptr_t)user);
}

/* ---- Engines ----------------------------------------------------------- */

/* Caller pointers go to Go as integers (U): Go reads and writes caller
 * memory only through fault-guarded copies (capi/cmem.go), and writes the
 * handle out-parameters itself, so that a bad pointer is a status code and
 * what the call created can be undone. */
#define U(p) ((uintptr_t)(p))

tent_status tent_engine_create(const tent_engine_options *opts, tent_engine **engine_out) {
  ENTER();
  return tentgo_engine_create(U(opts), U(engine_out));
}

tent_status tent_engine_destroy(tent_engine *engine) {
  ENTER();
  if (engine == NULL) {
    return TENT_OK;
  }
  return tentgo_engine_destroy(ID(engine));
}

tent_status tent_engine_name(tent_engine *engine, char *buf, size_t cap, size_t *len_out) {
  ENTER();
  return tentgo_engine_name(ID(engine), U(buf), cap, U(len_out));
}

/* ---- Memory registration ---------------------------------------------- */

tent_status tent_register(tent_engine *engine, void *addr, size_t len, const char *location,
                          uint32_t flags, tent_region **region_out) {
  ENTER();
  return tentgo_register(ID(engine), U(addr), len, U(location), flags, U(region_out));
}

tent_status tent_register_batch(tent_engine *engine, const tent_region_desc *descs, size_t n,
                                uint32_t flags, tent_region **regions_out) {
  ENTER();
  return tentgo_register_batch(ID(engine), U(descs), n, flags, U(regions_out));
}

tent_status tent_unregister(tent_engine *engine, tent_region *region) {
  ENTER();
  if (region == NULL) {
    return TENT_OK;
  }
  return tentgo_unregister(ID(engine), ID(region));
}

tent_status tent_unregister_batch(tent_engine *engine, tent_region *const *regions, size_t n) {
  ENTER();
  /* Go reads the entries as integers (ids), never as pointers. */
  return tentgo_unregister_batch(ID(engine), U(regions), n);
}

tent_status tent_region_get_info(tent_engine *engine, tent_region *region, tent_region_info *info) {
  ENTER();
  return tentgo_region_get_info(ID(engine), ID(region), U(info));
}

/* ---- Transports -------------------------------------------------------- */

tent_status tent_engine_transports(tent_engine *engine, char *buf, size_t cap, size_t *len_out) {
  ENTER();
  return tentgo_engine_transports(ID(engine), U(buf), cap, U(len_out));
}

tent_status tent_uninstall(tent_engine *engine, const char *transport_name) {
  ENTER();
  return tentgo_uninstall(ID(engine), U(transport_name));
}

/* ---- Statistics -------------------------------------------------------- */

tent_status tent_engine_stats(tent_engine *engine, tent_stats *out) {
  ENTER();
  return tentgo_engine_stats(ID(engine), U(out));
}

tent_status tent_engine_stats_json(tent_engine *engine, char *buf, size_t cap, size_t *len_out) {
  ENTER();
  return tentgo_engine_stats_json(ID(engine), U(buf), cap, U(len_out));
}

tent_status tent_topology_json(char *buf, size_t cap, size_t *len_out) {
  ENTER();
  return tentgo_topology_json(U(buf), cap, U(len_out));
}

/* ---- Allocation -------------------------------------------------------- */

tent_status tent_alloc(tent_engine *engine, size_t size, const char *location, uint32_t flags,
                       void **addr_out, tent_region **region_out) {
  ENTER();
  return tentgo_alloc(ID(engine), size, U(location), flags, U(addr_out), U(region_out));
}

tent_status tent_free(tent_engine *engine, tent_region *region) {
  ENTER();
  if (region == NULL) {
    return TENT_OK;
  }
  return tentgo_free(ID(engine), ID(region));
}

/* ---- Segments ---------------------------------------------------------- */

tent_status tent_segment_open(tent_engine *engine, const char *name, tent_segment **segment_out) {
  ENTER();
  return tentgo_segment_open(ID(engine), U(name), U(segment_out));
}

tent_status tent_segment_close(tent_engine *engine, tent_segment *segment) {
  ENTER();
  if (segment == NULL) {
    return TENT_OK;
  }
  return tentgo_segment_close(ID(engine), ID(segment));
}

/* ---- Transfers --------------------------------------------------------- */

tent_status tent_transfer(tent_engine *engine, const tent_request *requests, size_t n,
                          const tent_transfer_options *opts, tent_batch **batch_out) {
  ENTER();
  return tentgo_transfer(ID(engine), U(requests), n, U(opts), U(batch_out));
}

tent_status tent_transfer_poll(tent_engine *engine, const tent_request *requests, size_t n,
                               const tent_transfer_options *opts, tent_batch **batch_out) {
  ENTER();
  return tentgo_transfer_poll(ID(engine), U(requests), n, U(opts), U(batch_out));
}

tent_status tent_transfer_columns(tent_engine *engine, uint32_t opcode, tent_segment *segment,
                                  const uint64_t *local_addrs, const uint64_t *remote_addrs,
                                  const uint64_t *lengths, size_t n, const tent_transfer_options *opts,
                                  tent_batch **batch_out) {
  ENTER();
  return tentgo_transfer_columns(ID(engine), opcode, ID(segment), U(local_addrs), U(remote_addrs), U(lengths),
                                 n, U(opts), U(batch_out));
}

tent_status tent_transfer_columns_sync(tent_engine *engine, uint32_t opcode, tent_segment *segment,
                                       const uint64_t *local_addrs, const uint64_t *remote_addrs,
                                       const uint64_t *lengths, size_t n,
                                       const tent_transfer_options *opts,
                                       tent_request_status *statuses_out) {
  ENTER();
  return tentgo_transfer_columns_sync(ID(engine), opcode, ID(segment), U(local_addrs), U(remote_addrs),
                                      U(lengths), n, U(opts), U(statuses_out));
}

tent_status tent_batch_status(tent_batch *batch, tent_request_status *out, size_t n,
                              size_t *completed_out) {
  ENTER();
  return tentgo_batch_status(ID(batch), U(out), n, U(completed_out));
}

tent_status tent_batch_wait(tent_batch *batch, int64_t timeout_ms) {
  ENTER();
  return tentgo_batch_wait(ID(batch), timeout_ms);
}

tent_status tent_batch_destroy(tent_batch *batch) {
  ENTER();
  if (batch == NULL) {
    return TENT_OK;
  }
  return tentgo_batch_destroy(ID(batch));
}

tent_status tent_transfer_sync(tent_engine *engine, const tent_request *requests, size_t n,
                               const tent_transfer_options *opts,
                               tent_request_status *statuses_out) {
  ENTER();
  return tentgo_transfer_sync(ID(engine), U(requests), n, U(opts), U(statuses_out));
}

/* ---- Notifications ----------------------------------------------------- */

tent_status tent_notify_send(tent_engine *engine, tent_segment *segment, const void *msg,
                             size_t len) {
  ENTER();
  return tentgo_notify_send(ID(engine), ID(segment), U(msg), len);
}

tent_status tent_notify_recv(tent_engine *engine, int64_t timeout_ms, void *buf, size_t cap,
                             size_t *len_out, char *from, size_t from_cap) {
  ENTER();
  return tentgo_notify_recv(ID(engine), timeout_ms, U(buf), cap, U(len_out), U(from), from_cap);
}
