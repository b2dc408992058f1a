"""A pytest plugin: every skipped test is recorded for `make test`'s summary.

With TENT_SKIP_LOG set (make test sets it), each skip is appended there as
"<suite>: <test id>: <reason>" (suite: TENT_SKIP_SUITE, default
test-python); tools/skips.sh prints the file at the end of make test, and
with CI=true a skip fails the run. conftest.py loads it; other suites can
with `-p skiplog`.
"""

import os


def pytest_runtest_logreport(report):
    path = os.environ.get("TENT_SKIP_LOG")
    if not path or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if reason.startswith("Skipped: "):
        reason = reason[len("Skipped: "):]
    suite = os.environ.get("TENT_SKIP_SUITE", "test-python")
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{suite}: {report.nodeid}: {' '.join(reason.split())}\n")
