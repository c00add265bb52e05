"""The pipeline the user declares: blocks, connections and bindings, changed from any thread.

Each verb checks only what it touches (the PipelineIndex), changes the registry under the model lock, and
folds one change event into the pending plan; the engine's thread applies it before a following frame.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs

from ..blocks._blocks import Block, PortHandle, resolve_port
from ..blocks._bounds import untied_kernels
from ..cuda._memory import ExternalArray
from ..model import _dtypes
from ..model._describe import Connection, PortRef
from ..model._errors import ValidationError
from ..model._events import BlockAdded, BlockChanged, BlockRemoved, Connected, Disconnected, PortRebound
from . import _shapes_io
from ._delaystate import check_shared_initial, initial_connection
from ._io import DataIO
from ._records import Diagnostic
from ._runtime import Runtime
from ._tooltips import Link


def _bounds_info(rt: Runtime, block: Block) -> None:
    """One "info" diagnostic per kernel file none of whose scalars is tied to its buffers (the first block that
    uses it says so): rxcuda cannot check its bounds (see rxcuda.engine._bounds)."""
    for kernel in untied_kernels(block):
        origin = block.description.kernel(kernel).code.origin  # type: ignore[union-attr]
        if origin in rt.untied_told:  # one diagnostic per kernel file, not one per block that uses it
            continue
        rt.untied_told.add(origin)
        rt.reporter.publish(Diagnostic(
            "info", f"{block.name}.{kernel}",
            f"{block.name}.{kernel} ({origin}): no scalar of this kernel counts its buffers, so keeping its indices "
            "inside them is yours: rxcuda cannot refuse a value or a launch that makes it index past them. Declare "
            'the count ({"name": "n", "type": "i32", "counts": ["x", "out"]} in its sidecar, or '
            "int n RX_COUNTS(x, out) in CUDA C++) to have such values refused", rt.frame, block.id))


class Model:
    def __init__(self, rt: Runtime, io: DataIO):
        self.rt = rt
        self.io = io

    def ref(self, port: PortHandle) -> PortRef:
        return resolve_port(port, self.rt.blocks)

    def add(self, block: Block, engine) -> None:
        if not isinstance(block, Block):
            raise TypeError(f"engine.add takes a Block (got {type(block).__name__})")
        rt = self.rt
        with rt.lock:
            if block._engine is not None:
                raise ValueError(f"{block.name} is already in an engine; remove it there first")
            name = rt.index.free_name(block.name)
            if name != block.name:
                block._desc = attrs.evolve(block._desc, name=name)
            rt.index.add_block(block.id, block.description)
            rt.blocks[block.id] = block
            rt.forget(block.id)  # (what it changed while outside folded nowhere: its entry is made again)
            block._engine = engine
            block._sink = rt.pending
            block.state, block.message = "not built", ""
        rt.pending.add(BlockAdded(block.id, block.name))
        _bounds_info(rt, block)

    def detach_all(self) -> None:
        """The engine closed: its blocks no longer report to it."""
        for b in self.rt.blocks.values():
            b._sink = None
            b._engine = None

    def links(self) -> tuple[Link, ...]:
        """Every connection as a Link of port handles (``engine.connections``)."""
        rt = self.rt
        with rt.lock:
            return tuple(Link(PortHandle(rt.blocks[c.src.block], c.src.port),
                              PortHandle(rt.blocks[c.dst.block], c.dst.port), getattr(c, "delay", 0))
                         for c in rt.connections.values())

    def remove(self, block: Block, gpu: Callable) -> None:
        rt, io = self.rt, self.io
        if rt.blocks.get(block.id) is not block:
            raise ValueError(f"{block.name} is not in this engine")
        block.dispose_bindings()  # before the removal event, so no late value recreates its entries
        for ref in [r for r in io.feeds if r.block == block.id]:
            io.close_feed(ref, gpu)
        with rt.lock:
            del rt.blocks[block.id]
            for c in rt.index.remove_block(block.id):
                del rt.connections[c.dst]
            for ref in [r for r in rt.bindings if r.block == block.id]:
                del rt.bindings[ref]
            rt.fed = {r for r in rt.fed if r.block != block.id}
            rt.kept = {r for r in rt.kept if r.block != block.id}
            rt.shapes = {r: s for r, s in rt.shapes.items() if r.block != block.id}
            for ref in [r for r in io.staged if r.block == block.id]:
                io.forget(ref)
            block._engine = None
            block._sink = None
            block.state, block.message = "removed", ""
        rt.pending.add(BlockRemoved(block.id, block.name))

    def connect(self, src: PortHandle, dst: PortHandle, delay: int = 0, initial=None) -> None:
        rt = self.rt
        s, d = self.ref(src), self.ref(dst)  # NotAPortError (a TypeError) for a block or composite given whole
        try:
            conn = Connection(s, d, delay)  # refuses a delay other than 0 or 1
        except ValueError as e:
            raise ValidationError(f"{src!r} -> {dst!r}: {e}", subject=dst.block.name) from None
        if initial is not None:
            if not delay:
                raise ValidationError(f"an initial value is the frame-0 value of a delayed connection, and {src!r} "
                                      f"-> {dst!r} has no delay: pass delay=1 too, or drop initial",
                                      subject=dst.block.name)
            conn = initial_connection(conn, src, dst, initial)
        with rt.lock:
            if conn.initial is not None:
                check_shared_initial(conn, rt.connections.values(), rt.blocks)
            rt.index.add_connection(conn)  # checks what it touches; a refusal changes nothing
            rt.connections[conn.dst] = conn
            rt.fed.discard(conn.dst)
            rt.shapes.pop(conn.dst, None)  # a connected input takes its source's shape
            self.io.forget(conn.dst)
        rt.pending.add(Connected(conn.src, conn.dst))

    def disconnect(self, src: PortHandle, dst: PortHandle) -> None:
        rt = self.rt
        s, d = self.ref(src), self.ref(dst)
        with rt.lock:
            conn = rt.connections.get(d)  # delayed or not: one input has one connection
            if conn is None or conn.src != s:
                raise ValidationError(f"{src!r} is not connected to {dst!r}", subject=src.block.name)
            del rt.connections[conn.dst]
            rt.index.remove_connection(conn)
        rt.pending.add(Disconnected(conn.src, conn.dst))

    def bind(self, port: PortHandle, ext: ExternalArray) -> None:
        """Bind a resolved device array to a port, after checking it fits."""
        ref = self.ref(port)
        spec = port.spec
        rt = self.rt
        where = f"{port.block.name}.{port.name}"
        ext = _shapes_io.as_elements(ext, spec, where)  # a float32 (..., 4) array is float4 elements
        if spec.dtype and ext.dtype != spec.dtype:
            raise ValidationError(f"cannot bind a {ext.dtype} array to {where}, which takes {spec.dtype}; convert "
                                  f"it first (arr.astype('{_dtypes.to_numpy(spec.dtype)}'))", subject=port.block.name)
        need = math.prod(_shapes_io.current_shape(rt, ref, spec))
        if ext.count < need:
            raise ValidationError(f"cannot bind {ext.count} elements to {where}, which needs {need}",
                                  subject=port.block.name)
        if ext.device != rt.device.ordinal:
            raise ValidationError(f"the array lives on GPU {ext.device}, but this engine runs on GPU "
                                  f"{rt.device.ordinal}; copy it there first (e.g. cupy.asarray under "
                                  f"cupy.cuda.Device({rt.device.ordinal}))", subject=port.block.name)
        if ext.readonly and spec.direction != "in":
            raise ValidationError(f"{where} is written by the pipeline, but the array is read-only; bind a "
                                  "writable array", subject=port.block.name)
        with rt.lock:
            if rt.is_connected(ref):
                raise ValidationError(f"{where} is connected; disconnect it before binding an array",
                                      subject=port.block.name)
            was_bound = ref in rt.bindings
            rt.bindings[ref] = ext
            rt.index.bind(ref)
            rt.kept.add(ref)  # a bound port never shares memory, bound or (later) unbound
            rt.fed.discard(ref)
            self.io.forget(ref)
        if was_bound:
            rt.pending.add(PortRebound(ref.block, ref.port, ext))
        else:
            rt.pending.add(BlockChanged(ref.block, port.block.name, f"port {port.name} bound to an array"))

    def unbind(self, port: PortHandle) -> None:
        ref = self.ref(port)
        rt = self.rt
        with rt.lock:
            if rt.bindings.pop(ref, None) is None:
                raise ValidationError(f"{port!r} is not bound", subject=port.block.name)
            rt.index.unbind(ref)
        rt.pending.add(BlockChanged(ref.block, port.block.name, f"port {port.name} unbound"))
