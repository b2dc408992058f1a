/*
 * tent.h — the C ABI of tent, a transfer engine for LLM inference.
 *
 * tent registers host and GPU memory and moves bytes between registered
 * memory in this process, in other processes on this machine, and on other
 * hosts. This header is the whole public contract of libtent.so.
 *
 * Conventions
 * -----------
 * - Every fallible call returns a tent_status: TENT_OK (0) on success, a
 *   negative TENT_ERR_* code on failure (TENT_PENDING, positive, only where
 *   documented). Results go through trailing out-parameters, which are left
 *   untouched on failure.
 * - Bad pointers are a status, never a crash: a pointer argument (or a
 *   pointer field of an input struct) that is NULL where NULL is not
 *   allowed, points into the first page, or at memory that cannot be read
 *   (unmapped, PROT_NONE, an array or string running into such memory) is
 *   TENT_ERR_INVALID_ARGUMENT, and so is an out-parameter that cannot be
 *   written (also read-only memory). Out-parameters are checked before the
 *   call creates anything; if a write still fails (the caller unmapped it
 *   meanwhile), what the call created (handle, registration, allocation,
 *   segment, batch) is released again before it returns.
 * - Out-parameters: one that is NULL is TENT_ERR_INVALID_ARGUMENT, and
 *   tent_last_error() says "<name> is NULL", unless its documentation says
 *   it may be NULL (then nothing is written there). An output buffer or
 *   array passed with its size (buf and cap, out and n) may be NULL only
 *   when the size is 0. The same holds for input pointers that must not be
 *   NULL. The out-parameters of one call must not overlap each other (as
 *   far as the call may write them: buf up to the bytes of its result or
 *   of its documented bound, an array up to the entries written): one
 *   result would overwrite another, so that is TENT_ERR_INVALID_ARGUMENT
 *   naming both, before anything is created or dequeued. An out-parameter
 *   may overlap an input: inputs are copied before anything is written.
 * - tent_last_error() explains the most recent failure on the calling
 *   thread. The return code is the truth; the message explains it.
 * - Options structs start with a `size` field (set it to sizeof the struct,
 *   or use the *_INIT macro); a NULL options pointer means defaults.
 *   Output structs with a `size` field (tent_stats, tent_region_info) are
 *   written whole or not at all, all `size` bytes: the bytes past the
 *   struct this library knows (a newer caller's fields) are set to zero.
 *
 * Ownership
 * ---------
 * - Handles (tent_engine*, tent_region*, tent_segment*, tent_batch*) are
 *   opaque ids owned by the library. They are never dereferenced by the
 *   caller and never reused: a destroyed, stale or foreign handle, or a
 *   handle of the wrong type, is reported as TENT_ERR_INVALID_HANDLE, never a
 *   crash. Each handle is released by exactly one call, named in its
 *   documentation; releasing NULL is a no-op that returns TENT_OK.
 * - Destroying an engine releases every region, segment and batch created
 *   through it; their handles become invalid.
 * - The library never takes ownership of caller memory. Registered memory
 *   must stay valid until it is unregistered. Strings passed in are copied.
 * - Strings passed in are at most TENT_MAX_STRING_LEN bytes (without the
 *   NUL) unless documented otherwise; a longer or unterminated one is
 *   TENT_ERR_INVALID_ARGUMENT. Names and addresses (the strings of
 *   tent_engine_options, a segment name) must be valid UTF-8, or they are
 *   TENT_ERR_INVALID_ARGUMENT too: they travel in JSON, etcd keys and
 *   other languages' strings, where other bytes do not round-trip.
 * - Strings returned as `const char *` are owned by the library (static, or
 *   thread-local and valid until the next tent call on the same thread).
 *
 * Thread safety
 * -------------
 * Every function may be called from any thread, concurrently, on the same
 * or different handles. Blocking calls (tent_batch_wait, tent_transfer_sync,
 * tent_notify_recv) block only the calling thread.
 *
 * Processes that fork
 * -------------------
 * The Go runtime inside libtent does not survive fork(). In a child forked
 * after libtent was loaded, every function that would enter the runtime
 * returns TENT_ERR_FORKED at once (never hangs). Create engines in the child
 * after exec, or start workers with the "spawn" or "forkserver" method.
 */
#ifndef TENT_H
#define TENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versioning -------------------------------------------------------- */

#define TENT_VERSION_MAJOR 0
#define TENT_VERSION_MINOR 1
#define TENT_VERSION_PATCH 0
/* Bumped on any incompatible change of this header's types or functions. */
#define TENT_ABI_VERSION 1

#define TENT_MAKE_VERSION(major, minor, patch) \
  (((uint32_t)(major) << 16) | ((uint32_t)(minor) << 8) | (uint32_t)(patch))
#define TENT_VERSION \
  TENT_MAKE_VERSION(TENT_VERSION_MAJOR, TENT_VERSION_MINOR, TENT_VERSION_PATCH)

/* The library's version as TENT_MAKE_VERSION(major, minor, patch). Compare
 * with TENT_VERSION to detect a header/library mismatch. Never fails. */
uint32_t tent_version(void);
/* The library's TENT_ABI_VERSION. Never fails. */
uint32_t tent_abi_version(void);
/* "major.minor.patch", static. Never fails. */
const char *tent_version_string(void);

/* ---- Status codes ------------------------------------------------------ */

typedef int32_t tent_status;

#define TENT_OK 0
#define TENT_PENDING 1 /* not an error: the operation is still running */
#define TENT_ERR_INVALID_ARGUMENT -1
#define TENT_ERR_INVALID_HANDLE -2
#define TENT_ERR_OVERLAP -3
#define TENT_ERR_ALREADY_REGISTERED -4
#define TENT_ERR_NOT_REGISTERED -5
#define TENT_ERR_BUSY -6
#define TENT_ERR_OUT_OF_RANGE -7
#define TENT_ERR_PERMISSION_DENIED -8
#define TENT_ERR_NOT_FOUND -9
#define TENT_ERR_UNSUPPORTED -10
#define TENT_ERR_TRANSPORT -11
#define TENT_ERR_TIMEOUT -12
#define TENT_ERR_CLOSED -13
#define TENT_ERR_NO_MEMORY -14
#define TENT_ERR_INTERNAL -15
#define TENT_ERR_FORKED -16
#define TENT_ERR_AUTH -17
#define TENT_ERR_PROTOCOL -18
#define TENT_ERR_BUFFER_TOO_SMALL -19
#define TENT_ERR_CANCELED -20
#define TENT_ERR_NAME_IN_USE -21
#define TENT_ERR_VERSION_MISMATCH -22

/* A static, fixed description of a status code ("unknown status" for
 * values not listed above). Never NULL; never fails. */
const char *tent_status_str(tent_status status);

/* The message of the last failure on the calling thread, or "" if the last
 * call that returns a tent_status succeeded. Owned by the library; valid until the next tent call on
 * the same thread. Never NULL; never fails. */
const char *tent_last_error(void);

/* The longest input string (without the NUL) where no tighter bound is
 * documented. */
#define TENT_MAX_STRING_LEN 4096

/* The most entries of one batch call: regions of tent_register_batch and
 * tent_unregister_batch, requests of tent_transfer and tent_transfer_sync.
 * A larger n is TENT_ERR_INVALID_ARGUMENT; arrays are read in chunks, so an
 * n larger than the caller's array fails when the read reaches memory that
 * is not there, before anything is done. */
#define TENT_MAX_BATCH (1u << 24)

/* ---- Handles ----------------------------------------------------------- */

typedef struct tent_engine tent_engine;
typedef struct tent_region tent_region;
typedef struct tent_segment tent_segment;
typedef struct tent_batch tent_batch;

/* ---- Engines ----------------------------------------------------------- */

typedef struct tent_engine_options {
  uint32_t size;            /* sizeof(tent_engine_options) */
  uint32_t reserved0;       /* must be 0 */
  const char *name;         /* segment name; NULL = the listener's "host:port" */
  const char *listen_addr;  /* NULL = "127.0.0.1:0" (loopback, any port);
                               "host:port", host empty (all interfaces), an
                               IPv4, [IPv6] or DNS name, port 0..65535: a
                               malformed one is INVALID_ARGUMENT */
  const char *metadata;     /* NULL or "p2p" = peer-to-peer (no server);
                               "etcd://host:port[,host:port...]" */
  const char *metadata_prefix; /* etcd key prefix; NULL = "/tent" */
  const char *transports;   /* comma-separated, in preference order, e.g.
                               "local,shm,tcp"; NULL = all available */
  const void *secret;       /* shared secret peers must prove; NULL = none */
  size_t secret_len;
  uint64_t timeout_ms;      /* default request deadline; 0 = 30000. Also
                               bounds each wait for etcd when shorter than
                               its dial_timeout (see Publication) */
  uint64_t unregister_timeout_ms; /* wait for transfers on unregister; 0 = 5000 */
  uint32_t tcp_streams;     /* TCP connections per peer; 0 = 4 */
  uint32_t reserved1;       /* must be 0 */
} tent_engine_options;

#define TENT_ENGINE_OPTIONS_INIT \
  { sizeof(tent_engine_options), 0, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, 0, 0, 0 }

/* Creates an engine. opts may be NULL (defaults). On success *engine_out is
 * a new handle owned by the caller, released with tent_engine_destroy.
 * With etcd metadata the engine's descriptor, listing every installed
 * transport, is in etcd when this returns (see Publication); an etcd that
 * does not answer within the etcd timeout fails the call.
 * Errors: INVALID_ARGUMENT (bad options), NOT_FOUND (unknown transport),
 * TRANSPORT (listener or transport failed to start), NAME_IN_USE (p2p
 * metadata: a live engine of this process already has this name, or
 * listens on the address it names), AUTH/NAME_IN_USE/TIMEOUT/TRANSPORT
 * (metadata service). */
tent_status tent_engine_create(const tent_engine_options *opts, tent_engine **engine_out);

/* Destroys an engine (its handle is invalid afterwards, even if an error is
 * reported while releasing): transfers in flight fail with TENT_ERR_CLOSED
 * once their transports let go of them, every transport is uninstalled,
 * every region unregistered, every segment and batch handle of the engine
 * becomes invalid, and everything the engine acquired (sockets, mappings,
 * fds, threads) is released. Transfers of peers in this process that still
 * use the engine's memory are waited for, up to the unregister timeout;
 * memory from tent_alloc still in use then stays mapped and the call
 * returns TENT_ERR_BUSY. NULL is a no-op. */
tent_status tent_engine_destroy(tent_engine *engine);

/* Copies the engine's segment name (what peers pass to tent_segment_open),
 * NUL-terminated, into buf. If cap is too small, returns
 * TENT_ERR_BUFFER_TOO_SMALL. *len_out (may be NULL) receives the length
 * without the NUL in both cases. */
tent_status tent_engine_name(tent_engine *engine, char *buf, size_t cap, size_t *len_out);

/* ---- Publication (etcd metadata) ---------------------------------------
 *
 * With etcd metadata the engine's descriptor (its endpoints and registered
 * regions) is stored under <metadata_prefix>/segments/<name>. When
 * tent_engine_create, tent_register, tent_register_batch, tent_unregister,
 * tent_unregister_batch, tent_alloc, tent_free or tent_uninstall returns
 * TENT_OK, etcd already holds a descriptor that reflects the call (or a
 * newer one). So a process may register memory and hand the address to a
 * peer at once (the peer's open segment refreshes itself), and whoever
 * reads etcd sees the change. Concurrent calls share writes: a batch is one
 * write, a burst of registrations from many threads one or two.
 *
 * Each wait is bounded by the etcd timeout: the metadata URL's dial_timeout
 * (default 5 s) or timeout_ms, whichever is shorter. Past it,
 * tent_engine_create fails; the other calls succeed anyway — the change is
 * made, and peers that have the segment open learn it from this engine
 * directly — and the descriptor is published as soon as etcd answers.
 * Until then later calls do not wait (an outage costs one timeout, not one
 * per call), and tent_engine_stats_json reports the state under "metadata"
 * ("behind": 1, "publish_timeouts", "published_generation"). A
 * registration never hangs and never fails because etcd is away.
 *
 * With p2p metadata nothing is published: a peer asks the engine itself,
 * which answers with its registrations as of that moment. */

/* ---- Memory registration ---------------------------------------------- */

/* Flags of a registration: what remote peers may do with the memory.
 *
 * What a peer can do with a grant. Every request is checked by the target
 * (registered, inside one region, permitted) before its memory is touched,
 * whatever the peer's cached view says; a request outside the grant fails
 * with TENT_ERR_PERMISSION_DENIED, TENT_ERR_NOT_REGISTERED or
 * TENT_ERR_OUT_OF_RANGE. Beyond that:
 *  - tcp (any host): the peer gets bytes, never a capability.
 *  - shm (same host): memory from tent_alloc registered with both flags
 *    may be passed as a memfd (sealed against resizing) to a peer of the
 *    same uid or root. The peer can then read and write the whole
 *    allocation until it drops the mapping, also after tent_free (the
 *    pages then serve nothing else). Everything else (read-only or
 *    write-only allocations, tent_register memory) is never passed as a
 *    descriptor: it is copied with process_vm_readv/writev, which the
 *    kernel allows only to a process that may ptrace the target (and so
 *    could read and write all of its memory without tent).
 *  - cuda (same host, NVLink fabric): a POSIX fd or FABRIC handle, likewise
 *    only for tent_alloc GPU memory with both flags; the importer can read
 *    and write the whole allocation while it holds the import. Other GPU
 *    memory is staged through host memory over tcp.
 * So TENT_REMOTE_READ alone is read-only against any peer, and a peer can
 * only ever widen a grant to what the memory's own flags allow. */
#define TENT_REMOTE_READ 0x1u
#define TENT_REMOTE_WRITE 0x2u

typedef struct tent_region_desc {
  void *addr;
  size_t len;
  const char *location; /* "cpu", "cpu:N", "cuda:N", or NULL to detect;
                           the device named must exist (see tent_register) */
} tent_region_desc;

/* Registers [addr, addr+len). The reservation is atomic: a concurrent
 * overlapping registration fails with TENT_ERR_OVERLAP while this one is in
 * flight. An exact duplicate of a registered region fails with
 * TENT_ERR_ALREADY_REGISTERED (callers may treat it as success); an
 * identical registration still in flight fails with TENT_ERR_BUSY. Does not
 * take ownership of the memory. On success *region_out is owned by the
 * caller and released with tent_unregister. With etcd metadata the region
 * is in etcd when this returns (see Publication).
 * A location naming a device is checked against the devices present: a GPU
 * location ("cuda", "cuda:N") in a process without a CUDA driver or GPU is
 * TENT_ERR_UNSUPPORTED; a GPU the driver does not see, a NUMA node the
 * machine does not have, or (with the cuda transport) memory that is not
 * where the location says is TENT_ERR_INVALID_ARGUMENT.
 * Errors: INVALID_ARGUMENT (NULL or NULL-page addr, zero len, addr+len overflows,
 * unknown flags, bad location), UNSUPPORTED, OVERLAP, ALREADY_REGISTERED,
 * BUSY, TRANSPORT / INTERNAL (a transport failed; nothing stays
 * registered). */
tent_status tent_register(tent_engine *engine, void *addr, size_t len, const char *location,
                          uint32_t flags, tent_region **region_out);

/* Registers n regions (1 <= n <= TENT_MAX_BATCH), all or none. Entries
 * overlapping each other are TENT_ERR_INVALID_ARGUMENT. regions_out must
 * have room for n handles (checked writable before anything is
 * registered); it is written only on success, each handle released with tent_unregister or
 * tent_unregister_batch. The whole batch is published to etcd in one write
 * before this returns (see Publication). */
tent_status tent_register_batch(tent_engine *engine, const tent_region_desc *descs, size_t n,
                                uint32_t flags, tent_region **regions_out);

/* Unregisters a region and invalidates its handle. Transfers using the
 * region are waited for, up to the engine's unregister timeout; if they are
 * still running then, returns TENT_ERR_BUSY and the region stays
 * registered (and its handle valid). NULL is a no-op. A region from
 * tent_alloc is TENT_ERR_INVALID_ARGUMENT: release it with tent_free. With
 * etcd metadata the region is gone from etcd when this returns (see
 * Publication). */
tent_status tent_unregister(tent_engine *engine, tent_region *region);

/* Unregisters n regions, all or none (same waiting rule and publication as
 * tent_unregister).
 * A handle listed twice is TENT_ERR_INVALID_ARGUMENT; NULL entries are
 * TENT_ERR_INVALID_HANDLE. */
tent_status tent_unregister_batch(tent_engine *engine, tent_region *const *regions, size_t n);

typedef struct tent_region_info {
  uint32_t size;   /* sizeof(tent_region_info), set by the caller */
  uint32_t flags;  /* TENT_REMOTE_* */
  uint64_t addr;
  uint64_t len;
  char location[32];
} tent_region_info;

/* Describes a registered region. info->size must be set by the caller. */
tent_status tent_region_get_info(tent_engine *engine, tent_region *region, tent_region_info *info);

/* Allocates size bytes at location ("cpu", "cpu:N", "cuda:N"), registers
 * them with flags, and returns the address and region. Host memory is a
 * memfd mapping that same-host peers can map directly (the shm transport);
 * GPU memory is an exportable CUDA allocation. Either is shared as a
 * handle only when flags has both TENT_REMOTE_READ and TENT_REMOTE_WRITE
 * (see the flags above). Published like tent_register. Release with
 * tent_free, which unregisters (published like tent_unregister) and frees. Errors: INVALID_ARGUMENT, UNSUPPORTED (no GPU),
 * NO_MEMORY. */
tent_status tent_alloc(tent_engine *engine, size_t size, const char *location, uint32_t flags,
                       void **addr_out, tent_region **region_out);

/* Unregisters and frees memory from tent_alloc (same waiting rule as
 * tent_unregister). A region from tent_register is TENT_ERR_INVALID_ARGUMENT.
 * NULL is a no-op. */
tent_status tent_free(tent_engine *engine, tent_region *region);

/* ---- Transports -------------------------------------------------------- */

#define TENT_TRANSPORT_NONE 0u
#define TENT_TRANSPORT_LOCAL 1u
#define TENT_TRANSPORT_SHM 2u
#define TENT_TRANSPORT_TCP 3u
#define TENT_TRANSPORT_CUDA 4u
#define TENT_TRANSPORT_RDMA 5u
/* GPU memory: "cuda" copies with the driver's copy engines within a process,
 * and across processes and hosts when the remote GPU memory came from
 * tent_alloc(..., "cuda:N"). Anything else with GPU memory on either side
 * (cudaMalloc memory of another process, GPU with another process's host
 * memory) goes over "tcp" through host buffers on the side that holds the
 * GPU memory, and its status carries TENT_STATUS_STAGED. */

/* "none", "local", "shm", "tcp", "cuda", "rdma", or "unknown". Static; never fails. */
const char *tent_transport_name(uint32_t transport);

/* Copies the names of the engine's installed transports in the order a
 * request tries them (tent_engine_options.transports' order, or the
 * default preference order), comma-separated and NUL-terminated, into buf:
 * e.g. "local,shm,tcp", the format tent_engine_options.transports takes. A transport asked for that cannot serve
 * on this machine is not installed and not listed (tent_engine_stats_json's
 * "unavailable" says why); after tent_uninstall(engine, NULL) the list is
 * "". Buffer rules of tent_engine_name: if cap is too small, returns
 * TENT_ERR_BUFFER_TOO_SMALL; *len_out (may be NULL) receives the length
 * without the NUL in both cases, so cap 0 with buf NULL asks for the size. */
tent_status tent_engine_transports(tent_engine *engine, char *buf, size_t cap, size_t *len_out);

/* Uninstalls one transport by name, or all of them when name is NULL.
 * Transfers in flight on it finish or fail with TENT_ERR_CLOSED; then the
 * transport releases every socket, mapping, fd and thread it holds, and
 * cached peer mappings are invalidated. Later requests use the remaining
 * transports. With etcd metadata the descriptor without the transport's
 * endpoints is in etcd when this returns (see Publication).
 * Errors: NOT_FOUND (not installed). */
tent_status tent_uninstall(tent_engine *engine, const char *transport_name);

/* ---- Statistics (leak checks) ------------------------------------------ */

typedef struct tent_stats {
  uint32_t size;              /* sizeof(tent_stats), set by the caller */
  uint32_t reserved0;
  uint64_t regions;           /* registered regions */
  uint64_t registered_bytes;
  uint64_t reservations;      /* registrations in flight */
  uint64_t handles;           /* live handles created through this engine */
  uint64_t segments;          /* open segments */
  uint64_t batches;           /* live batches */
  uint64_t requests_in_flight;
  uint64_t allocations;       /* live tent_alloc allocations */
  uint64_t process_handles;   /* live handles of all engines in the process */
} tent_stats;

/* Fills *out with the engine's counts. out->size must be set. */
tent_status tent_engine_stats(tent_engine *engine, tent_stats *out);

/* Writes a JSON object with the engine's counts, each installed
 * transport's resource counts ("transports": fds, mappings, connections,
 * goroutines, ...), each listener's accept-loop counts ("listeners":
 * "engine" and the transports that run a listener, each with accepted,
 * accept_errors, last_accept_error, unauthenticated, authenticated,
 * handshake_failures, handshake_timeouts, evicted, peer_rejected, live,
 * refused: connections closed at accept past the per-peer or global cap,
 * see docs/ARCHITECTURE.md "Listeners"), with
 * etcd metadata the directory's counts ("metadata": published,
 * published_generation, behind, writes, publish_timeouts, lease_regrants,
 * watch_invalidations, stale_resolves), and "unavailable": each transport
 * asked for that cannot serve on this machine, with the reason (e.g.
 * "cuda": "no CUDA driver ..."; such a transport is not installed), and
 * "notify_sender_refused" (notifications refused on arrival for naming a
 * sender other than their connection's, see tent_notify_recv) into
 * buf, NUL-terminated; TENT_ERR_BUFFER_TOO_SMALL if cap is too small.
 * *len_out (may be NULL) receives the length without the NUL. */
tent_status tent_engine_stats_json(tent_engine *engine, char *buf, size_t cap, size_t *len_out);

/* Writes the GPU topology (NVML: GPUs, PCI bus ids, NUMA nodes, fabric
 * state) as JSON, same buffer rules. No GPU is not an error: "gpus": []. */
tent_status tent_topology_json(char *buf, size_t cap, size_t *len_out);

/* ---- Segments ---------------------------------------------------------- */

/* Opens a peer's segment by name, at most TENT_MAX_NAME_LEN bytes. With p2p
 * metadata the name is the peer's "host:port": an IPv4, [IPv6] or DNS host
 * and a port in 1..65535, checked whole before anything is dialed —
 * anything else is TENT_ERR_INVALID_ARGUMENT; the name of an engine of this
 * process (this one included), whatever it is, opens it. A peer in this process is reached directly, but
 * only with the secret it requires, as across processes. The descriptor is
 * cached and refreshed when the peer changes. On success *segment_out is
 * owned by the caller, released with tent_segment_close.
 * Errors: INVALID_ARGUMENT, NOT_FOUND, TIMEOUT, AUTH, PROTOCOL,
 * VERSION_MISMATCH, TRANSPORT. */
tent_status tent_segment_open(tent_engine *engine, const char *name, tent_segment **segment_out);

/* Closes a segment handle. Transfers already submitted to it continue.
 * NULL is a no-op. */
tent_status tent_segment_close(tent_engine *engine, tent_segment *segment);

/* ---- Transfers --------------------------------------------------------- */

#define TENT_OP_READ 0u  /* remote -> local */
#define TENT_OP_WRITE 1u /* local -> remote */

typedef struct tent_request {
  uint32_t opcode;        /* TENT_OP_READ or TENT_OP_WRITE */
  uint32_t reserved;      /* must be 0 */
  void *local_addr;       /* inside a region registered with this engine */
  tent_segment *segment;  /* the peer */
  uint64_t remote_addr;   /* inside a region the peer registered */
  uint64_t length;        /* > 0 */
} tent_request;

typedef struct tent_transfer_options {
  uint32_t size;          /* sizeof(tent_transfer_options) */
  uint32_t reserved0;     /* must be 0 */
  uint64_t timeout_ms;    /* 0 = the engine's default */
  const void *notify;     /* message delivered to each target segment after
                             all of the batch's data arrived; NULL = none */
  size_t notify_len;      /* <= 65536 */
  const char *transport;  /* "local", "shm", "tcp", "cuda", "rdma": only this
                             transport serves the batch (no retry elsewhere);
                             NULL = the first eligible, with one retry on the
                             next. One this machine cannot serve (stats'
                             "unavailable") fails tent_transfer with
                             UNSUPPORTED and the reason; one uninstalled,
                             NOT_FOUND */
} tent_transfer_options;

#define TENT_TRANSFER_OPTIONS_INIT { sizeof(tent_transfer_options), 0, 0, NULL, 0, NULL }

/* Flags in tent_request_status.flags */
#define TENT_STATUS_RETRIED 0x1u /* the first transport failed; served by another */
#define TENT_STATUS_STAGED  0x2u /* GPU memory copied through host memory (tcp) */
#define TENT_STATUS_NIC     0x4u /* nic and nics are set (an RDMA NIC carried it) */

/* Its size and layout never change (callers pass arrays of it): a field is
 * added only in the space that was `reserved`, a library that does not set
 * it leaves that space zero, and a flag says when it is set. So a caller
 * built against an older tent.h keeps working with a newer library (it
 * never reads the new fields), and a newer caller reads a field only when
 * its flag is set (an older library never sets it). */
typedef struct tent_request_status {
  tent_status status;     /* TENT_PENDING, TENT_OK or a TENT_ERR_* code */
  uint32_t transport;     /* TENT_TRANSPORT_* that served (or last tried) it */
  uint64_t bytes;         /* bytes transferred */
  uint32_t flags;         /* TENT_STATUS_* */
  uint16_t nic;           /* with TENT_STATUS_NIC: index of the first local NIC
                             that carried it (its first chunk's); the stats of
                             its transport name it: nic.<device>.index */
  uint16_t nics;          /* with TENT_STATUS_NIC: how many local NICs carried
                             parts of it (a large request stripes) */
} tent_request_status;

/* Submits n requests (1 <= n <= TENT_MAX_BATCH) and returns at once: it never
 * waits on a peer, though a small local or same-host batch whose memory the
 * peer already granted may be copied before it returns. Bad
 * input (a NULL or misaligned argument, an unwritable batch_out, an unknown opcode, zero length, a local range that is not
 * registered, an invalid segment handle) fails the call with nothing
 * submitted. Remote checks (range, permission) and transfer failures are
 * reported per request. The requests array is copied. On success *batch_out
 * is owned by the caller, released with tent_batch_destroy. */
tent_status tent_transfer(tent_engine *engine, const tent_request *requests, size_t n,
                          const tent_transfer_options *opts, tent_batch **batch_out);

/* tent_transfer, and the batch's state right after submitting, without
 * waiting: what tent_batch_status returns for it. TENT_OK means every
 * request already succeeded (a small local or shm transfer is often done
 * by the calling thread before the call returns), so no tent_batch_wait is
 * needed; TENT_PENDING means some are still running; an error code is the
 * first failed request's (message in tent_last_error). *batch_out receives
 * the batch whenever the requests were submitted, whatever their outcome:
 * the caller owns it and releases it with tent_batch_destroy. When the
 * call itself fails (the same bad input as tent_transfer), nothing is
 * submitted and *batch_out is set to NULL (unless batch_out itself is NULL
 * or unwritable): *batch_out tells "a request failed" from "the call
 * failed". */
tent_status tent_transfer_poll(tent_engine *engine, const tent_request *requests, size_t n,
                               const tent_transfer_options *opts, tent_batch **batch_out);

/* Copies the status of the first min(n, batch size) requests into out.
 * Returns TENT_OK if all requests succeeded, TENT_PENDING if any is still
 * running, or the code of the first failed request once all have finished.
 * *completed_out (may be NULL) receives the number of finished requests.
 * When the call itself fails (an invalid handle, NULL out with n > 0),
 * neither out nor *completed_out is written: a caller tells "a request
 * failed" from "the call failed" by *completed_out having been set. */
tent_status tent_batch_status(tent_batch *batch, tent_request_status *out, size_t n,
                              size_t *completed_out);

/* Waits until every request finished or timeout_ms passed (negative = the
 * batch's own deadline). Returns what tent_batch_status returns, or
 * TENT_ERR_TIMEOUT if requests are still running when the wait ends; the
 * batch stays valid either way. */
tent_status tent_batch_wait(tent_batch *batch, int64_t timeout_ms);

/* Releases a batch. If requests are still in flight they are canceled and
 * waited for (bounded by their deadlines), so the library never touches
 * local memory after this returns. NULL is a no-op. */
tent_status tent_batch_destroy(tent_batch *batch);

/* Submits, waits and releases in one call. statuses_out (may be NULL) has
 * room for n statuses; it is checked writable before anything is submitted
 * (an unwritable one is TENT_ERR_INVALID_ARGUMENT with no data moved), and
 * written only if the requests were submitted, so a failure of the call
 * itself (bad input) leaves it untouched. The batch is released on every
 * path. Returns what tent_batch_wait returns. */
tent_status tent_transfer_sync(tent_engine *engine, const tent_request *requests, size_t n,
                               const tent_transfer_options *opts,
                               tent_request_status *statuses_out);

/* tent_transfer_poll for n requests of one opcode to one segment, given as
 * three arrays of n uint64_t each instead of an array of tent_request:
 * request i moves lengths[i] bytes between local_addrs[i] (inside a region
 * registered with this engine) and remote_addrs[i] in the segment. For
 * callers that hold their addresses in parallel lists or columns (the
 * Mooncake and NIXL APIs do), so that no tent_request array is built per
 * call. The three arrays are the caller's: only read during the call
 * (copied), never kept or written. A NULL array, n = 0 or n >
 * TENT_MAX_BATCH, an opcode other than TENT_OP_READ/TENT_OP_WRITE
 * (TENT_ERR_INVALID_ARGUMENT) or an invalid segment handle
 * (TENT_ERR_INVALID_HANDLE) fails the call before any array is read; an
 * unreadable array, and each request's own checks (as in tent_transfer:
 * zero length, a local range not registered; the message names the
 * request's index) fail it with nothing submitted. Returns, and sets
 * *batch_out, as tent_transfer_poll: on success the caller owns the batch
 * and releases it with tent_batch_destroy; when the call fails *batch_out
 * is set to NULL (unless batch_out itself is NULL or unwritable). */
tent_status tent_transfer_columns(tent_engine *engine, uint32_t opcode, tent_segment *segment,
                                  const uint64_t *local_addrs, const uint64_t *remote_addrs,
                                  const uint64_t *lengths, size_t n, const tent_transfer_options *opts,
                                  tent_batch **batch_out);

/* tent_transfer_sync for requests given as columns (tent_transfer_columns'
 * arguments and checks): submits, waits and releases in one call.
 * statuses_out (may be NULL) has room for n statuses, checked writable
 * before anything is submitted and written only if the requests were
 * submitted. Returns what tent_transfer_sync returns. */
tent_status tent_transfer_columns_sync(tent_engine *engine, uint32_t opcode, tent_segment *segment,
                                       const uint64_t *local_addrs, const uint64_t *remote_addrs,
                                       const uint64_t *lengths, size_t n,
                                       const tent_transfer_options *opts,
                                       tent_request_status *statuses_out);

/* ---- Notifications ----------------------------------------------------- */

/* Sends msg (at most 65536 bytes) to the segment's engine, after every
 * batch this engine already completed to it. */
tent_status tent_notify_send(tent_engine *engine, tent_segment *segment, const void *msg,
                             size_t len);

/* The longest segment name, in bytes without the NUL: a `from` buffer of
 * TENT_MAX_NAME_LEN + 1 bytes always fits the sender's name. */
#define TENT_MAX_NAME_LEN 1024

/* Receives the oldest notification, waiting up to timeout_ms (0 = do not
 * wait, negative = the engine's default timeout). Copies the message into
 * buf and the sender's name, NUL-terminated, into from (may be NULL
 * when from_cap is 0). The sender's name is the one its connection gave in
 * the handshake (with a secret, proved by a holder of the secret; without
 * one, only a claim); a notification naming another sender, or a name with
 * a NUL byte, is refused on arrival (the sender gets
 * TENT_ERR_PERMISSION_DENIED) and counted in tent_engine_stats_json's
 * "notify_sender_refused". *len_out receives the message length. If buf or
 * from is too small the message stays queued, *len_out is set, and
 * TENT_ERR_BUFFER_TOO_SMALL is returned. No message: TENT_ERR_TIMEOUT.
 * len_out, buf (up to min(cap, 65536) bytes) and from (up to
 * min(from_cap, TENT_MAX_NAME_LEN + 1) bytes) are checked writable before a
 * message is taken, so a bad buffer (TENT_ERR_INVALID_ARGUMENT) leaves the
 * message queued. */
tent_status tent_notify_recv(tent_engine *engine, int64_t timeout_ms, void *buf, size_t cap,
                             size_t *len_out, char *from, size_t from_cap);

/* ---- Logging ----------------------------------------------------------- */

/* Log levels, least severe first. A level shows its lines and every more
 * severe one; TENT_LOG_OFF shows nothing. */
#define TENT_LOG_DEBUG 0
#define TENT_LOG_INFO 1
#define TENT_LOG_WARN 2
#define TENT_LOG_ERROR 3
#define TENT_LOG_OFF 4

/* The library logs through one process-wide sink, for every engine. By
 * default it writes warnings and errors to stderr. When the library loads it
 * reads TENT_LOG=debug|info|warn|error|off (the level) and TENT_LOG_FILE=path
 * (append lines to that file instead of stderr); an invalid value is
 * reported as a warning and the default kept. Debug shows what explains a
 * hang or a slow transfer: the transport chosen per peer (with the peer's
 * epoch), connection, lease and engine setup and teardown, retries with
 * their reasons, deadline expiries, etcd session changes. Nothing is logged
 * per request at info or above, and a disabled level costs the transfer
 * path nothing. */

/* Sets the level (TENT_LOG_DEBUG .. TENT_LOG_OFF); it applies at once to
 * every engine. Errors: INVALID_ARGUMENT (another value), BUSY (called from
 * inside a log callback). */
tent_status tent_log_set_level(int level);

/* The current level. Never fails, and may be called from inside a log
 * callback; TENT_LOG_OFF in a forked child (nothing logs there). */
int tent_log_get_level(void);

/* Receives one log line: level is a TENT_LOG_* value, msg the line without
 * time stamp, level or newline ("msg=... key=value ..."), NUL-terminated
 * and valid only during the call (copy it to keep it); user is what was
 * passed to tent_log_set_callback. */
typedef void (*tent_log_fn)(int level, const char *msg, void *user);

/* Sends log lines to fn(level, msg, user) instead of stderr (or
 * TENT_LOG_FILE); NULL fn restores that default. Lines are delivered one at
 * a time: fn is never called concurrently with itself, but it is called on
 * whichever thread logs, often one the library started. When this call
 * returns, the previous callback is not running and will never be called
 * again, so its user data may be freed. fn must return promptly (every
 * line of the process waits for it) and must not call tent functions:
 * from inside fn they return TENT_ERR_BUSY at once (no deadlock), except
 * tent_log_get_level, tent_last_error and the functions that never fail.
 * The library keeps fn and user, never frees user.
 * Errors: INVALID_ARGUMENT (fn is not in executable memory of this
 * process: it would crash the process on the next line), BUSY (called
 * from inside a log callback). */
tent_status tent_log_set_callback(tent_log_fn fn, void *user);

#ifdef __cplusplus
}
#endif

#endif /* TENT_H */
