"""python -m tent: see tent._cli."""

import sys

from ._cli import main

sys.exit(main())
