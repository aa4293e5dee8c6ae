"""`python -m vfuse ...` runs the same command line as the `vfuse` script."""

import sys

from vfuse.cli import main

sys.exit(main())
