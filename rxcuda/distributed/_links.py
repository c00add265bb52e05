"""The two ends of a link between workers, as each worker runs them every frame.

``host`` (and ``ipc`` between null-driver workers): through pinned host memory, see ``_hostlink``.

``ipc``: the producer copies its output into one of ``depth`` slots of device memory it exported once (CUDA
IPC) and records that slot's interprocess event, all on its engine's stream, then publishes the frame on the
link's board (``_board``: shared memory, no Ray call). The consumer, stepped at the same time, waits on the board
for the frame, maps the slot once (from the board's handles), makes its engine's stream wait for the event (no host
wait) and copies the slot into its input. Both ends read their port's device pointer once per graph the engine
builds (:class:`PortPointer`), not every frame. A slot is written again only ``depth``
frames later; the distributed engine keeps fewer frames than that in flight, so no slot is overwritten while read.
On the null driver (no device memory to export) the slots are the board's own shared memory (``_hostlink``).
"""

from __future__ import annotations

from ..cuda import _ipc
from . import _board


def device_pointer(engine, port) -> tuple[int, int]:
    """(pointer, bytes) of a port's device buffer in the running graph (through ``engine.array``)."""
    view = engine.array(port)
    return int(view.data.ptr), int(view.nbytes)


class PortPointer:
    """A port's device buffer in an engine's running graph, as (pointer, bytes). Read through ``engine.array``
    (which applies what is pending and builds a CuPy view) only when the engine built a graph since the last look
    or has a change pending that may move the buffer (``engine.settled_build()``); otherwise the pointer read
    before, at no cost."""

    def __init__(self, engine, port):
        self._engine, self._port = engine, port
        self._build: int | None = None  # the engine's settled build when the pointer was read
        self._ptr, self._nbytes = 0, 0

    def get(self) -> tuple[int, int]:
        engine = self._engine
        build = engine.settled_build()
        if build is None or build != self._build:
            self._ptr, self._nbytes = device_pointer(engine, self._port)
            self._build = engine.settled_build()  # after the read, which applied what was pending
        return self._ptr, self._nbytes


class IpcSender:
    """The producer's end of an ``ipc`` link: ``depth`` exported slots, each with an interprocess event, fed from
    one port of one engine. ``settle``: each frame's copy is waited for (its event synchronized) before ``send``
    returns, so the step answers with no work of this context left on the GPU: what stepping in turns needs
    (``share_gpu="turns"``: the consumer's stream wait for the event is then satisfied already)."""

    def __init__(self, engine, port, nbytes: int, depth: int, settle: bool = False):
        engine.device.make_current()
        api = engine.device.api
        self._api = api
        self._device = engine.device
        self._stream = int(engine.stream)  # an engine's stream lives as long as it does
        self._settle = settle
        self._src = PortPointer(engine, port)
        self.nbytes = int(nbytes)
        self._slots: list[_ipc.ExportedMemory] = []
        self._events: list[_ipc.ExportedEvent] = []
        try:
            for _ in range(depth):
                self._slots.append(_ipc.export_memory(api, self.nbytes))
                self._events.append(_ipc.export_event(api))
        except BaseException:
            self.close()
            raise
        self._ptrs = [m.ptr for m in self._slots]

    def handles(self) -> list[tuple[bytes, bytes]]:
        """Each slot's (memory, event) handles, as the link's board carries them to the consumers."""
        return [(m.handle, e.handle) for m, e in zip(self._slots, self._events, strict=True)]

    def send(self, frame: int) -> int:
        """Queue this frame's copy of the port into its slot and record the slot's event (after the frame, on
        the engine's stream), and where ``settle``, wait for it; returns the bytes copied."""
        self._device.make_current()
        src, nbytes = self._src.get()
        nbytes = min(nbytes, self.nbytes)
        s = frame % len(self._ptrs)
        _ipc.copy_after(self._api, self._stream, None, self._ptrs[s], src, nbytes)
        self._events[s].record(self._stream)
        if self._settle:
            self._events[s].synchronize()
        return nbytes

    def close(self) -> None:
        for ev in self._events:
            ev.close()
        for mem in self._slots:
            mem.close()
        self._events, self._slots, self._ptrs = [], [], []


class IpcReceiver:
    """The consumer's end of an ``ipc`` link into one port of one engine: each of the producer's slots mapped
    and its event opened when first used (again for a board that replaced it: a restarted producer)."""

    def __init__(self, engine, port):
        self._api = engine.device.api
        self._device = engine.device
        self._stream = int(engine.stream)
        self._dst = PortPointer(engine, port)
        # slot -> (the reader's board generation, memory handle, mapped pointer, event handle, opened event)
        self._slots: dict[int, tuple[int, bytes, int, bytes, object]] = {}
        self.received = 0

    def receive(self, reader: _board.BoardReader, frame: int) -> None:
        """Queue the copy of the slot holding ``frame`` (on ``reader``'s board: waited for, READY) into the port,
        after the producer's event, on the engine's stream."""
        self._device.make_current()
        board = reader.board
        assert board is not None, "receive() follows a wait() that returned READY"
        s = frame % board.depth
        got = self._slots.get(s)
        if got is None or got[0] != reader.generation:
            got = self._slots[s] = self._map(s, reader.generation, *board.handles(s), got)
        dst, room = self._dst.get()
        _ipc.copy_after(self._api, self._stream, got[4], dst, got[2], min(room, board.length(frame)))
        self.received += 1

    def _map(self, slot: int, generation: int, memory: bytes, event: bytes, old):
        """A slot's memory mapped and its event opened, keeping what the old mapping shares with the new."""
        api = self._api
        ptr = ev = None
        if old is not None:
            if old[1] == memory:
                ptr = old[2]
            else:
                _ipc.close_memory(api, old[2])
            if old[3] == event:
                ev = old[4]
            else:
                _ipc.destroy_event(api, old[4])
            del self._slots[slot]
        if ptr is None:
            ptr = _ipc.open_memory(api, memory)
        if ev is None:
            try:
                ev = _ipc.open_event(api, event)
            except BaseException:
                _ipc.close_memory(api, ptr)
                raise
        return generation, memory, ptr, event, ev

    def close(self) -> None:
        for _gen, _memory, ptr, _event, ev in self._slots.values():
            _ipc.close_memory(self._api, ptr)
            _ipc.destroy_event(self._api, ev)
        self._slots = {}

