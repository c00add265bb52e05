"""Page-locked host memory for copies between a device and another process: memory the driver allocates pinned
(``cuMemHostAlloc``) and memory mapped from elsewhere (a shared-memory file) that the driver pins in place
(``cuMemHostRegister``), so that a copy to or from it is a DMA transfer at the bus's pace, queued on a stream,
instead of a copy the driver stages through its own buffer before it returns.

>>> from rxcuda.cuda import NullDriver
>>> api = NullDriver()
>>> ring = PinnedRing(api, depth=2, nbytes=16)
>>> ring.view(1)[:4] = 7
>>> ring.close()
>>> import mmap; m = mmap.mmap(-1, 4096); import numpy as np
>>> ptr = np.frombuffer(m, np.uint8).ctypes.data
>>> register(api, ptr, 4096)
True
>>> unregister(api, ptr); api.leaks()
{}
"""

from __future__ import annotations

import ctypes

import numpy as np

from ..model._errors import CudaError
from ._driver import check, drv

PORTABLE = 0x01  # CU_MEMHOSTALLOC_PORTABLE / CU_MEMHOSTREGISTER_PORTABLE: pinned for every context of the process


def register(api, ptr: int, nbytes: int) -> bool:
    """Pin ``nbytes`` of host memory at ``ptr`` (page aligned) for the driver's copies; False where the driver
    refuses (a system that cannot pin that mapping): copies from it still work, staged by the driver."""
    api = api if api is not None else drv
    try:
        check(api.cuMemHostRegister(int(ptr), int(nbytes), PORTABLE), "cuMemHostRegister")
    except CudaError:
        return False
    return True


def unregister(api, ptr: int) -> None:
    """Undo :func:`register` (before the memory is unmapped)."""
    api = api if api is not None else drv
    check(api.cuMemHostUnregister(int(ptr)), "cuMemHostUnregister")


class PinnedRing:
    """``depth`` slots of ``nbytes`` pinned host memory each (``cuMemHostAlloc``), viewed as NumPy ``uint8``
    arrays, and an event that marks the end of the last copy queued into them."""

    def __init__(self, api, depth: int, nbytes: int):
        self._api = api = api if api is not None else drv
        self.depth, self.nbytes = int(depth), int(nbytes)
        self.ptrs: list[int] = []
        self.event = None
        try:
            for _ in range(self.depth):
                self.ptrs.append(int(check(api.cuMemHostAlloc(max(self.nbytes, 1), PORTABLE), "cuMemHostAlloc")))
            self.event = check(api.cuEventCreate(api.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        except BaseException:
            self.close()
            raise

    def view(self, slot: int, nbytes: int | None = None) -> np.ndarray:
        n = self.nbytes if nbytes is None else nbytes
        return np.frombuffer((ctypes.c_char * max(n, 1)).from_address(self.ptrs[slot]), np.uint8, count=n)

    def close(self) -> None:
        api = self._api
        if self.event is not None:
            api.cuEventDestroy(self.event)
            self.event = None
        for p in self.ptrs:
            api.cuMemFreeHost(p)
        self.ptrs = []


def record_and_wait(api, event, stream: int) -> None:
    """Record ``event`` after the work queued on ``stream`` so far and wait on the host until it has run (the
    copies before it landed): cheaper to wait for than the whole stream when more work follows."""
    api = api if api is not None else drv
    check(api.cuEventRecord(event, stream), "cuEventRecord")
    check(api.cuEventSynchronize(event), "cuEventSynchronize")
