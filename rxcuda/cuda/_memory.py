"""Device buffers, a pool with size classes, and zero-copy interop (CUDA array interface, DLPack)."""

from __future__ import annotations

import ctypes
import math

import attrs
import numpy as np

from ..model import _dtypes
from ..model._shapes import c_strides
from ._driver import check, drv

_MIN_CLASS = 256


def size_class(nbytes: int) -> int:
    """Round up to a size class: powers of two split in four steps (at most 25% slack), 256 B minimum."""
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    top = 1 << (nbytes - 1).bit_length()  # next power of two
    step = top // 8  # classes top/2 + k*top/8
    return -(-nbytes // step) * step


def copy_htod_async(dst: int, src: int, nbytes: int, stream, *, api=None) -> None:
    """Copy ``nbytes`` from host address ``src`` to device address ``dst``, ordered on ``stream``. From pageable
    memory the driver stages the bytes before it returns, so the host buffer may go at once."""
    api = api if api is not None else drv
    check(api.cuMemcpyHtoDAsync(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")


def copy_dtoh_async(dst: int, src: int, nbytes: int, stream, *, api=None) -> None:
    """Copy ``nbytes`` from device address ``src`` to host address ``dst`` (pinned, for the copy to be truly
    asynchronous), ordered on ``stream``; the host bytes are there once the stream gets past the copy."""
    api = api if api is not None else drv
    check(api.cuMemcpyDtoHAsync(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")


def copy_dtoh(dst: int, src: int, nbytes: int, *, api=None, what: str = "") -> None:
    """Copy ``nbytes`` from device address ``src`` to host address ``dst`` now (after all work on the device
    so far); ``what`` names the value read, for the error message."""
    api = api if api is not None else drv
    check(api.cuMemcpyDtoH(dst, src, nbytes), f"cuMemcpyDtoH ({what})" if what else "cuMemcpyDtoH")


def copy_dtod_async(dst: int, src: int, nbytes: int, stream, *, api=None) -> None:
    """Copy ``nbytes`` between device addresses, ordered on ``stream`` (a memcpy node when it captures)."""
    api = api if api is not None else drv
    check(api.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")


def set_bytes_async(ptr: int, value: int, nbytes: int, stream, *, api=None) -> None:
    """Set ``nbytes`` bytes from device address ``ptr`` to ``value`` (0..255), ordered on ``stream``."""
    api = api if api is not None else drv
    check(api.cuMemsetD8Async(ptr, value, nbytes, stream), "cuMemsetD8Async")


class DeviceBuffer:
    """Device memory: ``ptr`` (int) and ``nbytes``. Owned by a pool, or borrowed from a user array."""

    __slots__ = ("ptr", "nbytes", "capacity", "owner", "_pool", "_api")

    def __init__(self, ptr: int, nbytes: int, capacity: int | None = None, owner=None, pool=None, api=None):
        self._api = api if api is not None else drv
        self.ptr = ptr
        self.nbytes = nbytes
        self.capacity = capacity or nbytes
        self.owner = owner  # keeps a borrowed array alive
        self._pool = pool

    def upload(self, host: np.ndarray, stream) -> None:
        """Copy host data in, ordered on ``stream``; returns once the copy is done (``host`` may then go)."""
        host = np.ascontiguousarray(host)
        if host.nbytes > self.capacity:
            raise ValueError(f"{host.nbytes} bytes do not fit a {self.capacity}-byte buffer")
        copy_htod_async(self.ptr, host.ctypes.data, host.nbytes, stream, api=self._api)
        check(self._api.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def download(self, out: np.ndarray, stream) -> np.ndarray:
        """Copy into ``out``, ordered on ``stream`` after the frames queued there; waits for it."""
        copy_dtoh_async(out.ctypes.data, self.ptr, out.nbytes, stream, api=self._api)
        check(self._api.cuStreamSynchronize(stream), "cuStreamSynchronize")
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
    """Device memory by size class. ``release`` keeps a buffer for reuse; ``trim``/``close`` free memory.

    Small buffers (up to ``SMALL`` bytes) are carved from slabs that double from ``SMALL`` up to ``SLAB``
    bytes: a pipeline of a thousand small ports costs a handful of allocations, not a thousand, a pool that
    needs one small buffer holds 64 KiB, and buffers acquired together sit side by side, so ``zero`` clears
    them with a few memsets. Slab memory returns to the driver when the pool closes.
    """

    SMALL = 64 << 10
    SLAB = 2 << 20

    def __init__(self, api=None) -> None:
        self._api = api if api is not None else drv
        self._free: dict[int, list[int]] = {}
        self._live: dict[int, int] = {}  # ptr -> capacity
        self._slabs: list[tuple[int, int]] = []  # (base, bytes)
        self._home: dict[int, int] = {}  # small buffer -> the base of its slab
        self._cursor = self._end = 0  # the free tail of the newest slab
        self._mapped: dict[int, int] = {}  # host-mapped buffer -> capacity (in use or free)
        self._free_mapped: list[int] = []
        self.stats = PoolStats()

    def acquire(self, nbytes: int, *, zero: bool = False, stream=None, mapped: bool = False) -> DeviceBuffer:
        """A buffer of at least ``nbytes``; ``zero``: cleared on ``stream`` (stream-ordered, no sync).

        ``mapped``: page-locked host memory the device reads and writes at the same address (unified
        addressing), for a few bytes the host reads after a frame without a copy (a While's passes left). It
        starts with every byte 0xFF, set from the host at once; ``zero`` passes it over."""
        if nbytes <= 0:
            raise ValueError(f"'nbytes' must be positive (got {nbytes})")
        if mapped:
            return self._acquire_mapped(nbytes)
        cap = size_class(nbytes)
        free = self._free.get(cap)
        if free:
            ptr = free.pop()
            self.stats.reuses += 1
        elif cap <= self.SMALL:
            if self._cursor + cap > self._end:
                size = min(self.SLAB, self.SMALL << len(self._slabs))
                self._cursor = self._alloc(size)
                self._end = self._cursor + size
                self._slabs.append((self._cursor, size))
            ptr, self._cursor = self._cursor, self._cursor + cap
            self._home[ptr] = self._slabs[-1][0]
        else:
            ptr = self._alloc(cap)
        self._live[ptr] = cap
        self.stats.in_use += 1
        buf = DeviceBuffer(ptr, nbytes, cap, pool=self, api=self._api)
        if zero:
            self.zero([buf], stream)
        return buf

    def by_class(self) -> dict[int, tuple[int, int]]:
        """Size class (bytes) -> (buffers in use, buffers free for reuse), smallest class first."""
        used: dict[int, int] = {}
        for cap in self._live.values():
            used[cap] = used.get(cap, 0) + 1
        classes = sorted(set(used) | {c for c, f in self._free.items() if f})
        return {c: (used.get(c, 0), len(self._free.get(c, ()))) for c in classes}

    @property
    def slabs(self) -> tuple[tuple[int, int], ...]:
        """(base, bytes) of each slab the small buffers are carved from."""
        return tuple(self._slabs)

    def _acquire_mapped(self, nbytes: int) -> DeviceBuffer:
        cap = size_class(nbytes)
        ptr = next((p for p in self._free_mapped if self._mapped[p] >= nbytes), None)
        if ptr is not None:
            self._free_mapped.remove(ptr)
            cap = self._mapped[ptr]
        else:
            flags = drv.CU_MEMHOSTALLOC_DEVICEMAP | drv.CU_MEMHOSTALLOC_PORTABLE
            host = int(check(self._api.cuMemHostAlloc(cap, flags), "cuMemHostAlloc (mapped)"))
            try:
                ptr = int(check(self._api.cuMemHostGetDevicePointer(host, 0), "cuMemHostGetDevicePointer"))
                if ptr != host:  # (64-bit CUDA has unified addressing: the device sees host memory at its address)
                    raise RuntimeError(f"host-mapped memory at {host:#x} is at {ptr:#x} on the device; rxcuda "
                                       "needs unified addressing")
            except BaseException:
                self._api.cuMemFreeHost(host)
                raise
            self._mapped[ptr] = cap
        ctypes.memset(ptr, 0xFF, cap)
        self.stats.in_use += 1
        return DeviceBuffer(ptr, nbytes, cap, pool=self, api=self._api)

    def mapped_u32(self, ptr: int) -> ctypes.c_uint32 | None:
        """The first 32-bit word of this pool's host-mapped buffer at ``ptr``, read and written by the host as
        the device does (None: ``ptr`` is not one)."""
        return ctypes.c_uint32.from_address(ptr) if ptr in self._mapped else None

    def _alloc(self, nbytes: int) -> int:
        ptr = int(check(self._api.cuMemAlloc(nbytes), "cuMemAlloc"))
        self.stats.allocations += 1
        self.stats.bytes_reserved += nbytes
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.stats.bytes_reserved)
        return ptr

    def zero(self, buffers, stream) -> None:
        """Clear ``buffers`` (whole capacities) on ``stream``: one memset per run of adjacent buffers."""
        if stream is None:
            raise ValueError("zeroing needs the stream it is ordered on (the engine's stream)")
        runs: list[list[int]] = []  # [start, end, allocation]: a run never spans two allocations
        for b in sorted(buffers, key=lambda b: b.ptr):
            if b.ptr in self._mapped:
                continue  # (host-mapped: set from the host when acquired)
            home = self._home.get(b.ptr, b.ptr)
            if runs and runs[-1][1] == b.ptr and runs[-1][2] == home:
                runs[-1][1] = b.ptr + b.capacity
            else:
                runs.append([b.ptr, b.ptr + b.capacity, home])
        for start, end, _home in runs:
            set_bytes_async(start, 0, end - start, stream, api=self._api)

    def release(self, buf: DeviceBuffer) -> None:
        if buf.ptr in self._mapped:
            if buf.ptr in self._free_mapped:
                raise ValueError(f"{buf!r} was released twice")
            self.stats.in_use -= 1
            self._free_mapped.append(buf.ptr)
            return
        cap = self._live.pop(buf.ptr, None)
        if cap is None:
            raise ValueError(f"{buf!r} does not belong to this pool or was released twice")
        self.stats.in_use -= 1
        self._free.setdefault(cap, []).append(buf.ptr)

    def trim(self) -> int:
        """Free the unused large buffers (small ones live in slabs until ``close``); returns the bytes freed."""
        freed = 0
        for cap in [c for c in self._free if c > self.SMALL]:
            for p in self._free.pop(cap):
                check(self._api.cuMemFree(p), "cuMemFree")
                freed += cap
        self.stats.bytes_reserved -= freed
        return freed

    def close(self) -> None:
        self.trim()
        for p, cap in list(self._live.items()):
            if cap > self.SMALL:
                check(self._api.cuMemFree(p), "cuMemFree")
                self.stats.bytes_reserved -= cap
        for base, size in self._slabs:
            check(self._api.cuMemFree(base), "cuMemFree")
            self.stats.bytes_reserved -= size
        for p in self._mapped:
            check(self._api.cuMemFreeHost(p), "cuMemFreeHost")
        self._mapped.clear()
        self._free_mapped.clear()
        self._live.clear()
        self._free.clear()
        self._slabs, self._cursor, self._end = [], 0, 0
        self._home.clear()
        self.stats.in_use = 0


@attrs.frozen(eq=False)
class ExternalArray:
    """A user's device array resolved to a pointer, with the object kept alive."""

    ptr: int
    dtype: str
    count: int
    shape: tuple
    owner: object = attrs.field(repr=False)
    readonly: bool = False
    device: int = 0  # the GPU ordinal the memory lives on


def resolve_device_array(obj, stream: int | None = None, api=None) -> ExternalArray:
    """Pointer, dtype and size of a device array (DLPack or ``__cuda_array_interface__`` v3), zero-copy.

    Goes through cuda.core's ``StridedMemoryView``. With ``stream`` (the consumer's raw CUstream), the
    consumer is ordered after the producer as the protocols ask: the array's own stream (CAI v3's
    ``stream`` field, DLPack's ``stream`` argument) is waited on with an event, not a device sync.
    Raises TypeError for host arrays, non-contiguous views and objects that are no array, naming the fix.
    On the CPU device (``api`` a CpuDriver) the array's ``__cuda_array_interface__`` must point into the CPU
    device's own memory (such as a GL buffer's host copy: ``engine.gl_buffer``); it is read as it stands.
    """
    from cuda.core.utils import StridedMemoryView

    if getattr(api, "on_host", False) and not isinstance(obj, np.ndarray):
        return _resolve_on_host(obj, api)
    if isinstance(obj, np.ndarray):
        raise TypeError("a NumPy array lives in host memory; use engine.write(port, array) to copy it into the "
                        "port's buffer, or pass a CuPy/PyTorch CUDA array")
    if not (hasattr(obj, "__cuda_array_interface__") or hasattr(obj, "__dlpack__")):
        raise TypeError(f"{type(obj).__name__} is not a device array (no __cuda_array_interface__ or "
                        "__dlpack__); pass a CuPy/PyTorch CUDA array, or use engine.write(port, array) to copy "
                        "host data into the port's buffer")
    try:
        view = StridedMemoryView.from_any_interface(obj, stream_ptr=-1 if stream is None else int(stream))
    except BufferError as e:
        raise TypeError(f"{type(obj).__name__} could not be viewed as a device array ({e})") from e
    if not view.is_device_accessible:
        raise TypeError(f"the {type(obj).__name__} lives in host memory; use engine.write(port, array) to copy "
                        "it, or move it to the GPU first")
    shape = tuple(view.shape)
    count = int(np.prod(shape)) if shape else 1
    strides = view.strides
    if strides is not None and count > 1:
        expected, acc = [], 1
        for dim in reversed(shape):
            expected.append(acc)
            acc *= dim
        if any(s != e for s, e, d in zip(strides, reversed(expected), shape, strict=True) if d > 1):
            raise TypeError("the array is not C-contiguous; pass a contiguous copy (e.g. cupy.ascontiguousarray)")
    return ExternalArray(int(view.ptr), _dtypes.dtype_name(np.dtype(view.dtype)), count, shape, obj,
                         bool(view.readonly), int(view.device_id))


def _resolve_on_host(obj, api) -> ExternalArray:
    """An array in the CPU device's memory, from its ``__cuda_array_interface__`` (the CPU device is synchronous:
    its ``stream`` needs no wait)."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"the CPU device binds arrays in its own memory, given by __cuda_array_interface__; "
                        f"{type(obj).__name__} has none: use engine.write(port, array) to copy it into the port")
    shape = tuple(int(d) for d in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    ptr, readonly = int(cai["data"][0]), bool(cai["data"][1])
    count = math.prod(shape)
    strides = cai.get("strides")
    if strides is not None and count > 1:
        expected = (e * dtype.itemsize for e in c_strides(shape))
        if any(s != e for s, e, d in zip(strides, expected, shape, strict=True) if d > 1):
            raise TypeError("the array is not C-contiguous; pass a contiguous one")
    found = api.allocations.find(ptr)
    if found is None or ptr + count * dtype.itemsize > found[0] + found[1]:
        raise TypeError(f"{count * dtype.itemsize} bytes at {ptr:#x} are not memory of the CPU device (its "
                        "allocations, and GL buffers shared with engine.gl_buffer); a GPU's array cannot be bound "
                        "there: copy it to the host and engine.write(port, array)")
    return ExternalArray(ptr, _dtypes.dtype_name(dtype), count, shape, obj, readonly, 0)


class PinnedBuffer:
    """Page-locked host memory viewed as a NumPy array, with an event marking its last async copy."""

    def __init__(self, nbytes: int, api=None):
        self._api = api = api if api is not None else drv
        self.nbytes = nbytes
        self.ptr = int(check(api.cuMemHostAlloc(max(nbytes, 1), 0), "cuMemHostAlloc"))
        self.event = check(api.cuEventCreate(api.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        self.busy = False

    def view(self, dtype, count: int) -> np.ndarray:
        buf = (ctypes.c_char * self.nbytes).from_address(self.ptr)
        return np.frombuffer(buf, dtype=dtype, count=count)

    def done(self) -> bool:
        if not self.busy:
            return True
        err, = self._api.cuEventQuery(self.event)
        if err == drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuEventQuery")
        self.busy = False
        return True

    def wait(self) -> None:
        if self.busy:
            check(self._api.cuEventSynchronize(self.event), "cuEventSynchronize")
            self.busy = False

    def record(self, stream) -> None:
        check(self._api.cuEventRecord(self.event, stream), "cuEventRecord")
        self.busy = True

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._api.cuEventDestroy(self.event)
            self._api.cuMemFreeHost(self.ptr)


def as_cupy(ptr: int, nbytes: int, dtype, shape, owner, device_id: int = 0):
    """A CuPy array viewing device memory (no copy); ``owner`` is kept alive by the view."""
    import cupy

    mem = cupy.cuda.UnownedMemory(ptr, nbytes, owner, device_id)
    return cupy.ndarray(shape, dtype=_dtypes.to_numpy(dtype) if dtype else np.uint8,
                        memptr=cupy.cuda.MemoryPointer(mem, 0))
