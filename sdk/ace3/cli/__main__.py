"""``python -m ace3.cli``: the ``ace3`` command (tests and ``ace3 up`` start it this way)."""

import sys

from ace3.cli import main

sys.exit(main())
