"""Text for the DOT pictures (``_dot`` draws the pipeline, ``_plandot`` the graph plan): quoting, labels,
types and sizes as the pictures show them.

>>> print(quote('say "hi"'), type_text("f32", (64, 64)), size_text(16384))
"say \\"hi\\"" f32[64x64] 16 KiB
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable

from ..model import _dtypes

_FONT = 'fontname="Helvetica"'


# -- text helpers -------------------------------------------------------------------------------------------
def quote(text: object) -> str:
    r"""``text`` as a quoted DOT string: quotes and backslashes escaped, line breaks as ``\n``.

    >>> print(quote('say "hi"'))
    "say \"hi\""
    """
    s = str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\r\n", "\n").replace("\n", "\\n")
    return f'"{s}"'


def _lines(*parts: str) -> str:
    """Several lines as one quoted DOT label (each part escaped, joined by centred line breaks)."""
    return quote("\n".join(p for p in parts if p))


def _h(text: object) -> str:
    """``text`` for an HTML-like label (``&``, ``<``, ``>`` and quotes escaped)."""
    return html.escape(str(text), quote=True)


def _ident(text: str) -> str:
    """A bare DOT identifier made from ``text`` (letters, digits and underscores)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text, flags=re.ASCII)


size_text = _dtypes.format_bytes  # bytes for a label: "16 KiB", "1.5 MiB", "12 B"


def _dtype_text(dtype: str | None) -> str:
    if dtype is None:
        return "any"
    struct = _dtypes.struct_type(dtype)
    return struct.name if struct is not None else dtype


def type_text(dtype: str | None, shape: Iterable[int]) -> str:
    """A port's type as labels show it: ``f32[4096]``, ``f32[64x64]``, ``float4[1024]``, ``any[1]``."""
    return f"{_dtype_text(dtype)}[{'x'.join(str(int(d)) for d in shape)}]"


def _nbytes(dtype: str | None, shape: Iterable[int]) -> int | None:
    if dtype is None:
        return None
    try:
        return _dtypes.itemsize(dtype) * math.prod(shape)
    except (ValueError, TypeError, KeyError):
        return None


def _value_text(v: object) -> str:
    return repr(v) if isinstance(v, float) else str(v)
