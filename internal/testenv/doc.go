// Package testenv lets a test require something of the machine it runs
// on (a binary such as etcd) and say clearly what is missing.
//
// A missing requirement skips the test with the reason, and the line
// "<test>: <reason>" is appended to the file named by $TENT_SKIP_LOG when
// it is set, so a suite runner can print one summary of everything that
// did not run. With CI=true a missing requirement fails the test instead:
// in CI nothing may be skipped silently.
package testenv
