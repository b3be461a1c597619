"""``python -m bitdrift``: the same command line as ``bitdrift``."""

import sys

from bitdrift.cli import main

sys.exit(main())
