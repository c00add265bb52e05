"""The examples shipped with rxcuda (installed as ``rxcuda.examples``): runnable pipelines, each a script.

Run one from any directory as ``python -m rxcuda.examples.particles`` (or ``rxcuda examples particles``);
``python -m rxcuda.examples`` (or ``rxcuda examples``) lists them with what each shows. Where there is no CUDA
device they run on the CPU device (docs/cpu.md), saying so in their first line; docs/examples.md says what each
needs (a GPU, an extra).

>>> from rxcuda import examples
>>> "quickstart" in examples.names()
True
>>> examples.describe("quickstart")
'Quickstart: two shipped kernels, connected, launched as one CUDA graph per frame.'
"""

from __future__ import annotations

import ast
import difflib
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

_HERE = Path(__file__).resolve().parent

__all__ = ["describe", "names", "run"]


def names() -> list[str]:
    """The examples' names, sorted (``python -m rxcuda.examples.<name>`` runs one)."""
    return sorted(p.stem for p in _HERE.glob("*.py") if not p.stem.startswith("_"))


def describe(name: str) -> str:
    """The first line of example ``name``'s docstring: what it shows. Read from the file, not imported (an
    example runs when it is imported)."""
    doc = ast.get_docstring(ast.parse(_path(name).read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def run(name: str, args: Sequence[str] = ()) -> None:
    """Run example ``name`` as ``python -m rxcuda.examples.<name> ARGS`` would, in this process (``sys.argv``
    is set for it and restored afterwards). An example that cannot run raises SystemExit with its reason."""
    _path(name)  # an unknown name: ValueError with did you mean
    saved = sys.argv[:]
    sys.argv = [f"rxcuda.examples.{name}", *args]
    try:
        runpy.run_module(f"{__name__}.{name}", run_name="__main__", alter_sys=True)
    finally:
        sys.argv = saved


def _path(name: str) -> Path:
    if name in names():
        return _HERE / f"{name}.py"
    close = difflib.get_close_matches(name, names(), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ValueError(f"no example named {name!r}; {hint}the examples are {', '.join(names())}")
