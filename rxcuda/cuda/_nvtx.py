"""NVTX ranges, so Nsight Systems shows the engine's phases (tick, apply per tier, rebuild, capture, compile,
reload) on the timeline next to the kernels.

Free unless a tool is collecting. Whether ranges are made is decided once, at import: ``ENABLED`` is true
when the ``nvtx`` package (the optional extra ``view``) imports and is itself enabled (no
``NVTX_DISABLE``), and a tool is collecting: Nsight Systems sets ``NVTX_INJECTION64_PATH`` in the process it
profiles. ``RXCUDA_NVTX=1`` makes ranges whenever ``nvtx`` imports (another collector); ``RXCUDA_NVTX=0``
never makes them.

When ``ENABLED`` is false nothing here touches the frame path: the engine, the updater, the builder and the
hot reloader check it once, when they are made, and only then replace their methods by ranged ones
(:func:`instrument`). :func:`range` (for rare paths: compile) returns a shared no-op context.

Under Nsight:

    nsys profile -t cuda,nvtx python my_pipeline.py

shows an ``rxcuda`` row with ``tick`` ranges holding ``apply parameters`` / ``apply structure`` /
``rebuild`` / ``capture`` / ``compile NAME`` / ``reload BLOCK/KERNEL``.

>>> from rxcuda.cuda import _nvtx
>>> with _nvtx.range("compile"):   # a no-op unless Nsight (or RXCUDA_NVTX=1) collects
...     pass
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

DOMAIN = "rxcuda"  # the row Nsight Systems shows the ranges under
COLORS = {"tick": "green", "apply": "orange", "rebuild": "red", "capture": "purple", "compile": "blue",
          "reload": "yellow"}

ENABLED = False  # set by detect() at import: nvtx imports and a tool collects
_nvtx: Any = None  # the nvtx module while ENABLED
_NULL = contextlib.nullcontext()


def detect(environ: dict | None = None) -> bool:
    """Decide (again) whether ranges are made; sets and returns ``ENABLED``. Called once at import: objects
    made before a change keep the choice they made (tests call this after faking the environment)."""
    global ENABLED, _nvtx
    env = os.environ if environ is None else environ
    ENABLED, _nvtx = False, None
    wanted = env.get("RXCUDA_NVTX", "").strip().lower()
    if wanted in ("0", "false", "no", "off"):
        return False
    if wanted not in ("1", "true", "yes", "on") and not env.get("NVTX_INJECTION64_PATH"):
        return False  # nothing collects: ranges would be thrown away
    try:
        import nvtx
    except ImportError:
        return False
    enabled = getattr(nvtx, "enabled", None)
    if enabled is not None and not enabled():
        return False
    ENABLED, _nvtx = True, nvtx
    return True


def _color(name: str) -> str:
    return COLORS.get(name.split(" ", 1)[0], "gray")


def push(name: str) -> None:
    """Open a range named ``name`` on this thread (no-op unless ``ENABLED``)."""
    if ENABLED:
        _nvtx.push_range(message=name, color=_color(name), domain=DOMAIN)


def pop() -> None:
    """Close this thread's innermost range (no-op unless ``ENABLED``)."""
    if ENABLED:
        _nvtx.pop_range(domain=DOMAIN)


@contextlib.contextmanager
def _ranged(name: str) -> Iterator[None]:
    push(name)
    try:
        yield
    finally:
        pop()


def range(name: str) -> contextlib.AbstractContextManager:
    """A context manager that is one NVTX range while ``ENABLED``, else a shared no-op (a function call)."""
    return _ranged(name) if ENABLED else _NULL


def ranged(fn: Callable, name: str | Callable[..., str]) -> Callable:
    """``fn`` wrapped in a range; ``name`` is the range's name, or a function of ``fn``'s arguments that
    makes it (called only while collecting)."""
    naming = callable(name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        push(name(*args, **kwargs) if naming else name)  # type: ignore[operator]
        try:
            return fn(*args, **kwargs)
        finally:
            pop()

    return wrapper


def instrument(obj: object, **names: str | Callable[..., str]) -> bool:
    """While ``ENABLED``, replace each named method of ``obj`` (``instrument(engine, _tick="tick")``) by
    itself in a range, as an attribute of that one object (a name ``obj`` lacks is skipped); otherwise do
    nothing. Returns ``ENABLED``.

    Called where the object is made, so an object made while nothing collects runs its own methods
    unchanged: not even a flag is checked per call."""
    if not ENABLED:
        return False
    for method, name in names.items():
        fn = getattr(obj, method, None)
        if fn is not None:
            setattr(obj, method, ranged(fn, name))
    return True


detect()

__all__ = ["DOMAIN", "ENABLED", "detect", "instrument", "pop", "push", "range", "ranged"]
