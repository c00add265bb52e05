"""Kernel files on disk: reading source text (a decoding error names the line), the message for a missing
file (with *did you mean* among its neighbours of the same kind), and the names of the kernels shipped in the
package (``rxcuda.kernels``)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from pathlib import Path


def missing_file_message(path: Path, suffixes: Iterable[str], what: str = "file") -> str:
    """``'<path>: no such <what>; did you mean a.cu?'``: close names among the files of the same folder
    whose suffix is one of ``suffixes`` (or that the folder itself is missing)."""
    folder = path.parent
    if not folder.is_dir():
        return f"{path}: no such {what} (the folder {folder} does not exist)"
    kinds = {s.lower() for s in suffixes}
    names = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in kinds)
    msg = f"{path}: no such {what}"
    close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.6)
    if close:
        msg += f"; did you mean {', '.join(close)}?"
    return msg


def decode_text(data: bytes, name: str, error: Callable[[str], Exception]) -> str:
    """``data`` as UTF-8 text; otherwise ``error(message)`` is raised, the message naming the line and
    column of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise error(f"{name}:{line}:{column}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the file as "
                    f"UTF-8") from None


def read_text(path: Path, suffixes: Iterable[str], what: str, error: Callable[[str], Exception]) -> str:
    """The UTF-8 text of ``path``; ``error(message)`` is raised when it is missing (with *did you mean*),
    is a folder, cannot be read, or is not UTF-8 (naming the line)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(missing_file_message(path, suffixes, what)) from None
    except IsADirectoryError:
        raise error(f"{path}: is a folder, not a {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    return decode_text(data, str(path), error)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def shipped_kernel(source: object, suffix: str = ".ptx") -> Path | None:
    """The shipped kernel file ``source`` names (with ``suffix``), when ``source`` is a bare name: a str with
    no folder and no suffix that is not an existing file (``"vector_add"``); ``None`` for anything else.

    A bare name that rxcuda does not ship raises KernelFileError with *did you mean* among the shipped names.
    """
    if not isinstance(source, str) or not _NAME.fullmatch(source) or Path(source).exists():
        return None
    from .. import kernels  # rxcuda.kernels: the repository's kernels/ folder, mapped into the package
    from ..model._errors import KernelFileError

    try:
        return kernels.path(source + suffix)
    except KernelFileError as e:
        raise KernelFileError(f"{e}; a path to a kernel file works too, e.g. './{source}.ptx'",
                              path=source) from None


def shipped_hint(path: Path) -> str:
    """For a missing ``kernels/<name>.<ext>`` (a path copied from the repository): how to load the kernel of
    that name that rxcuda ships instead; '' when there is none."""
    from .. import kernels

    if path.stem not in kernels.names():
        return ""
    return (f" (rxcuda ships a kernel of that name: load it by name, Block.from_kernel({path.stem!r}, ...), "
            f"or its file, rxcuda.kernels.path({path.name!r}))")
