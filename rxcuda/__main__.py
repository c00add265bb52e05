"""``python -m rxcuda``: the same commands as the ``rxcuda`` script."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
