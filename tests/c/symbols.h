/*
 * symbols.h — every function declared in include/tent.h, as X-macro lists.
 *
 * TENT_IMPLEMENTED: exported by build/libtent.so today. header_check.c and
 * test_dlopen.c take the address of each, so a missing export fails the
 * link (or the dlsym).
 * TENT_NOT_YET: declared in tent.h, not exported yet. When you implement
 * one, move it to TENT_IMPLEMENTED.
 *
 * check_symbols.sh verifies that the two lists together are exactly the
 * header's functions, and that libtent.so exports exactly TENT_IMPLEMENTED.
 */
#ifndef TENT_TESTS_SYMBOLS_H
#define TENT_TESTS_SYMBOLS_H

#define TENT_IMPLEMENTED(X)  \
  X(tent_version)            \
  X(tent_abi_version)        \
  X(tent_version_string)     \
  X(tent_status_str)         \
  X(tent_last_error)         \
  X(tent_engine_create)      \
  X(tent_engine_destroy)     \
  X(tent_engine_name)        \
  X(tent_register)           \
  X(tent_register_batch)     \
  X(tent_unregister)         \
  X(tent_unregister_batch)   \
  X(tent_region_get_info)    \
  X(tent_transport_name)     \
  X(tent_engine_transports)  \
  X(tent_uninstall)          \
  X(tent_engine_stats)       \
  X(tent_engine_stats_json)  \
  X(tent_topology_json)      \
  X(tent_alloc)           \
  X(tent_free)            \
  X(tent_segment_open)    \
  X(tent_segment_close)   \
  X(tent_transfer)        \
  X(tent_transfer_poll)   \
  X(tent_batch_status)    \
  X(tent_batch_wait)      \
  X(tent_batch_destroy)   \
  X(tent_transfer_sync)   \
  X(tent_transfer_columns) \
  X(tent_transfer_columns_sync) \
  X(tent_notify_send)     \
  X(tent_notify_recv)     \
  X(tent_log_set_level)   \
  X(tent_log_get_level)   \
  X(tent_log_set_callback)

#define TENT_NOT_YET(X)

#endif /* TENT_TESTS_SYMBOLS_H */
