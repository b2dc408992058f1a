// Package cshared compiles the fake C libraries that tests load in place
// of a driver (CUDA, NVML, verbs): one C file into one shared library with
// the machine's C compiler, so every fake is built the same way and a
// compiler error reads the same.
package cshared
