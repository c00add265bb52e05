"""The kernels shipped with rxcuda (installed as ``rxcuda.kernels``): small float32 kernels, each as CUDA source
(``.cu``), PTX built from it (``.ptx``) and a JSON sidecar (``.json``) naming its parameters.

``Block.from_kernel("vector_add", size=n)`` loads one by name from any directory; :func:`path` gives its file
and :func:`names` lists them (README.md in this folder says what each computes).

>>> from rxcuda import kernels
>>> kernels.names()
['append_above', 'saxpy', 'scalar_mul', 'vector_add', 'vector_add3', 'vector_sub']
>>> kernels.path("vector_add").name, kernels.path("vector_add.cu").name
('vector_add.ptx', 'vector_add.cu')
"""

from __future__ import annotations

import difflib
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SUFFIXES = (".ptx", ".cu", ".json")

__all__ = ["names", "path"]


def names() -> list[str]:
    """The names of the shipped kernels, sorted (each has a ``.ptx``, ``.json`` and ``.cu`` file)."""
    return sorted(p.stem for p in _HERE.glob("*.ptx"))


def path(name: str) -> Path:
    """The shipped file of kernel ``name``: its ``.ptx`` for a bare name, else the file with that suffix
    (``"vector_add.cu"`` for its source, ``"vector_add.json"`` for its sidecar).

    Raises :class:`rxcuda.KernelFileError` (*did you mean* among the shipped names) for a name rxcuda does
    not ship.

    >>> path("scalar_mul").read_text().count(".entry scalar_mul")
    1
    """
    stem, suffix = (name[: -len(s)], s) if (s := Path(name).suffix) in _SUFFIXES else (name, ".ptx")
    found = _HERE / f"{stem}{suffix}"
    # a shipped kernel is a plain name with a .ptx here (two stats: cheaper than listing the folder)
    if stem and Path(stem).name == stem and not stem.startswith(".") and found.is_file() and (
            suffix == ".ptx" or (_HERE / f"{stem}.ptx").is_file()):
        return found
    from ..model._errors import KernelFileError

    shipped = names()
    close = difflib.get_close_matches(stem, shipped, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise KernelFileError(f"no kernel named {stem!r} ships with rxcuda; {hint}the shipped kernels are "
                          f"{', '.join(shipped)} (files {', '.join(_SUFFIXES)})", path=name)
