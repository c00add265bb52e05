"""Data in and out of ports as streams.

In: the newest array a source emitted is copied into the port's buffer before the next frame — a NumPy
array through pinned staging (double-buffered, asynchronous), a device array by a device-to-device copy —
ordered on the engine's stream, so the frame sees it, with no rebuild.

Out: after each frame (or every n-th), a port's content is emitted on the engine thread — as a CuPy
array (a zero-copy view when the frame was synchronised, else a device copy ordered after the frame), or
as a NumPy array read back asynchronously through a ring of pinned buffers (emitted when its copy has
finished; no per-frame sync unless asked).
"""

from __future__ import annotations

import threading

import numpy as np

from ..cuda._memory import PinnedBuffer, copy_dtod_async, copy_dtoh_async, copy_htod_async, resolve_device_array
from ..model import _dtypes


class EngineStream:
    """The engine's CUDA stream, for ordering your own work with the frames (``__cuda_stream__``).

    >>> import cupy                                                     # doctest: +SKIP
    >>> with cupy.cuda.Stream.from_external(engine.stream):             # doctest: +SKIP
    ...     y = engine.array(blk["out"]) * 2   # runs after the frames already queued
    """

    __slots__ = ("handle", "device")

    def __init__(self, handle: int, device: int):
        self.handle = handle
        self.device = device

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def __int__(self) -> int:
        return self.handle

    def __repr__(self) -> str:
        return f"<EngineStream 0x{self.handle:x} on GPU {self.device}>"


class InputFeed:
    """Holds the newest array from a source; ``stage`` copies it into the port buffer on the engine thread."""

    def __init__(self, label: str, dtype: str | None, count: int, api=None):
        self._api = api  # None: cuda.bindings' driver
        self.label = label
        self.dtype = _dtypes.to_numpy(dtype) if dtype else None
        self.count = count
        self._latest = None
        self._lock = threading.Lock()
        self._slots: list[PinnedBuffer] = []
        self._next = 0
        self.staged = 0

    def push(self, array) -> None:
        """Accept an array from any thread (checked here, so a bad one is reported at its source)."""
        shape_ok = getattr(array, "size", None)
        if shape_ok is None:
            raise TypeError(f"{self.label}: stream items must be arrays (got {type(array).__name__})")
        if self.dtype is not None and np.dtype(array.dtype) != self.dtype:
            raise TypeError(f"{self.label}: expected {self.dtype} arrays, got {array.dtype}")
        if array.size > self.count:
            raise ValueError(f"{self.label}: an array of {array.size} elements does not fit {self.count}")
        with self._lock:
            self._latest = array

    @property
    def dirty(self) -> bool:
        return self._latest is not None

    def stage(self, ptr: int, stream) -> None:
        with self._lock:
            arr, self._latest = self._latest, None
        if arr is None:
            return
        if isinstance(arr, np.ndarray):
            arr = np.ascontiguousarray(arr)
            if len(self._slots) < 2:
                self._slots = [PinnedBuffer(self.count * arr.itemsize, self._api) for _ in range(2)]
            slot = self._slots[self._next]
            self._next ^= 1
            slot.wait()  # its previous copy must be done before we overwrite it (rarely waits)
            slot.view(arr.dtype, arr.size)[:] = arr.ravel()
            copy_htod_async(ptr, slot.ptr, arr.nbytes, stream, api=self._api)
            slot.record(stream)
        else:
            # ordered after the array's producer stream (an event wait), as the interchange protocols ask
            src = resolve_device_array(arr, stream, self._api)
            nbytes = src.count * np.dtype(arr.dtype).itemsize
            # the source array must stay valid until the copy ran: keep it until the next stage
            self._keep = arr
            copy_dtod_async(ptr, src.ptr, nbytes, stream, api=self._api)
        self.staged += 1

    def resize(self, count: int) -> None:
        """Take arrays of up to ``count`` elements from now on (the port was resized); an array waiting that
        no longer fits is dropped, and the pinned staging is made again at the new size."""
        if count == self.count:
            return
        with self._lock:
            self.count = count
            if self._latest is not None and self._latest.size > count:
                self._latest = None
        for slot in self._slots:
            slot.close()  # waits for its last copy
        self._slots, self._next = [], 0

    def close(self) -> None:
        for s in self._slots:
            s.close()
        self._slots = []


class OutputTap:
    """Emits a port's content after every ``every``-th frame to ``emit`` (called on the engine thread)."""

    def __init__(self, emit, *, dtype: str | None, count: int, every: int, as_numpy: bool, append: bool,
                 depth: int = 3, api=None, on_count=None):
        self._api = api  # None: cuda.bindings' driver
        self.on_count = on_count  # append: called (frame, raw count) with each counter read back
        if not isinstance(every, int) or every <= 0:
            raise ValueError(f"'every' must be a positive int (got {every!r})")
        self.emit = emit
        self.dtype = _dtypes.to_numpy(dtype) if dtype else np.dtype(np.uint8)
        self.count = count
        self.every = every
        self.as_numpy = as_numpy
        self.append = append
        self._depth = depth
        self._ring: list[PinnedBuffer] = []
        self._pending: list[tuple[PinnedBuffer, PinnedBuffer | None, int]] = []  # (data, counter, frame)
        self._counters: list[PinnedBuffer] = []
        self._i = 0
        self._due: tuple | None = None
        self.closed = False

    def enqueue(self, frame: int, ptr: int, counter_ptr: int | None, stream) -> None:
        """After the launch, before any sync: queue this frame's readback (every ``every``-th frame)."""
        self._due = None
        if frame % self.every:
            return
        if not self.as_numpy:
            self._due = (ptr, counter_ptr, frame)
            if self.append:
                if not self._counters:
                    self._counters = [PinnedBuffer(4, self._api)]
                c = self._counters[0]
                c.wait()
                assert counter_ptr is not None  # an append port always has its counter
                copy_dtoh_async(c.ptr, counter_ptr, 4, stream, api=self._api)
                c.record(stream)
            return
        if not self._ring:
            nbytes = self.count * self.dtype.itemsize
            self._ring = [PinnedBuffer(nbytes, self._api) for _ in range(self._depth)]
            if self.append:
                self._counters = [PinnedBuffer(4, self._api) for _ in range(self._depth)]
        slot = self._ring[self._i]
        cslot = self._counters[self._i] if self.append else None
        if slot.busy:  # the ring is full: wait for the oldest copy and emit it first
            self.poll(block_until=slot)
        self._i = (self._i + 1) % self._depth
        copy_dtoh_async(slot.ptr, ptr, slot.nbytes, stream, api=self._api)
        if cslot is not None:
            assert counter_ptr is not None  # an append port always has its counter
            copy_dtoh_async(cslot.ptr, counter_ptr, 4, stream, api=self._api)
        slot.record(stream)
        self._pending.append((slot, cslot, frame))

    def deliver(self, stream, synced: bool, owner, device_id: int) -> None:
        """After the frame (and its sync, if any): emit what has arrived."""
        if self.as_numpy:
            self.poll()
        elif self._due is not None:
            ptr, _, frame = self._due
            self._due = None
            self._emit_cupy(ptr, stream, synced, owner, device_id, frame)

    def poll(self, block_until: PinnedBuffer | None = None) -> None:
        """Emit every finished readback, oldest first."""
        while self._pending:
            slot, cslot, frame = self._pending[0]
            if block_until is not None:
                slot.wait()
            elif not slot.done():
                return
            self._pending.pop(0)
            n = self.count
            if cslot is not None:
                raw = int(cslot.view(np.uint32, 1)[0])
                n = min(raw, self.count)
                if self.on_count is not None:
                    self.on_count(frame, raw)
            if not self.closed:
                self.emit(slot.view(self.dtype, self.count)[:n].copy())
            if slot is block_until:
                return

    def resize(self, count: int) -> None:
        """Read ``count`` elements from the next frame on (the port was resized): what is in flight is emitted
        first, at its old size, then the pinned ring is made again at the new one."""
        if count == self.count:
            return
        while self._pending:
            self.poll(block_until=self._pending[-1][0])
        for s in self._ring + self._counters:
            s.close()
        self._ring, self._counters, self._i = [], [], 0
        self.count = count

    def _emit_cupy(self, ptr, stream, synced, owner, device_id, frame: int = 0) -> None:
        import cupy

        from ..cuda._memory import as_cupy

        n = self.count
        if self.append:
            c = self._counters[0]
            c.wait()
            raw = int(c.view(np.uint32, 1)[0])
            n = min(raw, self.count)
            if self.on_count is not None:
                self.on_count(frame, raw)
        view = as_cupy(ptr, max(self.count * self.dtype.itemsize, 1), self.dtype, (self.count,), owner,
                       device_id)[:n]
        if synced:
            self.emit(view)  # valid until the next frame; copy it to keep it
        else:
            with cupy.cuda.Stream.from_external(EngineStream(int(stream), device_id)):
                self.emit(view.copy())  # ordered after this frame on the engine stream

    def close(self) -> None:
        self.closed = True
        for s in self._ring + self._counters:
            s.close()
        self._ring, self._counters, self._pending = [], [], []
