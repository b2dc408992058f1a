"""The wheel and the installed package: what it contains, its platform
tag, loading and version checks, a bare venv without numpy, and the
command line (python -m tent, tent-bench)."""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import tent
from tent import _lib

from conftest import SOURCE_DIR, run_python

WHEEL = os.environ.get("TENT_WHEEL")
needs_wheel = pytest.mark.skipif(not WHEEL, reason="TENT_WHEEL not set (make test-python sets it)")


@needs_wheel
def test_tests_run_against_the_installed_package():
    pkg = os.path.dirname(os.path.abspath(tent.__file__))
    assert "site-packages" in pkg, f"tent imported from {pkg}, not from an installed wheel"
    assert not pkg.startswith(os.path.join(SOURCE_DIR, "python"))
    assert "TENT_LIBRARY" not in os.environ
    _lib.lib()
    assert _lib.loaded_path() == os.path.join(pkg, "libtent.so")


@needs_wheel
def test_wheel_contents_and_tag():
    name = os.path.basename(WHEEL)
    m = re.fullmatch(r"tent-(\d+\.\d+\.\d+)-py3-none-(\w+)\.whl", name)
    assert m, name
    assert m.group(1) == tent.__version__
    plat = m.group(2)
    with zipfile.ZipFile(WHEEL) as z:
        names = set(z.namelist())
        for f in ("tent/__init__.py", "tent/libtent.so", "tent/py.typed", "tent/include/tent.h", "tent/_cli.py"):
            assert f in names, f
        info = f"tent-{tent.__version__}.dist-info/"
        wheel_meta = z.read(info + "WHEEL").decode()
        assert "Root-Is-Purelib: false" in wheel_meta
        assert f"Tag: py3-none-{plat}" in wheel_meta
        assert "tent-bench = tent._cli:bench_main" in z.read(info + "entry_points.txt").decode()

    # The tag is what the library needs: manylinux_2_X only if its newest
    # GLIBC symbol version is 2.X and it links nothing else.
    sys.path.insert(0, os.path.join(SOURCE_DIR, "python", "tools"))
    try:
        import wheel_tag
    finally:
        sys.path.pop(0)
    lib = os.path.join(os.path.dirname(tent.__file__), "libtent.so")
    info = wheel_tag.inspect(lib)
    assert plat == wheel_tag.decide(info)[0]
    if plat.startswith("manylinux_"):
        x, y = map(int, plat.split("_")[1:3])
        assert info["glibc"] == (x, y)
        assert set(info["needed"]) <= wheel_tag.MANYLINUX_LIBS
    if shutil.which("objdump"):  # cross-check the ELF reader against binutils
        out = subprocess.run(["objdump", "-T", lib], capture_output=True, text=True, check=True).stdout
        versions = {tuple(map(int, v.split(".")))[:2] for v in re.findall(r"GLIBC_(\d+\.\d+)", out)}
        assert max(versions) == info["glibc"]
        dyn = subprocess.run(["objdump", "-p", lib], capture_output=True, text=True, check=True).stdout
        assert sorted(re.findall(r"NEEDED\s+(\S+)", dyn)) == sorted(info["needed"])


@needs_wheel
def test_bare_venv_without_numpy(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-index", "--no-deps",
                    "--disable-pip-version-check", WHEEL], check=True)
    code = ("import sys, tent; from tent import _lib; assert not _lib.loaded(); "
            "e = tent.Engine(); a = e.alloc(4096); a.view()[:3] = b'abc'; "
            "s = e.open_segment(e.name); b = bytearray(4096); r = e.register(b); "
            "e.read(r, s, a.addr); assert b[:3] == b'abc'; e.close(); "
            "assert 'numpy' not in sys.modules; print(tent.version())")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == tent.__version__
    out = subprocess.run([str(venv / "bin" / "tent-bench"), "--transport", "local", "--duration", "0.3",
                          "--block-size", "4K", "--batch", "16", "--json"],
                         capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    (result,) = [r for r in map(json.loads, out.stdout.splitlines()) if r["type"] == "point"]
    assert result["transport"] == "local" and result["batches"] > 0 and result["gbps"] > 0


def test_cli_version_and_topology():
    out = subprocess.run([sys.executable, "-m", "tent", "version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"libtent {tent.__version__}" in out.stdout, out.stderr
    out = subprocess.run([sys.executable, "-m", "tent", "topology"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "gpus" in json.loads(out.stdout), out.stderr


def test_cli_demo_moves_data_over_every_transport():
    out = subprocess.run([sys.executable, "-m", "tent", "demo", "--size", "4M", "--block-size", "256K",
                          "--iters", "1", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(out.stdout)
    with tent.Engine() as e:
        want = {t for t in e.transports if t != "cuda"}
    assert {r["transport"] for r in rows} == want
    for r in rows:
        assert r["ok"] and r["served_by"] == r["transport"] and r["bytes"] == 4 << 20, r
    assert {r["op"] for r in rows} == {"READ", "WRITE"}


def test_cli_bench_over_tcp():
    out = subprocess.run([sys.executable, "-m", "tent", "bench", "--transport", "tcp", "--duration", "0.5",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    (result,) = [r for r in map(json.loads, out.stdout.splitlines()) if r["type"] == "point"]
    assert result["gbps"] > 0


def test_missing_or_foreign_library_is_a_clear_error(tmp_path):
    env = dict(os.environ, TENT_LIBRARY=str(tmp_path / "nope.so"))
    out = run_python("import tent\ntry:\n tent.Engine()\nexcept tent.LibraryError as e: print('LibraryError', e)",
                     env=env)
    assert "LibraryError cannot load libtent from" in out.stdout and "TENT_LIBRARY" in out.stdout, out.stderr
    env["TENT_LIBRARY"] = "libc.so.6"
    out = run_python("import tent\ntry:\n tent.version()\nexcept tent.LibraryError as e: print('LibraryError', e)",
                     env=env)
    assert "is not libtent" in out.stdout, out.stdout + out.stderr


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")
def test_version_mismatch_is_refused(tmp_path):
    src = tmp_path / "fake.c"
    src.write_text("#include <stdint.h>\nuint32_t tent_abi_version(void){return ABI;}\n"
                   "uint32_t tent_version(void){return VER;}\n")
    for abi, ver, words in ((2, 0x000100, "ABI"), (1, 0x010000, "major"), (1, 0x000200, "minor")):
        so = tmp_path / f"fake{abi}{ver}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", f"-DABI={abi}", f"-DVER={ver}", "-o", str(so), str(src)],
                       check=True)
        out = run_python("import tent\ntry:\n tent.Engine()\nexcept tent.VersionMismatch as e: print('VM', e)",
                         env=dict(os.environ, TENT_LIBRARY=str(so)))
        assert out.stdout.startswith("VM") and words in out.stdout, out.stdout + out.stderr


def test_version_rule():
    ok = (1 << 16) * 0 + (1 << 8) * 1
    assert _lib.version_compatible(1, ok) is None
    assert _lib.version_compatible(1, ok + 7) is None  # any patch
    assert "ABI" in _lib.version_compatible(2, ok)
    assert _lib.version_compatible(1, (1 << 8) * 2) is not None  # 0.2 may break 0.1


def test_import_does_not_load_the_library():
    out = run_python("import tent; from tent import _lib; print(_lib.loaded()); tent.version(); print(_lib.loaded())")
    assert out.stdout.split() == ["False", "True"], out.stderr
