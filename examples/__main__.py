"""``python -m rxcuda.examples``: the same as ``rxcuda examples`` (list them; ``NAME [ARGS]`` runs one)."""

import sys

from rxcuda._cli import main

if __name__ == "__main__":
    sys.exit(main(["examples", *sys.argv[1:]]))
