"""Device buffers, a pool with size classes, and zero-copy interop (CUDA array interface, DLPack)."""

from __future__ import annotations

import attrs
import numpy as np

from ..model import _dtypes
from ._driver import check, drv

_MIN_CLASS = 256


def size_class(nbytes: int) -> int:
    """Round up to a size class: powers of two split in four steps (at most 25% slack), 256 B minimum."""
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    top = 1 << (nbytes - 1).bit_length()  # next power of two
    step = top // 8  # classes top/2 + k*top/8
    return -(-nbytes // step) * step


class DeviceBuffer:
    """Device memory: ``ptr`` (int) and ``nbytes``. Owned by a pool, or borrowed from a user array."""

    __slots__ = ("ptr", "nbytes", "capacity", "owner", "_pool")

    def __init__(self, ptr: int, nbytes: int, capacity: int | None = None, owner=None, pool=None):
        self.ptr = ptr
        self.nbytes = nbytes
        self.capacity = capacity or nbytes
        self.owner = owner  # keeps a borrowed array alive
        self._pool = pool

    def upload(self, host: np.ndarray, stream) -> None:
        host = np.ascontiguousarray(host)
        if host.nbytes > self.capacity:
            raise ValueError(f"{host.nbytes} bytes do not fit a {self.capacity}-byte buffer")
        check(drv.cuMemcpyHtoDAsync(self.ptr, host.ctypes.data, host.nbytes, stream), "cuMemcpyHtoDAsync")
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")  # host may be freed after return

    def download(self, out: np.ndarray, stream) -> np.ndarray:
        check(drv.cuMemcpyDtoHAsync(out.ctypes.data, self.ptr, out.nbytes, stream), "cuMemcpyDtoHAsync")
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return out

    def __repr__(self) -> str:
        return f"<DeviceBuffer 0x{self.ptr:x} {self.nbytes} B>"


@attrs.define
class PoolStats:
    allocations: int = 0  # cuMemAlloc calls
    reuses: int = 0  # acquisitions served from the free lists
    in_use: int = 0  # buffers handed out
    bytes_reserved: int = 0  # device bytes held (in use + free)
    peak_bytes: int = 0


class BufferPool:
    """Device memory by size class. ``release`` keeps a buffer for reuse; ``trim``/``close`` free memory."""

    def __init__(self) -> None:
        self._free: dict[int, list[int]] = {}
        self._live: dict[int, int] = {}  # ptr -> capacity
        self.stats = PoolStats()

    def acquire(self, nbytes: int, *, zero: bool = False, stream=None) -> DeviceBuffer:
        if nbytes <= 0:
            raise ValueError(f"'nbytes' must be positive (got {nbytes})")
        cap = size_class(nbytes)
        free = self._free.get(cap)
        if free:
            ptr = free.pop()
            self.stats.reuses += 1
        else:
            ptr = int(check(drv.cuMemAlloc(cap), "cuMemAlloc"))
            self.stats.allocations += 1
            self.stats.bytes_reserved += cap
            self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes_reserved)
        self._live[ptr] = cap
        self.stats.in_use += 1
        if zero:
            if stream is None:
                check(drv.cuMemsetD8(ptr, 0, cap), "cuMemsetD8")
            else:
                check(drv.cuMemsetD8Async(ptr, 0, cap, stream), "cuMemsetD8Async")
        return DeviceBuffer(ptr, nbytes, cap, pool=self)

    def release(self, buf: DeviceBuffer) -> None:
        cap = self._live.pop(buf.ptr, None)
        if cap is None:
            raise ValueError(f"{buf!r} does not belong to this pool or was released twice")
        self.stats.in_use -= 1
        self._free.setdefault(cap, []).append(buf.ptr)

    def trim(self) -> int:
        """Free all unused memory; returns the bytes freed."""
        freed = 0
        for cap, ptrs in self._free.items():
            for p in ptrs:
                check(drv.cuMemFree(p), "cuMemFree")
                freed += cap
        self._free.clear()
        self.stats.bytes_reserved -= freed
        return freed

    def close(self) -> None:
        self.trim()
        for p in list(self._live):
            check(drv.cuMemFree(p), "cuMemFree")
            self.stats.bytes_reserved -= self._live.pop(p)
        self.stats.in_use = 0


@attrs.frozen(eq=False)
class ExternalArray:
    """A user's device array resolved to a pointer, with the object kept alive."""

    ptr: int
    dtype: str
    count: int
    shape: tuple
    owner: object = attrs.field(repr=False)


def resolve_device_array(obj) -> ExternalArray:
    """Pointer, dtype and size of a device array (``__cuda_array_interface__`` or DLPack), zero-copy.

    Raises TypeError for host arrays and non-contiguous views, naming the fix.
    """
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None and hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray):
        import cupy

        obj = cupy.from_dlpack(obj)
        cai = obj.__cuda_array_interface__
    if cai is None:
        raise TypeError(f"{type(obj).__name__} is not a device array (no __cuda_array_interface__ or "
                        "__dlpack__); pass a CuPy/PyTorch CUDA array, or use engine.write(port, array) to copy "
                        "host data into the port's buffer")
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        expected, acc = [], dtype.itemsize
        for dim in reversed(shape):
            expected.append(acc)
            acc *= dim
        if tuple(reversed(expected)) != tuple(strides) and int(np.prod(shape)) > 1:
            raise TypeError("the array is not C-contiguous; pass a contiguous copy (e.g. cupy.ascontiguousarray)")
    count = int(np.prod(shape)) if shape else 1
    return ExternalArray(int(cai["data"][0]), _dtypes.dtype_name(dtype), count, shape, obj)


def as_cupy(ptr: int, nbytes: int, dtype, shape, owner, device_id: int = 0):
    """A CuPy array viewing device memory (no copy); ``owner`` is kept alive by the view."""
    import cupy

    mem = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device_id)
    return cupy.ndarray(shape, dtype=_dtypes.to_numpy(dtype) if dtype else np.uint8,
                        memptr=cupy.cuda.MemoryPointer(mem, 0))
