"""Methods a lower class declares whose work an upper package does: ``engine.serve()``, ``engine.to_dot()``,
``plan.to_dot()``, ... (docs/architecture.md, "The rules"). The class declares the method, with its signature and
docstring (so the API reference, type checkers and editors see it where users call it); the method calls the
function the upper package provided here, by name. ``rxcuda.view`` provides its functions when it is imported,
and ``import rxcuda`` imports it, so the lower package never imports the upper one.

The upper functions import their optional extras (aiohttp, Graphviz, matplotlib, ipywidgets) only when called,
and a missing one raises an error naming the extra to install (``pip install '.[view]'``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_functions: dict[str, Callable[..., Any]] = {}


def provide(**functions: Callable[..., Any]) -> None:
    """The upper package's functions, by the names the lower classes call them by."""
    _functions.update(functions)


def provided(name: str) -> Callable[..., Any]:
    """The function provided as ``name``; an ImportError saying what to import where none was (rxcuda.view did not
    load)."""
    fn = _functions.get(name)
    if fn is None:
        raise ImportError(f"{name} is done by rxcuda.view, which is not loaded: `import rxcuda.view` (`import rxcuda` "
                          f"does) and see why it fails")
    return fn


__all__ = ["provide", "provided"]
