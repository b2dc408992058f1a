"""tent's log: TENT_LOG in the environment, forwarding to the logging
module, levels, and a callback that must never raise into C."""

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import tent
from tent import _lib, _log

# Two tcp engines of one process, one transfer, both closed.
TRANSFER = """
import numpy as np, tent
with tent.Engine(transports="tcp") as a, tent.Engine(transports="tcp") as b:
    src = np.arange(1 << 16, dtype=np.uint8)
    dst = np.zeros(1 << 16, dtype=np.uint8)
    with a.register(src) as rs, b.register(dst, remote_write=True) as rd, a.open_segment(b.name) as seg:
        a.write(rs, seg, rd.addr)
    assert (src == dst).all()
    print(b.name)
"""


def run_transfer(env):
    full = {k: v for k, v in os.environ.items() if k not in ("TENT_LOG", "TENT_LOG_FILE")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", TRANSFER], env=full, capture_output=True, text=True, timeout=60)


def test_env_debug_prints_transport_choice_and_teardown():
    p = run_transfer({"TENT_LOG": "debug"})
    assert p.returncode == 0, p.stderr
    peer = p.stdout.strip()
    lines = p.stderr.splitlines()
    chosen = [ln for ln in lines if 'msg="transport chosen"' in ln and f"peer={peer}" in ln]
    assert len(chosen) == 1 and "transport=tcp" in chosen[0] and "level=DEBUG" in chosen[0], p.stderr
    assert any('msg="tcp connection up"' in ln for ln in lines), p.stderr
    assert sum('msg="transport uninstalled"' in ln and "transport=tcp" in ln for ln in lines) == 2, p.stderr
    assert sum('msg="engine closed"' in ln for ln in lines) == 2, p.stderr


def test_default_is_quiet_and_bad_env_warns():
    p = run_transfer({})
    assert p.returncode == 0, p.stderr
    assert p.stderr == "", "nothing below a warning by default"
    p = run_transfer({"TENT_LOG": "chatty"})
    assert p.returncode == 0, p.stderr
    assert "level=WARN" in p.stderr and "TENT_LOG" in p.stderr and "chatty" in p.stderr, p.stderr
    assert "transport chosen" not in p.stderr, "the default level is kept"


def test_env_log_file(tmp_path):
    path = tmp_path / "tent.log"
    p = run_transfer({"TENT_LOG": "debug", "TENT_LOG_FILE": str(path)})
    assert p.returncode == 0, p.stderr
    assert "transport chosen" not in p.stderr
    assert 'msg="transport chosen"' in path.read_text()


@pytest.fixture
def tent_logger_restored():
    """Puts tent's logger and the library back to warnings."""
    lg = logging.getLogger("tent")
    old = lg.level
    yield lg
    lg.setLevel(old)
    tent.set_log_level("warning")


@pytest.fixture
def no_env_override(monkeypatch):
    monkeypatch.delenv("TENT_LOG", raising=False)
    monkeypatch.delenv("TENT_LOG_FILE", raising=False)


def transfer_in_process():
    with tent.Engine(transports="tcp") as a, tent.Engine(transports="tcp") as b:
        src = np.arange(4096, dtype=np.uint8)
        dst = np.zeros(4096, dtype=np.uint8)
        with a.register(src) as rs, b.register(dst, remote_write=True) as rd, a.open_segment(b.name) as seg:
            a.write(rs, seg, rd.addr)
        return b.name


def test_logging_module_receives_records(caplog, tent_logger_restored, no_env_override):
    caplog.set_level(logging.DEBUG, logger="tent")  # synced at Engine creation
    peer = transfer_in_process()
    assert tent.get_log_level() == _lib.TENT_LOG_DEBUG
    recs = [r for r in caplog.records if r.name == "tent"]
    chosen = [r for r in recs if 'msg="transport chosen"' in r.getMessage() and f"peer={peer}" in r.getMessage()]
    assert len(chosen) == 1 and chosen[0].levelno == logging.DEBUG
    assert any(r.levelno == logging.INFO and 'msg="engine closed"' in r.getMessage() for r in recs)
    assert not any("time=" in r.getMessage() or "level=" in r.getMessage() for r in recs), \
        "logging adds its own time and level"

    caplog.clear()
    tent.set_log_level("warning")
    assert tent.get_log_level() == _lib.TENT_LOG_WARN
    transfer_in_process()
    assert [r for r in caplog.records if r.name == "tent"] == []


def test_set_log_level_names_and_errors(tent_logger_restored, no_env_override):
    for name, want in [("debug", _lib.TENT_LOG_DEBUG), ("INFO", _lib.TENT_LOG_INFO), ("warn", _lib.TENT_LOG_WARN),
                       ("error", _lib.TENT_LOG_ERROR), ("off", _lib.TENT_LOG_OFF),
                       (logging.DEBUG, _lib.TENT_LOG_DEBUG), (logging.CRITICAL, _lib.TENT_LOG_OFF)]:
        tent.set_log_level(name)
        assert tent.get_log_level() == want, name
    for bad in ["verbose", "", None, 1.5, True]:
        with pytest.raises(tent.InvalidArgument):
            tent.set_log_level(bad)
    with pytest.raises(tent.InvalidArgument):
        tent.set_log_level("loud")
    assert tent.get_log_level() == _lib.TENT_LOG_OFF, "a bad level changes nothing"


def test_callback_never_raises_into_c(tent_logger_restored, no_env_override):
    seen = []

    def explode(record):
        seen.append(record.getMessage())
        raise RuntimeError("a broken filter")

    lg = tent_logger_restored
    lg.addFilter(explode)
    try:
        tent.set_log_level("debug")
        transfer_in_process()
    finally:
        lg.removeFilter(explode)
    assert any("transport chosen" in m for m in seen), "the records reached the filter"


def test_busy_inside_the_callback(tent_logger_restored, no_env_override):
    """A handler calling back into tent gets Busy, and nothing deadlocks."""
    got = []

    class Reenter(logging.Handler):
        def emit(self, record):
            if not got:
                try:
                    _lib.lib().tent_log_set_level(_lib.TENT_LOG_ERROR)
                    got.append(_lib.lib().tent_log_set_level(_lib.TENT_LOG_ERROR))
                except Exception as e:  # pragma: no cover - would be a bug
                    got.append(e)

    h = Reenter()
    tent_logger_restored.addHandler(h)
    try:
        tent.set_log_level("debug")
        transfer_in_process()
    finally:
        tent_logger_restored.removeHandler(h)
    assert got == [_lib.TENT_ERR_BUSY]
    assert tent.get_log_level() == _lib.TENT_LOG_DEBUG


def test_set_log_level_inside_a_handler_is_busy(tent_logger_restored, no_env_override):
    """tent.set_log_level from a handler raises Busy instead of waiting
    for the log lock its own thread holds."""
    got = []

    class Reenter(logging.Handler):
        def emit(self, record):
            if not got:
                try:
                    tent.set_log_level("error")
                    got.append("no error")
                except tent.Busy as e:
                    got.append(e)

    h = Reenter()
    tent_logger_restored.addHandler(h)
    try:
        tent.set_log_level("debug")
        transfer_in_process()
    finally:
        tent_logger_restored.removeHandler(h)
    assert len(got) == 1 and isinstance(got[0], tent.Busy), got
    assert tent.get_log_level() == _lib.TENT_LOG_DEBUG


def test_tent_level_mapping():
    assert _log.tent_level(logging.NOTSET) == _lib.TENT_LOG_DEBUG
    assert _log.tent_level(logging.INFO) == _lib.TENT_LOG_INFO
    assert _log.tent_level(25) == _lib.TENT_LOG_WARN
    assert _log.tent_level(logging.ERROR) == _lib.TENT_LOG_ERROR
    assert _log.tent_level(logging.ERROR + 1) == _lib.TENT_LOG_OFF


def test_transports_lists_only_what_can_serve(engine):
    from conftest import has_gpu

    s = engine.stats()
    unavailable = s["unavailable"]
    assert isinstance(unavailable, dict)
    assert not set(unavailable) & set(engine.transports), "a transport is either installed or unavailable"
    if not has_gpu():
        assert "cuda" not in engine.transports
    if "cuda" not in engine.transports:
        assert unavailable.get("cuda"), f"no reason given for the missing cuda transport: {s}"


def test_ctrl_c_while_a_line_is_forwarded_is_not_lost():
    # The library calls the forwarder on whatever thread logs, the caller's
    # too; a KeyboardInterrupt raised inside it (a handler, or the signal
    # landing there) cannot go into C, and must come back out in Python.
    from tent import _log

    class Interrupting(logging.Handler):
        def emit(self, record):
            raise KeyboardInterrupt

    lg = logging.getLogger("tent")
    h = Interrupting()
    lg.addHandler(h)
    try:
        with pytest.raises(KeyboardInterrupt):
            _log._forward(_lib.TENT_LOG_ERROR, b"a line", None)
            for _ in range(100000):  # the interrupt asked for again is raised here
                pass
    finally:
        lg.removeHandler(h)
