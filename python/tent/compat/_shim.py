"""The guard the tent-compat wheel's top-level ``mooncake`` and ``nixl``
packages run at import, and what ``python -m tent.compat check`` reports.

The shims replace the real wheels (same import names); one installed next
to the real one would make which code runs depend on install order, so a
shim refuses to import while the real distribution is also installed.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from typing import Dict, List, Optional

MARKER = "__tent_compat__"

# The real wheels' distribution names (prefixes), per top-level package.
REAL_DISTS: Dict[str, List[str]] = {
    "mooncake": ["mooncake-transfer-engine", "mooncake_transfer_engine"],
    "nixl": ["nixl"],
}
SHIM_DIST = "tent-compat"


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def real_distributions(package: str) -> List[str]:
    """'name version' of each installed real distribution providing package."""
    found = []
    prefixes = [_norm(p) for p in REAL_DISTS[package]]
    for dist in importlib.metadata.distributions():
        try:
            raw = dist.metadata["Name"]
        except KeyError:
            continue
        name = _norm(str(raw or ""))
        if not name or name == SHIM_DIST:
            continue
        if any(name == p or name.startswith(p + "-") for p in prefixes):
            found.append(f"{dist.metadata['Name']} {dist.version}")
    return sorted(set(found))


def guard(package: str) -> None:
    """Raises ImportError when a real distribution of package is installed
    too (TENT_COMPAT_ALLOW_SHADOW=1 lets the shim win anyway)."""
    real = real_distributions(package)
    if not real or os.environ.get("TENT_COMPAT_ALLOW_SHADOW") == "1":
        return
    raise ImportError(
        f"tent-compat's '{package}' package replaces the real one, but {', '.join(real)} is installed in this "
        f"environment too ({sys.prefix}): the two provide the same modules. Either uninstall the real one "
        f"(pip uninstall {real[0].split()[0]}) to run on tent, or uninstall tent-compat to run on it."
    )


def describe(package: str) -> Dict[str, Optional[str]]:
    """{"state": "tent" | "real" | "absent" | "conflict", "path", "real"}."""
    spec = importlib.util.find_spec(package)
    real = real_distributions(package)
    path = None
    shim = False
    if spec is not None and spec.origin:
        path = os.path.dirname(spec.origin)
        try:
            with open(spec.origin, encoding="utf-8") as f:
                shim = MARKER in f.read()
        except OSError:
            shim = False
    if spec is None:
        state = "absent"
    elif shim and real:
        state = "conflict"
    elif shim:
        state = "tent"
    else:
        state = "real"
    return {"state": state, "path": path, "real": ", ".join(real) or None}
