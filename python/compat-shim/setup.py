"""Builds the tent-compat wheel: the top-level ``mooncake`` and ``nixl``
shim packages. Its version is tent's (python/tent/_version.py) and it
depends on exactly that tent, with numpy (the shims' request arrays)."""

import os
import re

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "..", "tent", "_version.py"), encoding="utf-8") as f:
    VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)

setup(version=VERSION, install_requires=[f"tent=={VERSION}", "numpy"])
