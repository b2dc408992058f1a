"""Adversarial use of the Python layer's objects: views of freed memory,
locks inherited through fork, numpy scalars where bytes go, sequences
whose length lies, timeouts of 0 that C would read as its default. Each is
a tent error or a TypeError/ValueError naming the problem, never a crash,
a hang or a leaked handle."""

import logging
import textwrap

import numpy as np
import pytest

import tent

from conftest import run_python


def test_a_view_of_an_allocation_after_its_engine_closed_is_refused():
    # Closing the engine frees its allocations, but view() and numpy() of
    # an AllocatedRegion still handed out memoryviews of the unmapped
    # memory: the first access killed the process (SIGSEGV).
    code = textwrap.dedent(
        """
        import tent
        e = tent.Engine(transports="local")
        a = e.alloc(1 << 20)
        a.view()[0] = 1
        e.close()
        for make in (a.view, a.numpy, lambda: a.numpy("u4", (4, -1))):
            try:
                v = make()
            except tent.InvalidHandle as exc:
                assert "engine is closed" in str(exc), exc
            else:
                v[0] = 1
                raise SystemExit("a view of freed memory was made")
        b = tent.Engine(transports="local")
        c = b.alloc(4096)
        c.close()
        try:
            c.view()
        except tent.InvalidHandle as exc:
            assert "allocation is closed" in str(exc), exc
        else:
            raise SystemExit("a view of a freed allocation was made")
        b.close()
        print("refused")
        """
    )
    out = run_python(code)
    assert out.returncode == 0 and "refused" in out.stdout, (out.returncode, out.stdout, out.stderr)


_FORK_WITH_A_HELD_LOCK = """
import os, sys, threading, time
import numpy as np
import tent
from tent import _log

e = tent.Engine(transports="local")
r = e.register(np.zeros(4096, np.uint8))
a = e.alloc(4096)
seg = e.open_segment(e.name)
b = e.transfer([("write", r.addr, seg, r.addr, 8)])
b.wait()
calls = {
    "engine.close": (e._lock, e.close),
    "region.close": (r._lock, r.close),
    "alloc.close": (a._lock, a.close),
    "alloc.view": (a._lock, a.view),
    "segment.close": (seg._lock, seg.close),
    "batch.close": (b._lock, b.close),
    "unregister_batch": (r._lock, lambda: e.unregister_batch([r])),
    "Engine()": (_log._lock, lambda: tent.Engine(transports="local")),
}
lock, call = calls[sys.argv[1]]
# Another thread of the parent holds the lock when the fork comes (as if
# it were inside close()): the child inherits it held, by no thread.
held, release = threading.Event(), threading.Event()
def holder():
    with lock:
        held.set()
        release.wait()
threading.Thread(target=holder, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    try:
        call()
        os._exit(3)
    except tent.ForkError as exc:
        os._exit(0 if "spawn" in str(exc) else 4)
    except BaseException:
        os._exit(5)
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print("the child hung")
    sys.exit(1)
release.set()
print("child exit", os.WEXITSTATUS(status))
sys.exit(os.WEXITSTATUS(status))
"""


@pytest.mark.parametrize("call", ["engine.close", "region.close", "alloc.close", "alloc.view", "segment.close",
                                  "batch.close", "unregister_batch", "Engine()"])
def test_a_forked_child_gets_fork_error_even_where_a_parent_thread_held_a_lock(tmp_path, call):
    # close() took the object's lock before the library could say
    # TENT_ERR_FORKED: a lock held by another parent thread at the fork
    # stays held in the child, and the child waited forever.
    script = tmp_path / "fork_held_lock.py"
    script.write_text(_FORK_WITH_A_HELD_LOCK)
    out = run_python(f"import runpy, sys; sys.argv = ['x', {call!r}]; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert out.returncode == 0, (call, out.stdout, out.stderr)


def test_numpy_scalars_are_no_messages_or_secrets(engine, self_segment):
    # numpy exports a scalar's bytes: np.int64(5) went out as 8 bytes where
    # a Python 5 is a TypeError.
    for scalar in (np.int64(5), np.float64(1.5), np.bool_(True), np.uint8(7)):
        with pytest.raises(TypeError, match="numpy scalar"):
            engine.notify(self_segment, scalar)
        with engine.register(np.zeros(64, np.uint8)) as r:
            with pytest.raises(TypeError, match="numpy scalar"):
                engine.transfer([("write", r, self_segment, r.addr, 8)], notify=scalar)
        with pytest.raises(TypeError, match="numpy scalar"):
            tent.Engine(transports="local", secret=scalar)
    with pytest.raises(tent.Timeout):
        engine.recv_notification(0)
    # numpy's bytes and str scalars are bytes and str
    engine.notify(self_segment, np.bytes_(b"raw"))
    engine.notify(self_segment, np.str_("text"))
    assert engine.recv_notification(5).message == b"raw"
    assert engine.recv_notification(5).message == b"text"
    with tent.Engine(transports="local", secret=np.bytes_(b"s3cret")):
        pass
    assert engine.stats()["batches"] == 0


class _ShortList(list):
    def __len__(self):
        return 1


class _EmptyList(list):
    def __len__(self):
        return 0


class _LongList(list):
    def __len__(self):
        return 5


@pytest.mark.parametrize("liar", [_ShortList, _EmptyList, _LongList])
def test_a_request_list_whose_length_lies_moves_what_it_holds(engine, self_segment, liar):
    # len() sized the request array and iteration filled it: one item past
    # a short length was an IndexError, a zero length "no requests", and a
    # long one sent zeroed requests to the library.
    src, dst = np.arange(64, dtype=np.uint8), np.zeros(64, np.uint8)
    with engine.register(src) as rs, engine.register(dst) as rd:
        reqs = liar([("write", rs.addr + 8 * i, self_segment, rd.addr + 8 * i, 8) for i in range(3)])
        with engine.transfer(reqs) as batch:
            assert len(batch) == 3
            batch.wait()
            assert all(s.ok for s in batch.status())
        assert bytes(dst[:24]) == bytes(src[:24]) and not dst[24:].any()
    s = engine.stats()
    assert (s["batches"], s["regions"], s["requests_in_flight"]) == (0, 0, 0)


def test_a_numpy_integer_is_a_log_level():
    before = logging.getLogger("tent").level
    try:
        tent.set_log_level(np.int64(logging.ERROR))
        assert logging.getLogger("tent").level == logging.ERROR
        with pytest.raises(tent.InvalidArgument):
            tent.set_log_level(np.bool_(True))
    finally:
        logging.getLogger("tent").setLevel(before)


def test_a_zero_timeout_is_refused_not_read_as_the_default(engine, self_segment):
    # C reads a timeout_ms of 0 as its default: timeout=0 gave a request
    # 30 s, and an engine or its unregister wait the library's defaults.
    for kwargs in ({"timeout": 0}, {"timeout": 0.0}, {"unregister_timeout": 0}, {"timeout": np.float64(0)}):
        with pytest.raises(tent.InvalidArgument, match="> 0"):
            tent.Engine(transports="local", **kwargs)
    with engine.register(np.zeros(64, np.uint8)) as r:
        with pytest.raises(tent.InvalidArgument, match="> 0"):
            engine.transfer([("write", r, self_segment, r.addr, 8)], timeout=0)
        with pytest.raises(tent.InvalidArgument, match="> 0"):
            engine.write(r, self_segment, r.addr, 8, timeout=0)
        # the smallest timeouts that are not 0 still mean what they say
        engine.write(r, self_segment, r.addr, 8, timeout=10)
        assert engine.stats()["batches"] == 0
    # waits keep 0 = do not wait
    with pytest.raises(tent.Timeout):
        engine.recv_notification(0)


def test_a_segment_opened_by_bytes_is_named_by_a_str(engine):
    with engine.open_segment(engine.name.encode()) as seg:
        assert seg.name == engine.name


def test_an_index_that_raises_is_the_callers_error_and_leaks_nothing(engine, self_segment):
    # The caller's own exception comes through unchanged (as from range());
    # nothing was created before it.
    class Raises:
        def __index__(self):
            raise RuntimeError("from __index__")

    with engine.register(np.zeros(64, np.uint8)) as r:
        for call in (lambda: engine.write(r, self_segment, Raises(), 8),
                     lambda: engine.write(r, self_segment, r.addr, Raises()),
                     lambda: engine.write((r, Raises()), self_segment, r.addr, 8),
                     lambda: engine.transfer([("write", r, self_segment, r.addr, Raises())]),
                     lambda: engine.alloc(Raises()),
                     lambda: tent.make_requests("write", r, self_segment, r.addr, local_offsets=[0],
                                                lengths=Raises())):
            with pytest.raises(RuntimeError, match="from __index__"):
                call()
        s = engine.stats()
        assert (s["batches"], s["allocations"], s["regions"]) == (0, 0, 1)
