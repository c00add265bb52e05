"""Checking what a page sends the live view (``rxcuda/view/PROTOCOL.md``), in pure Python.

Every message from a page is refused unless it is a JSON object of a known ``type`` with exactly the keys
that type takes, within :data:`MAX_MESSAGE` bytes. A refusal is a :class:`Refused` whose text is what the
page shows; nothing changes. ``set`` is checked here only for what JSON carries (a known block and
parameter, a number); the server then sets it through the public path, ``block.set(name=value)``, so every
check Python makes (type, range, counts) refuses it the same way, and :func:`for_page` words that refusal
for a web page.

>>> parse('{"type":"ping"}')
{'type': 'ping'}
>>> parse('{"type":"set","block":"mul"}')
Traceback (most recent call last):
...
rxcuda.view._protocol.Refused: 'set' needs the keys block, param, value (missing: param, value)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

MAX_MESSAGE = 4096  # bytes of one page message
MAX_NAME = 256  # characters of a block, port or parameter name
PREVIEW_KINDS = ("line", "hist")

# type -> (required keys, optional keys), besides "type"
MESSAGES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "hello": ((), ("token",)),
    "set": (("block", "param", "value"), ("id",)),
    "preview": (("block", "port"), ("kind",)),
    "unpreview": (("block", "port"), ()),
    "ping": ((), ()),
}


class Refused(ValueError):
    """A page message the live view refuses; its text is sent back as ``{"type": "error", ...}``."""


def _no_constants(name: str):
    raise Refused(f"{name} is not a number the live view takes; send a finite number")


def parse(text: str | bytes) -> dict[str, Any]:
    """One page message: a JSON object with a known ``type`` and exactly its keys; else :class:`Refused`."""
    size = len(text.encode("utf-8") if isinstance(text, str) else text)
    if size > MAX_MESSAGE:
        raise Refused(f"message too long: {size} bytes (at most {MAX_MESSAGE})")
    try:
        msg = json.loads(text, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        if isinstance(e, Refused):
            raise
        raise Refused(f"not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise Refused(f"a message is a JSON object with a 'type' (got {type(msg).__name__})")
    kind = msg.get("type")
    if kind not in MESSAGES:
        raise Refused(f"unknown message type {kind!r}; the page sends {', '.join(MESSAGES)}")
    required, optional = MESSAGES[kind]
    missing = [k for k in required if k not in msg]
    if missing:
        raise Refused(f"'{kind}' needs the keys {', '.join(required)} (missing: {', '.join(missing)})")
    extra = sorted(set(msg) - {"type", *required, *optional})
    if extra:
        raise Refused(f"'{kind}' takes the keys {', '.join((*required, *optional)) or 'none'}, not "
                      f"{', '.join(extra)}")
    for key in ("block", "param", "port"):
        if key in msg and (not isinstance(msg[key], str) or not msg[key] or len(msg[key]) > MAX_NAME):
            raise Refused(f"'{kind}': '{key}' must be a name (a non-empty string of at most {MAX_NAME} "
                          f"characters), got {_short(msg[key])}")
    return msg


def find_block(blocks: Mapping[str, Any], name: str):
    """The block called ``name``; :class:`Refused` naming the blocks there are."""
    block = blocks.get(name)
    if block is None:
        known = ", ".join(sorted(blocks)[:20]) or "none"
        raise Refused(f"no block '{name}' in this engine (blocks: {known})")
    return block


def check_set(msg: Mapping[str, Any], blocks: Mapping[str, Any]):
    """``(block, parameter name, value)`` for a ``set`` message: a known block and parameter and a JSON number
    (a whole float such as ``3.0`` becomes ``3`` for an integer parameter: JavaScript has one number type).
    The value itself is checked where Python's are, by ``block.set``; :class:`Refused` says what is wrong."""
    block = find_block(blocks, msg["block"])
    name = msg["param"]
    prm = block.params.get(name)
    if prm is None:
        raise Refused(f"{block.name} has no parameter '{name}' (parameters: {', '.join(block.params) or 'none'})")
    value = msg["value"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refused(f"{block.name}.{name} ({prm.dtype}) takes a number (got {_short(value)})"
                      + _range_text(prm))
    if isinstance(value, float) and value.is_integer() and prm.dtype[0] in "iu" and math.isfinite(value):
        value = int(value)  # JavaScript has one number type: 3.0 for an integer box is 3
    return block, name, value


# the library's words for Python users -> a web page's (the library's own messages stay as they are)
_PAGE_WORDS = (
    (re.compile(r"an integer: a Python or NumPy int\b"), "a whole number"),
    (re.compile(r"a number: a Python or NumPy int or float\b"), "a number"),
    (re.compile(r"a Python or NumPy (int|integer)\b"), "a whole number"),
    (re.compile(r"a Python or NumPy float\b"), "a number"),
    (re.compile(r"\(got (.*?), an? [A-Za-z_.]+\)"), r"(got \1)"),  # "(got 2.5, a float)": the type is Python's
)


def for_page(message: str) -> str:
    """A refusal from the library, worded for a web page: no Python type names.

    >>> for_page("loop.n (i32) takes an integer: a Python or NumPy int (got 2.5, a float)")
    'loop.n (i32) takes a whole number (got 2.5)'
    >>> for_page("mul.scale (f32) must be within [0.0, 10.0], its declared range (got 11.0)")
    'mul.scale (f32) must be within [0.0, 10.0], its declared range (got 11.0)'
    """
    for pattern, words in _PAGE_WORDS:
        message = pattern.sub(words, message)
    return message


def check_preview(msg: Mapping[str, Any], blocks: Mapping[str, Any]):
    """``(block, port, kind)`` for a ``preview`` or ``unpreview`` message; :class:`Refused` otherwise."""
    block = find_block(blocks, msg["block"])
    port = msg["port"]
    names = [p.name for p in block.description.ports]
    if port not in names:
        raise Refused(f"{block.name} has no port '{port}' (ports: {', '.join(names) or 'none'})")
    kind = msg.get("kind", "line")
    if kind not in PREVIEW_KINDS:
        raise Refused(f"a preview is drawn as {' or '.join(PREVIEW_KINDS)} (got {_short(kind)})")
    return block, port, kind


def _range_text(prm) -> str:
    lo, hi = getattr(prm, "min", None), getattr(prm, "max", None)
    if lo is None and hi is None:
        return ""
    return f"; allowed: {lo if lo is not None else '-inf'} to {hi if hi is not None else 'inf'}"


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["MAX_MESSAGE", "MESSAGES", "PREVIEW_KINDS", "Refused", "check_preview", "check_set", "find_block",
           "for_page", "parse"]
