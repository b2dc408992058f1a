/*
 * shim.h — private glue between the public C functions (shim.c) and the Go
 * exports (tentgo_*, declared in cgo's _cgo_export.h). Not installed.
 *
 * Declarations only: cgo copies the preamble of every file with an //export
 * into _cgo_export.h, and this header is that preamble.
 *
 * Internal C symbols use the prefix "tentshim_" so that the version script
 * (exports.map, "tent_*") keeps them out of the dynamic symbol table.
 */
#ifndef TENT_SHIM_H
#define TENT_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "tent.h"

/* Sets the calling thread's last-error message (copied; truncated at
 * TENTSHIM_MAX_ERROR bytes). Go calls it from inside an export, which runs
 * on the caller's OS thread, so the message lands in the caller's
 * thread-local storage. */
void tentshim_set_error(const char *msg, size_t len);

/* 1 in a process forked after the library was loaded. */
int tentshim_forked(void);

/* Calls a tent_log_fn (fn and user as integers: Go never holds them as
 * pointers), marking the thread as inside a log callback meanwhile, so that
 * tent calls made by the callback return TENT_ERR_BUSY instead of waiting
 * for the log lock the callback runs under. */
void tentshim_call_log(uintptr_t fn, int level, const char *msg, uintptr_t user);

#define TENTSHIM_MAX_ERROR (64 * 1024)

#endif /* TENT_SHIM_H */
