// Package coretest provides a fault-injecting fake transport for tests of
// the engine and of everything above it. The fake can fail, panic or block at
// the nth call of any method, so every rollback path can be driven
// deterministically, without sleeps.
package coretest
