"""The compiled parameter path: the extension module ``rxcuda.cuda._hotpath`` (``_hotpath.c``), built with the
package (setup.py: ``pip install .``, ``pip wheel .``, and the editable ``pip install -e .``, which builds it in
place); pure Python without it.

One parameter change, from the setter to its exec-node update, is a handful of Python calls, which cost more than
the driver call itself. ``_hotpath`` does them in C: ``ParamBase`` (the fields and ``value`` setter of
rxcuda.blocks.Parameter) and ``PendingBase`` (the hot fields and fold of the engine's pending plan) take a value
from the setter into the pending plan, ``drain_one`` takes a single pending value under the pending plan's lock
and applies it, and an ``Apply`` per hot parameter writes it and calls the driver's function through its address
(see the C file's comment for the contracts). The C file knows no field of the Python classes: each class hands
its own names over when its base is made (``param_base``, from rxcuda.blocks._params; ``pending_base``, from
rxcuda.engine._runtime with rxcuda.streams.PendingPlan's ``HOT_FIELDS``).

Importing rxcuda compiles nothing. Where the module was not built (the install had no C compiler or no Python
headers: the extension is optional), was built from another ``_hotpath.c`` than the one beside it (a checkout that
changed the C file since its last ``pip install -e .``: the module's ``SOURCE`` digest, from setup.py, says which
source it was built from), or ``RXCUDA_NATIVE=0`` is set, :func:`hotpath` returns None and rxcuda keeps its Python
path: the same results, at twice the host's instructions per change (~1 µs more on an H200 host). The first time
it is missing is logged once, with the reason and the fix.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import threading
from pathlib import Path
from types import ModuleType

log = logging.getLogger("rxcuda")

MODULE = "rxcuda.cuda._hotpath"
ENV = "RXCUDA_NATIVE"  # "0": never load it (the Python path only)
_lock = threading.Lock()
_loaded: ModuleType | None = None
_tried = False
why_not = ""  # why hotpath() is None ("" while it was never asked or it loaded)


def hotpath() -> ModuleType | None:
    """The compiled ``_hotpath`` module; None where it was not built or is turned off (the reason is in
    :data:`why_not`, and logged once)."""
    global _loaded, _tried, why_not
    if _tried:
        return _loaded
    with _lock:
        if _tried:
            return _loaded
        if os.environ.get(ENV, "1") == "0":
            why_not = f"{ENV}=0 is set"
        else:
            try:
                _loaded = importlib.import_module(MODULE)
                why_not = stale(_loaded)
            except ImportError as e:  # built without a compiler, or for another interpreter
                why_not = f"{type(e).__name__}: {e}"
            if why_not:
                _loaded = None
                log.warning("rxcuda: the compiled parameter path is not available (%s); parameter changes take the "
                            "Python path, ~1 us slower each. It is built when rxcuda is installed on a machine with "
                            "a C compiler and the Python headers (e.g. apt install gcc python3-dev, then install "
                            "rxcuda again: pip install -e . in its checkout, or build and install its wheel there); "
                            "set %s=0 to silence this", why_not, ENV)
        _tried = True
        return _loaded


def stale(module: ModuleType) -> str:
    """Why ``module`` (the compiled ``_hotpath``) must not be used: it was built from another ``_hotpath.c`` than the
    one beside it (its ``SOURCE``, the digest setup.py gave it, differs from that file's); "" where it may (no source
    beside it, as in an installed wheel, which carries the module built with it, or the same digest)."""
    source = Path(module.__file__ or "").with_name("_hotpath.c")
    if not source.is_file():
        return ""
    built = getattr(module, "SOURCE", None)
    if built == hashlib.sha256(source.read_bytes()).hexdigest():
        return ""
    return (f"{Path(module.__file__ or '').name} was built from "
            f"{'another' if built else 'an older'} {source.name} than the one beside it, {source}; build it again")


def describe() -> str:
    """Which parameter path runs, in one line: the compiled module's file, or "Python" and why (the test run's summary
    and the GPU batch's log say it, since the tests of the compiled path skip where it is missing)."""
    module = hotpath()
    return f"compiled ({module.__file__})" if module is not None else f"Python ({why_not})"


def reset() -> None:
    """Forget what :func:`hotpath` found, so the next call looks again (tests; an environment that changed)."""
    global _loaded, _tried, why_not
    with _lock:
        _loaded, _tried, why_not = None, False, ""
