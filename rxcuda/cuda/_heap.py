"""Keep the C heap mapped between PTX JITs: glibc's trim threshold and top pad, set once per process.

Why: the driver's PTX JIT (``cuModuleLoadData`` of PTX) works in ~4 MB of ``malloc`` memory that it frees again.
With glibc's defaults that memory goes back to the kernel when it is freed (the heap's top is trimmed above
128 KiB) and is faulted in again, page by page, by the next JIT: ~900 minor page faults per JIT of
``rxcuda.tensor``'s first tier of a new kernel. With a trim threshold of 64 MiB and a 16 MiB top pad the heap
keeps that memory and the JIT faults nothing. Measured on H200 hosts (the JIT of an empty kernel alone takes
5-10 ms there, varying from process to process): a new tensor kernel 10.1-10.7 -> 8.1-8.4 ms on one host,
``bench/tensor.py``'s factory-miss row 14.4-14.5 -> 10.5-12.8 ms on another.

The cost: up to :data:`TRIM_THRESHOLD` bytes of freed heap stay mapped in the process. It is set at the first PTX
JIT (nothing happens for cubins), only on glibc, and not at all where ``RXCUDA_KEEP_HEAP=0`` is in the
environment or the user already tuned glibc through its ``MALLOC_TRIM_THRESHOLD_``/``MALLOC_TOP_PAD_``
variables (theirs win).

>>> wanted({"RXCUDA_KEEP_HEAP": "0"}), wanted({"MALLOC_TOP_PAD_": "0"}), wanted({})
(False, False, True)
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading

TRIM_THRESHOLD = 64 << 20  # freed heap above this at the top is returned to the kernel (glibc's default: 128 KiB)
TOP_PAD = 16 << 20  # the heap grows by this much more than asked, so a JIT's working memory is there already
_M_TRIM_THRESHOLD, _M_TOP_PAD = -1, -2  # glibc's mallopt parameters (malloc.h)
_DONE: list[bool] = []  # set once per process: [whether the heap is kept]
_LOCK = threading.Lock()


def wanted(environ) -> bool:
    """Whether ``environ`` lets rxcuda tune the heap: not where ``RXCUDA_KEEP_HEAP=0`` is set, nor where the user
    tuned glibc through its own ``MALLOC_TRIM_THRESHOLD_``/``MALLOC_TOP_PAD_`` (theirs win)."""
    return not (environ.get("RXCUDA_KEEP_HEAP", "1") == "0" or "MALLOC_TRIM_THRESHOLD_" in environ
                or "MALLOC_TOP_PAD_" in environ)


def keep_jit_heap() -> bool:
    """Set glibc's trim threshold and top pad once per process, where :func:`wanted` (see the module's note);
    whether the heap is kept. Later calls return the first call's answer."""
    if not _DONE:
        with _LOCK:
            if not _DONE:
                _DONE.append(wanted(os.environ) and _mallopt())
    return _DONE[0]


def _mallopt() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt, gnu = libc.mallopt, libc.gnu_get_libc_version  # glibc only (musl has no gnu_get_libc_version)
    except (OSError, AttributeError):
        return False
    del gnu
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(_M_TOP_PAD, TOP_PAD))
