"""python -m attnid: the command-line interface."""

import sys

from attnid.cli import main

sys.exit(main())
