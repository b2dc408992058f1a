"""``python -m tent.compat check``: which of the top-level ``mooncake`` and
``nixl`` packages are tent's shims (the tent-compat wheel), which are the
real wheels, and whether both are installed (exit 1)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import _shim

_REAL_NAMES = {"mooncake": "Mooncake (mooncake-transfer-engine)", "nixl": "NIXL (nixl)"}


def check() -> int:
    bad = 0
    for pkg in ("mooncake", "nixl"):
        d = _shim.describe(pkg)
        state = d["state"]
        if state == "tent":
            print(f"{pkg}: tent shim active ({d['path']}): `import {pkg}` runs on tent")
        elif state == "real":
            print(f"{pkg}: the real {_REAL_NAMES[pkg]} ({d['path']}); tent's shim is not installed")
        elif state == "conflict":
            bad = 1
            print(f"{pkg}: CONFLICT: tent shim at {d['path']} and {d['real']} both installed; "
                  f"the shim refuses to import (uninstall one)")
        else:
            print(f"{pkg}: not installed (pip install tent-compat provides it on tent)")
    return bad


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tent.compat")
    p.add_argument("command", choices=["check"], help="check: which mooncake/nixl packages are tent's shims")
    p.parse_args(argv)
    return check()


if __name__ == "__main__":
    sys.exit(main())
