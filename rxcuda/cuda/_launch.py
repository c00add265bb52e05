"""Work issued on a stream from Python: kernel launches and device-to-device copies.

Library chains issue these on the capturing stream, so they become nodes of the captured graph; the
driver copies kernel arguments when the launch is issued (or captured), so the packed arguments only
have to live through the call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model import _dtypes
from ..model._describe import KernelParam, Launch
from . import _host
from ._driver import check, drv
from ._memory import copy_dtod_async

_BY_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def pack_args(params: Sequence[KernelParam], values: Sequence[int | float]) -> tuple[np.ndarray, np.ndarray]:
    """``(storage, pointers)``: every argument in its own 8-byte-aligned slot of ``storage`` and the slot
    addresses in ``pointers`` (the ``void**`` the driver reads). Pointers are 8-byte values; a scalar is
    stored as its dtype, or as an unsigned word of its size when the dtype is unknown. Keep both arrays
    alive until the launch has been issued."""
    if len(params) != len(values):
        raise ValueError(f"{len(values)} values for {len(params)} kernel parameters")
    sizes = [8 if p.is_pointer else max(p.size, 1) for p in params]
    offsets, off = [], 0
    for s in sizes:
        offsets.append(off)
        off += -(-s // 8) * 8
    storage = np.zeros(max(off // 8, 1), dtype=np.uint64).view(np.uint8)
    base = storage.ctypes.data
    for p, v, o, s in zip(params, values, offsets, sizes, strict=True):
        if p.is_pointer:
            dt = np.dtype(np.uint64)
        else:
            dt = _dtypes.to_numpy(p.dtype) if p.dtype else None
            if dt is None or dt.itemsize != s:
                dt = np.dtype(_BY_SIZE.get(s, np.uint8))
        storage[o:o + dt.itemsize].view(dt)[0] = v
    pointers = np.array([base + o for o in offsets], dtype=np.uint64)
    return storage, pointers


def launch_kernel(function, launch: Launch, stream: int, params: Sequence[KernelParam],
                  values: Sequence[int | float]) -> None:
    """``cuLaunchKernel`` of ``function`` on ``stream`` with one value per parameter (pointers as ints)."""
    _storage, pointers = pack_args(params, values)  # both alive until the driver has read them
    api = _host.current() or drv  # the CPU device's driver where its context is current on this thread
    check(api.cuLaunchKernel(function, *launch.grid, *launch.block, launch.shared_mem, stream,
                             int(pointers.ctypes.data) if len(params) else 0, 0), "cuLaunchKernel")


def copy_async(dst: int, src: int, nbytes: int, stream: int) -> None:
    """Device-to-device copy of ``nbytes`` on ``stream`` (a memcpy node when the stream captures)."""
    copy_dtod_async(dst, src, nbytes, stream, api=_host.current())
