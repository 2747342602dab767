"""``python3 -m beaconkv``: the same command line as the ``beaconkv`` script."""

import sys

from .cli import main

sys.exit(main())
