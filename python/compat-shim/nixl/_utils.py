"""``nixl._utils`` on tent: this module is tent.compat.nixl._utils itself (an alias in
sys.modules), so names, identities and a test's monkeypatching are shared
with it."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("tent.compat.nixl._utils")
