"""The tent-compat wheel in a fresh venv next to the tent wheel: the
client imports work, `python -m tent.compat check` reports the shims, and
a real wheel installed too makes the shims refuse to import."""

import os
import subprocess
import sys
import zipfile

import pytest

import tent

COMPAT_WHEEL = os.environ.get("TENT_COMPAT_WHEEL", "")
TENT_WHEEL = os.environ.get("TENT_WHEEL", "")

needs_wheels = pytest.mark.skipif(not (os.path.exists(COMPAT_WHEEL) and os.path.exists(TENT_WHEEL)),
                                  reason="TENT_WHEEL / TENT_COMPAT_WHEEL not set (make test-python sets them)")


@needs_wheels
def test_compat_wheel_contents():
    name = os.path.basename(COMPAT_WHEEL)
    assert name == f"tent_compat-{tent.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(COMPAT_WHEEL) as z:
        names = set(z.namelist())
        for f in ("mooncake/__init__.py", "mooncake/engine.py", "nixl/__init__.py", "nixl/_api.py",
                  "nixl/_bindings.py", "nixl/logging.py", "nixl/_utils.py"):
            assert f in names, f
        meta = z.read(f"tent_compat-{tent.__version__}.dist-info/METADATA").decode()
        assert f"Requires-Dist: tent=={tent.__version__}" in meta


@needs_wheels
def test_fresh_venv_imports_and_check(tmp_path):
    venv = tmp_path / "v"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", TENT_WHEEL, COMPAT_WHEEL],
                   check=True)
    code = ("from mooncake.engine import TransferEngine; from nixl._api import nixl_agent, nixl_agent_config; "
            "from nixl import nixl_agent as a2; from nixl._bindings import nixlBackendError, nixlXferDList, "
            "nixlXferTelemetry; from nixl.logging import get_logger; import tent.compat.mooncake as m; "
            "assert TransferEngine is m.TransferEngine and a2 is nixl_agent; print('ok')")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    check = subprocess.run([py, "-m", "tent.compat", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "mooncake: tent shim active" in check.stdout and "nixl: tent shim active" in check.stdout

    # a real nixl distribution installed too: the shim refuses, and check says so
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    info = os.path.join(site, "nixl_cu12-0.7.1.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: nixl-cu12\nVersion: 0.7.1\n")
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("")
    out = subprocess.run([py, "-c", "import nixl._api"], capture_output=True, text=True)
    assert out.returncode != 0
    assert "nixl-cu12 0.7.1 is installed" in out.stderr and "pip uninstall nixl-cu12" in out.stderr
    out = subprocess.run([py, "-c", "from mooncake.engine import TransferEngine"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr  # only the shadowed package refuses
    check = subprocess.run([py, "-m", "tent.compat", "check"], capture_output=True, text=True)
    assert check.returncode == 1 and "nixl: CONFLICT" in check.stdout

