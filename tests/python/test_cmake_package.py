"""The wheel as a CMake package: tent.hpp and tentConfig.cmake ship with
it, and a C++ project finds them with
CMAKE_PREFIX_PATH=$(python -c 'import tent; print(tent.get_cmake_dir())')."""

import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

import tent

from conftest import SOURCE_DIR

WHEEL = os.environ.get("TENT_WHEEL")
PKG_FILES = ("include/tent.h", "include/tent.hpp", "share/cmake/tent/tentConfig.cmake",
             "share/cmake/tent/tentConfigVersion.cmake")


def test_package_ships_both_headers_and_the_cmake_package():
    pkg = os.path.dirname(os.path.abspath(tent.__file__))
    assert tent.get_cmake_dir() == os.path.join(pkg, "share", "cmake", "tent")
    assert os.path.isfile(os.path.join(tent.get_cmake_dir(), "tentConfig.cmake"))
    for name in ("tent.h", "tent.hpp"):
        with open(os.path.join(tent.get_include(), name), "rb") as shipped, \
                open(os.path.join(SOURCE_DIR, "include", name), "rb") as source:
            assert shipped.read() == source.read(), f"the package's {name} is not include/{name}"
    with open(os.path.join(tent.get_cmake_dir(), "tentConfigVersion.cmake")) as f:
        assert f'set(PACKAGE_VERSION "{tent.__version__}")' in f.read()
    if WHEEL:
        with zipfile.ZipFile(WHEEL) as z:
            names = set(z.namelist())
        for f in PKG_FILES:
            assert "tent/" + f in names, f


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found (Debian: cmake; make test installs it)")
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
def test_find_package_from_the_wheel(tmp_path):
    src = tmp_path / "consumer"
    shutil.copytree(os.path.join(SOURCE_DIR, "tests", "install", "consumer"), src)
    build = tmp_path / "build"
    # The documented way: the directory from a separate interpreter, as an
    # environment variable.
    cmake_dir = subprocess.run([sys.executable, "-c", "import tent; print(tent.get_cmake_dir())"],
                               capture_output=True, text=True, check=True).stdout.strip()
    env = dict(os.environ, CMAKE_PREFIX_PATH=cmake_dir)
    cfg = subprocess.run(["cmake", "-S", str(src), "-B", str(build)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    built = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr

    exe = str(build / "consumer")
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"consumer ok: libtent {tent.__version__} moved 65536 bytes"
    # It ran on the wheel's own libtent.so (through the RPATH CMake set),
    # not on some other copy.
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True, check=True).stdout
    wheel_lib = os.path.join(os.path.dirname(os.path.abspath(tent.__file__)), "libtent.so")
    m = re.search(r"libtent\.so => (\S+)", ldd)
    assert m, ldd
    assert os.path.realpath(m.group(1)) == os.path.realpath(wheel_lib)
