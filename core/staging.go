package core

// FlagStaged: the request's GPU memory was copied through host memory (on
// this side, the target's, or both) because its transport cannot reach GPU
// memory directly. The copies are those of the engine's memory kinds
// (Engine.Memory).
const FlagStaged uint32 = 2

// MarkStaged records that r's data went through host memory; the flag
// shows in its status.
func (r *Request) MarkStaged() { r.flags.Or(FlagStaged) }
