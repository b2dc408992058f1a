// Package status defines tent's error vocabulary: one Code per failure kind,
// sentinel errors for errors.Is, and the single table that maps them to the
// C status codes in include/tent.h. The Python and C++ wrappers take their
// enums from the header, and tests check that all of them agree with Table.
//
// Errors carry a Code and a message. Wrap them with fmt.Errorf("...: %w", err)
// freely: CodeOf finds the code through any chain of wrapping.
package status
