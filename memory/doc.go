// Package memory is the engine's memory layer: the kinds of memory an
// engine can register, detect, allocate and reach, each behind one
// interface (Kind), gathered per engine in a Layer.
//
// Every engine owns its Layer, built from core.Options.Memory when the
// engine is created and fixed from then on; nothing about memory is
// process-wide. The host kind ("cpu", package memory/host) is always
// there. Other kinds are added by whoever creates the engine: the C
// library adds the CUDA kind ("cuda", package memory/cuda) when a CUDA
// driver is present. So what an engine can do with GPU memory depends on
// its own kinds, never on which transports it, or another engine of the
// process, installed.
//
// A Kind answers four questions for the memory of its kind:
//
//   - detection: is this address mine, and on which device (Detect), and
//     does a device of mine exist (CheckDevice);
//   - allocation: memory the engine owns and may share with peers (Alloc);
//   - staging and fault-safe byte access: copy bytes between memory of the
//     kind and host memory (CopyOut, CopyIn). For host memory that is a copy
//     that turns a fault into an error; for GPU memory a driver copy. A
//     transport that reaches only host memory (tcp) moves other kinds
//     through host buffers with them.
//
// Transports get the engine's Layer from the engine they are installed in
// (core.Engine.Memory).
package memory
