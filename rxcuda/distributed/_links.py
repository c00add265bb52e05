"""The two ends of a link between workers, as each worker runs them every frame.

``host``: the producer reads its output into a NumPy array (one device-to-host copy); Ray moves it (through its
object store) to the consumer, which writes it into its input. Works across hosts and on the null driver.

``ipc``: the producer copies its output into one of ``depth`` slots of device memory it exported once (CUDA
IPC) and records that slot's interprocess event, all on its engine's stream, then publishes the frame on the
link's board (``_board``: shared memory, no Ray call). The consumer, stepped at the same time, waits on the board
for the frame, maps the slot once (an :class:`IpcToken` built from the board's handles), makes its engine's stream
wait for the event (no host wait) and copies the slot into its input. A slot is written again only ``depth``
frames later; the distributed engine keeps fewer frames than that in flight, so no slot is overwritten while read.
On the null driver (no device memory to export) the slots are the board's own shared memory: the producer's
output read back to the host, the consumer's input written from it.
"""

from __future__ import annotations

import attrs
import numpy as np

from ..cuda import _ipc


@attrs.frozen
class IpcToken:
    """What an ``ipc`` link sends each frame: which slot holds the frame, the slot's memory and event handles
    (bytes, opened once by the consumer) and how many bytes the frame has."""

    slot: int
    memory: bytes = attrs.field(repr=False)
    event: bytes = attrs.field(repr=False)
    nbytes: int
    pid: int  # the producer's process: a restarted producer exports new slots


def device_pointer(engine, port) -> tuple[int, int]:
    """(pointer, bytes) of a port's device buffer in the running graph (through ``engine.array``)."""
    view = engine.array(port)
    return int(view.data.ptr), int(view.nbytes)


class IpcSender:
    """The producer's end of an ``ipc`` link: ``depth`` exported slots, each with an interprocess event."""

    def __init__(self, engine, nbytes: int, depth: int, pid: int):
        engine.device.make_current()
        api = engine.device.api
        self._api = api
        self._pid = pid
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

    def handles(self) -> list[tuple[bytes, bytes]]:
        """Each slot's (memory, event) handles, as the link's board carries them to the consumers."""
        return [(m.handle, e.handle) for m, e in zip(self._slots, self._events, strict=True)]

    def send(self, engine, port, frame: int) -> IpcToken:
        """Queue this frame's copy of ``port`` into its slot (after the frame, on the engine's stream)."""
        engine.device.make_current()
        src, nbytes = device_pointer(engine, port)
        nbytes = min(nbytes, self.nbytes)
        s = frame % len(self._slots)
        stream = int(engine.stream)
        _ipc.copy_after(self._api, stream, None, self._slots[s].ptr, src, nbytes)
        self._events[s].record(stream)
        return IpcToken(s, self._slots[s].handle, self._events[s].handle, nbytes, self._pid)

    def close(self) -> None:
        for ev in self._events:
            ev.close()
        for mem in self._slots:
            mem.close()
        self._events, self._slots = [], []


class IpcReceiver:
    """The consumer's end of an ``ipc`` link: the producer's slots mapped once (again after the producer
    restarted), its events opened once."""

    def __init__(self, engine):
        self._api = engine.device.api
        self._memory: dict[int, tuple[bytes, int]] = {}  # slot -> (handle, mapped pointer)
        self._events: dict[int, tuple[bytes, object]] = {}
        self.received = 0

    def receive(self, engine, port, token: IpcToken) -> None:
        """Queue the copy of the token's slot into ``port``, after the producer's event, on the engine's stream."""
        engine.device.make_current()
        api = self._api
        mem = self._memory.get(token.slot)
        if mem is None or mem[0] != token.memory:
            if mem is not None:
                _ipc.close_memory(api, mem[1])
            mem = self._memory[token.slot] = (token.memory, _ipc.open_memory(api, token.memory))
        ev = self._events.get(token.slot)
        if ev is None or ev[0] != token.event:
            if ev is not None:
                _ipc.destroy_event(api, ev[1])
            ev = self._events[token.slot] = (token.event, _ipc.open_event(api, token.event))
        dst, room = device_pointer(engine, port)
        _ipc.copy_after(api, int(engine.stream), ev[1], dst, mem[1], min(room, token.nbytes))
        self.received += 1

    def close(self) -> None:
        for _handle, ptr in self._memory.values():
            _ipc.close_memory(self._api, ptr)
        for _handle, ev in self._events.values():
            _ipc.destroy_event(self._api, ev)
        self._memory, self._events = {}, {}


def host_send(engine, port) -> np.ndarray:
    """The producer's end of a ``host`` link: the port's value after the frame."""
    return engine.read(port)


def host_receive(engine, port, array) -> None:
    """The consumer's end of a ``host`` link: the producer's array into the input."""
    engine.write(port, array)


def bytes_receive(engine, port, raw: np.ndarray) -> None:
    """The consumer's end of an ``ipc`` link on the null driver: a slot's bytes into the input, as an array of
    the input's element type and shape (fewer bytes fill its start)."""
    from ..model import _dtypes

    spec = port.spec
    like = np.zeros(engine.shape(port), _dtypes.to_numpy(spec.dtype) if spec.dtype else np.uint8)
    flat = like.reshape(-1).view(np.uint8)
    n = min(flat.size, raw.size)
    flat[:n] = raw[:n]
    engine.write(port, like)
