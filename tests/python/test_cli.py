"""The command line (python -m tent, tent-bench) as a user meets it: the
help lists what a user can run, an error is one line and an exit status
(the traceback only when asked for), and numpy's absence is named with the
extra that brings it (bench/sweep/sweep.py's own command line, --plot
without matplotlib among it: test_bench.py). Each case runs in its own
interpreter, as a user's would."""

import os
import subprocess
import sys

import pytest

from conftest import HERE

MISSING_LIBRARY = {"TENT_LIBRARY": "/nonexistent/libtent.so"}


def run(args, env=None, prelude=None, timeout=120, cwd=HERE):
    """python -m tent ARGS (or, with prelude, python -c 'PRELUDE; main(ARGS)'
    so the prelude can hide a module) in a fresh interpreter."""
    full_env = dict(os.environ)
    full_env.pop("TENT_DEBUG", None)
    full_env.update(env or {})
    if prelude is None:
        cmd = [sys.executable, "-m", "tent", *args]
    else:
        cmd = [sys.executable, "-c", f"{prelude}\nimport sys\nfrom tent._cli import main\nsys.exit(main({args!r}))"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=str(cwd))


# Makes `import NAME` fail the way a missing module does (sys.modules[name] = None).
def hide(*names):
    return "import sys\n" + "".join(f"sys.modules[{n!r}] = None\n" for n in names)


def test_help_lists_the_commands_and_nothing_internal():
    p = run(["--help"])
    assert p.returncode == 0, p.stderr
    assert "SUPPRESS" not in p.stdout
    assert "peer" not in p.stdout  # the demo's helper process is not a user command
    for command in ("version", "topology", "demo", "bench", "--debug"):
        assert command in p.stdout
    # still there for the demo, though unlisted
    p = run(["peer", "--help"])
    assert p.returncode == 0 and "--size" in p.stdout


@pytest.mark.parametrize(
    "args, env",
    [
        (["version"], MISSING_LIBRARY),
        (["topology"], MISSING_LIBRARY),
        (["demo", "--size", "64K"], MISSING_LIBRARY),
        (["bench", "--transport", "local", "--duration", "0.01"], MISSING_LIBRARY),
        (["bench", "--transport", "local", "--streams", "-1"], {}),  # tent.InvalidArgument
    ],
    ids=["version", "topology", "demo", "bench", "bench-bad-streams"],
)
def test_a_tent_error_is_one_line_and_exit_status_3(args, env):
    p = run(args, env)
    assert p.returncode == 3, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("python -m tent: error: ") and "Traceback" not in p.stderr
    if env:
        assert "LibraryError: cannot load libtent from /nonexistent/libtent.so" in lines[0]
    else:
        assert "InvalidArgument: tcp_streams must be in 1.." in lines[0]


@pytest.mark.parametrize(
    "args, env",
    [(["--debug", "version"], {}), (["version", "--debug"], {}), (["version"], {"TENT_DEBUG": "1"}),
     (["--debug", "bench", "--transport", "local"], {}), (["bench", "--transport", "local", "--debug"], {})],
    ids=["--debug first", "--debug last", "TENT_DEBUG=1", "bench, --debug first", "bench, --debug last"],
)
def test_debug_shows_the_traceback(args, env):
    p = run(args, {**MISSING_LIBRARY, **env})
    assert p.returncode == 1, p.stderr  # an uncaught exception
    assert p.stderr.startswith("Traceback (most recent call last):")
    assert p.stderr.strip().splitlines()[-1].startswith("tent.LibraryError: cannot load libtent")


@pytest.mark.parametrize("args", [["demo", "--timeout", "nan"], ["demo", "--timeout", "inf"], ["demo", "--size", "inf"],
                                  ["bench", "--duration", "nan"], ["bench", "--duration", "-1"],
                                  ["bench", "--timeout", "inf"], ["bench", "--block-size", "x"]],
                         ids=lambda a: " ".join(a))
def test_bad_numbers_are_usage_errors(args):
    p = run(args)
    assert p.returncode == 2 and "error: argument" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_tent_debug_0_is_off():
    p = run(["version"], {**MISSING_LIBRARY, "TENT_DEBUG": "0"})
    assert p.returncode == 3 and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_tent_bench_console_script_errors_are_one_line(tmp_path):
    code = "import sys\nfrom tent._cli import bench_main\nsys.exit(bench_main(['--transport', 'local']))"
    env = {**os.environ, **MISSING_LIBRARY}
    env.pop("TENT_DEBUG", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                       cwd=str(tmp_path))
    assert p.returncode == 3 and p.stderr.startswith("tent-bench: error: LibraryError"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


NUMPY_CASES = [
    ("make_requests", "tent.make_requests('write', 0x1000, 1, 0x2000, local_offsets=[0], lengths=4)"),
    ("request_dtype", "tent.request_dtype"),
    ("status_dtype", "tent.status_dtype"),
    ("AllocatedRegion.numpy", "e.alloc(4096).numpy()"),
    ("Batch.status_array", "e.transfer([('write', r, s, r.addr, 4)]).status_array()"),
]


@pytest.mark.parametrize("feature, expr", NUMPY_CASES, ids=[c[0] for c in NUMPY_CASES])
def test_missing_numpy_names_the_extra(feature, expr):
    code = hide("numpy") + f"""
import tent
buf = bytearray(4096)
with tent.Engine() as e, e.register(buf) as r, e.open_segment(e.name) as s:
    e.write(r, s, r.addr)  # the package itself works without numpy
    try:
        {expr}
    except ModuleNotFoundError as exc:
        assert exc.name == "numpy", exc.name
        print(exc)
    else:
        raise AssertionError("no error without numpy")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=HERE)
    assert p.returncode == 0, p.stdout + p.stderr
    msg = p.stdout.strip()
    assert feature in msg and "pip install 'tent[numpy]'" in msg, msg
