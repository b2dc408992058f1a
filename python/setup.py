"""Builds the tent wheel: pure-Python code plus the bundled libtent.so.

The wheel is tagged py3-none-<platform>: it runs on any Python 3 (ctypes,
no compiled extension) but only on the platform libtent.so was built for.
The platform tag is computed by tools/wheel_tag.py from the library itself
(the newest GLIBC symbol version it needs and the libraries it links); see
README.md, "The wheel's platform tag". TENT_WHEEL_PLAT overrides it.

libtent.so and tent.h are copied into the package by the Makefile (`make
wheel`); building without them is an error, not a wheel without a library.
"""

import os
import sys

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "tools"))

import wheel_tag  # noqa: E402


class BinaryDistribution(Distribution):
    """Carries a binary (libtent.so): the wheel root is platlib, not purelib."""

    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False  # a platform wheel: it carries libtent.so

    def get_tag(self):
        lib = os.path.join(HERE, "tent", "libtent.so")
        if not os.path.exists(lib):
            raise SystemExit(f"{lib} is missing: build the wheel with `make wheel` (it copies build/libtent.so)")
        plat = os.environ.get("TENT_WHEEL_PLAT") or wheel_tag.platform_tag(lib)
        return "py3", "none", plat


setup(distclass=BinaryDistribution, cmdclass={"bdist_wheel": BdistWheel})
