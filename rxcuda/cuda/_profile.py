"""The device side of profiling: a ring of timestamps in host-mapped memory, written by stamp kernels.

Each stamp node of a profiled graph (see rxcuda.plan._profile) writes the GPU's global timer (ns) into
its column of row ``frame % slots``; the host reads a row straight from memory once the frame's end event has
completed, so profiling adds no copy and no wait. The frame's start stamp (column 0), which runs before the
rest of the frame, counts the frames in device memory and the other stamps read that count (a GPU-driven batch
of k frames advances it by k). Measured on an H100, a copy node mirroring a device ring to the host at the end
of each frame cost more than writing host-mapped memory from the stamps.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ._driver import check, drv

SLOTS = 4  # rows of the ring: frames whose timings may be in flight at once before the oldest is dropped


class StampRing:
    """``columns`` timestamps for each of ``SLOTS`` frames, and the stamp kernel's node parameters.

    ``function``: the loaded ``rx_stamp`` kernel. The ring owns its frame counter (device memory, zeroed
    here) and its host memory; ``launches`` counts the frames launched since it was made (the caller adds
    them: one per tick, k per GPU-driven batch), so ``row(launch)`` finds a frame's timestamps.
    """

    def __init__(self, api, function, columns: int):
        self.api = api
        self.function = function
        self.columns = columns
        self.launches = 0
        self._host = None
        self.device = 0
        self.counters = int(check(api.cuMemAlloc(8), "cuMemAlloc (profiling frame count)"))
        try:
            check(api.cuMemsetD8(self.counters, 0, 8), "cuMemsetD8 (profiling frame count)")
            flags = drv.CU_MEMHOSTALLOC_DEVICEMAP | drv.CU_MEMHOSTALLOC_PORTABLE
            self._host = check(api.cuMemHostAlloc(SLOTS * columns * 8, flags), "cuMemHostAlloc (profiling ring)")
            self.device = int(check(api.cuMemHostGetDevicePointer(self._host, 0), "cuMemHostGetDevicePointer"))
        except BaseException:
            self.close()
            raise
        raw = (ctypes.c_uint64 * (SLOTS * columns)).from_address(int(self._host))
        self.rows = np.ctypeslib.as_array(raw).reshape(SLOTS, columns)
        self.rows[:] = 0
        self._args: list = []  # argument memory of each stamp node's parameters (the driver reads it at add)

    def params(self, column: int):
        """Kernel-node parameters of the stamp for ``column``."""
        words = np.array([self.device, self.counters, SLOTS, self.columns, column], dtype=np.uint64)
        ptrs = np.arange(5, dtype=np.uint64) * np.uint64(8) + np.uint64(words.ctypes.data)
        self._args.append((words, ptrs))
        p = drv.CUDA_KERNEL_NODE_PARAMS()
        p.func = self.function
        p.gridDimX = p.gridDimY = p.gridDimZ = 1
        p.blockDimX = p.blockDimY = p.blockDimZ = 1
        p.sharedMemBytes = 0
        p.kernelParams = ptrs.ctypes.data
        return p

    def row(self, launch: int) -> np.ndarray:
        """The timestamps (ns) of the ``launch``-th frame since the ring was made (0-based), as int64."""
        return self.rows[launch % SLOTS].astype(np.int64)

    def close(self) -> None:
        if self._host is not None:
            self.api.cuMemFreeHost(self._host)
            self._host = None
            self.rows = None
        if self.counters:
            self.api.cuMemFree(self.counters)
            self.counters = 0
        self.device = 0
