"""The compiled parameter path: ``_hotpath.c``, built on first use with the host's C compiler, pure Python without.

One parameter change, from the setter to its exec-node update, is a handful of Python calls, which cost more than
the driver call itself. ``_hotpath`` does them in C: ``ParamBase`` (the fields and ``value`` setter of
rxcuda.blocks.Parameter) and ``PendingBase`` (the hot fields and fold of the engine's pending plan) take a value
from the setter into the pending plan, ``drain_one`` takes a single pending value under the pending plan's lock
and applies it, and an ``Apply`` per hot parameter writes it and calls the driver's function through its address
(see the C file's comment for the contracts).

The module is compiled once per machine and Python (``cc -O2 -shared``, ~0.3 s) into
``cache_dir()/native``, keyed by a digest of the source, the interpreter and the compiler, and loaded from there
afterwards; the first ``import rxcuda`` asks for it (Parameter's base is chosen then). Where there is no compiler
or no Python headers, or ``RXCUDA_NATIVE=0`` is set, :func:`hotpath` returns None and rxcuda keeps its Python
path: the same results, at twice the host's instructions per change (~1 µs more on an H200 host). The first
failure is logged once, with the reason and the fix.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from ._paths import cache_dir

log = logging.getLogger("rxcuda")

SOURCE = Path(__file__).with_name("_hotpath.c")
ENV = "RXCUDA_NATIVE"  # "0": never build or load it (the Python path only)
_lock = threading.Lock()
_loaded: ModuleType | None = None
_tried = False
why_not = ""  # why hotpath() is None ("" while it was never asked or it loaded)


def hotpath() -> ModuleType | None:
    """The compiled ``_hotpath`` module, built on the first call where needed; None where it cannot be (the
    reason is in :data:`why_not`, and logged once)."""
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
                _loaded = _load(build())
            except Exception as e:  # no compiler, no headers, a read-only cache, a failed load
                why_not = f"{type(e).__name__}: {e}"
                log.warning("rxcuda: the compiled parameter path is not available (%s); parameter changes take the "
                            "Python path, ~1 us slower each. Install a C compiler and the Python headers (e.g. "
                            "apt install gcc python3-dev) to use it, or set %s=0 to silence this", why_not, ENV)
        _tried = True
        return _loaded


def reset() -> None:
    """Forget what :func:`hotpath` found, so the next call looks again (tests; an environment that changed)."""
    global _loaded, _tried, why_not
    with _lock:
        _loaded, _tried, why_not = None, False, ""


def _compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = shlex.split(cc)
    if not argv or shutil.which(argv[0]) is None:
        for name in ("cc", "gcc", "clang"):
            if shutil.which(name):
                return [name]
        raise FileNotFoundError(f"no C compiler found (tried {cc!r}, cc, gcc, clang)")
    return argv


def build(directory: Path | None = None) -> Path:
    """The compiled module's path, compiling it into ``directory`` (default ``cache_dir()/native``) unless a
    build of this source for this interpreter and compiler is there already. Raises with the compiler's
    output when it fails."""
    cc = _compiler()
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise FileNotFoundError(f"the Python headers are missing ({include}/Python.h)")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    src = SOURCE.read_bytes()
    digest = hashlib.sha256(src + repr((sys.version, sys.platform, cc, include)).encode()).hexdigest()[:16]
    out_dir = Path(directory) if directory is not None else cache_dir() / "native"
    out = out_dir / f"_hotpath-{digest}{suffix}"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".hotpath-", suffix=suffix, dir=out_dir)
    os.close(fd)
    try:
        cmd = [*cc, "-O2", "-shared", "-fPIC", "-fno-strict-aliasing", f"-I{include}", str(SOURCE), "-o", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode:
            said = (done.stderr or done.stdout).strip()[:800]
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {said}")
        os.replace(tmp, out)  # atomic: a concurrent build of the same digest writes the same bytes
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("rxcuda.cuda._hotpath", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
