// Package slab hands out fixed-size blocks carved from memory that the Go
// garbage collector does not own: chunks mapped with mmap (anonymous and
// private by default, or shared from a caller's file descriptor, e.g. a
// memfd). The blocks are meant for objects shared with C callers, such as
// request and status arrays and staging buffers, whose addresses must not
// move and must stay valid while C holds them.
//
// # Blocks and pointers
//
// Alloc returns a Block, a small value (slab, chunk index, block index,
// generation). The slab's free list and per-block state hold indices, never
// pointers, so nothing inside the package points into a mapping once it is
// gone. The generation makes a Block single-use: after Free, the same value
// is stale, and Free, Bytes, Ptr and Access report it instead of touching a
// block that may now belong to someone else.
//
// Bytes and Ptr expose the memory itself. The slice or pointer they return
// is valid until the block is freed or the slab is closed, whichever comes
// first; the package cannot check what is done with it after that. Go code
// that may race with Close should touch blocks through Access, which holds
// the slab open while its callback runs.
//
// A pointer handed back by C goes to FreePtr. A raw pointer has no
// generation: a pointer that is not at a block boundary of a chunk of this
// slab is rejected as foreign, and a pointer to a block that is not
// allocated is reported as a double free, but a pointer kept from an
// earlier life of a block that has since been allocated again frees the new
// owner's block. Prefer Free with a Block wherever the Block can be kept.
//
// Block contents are not cleared: a block from a fresh chunk is zero, a
// reused block holds whatever was there (or the poison pattern, below).
//
// # Thread safety
//
// All methods of Slab and Block are safe for concurrent use. Alloc, Free
// and FreePtr take one mutex for a few index operations; a chunk is mapped
// under that mutex when the free list runs dry. Two goroutines freeing the
// same block: one succeeds, the other gets the double-free error. There is
// no per-goroutine or per-P cache (and no sync.Pool): a cache would hold
// blocks, and with them addresses, that Close could not see. The price is
// one contended mutex; shard by creating several slabs if that shows up.
//
// # Close
//
// Close marks the slab closed, waits until no Alloc, Free, FreePtr, Bytes,
// Ptr or Access call is still running inside it, then unmaps every chunk.
// An operation either finishes before the unmapping starts or fails with an
// error that wraps status.ErrClosed; there is no window in which one has
// passed the closed check and then touches unmapped memory. Bytes and Ptr
// on a closed slab return nil.
//
// Blocks still allocated at Close are unmapped with the rest: by calling
// Close the owner declares that nothing uses the memory any more. Close
// returns nil in that case too; Stats().OutstandingAtClose says how many
// there were, so a leak is visible without making shutdown fail.
//
// A second Close waits until the first one has finished unmapping and then
// returns an error wrapping status.ErrClosed. It never unmaps twice.
//
// Close must not be called from inside an Access callback of the same slab:
// it would wait for that callback, which waits for it.
//
// # Lifetime and process exit
//
// There is no finalizer. A slab that is never closed keeps its mappings
// until the process exits, when the kernel drops them; nothing runs at exit
// that could race with goroutines still using the slab. MappedBytes and
// OpenSlabs report what is mapped across all slabs, so tests can check that
// everything they created was closed.
//
// # Invariant checks
//
// Built with the tentinvariants tag, Free fills a freed block with a poison
// pattern and Alloc checks that the pattern is intact before handing the
// block out again. A mismatch means something wrote to the block after it
// was freed: Alloc then returns a status.Internal error naming the block and
// the offset, and the block is quarantined (never handed out again, counted
// in Stats().Quarantined). Without the tag there is no poisoning and Alloc
// and Free never touch block memory.
package slab
