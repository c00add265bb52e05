"""rxcuda.cuda._heap: glibc keeps the PTX JIT's working memory mapped (trim threshold and top pad), once, opt-out."""

import subprocess
import sys
import textwrap

import pytest

from rxcuda.cuda import NullDriver
from rxcuda.cuda._heap import wanted
from rxcuda.cuda._kernels import load_module

# a fresh process mallocs 8 MB in 32 KiB chunks (below the mmap threshold: they live on the heap), frees them
# from the top down, and prints how far the heap's break moved back down: glibc trims it by default
_TRIM = textwrap.dedent("""
    import ctypes, sys
    from rxcuda.cuda._heap import keep_jit_heap
    kept = keep_jit_heap() if sys.argv[1] == "keep" else None
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes, libc.sbrk.restype, libc.sbrk.argtypes = (ctypes.c_void_p,), ctypes.c_void_p, (ctypes.c_long,)
    blocks = [libc.malloc(32 << 10) for _ in range(256)]
    top = libc.sbrk(0)
    for b in reversed(blocks):
        libc.free(b)
    print(kept, top - libc.sbrk(0))
""")


def _trimmed(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", _TRIM, mode], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_the_kept_heap_is_not_trimmed_when_freed_and_the_default_one_is():
    kept, back = _trimmed("keep")
    assert kept == "True" and back == 0
    kept, back = _trimmed("default")
    assert kept == "None" and back >= 4 << 20  # glibc's default trims the freed top of the heap


def test_rxcuda_keep_heap_0_and_glibcs_own_variables_leave_the_heap_alone():
    assert wanted({"RXCUDA_KEEP_HEAP": "0"}) is False
    assert wanted({"MALLOC_TRIM_THRESHOLD_": "131072"}) is False
    assert wanted({"MALLOC_TOP_PAD_": "0"}) is False
    assert wanted({"RXCUDA_KEEP_HEAP": "1"}) is True and wanted({}) is True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_rxcuda_keep_heap_0_in_the_environment_keeps_glibcs_default():
    out = subprocess.run([sys.executable, "-c", _TRIM, "keep"], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "RXCUDA_KEEP_HEAP": "0"}).stdout.split()
    assert out[0] == "False" and int(out[1]) >= 4 << 20


def test_a_null_driver_load_does_not_touch_the_heap(monkeypatch):
    calls = []
    monkeypatch.setattr("rxcuda.cuda._kernels.keep_jit_heap", lambda: calls.append(1))
    load_module(b".version 7.0", ptx=True, optimization_level=0, api=NullDriver()).close()
    assert calls == []
