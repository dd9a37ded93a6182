"""`python -m rankwise ...`: the same command as `rankwise ...`."""

import sys

from rankwise.cli import main

if __name__ == "__main__":
    sys.exit(main())
