"""The ends of a ``host`` link, and of an ``ipc`` link between null-driver workers: links whose bytes cross host
memory. Every copy is the DMA engine's, into or out of pinned memory, queued on the engine's stream; the payload is
never pickled.

**One host (``via="board"``).** The link's board (``_board``) carries the bytes: ``depth`` slots in one
shared-memory file that both processes map and pin in place (``cuMemHostRegister``). After its frame the producer
copies its output's device buffer straight into the frame's slot (``cuMemcpyDtoHAsync``), waits for that copy
alone (an event) and publishes the frame on the board; the consumer, stepped at the same time, waits on the board
and copies the slot straight into its input's device buffer (``cuMemcpyHtoDAsync``) before its frame's launch, on
its stream. Two copies at the bus's pace and no Ray call: frames step through the workers' clocks. While the
consumer copies frame N in, the producer already computes frame N+1 into the next slot; a slot is written again
only ``depth`` frames later, and the driver keeps fewer frames than that in flight, so none is overwritten while
read (and a consumer checks its slot's stamp after its copy: never a stale frame).

**Across hosts (``via="store"``).** The producer copies its output into a ring of ``depth`` pinned buffers
(``cuMemHostAlloc``) and returns the slot as a NumPy array: Ray puts it into its object store as an out-of-band
buffer (one copy, no pickling of the bytes) and hands the consumer's step a read-only array mapped from the store
on its node (no copy on read), which the consumer copies into its input (the driver stages it).
"""

from __future__ import annotations

import contextlib
import math
import os

import numpy as np

from ..cuda import _hostmem
from ..cuda._memory import copy_dtoh_async, copy_htod_async
from ..cuda._stream import create_event, destroy_event
from . import _board
from ._links import PortPointer


class _End:
    """What both ends hold: the engine's driver, device and stream, and one port's device buffer."""

    def __init__(self, engine, port):
        engine.device.make_current()
        self._api = engine.device.api
        self._device = engine.device
        self._stream = int(engine.stream)  # an engine's stream lives as long as it does
        self._port = PortPointer(engine, port)


class BoardSender(_End):
    """The producer's end on one host: copies a port into the slots of ``board`` (pinned here)."""

    def __init__(self, engine, port, board: _board.LinkBoard):
        super().__init__(engine, port)
        self.board = board
        self._base, size = board.region()
        self.pinned = _hostmem.register(self._api, self._base, size)
        self._event = create_event(timing=False, api=self._api)

    def send(self, frame: int) -> int:
        """Copy the port's bytes after the frame into frame ``frame``'s slot and wait for that copy (the caller
        publishes it); returns the bytes copied."""
        self._device.make_current()
        src, nbytes = self._port.get()
        n = min(nbytes, self.board.nbytes)
        copy_dtoh_async(self.board.slot_address(frame), src, n, self._stream, api=self._api)
        _hostmem.record_and_wait(self._api, self._event, self._stream)
        return n

    def close(self) -> None:
        """Release the event and unpin the board (before it is unmapped)."""
        self._device.make_current()
        if self._event is not None:
            destroy_event(self._event, api=self._api)
            self._event = None
        if self.pinned:
            _hostmem.unregister(self._api, self._base)
            self.pinned = False


class BoardReceiver(_End):
    """The consumer's end on one host: copies a frame's slot of its producer's board (pinned here once per board
    it maps: a restarted producer's is a new one) into a port."""

    def __init__(self, engine, port, reader: _board.BoardReader):
        super().__init__(engine, port)
        self._generation = 0  # the reader's board generation pinned
        self._base: int | None = None
        self.pinned = False
        reader.on_drop = self._unpin  # a board is unpinned before the reader unmaps it

    def receive(self, reader: _board.BoardReader, frame: int) -> None:
        """Queue the copy of frame ``frame``'s slot (on ``reader``'s board: waited for, READY) into the port, on
        the engine's stream (before the frame's launch)."""
        self._device.make_current()
        board = reader.board
        assert board is not None, "receive() follows a wait() that returned READY"
        if reader.generation != self._generation:
            self._unpin(None)
            self._base, size = board.region()
            self.pinned = _hostmem.register(self._api, self._base, size)
            self._generation = reader.generation
        dst, room = self._port.get()
        copy_htod_async(dst, board.slot_address(frame), min(room, board.length(frame)), self._stream, api=self._api)

    def _unpin(self, _board_dropped) -> None:
        if self.pinned and self._base is not None:
            self._device.make_current()
            _hostmem.unregister(self._api, self._base)
        self.pinned, self._base, self._generation = False, None, 0

    def close(self) -> None:
        self._unpin(None)


class StoreSender(_End):
    """The producer's end across hosts: each frame's bytes in one of ``depth`` pinned buffers, handed to Ray."""

    def __init__(self, engine, port, nbytes: int, depth: int):
        super().__init__(engine, port)
        self._ring = _hostmem.PinnedRing(self._api, depth, nbytes)

    def send(self, frame: int) -> np.ndarray:
        """The port's bytes after frame ``frame``, as a ``uint8`` array viewing a pinned slot (valid until the slot
        comes round again, ``depth`` frames later: Ray has copied it into its object store by then)."""
        self._device.make_current()
        ring = self._ring
        src, nbytes = self._port.get()
        n = min(nbytes, ring.nbytes)
        s = frame % ring.depth
        copy_dtoh_async(ring.ptrs[s], src, n, self._stream, api=self._api)
        _hostmem.record_and_wait(self._api, ring.event, self._stream)
        return ring.view(s, n)

    def close(self) -> None:
        self._ring.close()


class StoreReceiver(_End):
    """The consumer's end across hosts: the array Ray brought (read-only, mapped from its object store) copied
    into a port."""

    def receive(self, data) -> None:
        self._device.make_current()
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        dst, room = self._port.get()
        copy_htod_async(dst, raw.ctypes.data, min(room, raw.size), self._stream, api=self._api)

    def close(self) -> None:
        pass  # holds nothing of its own: the driver staged the bytes before the copy call returned


class PinnedArrays(_board.SharedArrays):
    """:class:`~._board.SharedArrays` whose files are pinned in this process for ``engine``'s driver
    (``cuMemHostRegister``): a read copies from the device straight into them at the bus's pace, and the other
    process copies out (the isolated engine's reads: one DMA and one host copy, no staging). Where the driver
    does not pin (the CPU device, the null driver), they work unpinned."""

    def __init__(self, prefix: str, engine):
        super().__init__(prefix)
        self.engine = engine
        self._api = engine.device.api
        self._pinned: dict[str, int] = {}  # path -> base address registered

    def _map(self, path: str, nbytes: int, create: bool):
        had = self._maps.get(path)
        if had is not None and had[0] < nbytes:  # mapped anew, larger: unpinned before the old mapping goes
            self._unpin(path)
        mm = super()._map(path, nbytes, create)
        if path not in self._pinned and not self.engine.closed:  # asked once per mapping (0: refused)
            base = np.frombuffer(mm, np.uint8).ctypes.data
            self.engine.device.make_current()
            self._pinned[path] = base if _hostmem.register(self._api, base, len(mm)) else 0
        return mm

    def at(self, path: str, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """A writable array of ``shape`` and ``dtype`` at the start of the file ``path`` another process made (a
        slab of ``_readback.ReadSlabs``, at least that large), mapped and pinned here once; the mappings of
        such files since removed are dropped first."""
        if path not in self._maps:
            for gone in [p for p in self._maps if p not in self._paths.values() and not os.path.exists(p)]:
                self._unpin(gone)
                self._maps.pop(gone)[1].close()
        count = math.prod(shape)
        return np.frombuffer(self._map(path, count * dtype.itemsize, False), dtype, count).reshape(shape)

    def _unpin(self, path: str) -> None:
        base = self._pinned.pop(path, None)
        if base and not self.engine.closed:
            with contextlib.suppress(Exception):  # (a context already gone took its registrations with it)
                self.engine.device.make_current()
                _hostmem.unregister(self._api, base)

    def close(self) -> None:
        for path in list(self._pinned):
            self._unpin(path)
        super().close()
