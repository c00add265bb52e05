"""Headers a CUDA source includes: the ones on disk (their contents key the compile cache) and where the
CUDA toolkit's own headers (``<cuda_fp16.h>``, ``<cuda_runtime.h>``, ...) are installed.

NVRTC knows only a few built-in headers; the toolkit's others come from its ``include`` folder, found by
:func:`toolkit_include_dir` in this order: ``$CUDA_HOME`` / ``$CUDA_PATH`` (the user said so), then
``cuda.pathfinder`` (NVIDIA's wheels, conda, the installed toolkit), then ``/usr/local/cuda``. Where there
is none, NVRTC's bundled copies (``options={"use_bundled_headers": True}``) still serve.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger("rxcuda")

_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)
_KEY_SALT = b"rxcuda-nvrtc-1"
_PROBE = "cuda_runtime.h"  # in the toolkit's include folder, beside cuda_fp16.h and the rest


def header_files(source: str, base_dir: Path | None, include_paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The headers on disk a source includes, transitively, in the order first seen. Headers that are
    not found in ``base_dir`` (for ``"..."``) or ``include_paths`` are left out: NVRTC's version and the
    toolkit folder (part of the compile options) cover them."""
    paths = [Path(p) for p in include_paths]
    seen: dict[Path, None] = {}
    stack: list[tuple[str, Path | None]] = [(source, base_dir)]
    while stack:
        text, here = stack.pop()
        for m in _INCLUDE_RE.finditer(text):
            quote, name = m.group(1), m.group(2)
            candidates = ([here] if quote == '"' and here is not None else []) + paths
            for d in candidates:
                p = d / name
                if p.is_file():
                    p = p.resolve()
                    if p not in seen:
                        seen[p] = None
                        with contextlib.suppress(OSError):
                            stack.append((p.read_text(encoding="utf-8", errors="replace"), p.parent))
                    break
    return list(seen)


def headers_digest(headers: Iterable[Path]) -> bytes:
    """SHA-256 over the paths and contents of ``headers`` (a header edited is a cache miss)."""
    h = hashlib.sha256(_KEY_SALT)
    for p in headers:
        h.update(str(p).encode() + b"\0")
        try:
            h.update(p.read_bytes())
        except OSError:
            h.update(b"<unreadable>")
        h.update(b"\0")
    return h.digest()


def includes_system_headers(source: str) -> bool:
    """Whether the source has an ``#include <...>`` (which may need the toolkit's headers)."""
    return any(m.group(1) == "<" for m in _INCLUDE_RE.finditer(source))


def toolkit_include_dir() -> Path | None:
    """The ``include`` folder of an installed CUDA toolkit, or ``None``. Looked up once per process and
    per ``$CUDA_HOME``/``$CUDA_PATH`` value."""
    return _toolkit_include_dir(os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"))


@functools.cache
def _toolkit_include_dir(cuda_home: str | None, cuda_path: str | None) -> Path | None:
    for root in (cuda_home, cuda_path):
        if root and (Path(root) / "include" / _PROBE).is_file():
            return Path(root) / "include"
    try:
        from cuda.pathfinder import locate_nvidia_header_directory

        found = locate_nvidia_header_directory("cudart")
        if found is not None and found.abs_path and (Path(found.abs_path) / _PROBE).is_file():
            return Path(found.abs_path)
    except Exception as e:  # pathfinder is best-effort here: the standard place is tried next
        log.debug("cuda.pathfinder found no toolkit headers: %s", e)
    standard = Path("/usr/local/cuda/include")
    return standard if (standard / _PROBE).is_file() else None


def missing_header_hint(log_text: str, toolkit: Path | None) -> str:
    """A sentence for a compile log that says a system header could not be opened, else ''."""
    m = re.search(r'cannot open source file "([^"]+)"|could not open source file "([^"]+)"', log_text)
    if m is None:
        return ""
    header = m.group(1) or m.group(2)
    if toolkit is None:
        return (f"'{header}' is a CUDA toolkit header and no toolkit was found (set CUDA_HOME to one, or "
                f"pip install nvidia-cuda-runtime); or compile with NVRTC's own copies: "
                f"options={{'use_bundled_headers': True}} (use_bundled_headers=True)")
    return (f"'{header}' is not in the CUDA toolkit headers at {toolkit} nor in include_paths; add its "
            f"folder to include_paths, or try options={{'use_bundled_headers': True}}")
