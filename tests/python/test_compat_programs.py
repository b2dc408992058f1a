"""Programs written the way outside code is written against the real
wheels (tests/python/compat_programs: NIXL's two-peer example shape and
Mooncake's wheel-test shape), each side its own process, run unchanged on
the shims over shm and tcp: their own checks pass, the data's crc32
matches what the seeds say it must be, tent's leak counts and the
processes' live handles are back to zero at the end."""

import json
import os
import select
import subprocess
import sys
import time

import pytest

from compat_fixtures import etcd, http_metadata_server, server_port  # noqa: F401 - etcd, http_metadata_server: fixtures

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "compat_programs")
TIMEOUT_S = 120
TRANSPORTS = ("shm", "tcp")

sys.path.insert(0, PROGRAMS)
import mooncake_wheel_shaped  # noqa: E402 - the expected contents, from the program's own seeds


def _spawn(script, args, env):
    full = dict(os.environ)
    full.update(env)
    return subprocess.Popen([sys.executable, os.path.join(PROGRAMS, script), *args], env=full,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _line_matching(stream, needle, proc):
    """The first line of stream containing needle (within TIMEOUT_S)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if select.select([stream], [], [], 1.0)[0]:
            line = stream.readline()
            if not line:
                break
            if needle in line:
                return line
    proc.kill()
    pytest.fail(f"no {needle!r} line (exit {proc.poll()})")


def _finish(proc):
    """(exit code, the last stdout line as JSON, stderr)."""
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the program did not finish within {TIMEOUT_S} s: {err[-2000:]}")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else {}), err


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_nixl_two_peer_program(transport):
    env = {"TENT_COMPAT_TRANSPORTS": transport}
    # as NIXL's CI runs its example: the target on port 0, the port read off its log
    target = _spawn("nixl_two_peers.py", ["--mode", "target", "--ip", "127.0.0.1", "--port", "0"],
                    {**env, "NIXL_LOG_LEVEL": "INFO"})
    try:
        port = _line_matching(target.stderr, "MD listener is listening on port", target).split()[-1]
        initiator = _spawn("nixl_two_peers.py", ["--mode", "initiator", "--ip", "127.0.0.1", "--port", port], env)
        irc, ireport, ierr = _finish(initiator)
        trc, treport, terr = _finish(target)
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
    assert irc == 0 and ireport["ok"], ierr[-3000:]
    assert trc == 0 and treport["ok"], terr[-3000:]
    for report in (ireport, treport):
        assert report["leaks"] == {} and report["process_handles"] == 0, report
    # the initiator removed its peer; the target keeps its connection to the
    # initiator until close() (process_handles 0 afterwards)
    assert ireport["segments"] == 0 and treport["segments"] <= 1
    assert ireport["moved"].get(transport, 0) > 0, ireport  # the data went over the transport asked for


def _mooncake_metadata(kind, request):
    if kind == "P2PHANDSHAKE":
        return "P2PHANDSHAKE"
    if kind == "etcd":
        return "etcd://" + request.getfixturevalue("etcd")
    return request.getfixturevalue("http_metadata_server")


@pytest.mark.parametrize("transport,metadata", [("shm", "P2PHANDSHAKE"), ("tcp", "P2PHANDSHAKE"),
                                                ("tcp", "etcd"), ("shm", "http")])
def test_mooncake_wheel_shaped_program(request, tmp_path, transport, metadata):
    env = {"TENT_COMPAT_TRANSPORTS": transport, "MC_METADATA_SERVER": _mooncake_metadata(metadata, request),
           "PROTOCOL": "rdma", "TARGET_SERVER_NAME": f"127.0.0.1:{server_port()}",
           "INITIATOR_SERVER_NAME": f"127.0.0.1:{server_port()}"}
    target = _spawn("mooncake_wheel_shaped.py", ["target"], env)
    try:
        ready = json.loads(_line_matching(target.stdout, '"ready"', target))
        report = tmp_path / "initiator.json"
        initiator = _spawn("mooncake_wheel_shaped.py", ["initiator"],
                           {**env, "TARGET_SERVER_NAME": ready["segment"], "REPORT": str(report)})
        irc, _, ierr = _finish(initiator)
        target.stdin.write("stop\n")
        target.stdin.flush()
        trc, treport, terr = _finish(target)
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
    assert irc == 0 and "OK" in ierr, ierr[-3000:]  # unittest's verdict
    assert trc == 0, terr[-3000:]
    want = mooncake_wheel_shaped.expected_target_crcs()
    assert {k: treport[k] for k in want} == want, treport
    assert ["initiator", "pattern-written"] in treport["notifies"]
    ireport = json.loads(report.read_text())
    for r in (ireport, treport):
        assert r["leaks"] == {} and r["process_handles"] == 0, r
    assert ireport["moved"].get(transport, 0) > 0, ireport
