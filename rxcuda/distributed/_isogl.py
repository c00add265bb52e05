"""OpenGL drawing from an isolated engine (``IsolatedEngine.gl_buffer``): the GL buffer is registered in the user's
process, whose CUDA context a fault in the GPU process leaves working, and each frame reaches it through memory both
processes map, so a kernel that faults costs the frames it ended, not the drawing.

How a frame reaches GL:

- The GPU process exports the port as a link's producer does (``FragmentHost._export``: the buffer is one more
  export of its fragment, added by :func:`with_exports`, so a replaced process exports it again when it rebuilds):
  after each frame it copies the port into one of ``depth`` slots and publishes the frame on a board (``_board``:
  a shared-memory file, no call). On a GPU the slots are device memory it allocated and exported (CUDA IPC), each
  with an interprocess event; on the CPU device and the null driver they are the board's own shared memory.
- This process registers the GL buffer with a CUDA context of its own (``cuGraphicsGLRegisterBuffer``: the primary
  context of the same GPU; on the CPU device a :class:`~rxcuda.cuda._cpu.CpuDriver`), and after the frame maps it,
  copies the frame's slot into it and unmaps it, on a stream of its own. On a GPU that is one device-to-device copy
  ordered after the slot's event (no host wait; the slot mapped once per board with ``cuIpcOpenMemHandle``); on the
  CPU device a host copy into the buffer's host copy, which the unmap uploads (``glBufferSubData``: ``_cpugl``).
- After a fault the new GPU process exports the port on a new board (it retires the dead one's); the next good
  frame maps the new board and its slots (the old ones closed), and drawing goes on. A frame that did not complete
  (the one a fault ended, those while the process is replaced) is not copied: GL keeps the last good frame's bytes.

The copy is a frame behind nothing: the render loop ticks through the buffer (``shared.tick()``: the frame in the GPU
process, then the copy), as with ``rxcuda.Engine.gl_buffer``. Before the next frame is submitted, this side waits for
its last copy (an event long done by then: GL drew from it), so the GPU process never refills a slot being copied.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import attrs
import numpy as np

from ..cuda import NullDriver, _gl, _ipc
from ..cuda._device import Device
from ..cuda._memory import copy_htod_async
from ..cuda._stream import (
    create_event,
    create_stream,
    destroy_event,
    destroy_stream,
    event_synchronize,
    record_event,
    synchronize,
)
from ..model import _dtypes
from ..model._describe import PortRef
from ..model._errors import CudaError, EngineClosedError
from . import _board
from ._placement import RemoteLink, Split

SINK = "gl"  # the consumer a GL export names (no worker: this process)


def _port_name(port) -> str:
    return f"{port.block.name}.{port.name}"


def check(engine, port, glo) -> None:
    """Refuse what an isolated engine's GL buffer cannot be made of, naming the fix (before any CUDA context is made
    here for it)."""
    what = "IsolatedGLBuffer"
    if engine.closed:
        raise EngineClosedError(f"{what}: the engine is closed")
    if engine._loop is not None:
        raise RuntimeError(f"{what}: engine.run() drives the frames on its own thread, but GL objects are mapped on "
                           "the GL context's thread; dispose run() and tick from the render loop (shared.tick())")
    if not isinstance(glo, int | np.integer) or isinstance(glo, bool) or glo <= 0:
        raise TypeError(f"{what} takes the GL object's name, a positive int such as moderngl's buffer.glo "
                        f"(got {glo!r})")
    engine.placement(port.block)  # a port of a block of this engine, or a ValidationError naming the fix
    if port.spec.dtype is None:
        raise TypeError(f"{_port_name(port)} has no element type (void*); share a typed port with GL")


class GLSide:
    """This process's CUDA side of an isolated engine's GL buffers: a device (the primary context of the engine's
    GPU; the CPU device's driver; the null driver), a stream, and the buffers shared so far."""

    def __init__(self, device: int | str, *, cpu: bool, null: bool):
        if null or cpu:
            from ..cuda._cpu import CpuDriver

            self.device = Device(0, api=NullDriver() if null else CpuDriver())
        else:
            self.device = Device(int(device))
        self.api = self.device.api
        self.slots_on_device = not (null or cpu)  # CUDA IPC slots (a GPU) or the board's shared memory
        self.stream = create_stream(api=self.api)
        self.buffers: list[IsolatedGLBuffer] = []

    def close(self) -> None:
        for b in list(self.buffers):
            b.close()
        self.device.make_current()
        destroy_stream(self.stream, api=self.api)
        self.device.close()


class IsolatedGLBuffer:
    """A port of an :class:`~rxcuda.IsolatedEngine` drawn by an OpenGL buffer: after each frame the GPU process
    wrote, its bytes are copied into the buffer in this process (module docstring). ``iso.gl_buffer(port, glo)``
    makes one; ``tick()`` runs a frame and copies it, as ``rxcuda.Engine.gl_buffer``'s object does, and
    ``with a, b: iso.tick()`` copies several. ``copied``: frames copied into the buffer; ``missed``: frames that did
    not complete (a fault, the GPU process being replaced), after which GL kept the last good frame's bytes."""

    what = "GL buffer"

    def __init__(self, engine, side: GLSide, port, glo: int):
        check(engine, port, glo)
        self.engine, self.port, self.glo = engine, port, int(glo)
        self.ref = PortRef(port.block.id, port.name)
        self.shape: tuple[int, ...] = ()
        self.nbytes = 0
        self.measure()
        self._side, self._api = side, side.api
        self.transport = "ipc" if side.slots_on_device else "host"
        side.device.make_current()
        self._resource = _gl.register_buffer(self._api, self.glo)
        self._event = create_event(timing=False, api=self._api)  # after this side's last copy
        self._copying = False  # a copy was queued since the event was last waited for
        self._reader = _board.BoardReader(_board.board_path(engine._session, self.ref.block,
                                                            port.name + ("" if self.transport == "ipc" else "~h")))
        self._slots: dict[int, tuple[int, bytes, int, bytes, Any]] = {}  # slot -> (generation, handles, mapped)
        self._from = 0  # the engine's frame when __enter__ ran
        self.copied = 0
        self.missed = 0
        self.closed = False
        side.buffers.append(self)

    def measure(self) -> int:
        """The port's shape and bytes now (a resize changes them); returns the bytes."""
        self.shape = tuple(self.engine._model.shape(self.port))
        self.nbytes = math.prod(self.shape) * _dtypes.itemsize(self.port.spec.dtype)
        return self.nbytes

    def _check(self) -> None:
        if self.engine.closed:  # (which closed this buffer too)
            raise EngineClosedError(f"the engine of {_port_name(self.port)} is closed")
        if self.closed:
            raise RuntimeError(f"the {self.what} shared with {_port_name(self.port)} is closed")

    # -- frames ------------------------------------------------------------------------------------------
    def tick(self, sync: bool = False):
        """One frame in the GPU process, then its bytes copied into the GL buffer (GL's next draw comes after the
        copy); returns the Frame. ``sync``: also wait on the host until the copy is done."""
        with self:
            frame = self.engine.tick()
        if sync:
            self._side.device.make_current()
            synchronize(self._side.stream, api=self._api, what="a GL buffer's copy")
        return frame

    def __enter__(self):
        self._check()
        self._side.device.make_current()
        if self._copying:  # the slot the next frames write is not being copied from any more
            event_synchronize(self._event, api=self._api)
            self._copying = False
        self._from = self.engine._index
        return self

    def __exit__(self, exc_type, *exc) -> None:
        index = self.engine._index
        if exc_type is None and index != self._from and not self.closed:
            self._take(index)

    def _take(self, index: int) -> None:
        """Copy frame ``index`` from the GPU process's board into the GL buffer; a frame that did not complete is
        counted in ``missed`` and leaves the buffer as it was."""
        e = self.engine
        if index in e._faulted or e._down or e._held or self.ref.block not in e._placement:
            self.missed += 1  # (a removed block's port is exported no more: nothing to wait for)
            return
        reader = self._reader
        if reader.wait(index, e.deadline) != _board.READY or reader.board is None:
            self.missed += 1
            return
        board = reader.board
        n = board.length(index)
        api, stream = self._api, int(self._side.stream)
        self._side.device.make_current()
        _gl.map_resources(api, self._resource, stream)
        try:
            ptr, size = _gl.mapped_pointer(api, self._resource)
            if size < self.nbytes:
                raise ValueError(f"GL buffer {self.glo} holds {size} bytes, but {_port_name(self.port)} "
                                 f"({'x'.join(map(str, self.shape))} {self.port.spec.dtype}) needs {self.nbytes}; "
                                 f"make it larger (moderngl: ctx.buffer(reserve={self.nbytes}))")
            if board.data:  # the bytes are in the board's shared memory
                copy_htod_async(ptr, board.slot_address(index), min(n, size), stream, api=api)
            else:  # in a slot of device memory the GPU process exported: one copy after its event
                _gen, _m, src, _e, event = self._slot(reader, index)
                _ipc.copy_after(api, stream, event, ptr, src, min(n, size))
        finally:
            _gl.unmap_resources(api, self._resource, stream)
        record_event(self._event, stream, api=api)
        self._copying = True
        if board.data:
            board.check(index)  # (a host copy: done; the slot was not written again meanwhile)
        self.copied += 1

    def _slot(self, reader: _board.BoardReader, index: int):
        """The slot holding frame ``index`` mapped here and its event opened (again for a new board: a replaced
        GPU process's), closing what the old board's slot held."""
        board = reader.board
        assert board is not None
        s = index % board.depth
        got = self._slots.get(s)
        if got is not None and got[0] == reader.generation:
            return got
        memory, event = board.handles(s)
        if got is not None:  # a slot of a process that ended (a fault) or rebuilt its fragment
            del self._slots[s]
            with contextlib.suppress(CudaError):  # (a dead exporter's memory: nothing left to do if refused)
                self._unmap(got)
        ptr = _ipc.open_memory(self._api, memory)
        try:
            ev = _ipc.open_event(self._api, event)
        except BaseException:
            _ipc.close_memory(self._api, ptr)
            raise
        got = self._slots[s] = (reader.generation, memory, ptr, event, ev)
        return got

    def _unmap(self, got) -> None:
        _ipc.close_memory(self._api, got[2])
        _ipc.destroy_event(self._api, got[4])

    def close(self) -> None:
        """Unregister the GL buffer and stop copying into it (idempotent); the GPU process stops exporting the port
        with the next frame."""
        if self.closed:
            return
        self.closed = True
        side = self._side
        if self in side.buffers:
            side.buffers.remove(self)
        side.device.make_current()
        if self._copying:
            event_synchronize(self._event, api=self._api)
        for got in self._slots.values():
            self._unmap(got)
        self._slots = {}
        self._reader.close()
        destroy_event(self._event, api=self._api)
        _gl.unregister(self._api, self._resource)
        if not self.engine.closed:
            self.engine._dirty = True  # its export leaves the GPU process's fragment

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.copied} frames copied, {self.missed} missed"
        return f"<{type(self).__name__} {_port_name(self.port)} -> GL buffer {self.glo}, {state}>"


def with_exports(split: Split, worker: str, side: GLSide | None) -> Split:
    """``split`` with the GL buffers' ports exported by ``worker``'s fragment (and kept: their memory is not reused
    within the frame), one board each, for this process to copy from."""
    frag = split.fragments.get(worker)
    if side is None or not side.buffers or frag is None:
        return split
    mine = {b.id for b in frag.description.blocks}
    links = []
    for b in side.buffers:
        if b.ref.block not in mine:
            continue  # its block was removed: nothing to copy
        links.append(RemoteLink(worker, b.ref, SINK, b.ref, b.transport, f"{_port_name(b.port)} -> GL buffer {b.glo}",
                                b.measure(), "board", "an OpenGL buffer in the user's process"))
    if not links:
        return split
    desc = attrs.evolve(frag.description, kept=frag.description.kept | {ln.src for ln in links})
    frag = attrs.evolve(frag, description=desc, exports=frag.exports + tuple(links))
    return attrs.evolve(split, fragments={**split.fragments, worker: frag})


__all__ = ["GLSide", "IsolatedGLBuffer", "check", "with_exports"]
