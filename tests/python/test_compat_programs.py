"""Programs written the way outside code is written against the real
wheels (tests/python/compat_programs: NIXL's two-peer example shape and
Mooncake's wheel-test shape), each side its own process, run unchanged on
the shims over shm and tcp: their own checks pass, the data's crc32
matches what the seeds say it must be, tent's leak counts and the
processes' live handles are back to zero at the end."""

import json
import os
import queue
import subprocess
import sys
import threading

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
    """The first line of stream containing needle (within TIMEOUT_S). Read
    on a thread: select on the pipe misses lines the stream has already
    buffered (the nixl logger writes on stdout too); what follows the line
    stays in the stream for _finish."""
    found = queue.Queue()

    def scan():
        for line in iter(stream.readline, ""):
            if needle in line:
                found.put(line)
                return
        found.put(None)

    threading.Thread(target=scan, daemon=True).start()
    try:
        line = found.get(timeout=TIMEOUT_S)
    except queue.Empty:
        line = None
    if line is None:
        proc.kill()
        pytest.fail(f"no {needle!r} line (exit {proc.poll()})")
    return line


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


def _spawn_ready(script, args, env):
    proc = _spawn(script, args, env)
    return proc, json.loads(_line_matching(proc.stdout, '"ready"', proc))


def _stop(proc):
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    return _finish(proc)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_nixl_clients_shaped_program(transport):
    """vLLM's NixlConnector (pull and push) and SGLang's nixl backend, as
    they call NIXL, between a prefill and a decode process."""
    env = {"TENT_COMPAT_TRANSPORTS": transport}
    prefill, ready = _spawn_ready("nixl_clients_shaped.py", ["prefill"], env)
    try:
        decode = _spawn("nixl_clients_shaped.py", ["decode", "--port", str(ready["ready"])], env)
        drc, dreport, derr = _finish(decode)
        prc, preport, perr = _finish(prefill)
    finally:
        if prefill.poll() is None:
            prefill.kill()
            prefill.wait()
    assert drc == 0 and dreport["ok"], (dreport, derr[-3000:])
    assert prc == 0 and preport["ok"], (preport, perr[-3000:])
    for report in (dreport, preport):
        assert report["leaks"] == {} and report["process_handles"] == 0, report
        assert report["moved"].get(transport, 0) > 0, report
        # vLLM's stats: durations in seconds from microseconds, bytes and descriptor counts as posted
        for xfer_s, post_s, nbytes, ndescs in report["telemetry"]:
            assert 0 <= post_s <= xfer_s < 60 and nbytes == ndescs * 2048


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mooncake_clients_shaped_program(transport):
    """vLLM's MooncakeConnector and SGLang's MooncakeTransferEngine, as they
    call Mooncake, between a sender and a receiver process; then the
    receiver gone, and restarted on the same host:port."""
    sys.path.insert(0, PROGRAMS)
    import mooncake_clients_shaped as shaped

    env = {"TENT_COMPAT_TRANSPORTS": transport}
    receiver, ready = _spawn_ready("mooncake_clients_shaped.py", ["receiver"], env)
    sender = _spawn("mooncake_clients_shaped.py", ["sender"], env)
    restarted = None
    try:
        sender.stdin.write(json.dumps(ready) + "\n")
        sender.stdin.flush()
        phase1 = json.loads(_line_matching(sender.stdout, '"probe"', sender))
        rrc, rreport, rerr = _stop(receiver)
        sender.stdin.write("gone\n")
        sender.stdin.flush()
        dead = json.loads(_line_matching(sender.stdout, '"dead_write"', sender))
        port = ready["session"].rpartition(":")[2]
        restarted, ready2 = _spawn_ready("mooncake_clients_shaped.py", ["receiver", "--port", port], env)
        sender.stdin.write(json.dumps(ready2) + "\n")
        sender.stdin.flush()
        src, final, serr = _finish(sender)
        rrc2, rreport2, rerr2 = _stop(restarted)
    finally:
        for p in (receiver, sender, restarted):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    assert phase1 == {"probe": 0, "engine": True, "batch_sync": [0] * len(shaped.REQS), "sync": 0,
                      "scratch": [0, 0], "async": [True, 0]}, (phase1, serr[-3000:])
    assert rrc == 0 and rreport["crcs"] == shaped.expected_receiver_crcs(False), rerr[-3000:]
    assert dead["dead_write"] < 0 and dead["dead_probe"] != 0, dead
    assert src == 0 and final["restart_probe"] == 0 and final["restart_write"] == 0, (final, serr[-3000:])
    assert rrc2 == 0 and rreport2["crcs"] == shaped.expected_receiver_crcs(True), rerr2[-3000:]
    for report in (rreport, rreport2, final):
        assert report["leaks"] == {} and report["process_handles"] == 0, report
    assert rreport["unregistered"] == 0 and rreport2["unregistered"] == 0
    assert final["moved"].get(transport, 0) > 0, final
