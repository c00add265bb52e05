"""What the engine's verbs share: the device and its driver, streams, memory, modules, the model (blocks,
connections, bindings, fed inputs) and the graph now running. One per engine; only data and small helpers.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, cast

import attrs

from ..cuda import _native
from ..cuda._device import Device
from ..cuda._fast import FastDriver
from ..cuda._graph import CompiledGraph
from ..cuda._memory import BufferPool, ExternalArray
from ..cuda._modules import ModuleCache
from ..cuda._stream import destroy_stream, synchronize
from ..model._describe import BlockEntry, Connection, ExternalBinding, PipelineDescription, PortRef
from ..model._events import ParameterChanged
from ..plan._index import PipelineIndex
from ..streams._coalesce import PendingPlan
from ._records import Reporter


@attrs.define(eq=False)
class Runtime:
    device: Device
    api: Any  # cuda.bindings' driver module, or a NullDriver
    fast: FastDriver
    stream: Any  # the engine's CUstream (non-blocking); every copy, memset and frame goes on it
    capture_stream: Any  # library calls are captured here (never executed)
    pool: BufferPool
    modules: ModuleCache
    pending: PendingPlan
    reporter: Reporter
    blocks: dict = attrs.field(factory=dict)  # id -> Block, in insertion order
    connections: dict[PortRef, Connection] = attrs.field(factory=dict)  # by input port: one source each
    bindings: dict[PortRef, ExternalArray] = attrs.field(factory=dict)
    fed: set[PortRef] = attrs.field(factory=set)  # inputs the user fills with write() or feed()
    # ports the user reads, observes, writes, binds or feeds: never sharing memory (PipelineDescription.kept)
    kept: set[PortRef] = attrs.field(factory=set)
    shapes: dict[PortRef, tuple] = attrs.field(factory=dict)  # inputs the user resized (PipelineDescription.shapes)
    reuse_memory: bool = True  # buffers whose lifetimes never overlap share memory (Engine(reuse_memory=...))
    regions: dict = attrs.field(factory=dict)  # id -> Region (also in blocks): whose bodies hold which blocks
    stamps: str | None = None  # profiling: the graph gets a timestamp node per "block" or per "kernel"
    occupancy: dict = attrs.field(factory=dict)  # (block id, kernel) -> theoretical occupancy (per_kernel+)
    graph: CompiledGraph | None = None
    # what waits for the next frame's launch: a direct tick's rebuild leaves the destruction of the graph it replaced
    # here (idle: its frames were waited for), so that the driver's work overlaps that frame on the GPU
    after_launch: list = attrs.field(factory=list)
    preparing: bool = False  # a new graph is being prepared off the frame thread (rxcuda.engine._prepare)
    # tiers applied between frames (a read, array() or write that needed the pending changes first): the next
    # frame is the first to run with them, so it reports them (Frame.tiers)
    carried: tuple = ()
    frame: int = 0
    lock: threading.RLock = attrs.field(factory=threading.RLock)  # the model; never held while waiting
    index: PipelineIndex = attrs.field(factory=PipelineIndex)  # checks one change at a time
    # several devices (Engine(devices=[...])): rxcuda.engine._devices.Devices, and block id -> device position
    devices: Any = None
    placement: dict[int, int] = attrs.field(factory=dict)
    # kernel files already named in an "info" diagnostic for counting none of their buffers (said once each)
    untied_told: set = attrs.field(factory=set)
    # block id -> (the block, its entry in the last snapshot): kept while the block's description, values and
    # launches are the same, so that the planner (rxcuda.plan._plan.Replanner) recognizes an unchanged block by
    # identity; and the pending plan's ``value_folds`` when it was taken (see _entries)
    entries: dict = attrs.field(factory=dict)
    entries_folds: int = -1

    stream_h: int = attrs.field(init=False)  # the stream's raw handle, for the per-frame calls

    def __attrs_post_init__(self) -> None:
        self.stream_h = int(self.stream)

    @classmethod
    def open(cls, device: Device, on_change_error) -> Runtime:
        """The runtime of a new engine on ``device``: its streams, memory pool, module cache, pending plan
        (``on_change_error(err, event)``: where a failing subscriber of its changes is reported) and reporter."""
        api = device.api
        blocks: dict = {}
        rt: Runtime
        rt = cls(device=device, api=api, fast=FastDriver(api=api), stream=device.create_stream(),
                 capture_stream=device.create_stream(), pool=BufferPool(api), modules=ModuleCache(api),
                 pending=pending_plan(on_change_error), reporter=Reporter(blocks, lambda: rt.frame), blocks=blocks)
        return rt

    def snapshot(self) -> PipelineDescription:
        """The pipeline as pure data, as the planner sees it."""
        with self.lock:
            blocks = self._entries()
            binds = {r: ExternalBinding(e.dtype, e.count) for r, e in self.bindings.items()}
            regions = tuple(r.spec() for r in self.regions.values())
            placement = {b: p for b, p in self.placement.items() if p and b in self.blocks} if self.placement else {}
            return PipelineDescription(blocks, tuple(self.connections.values()), binds, frozenset(self.fed),
                                       regions=regions, kept=frozenset(self.kept), shapes=self.shapes,
                                       placement=placement)

    def _entries(self) -> tuple[BlockEntry, ...]:
        """Each block's entry: the last snapshot's where nothing in it changed (measured on the null driver,
        1000 blocks: 0.9 ms, against 1.3 ms for new entries, and the planner's check of the unchanged blocks
        goes from 2.1 ms to 0.1 ms).

        Where no parameter value or launch was folded into the pending plan since the last snapshot
        (``value_folds`` stood still), a block that is the same object with the same description as then is
        taken as it was, its values and launches not read again (a structural edit at 1000 blocks: ~1.2 ms
        less). That holds because every change of a block in the engine folds there (its setters hand it to
        ``_sink``), and a block added again drops its entry (``forget``): what it changed outside the engine
        folded nowhere."""
        folds = self.pending.value_folds  # (read first: a change folded after it is seen by the next snapshot)
        same = folds == self.entries_folds
        was, now = self.entries, {}
        out = []
        for b in self.blocks.values():
            bid = b.id
            kept = was.get(bid)
            if kept is not None and same and kept[0] is b and kept[1].desc is b.description:
                e = kept[1]
            else:
                e = kept[1] if kept is not None else None
                values, launches = b._planned_values(), b.launches()
                if e is None or e.desc is not b.description or e.values != values or e.launches != launches:
                    e = BlockEntry.of(bid, b.description, values, launches)  # (dicts made for it alone)
            now[bid] = (b, e)
            out.append(e)
        self.entries, self.entries_folds = now, folds
        return tuple(out)

    def forget(self, block_id: int) -> None:
        """Drop a block's entry from the last snapshot (it was added again, or replaced: see _entries)."""
        self.entries.pop(block_id, None)

    def running(self) -> CompiledGraph:
        """The graph now running (callers know there is one)."""
        g = self.graph
        if g is None:
            raise RuntimeError("no graph is running yet")
        return g

    def is_connected(self, ref: PortRef) -> bool:
        return ref in self.connections

    def launched(self) -> None:
        """Run what waited for a frame's launch (``after_launch``), in order."""
        waiting, self.after_launch = self.after_launch, []
        for fn in waiting:
            fn()

    def synchronize(self) -> None:
        synchronize(self.stream, api=self.api)

    def release(self) -> None:
        """Free the module cache, the memory pool and the streams (the GPU is done with them; never raises)."""
        if self.devices is not None:  # the other devices' lanes (their own streams, pools, modules)
            quietly(self.devices.close)
        quietly(self.modules.close)
        quietly(self.pool.close)
        for s in (self.stream, self.capture_stream):
            quietly(lambda s=s: destroy_stream(s, api=self.api))


def pending_plan(on_change_error=None) -> PendingPlan:
    """An engine's pending plan: with its hot fields and its fold (``set_value``) in C where the compiled path
    builds (rxcuda.cuda._native: ``PendingBase`` before PendingPlan, whose methods read the same fields), so that a
    parameter's setter in C (rxcuda.blocks.Parameter) folds a value without a Python call; else a PendingPlan."""
    pending = _pending_type()(on_change_error)
    if type(pending) is not PendingPlan:
        cast(Any, pending)._event_type = ParameterChanged  # (what its set_value publishes, made in C)
    return pending


@functools.cache
def _pending_type() -> type[PendingPlan]:
    native = _native.hotpath()
    if native is None:
        return PendingPlan
    base = native.pending_base(PendingPlan.HOT_FIELDS, PendingPlan.HOT_NAMES)
    return type("PendingPlan", (base, PendingPlan), {"__module__": __name__, "__slots__": ()})


def quietly(fn) -> None:
    """Run a release step, ignoring its failure: closing releases what it can and never raises over it."""
    with contextlib.suppress(Exception):
        fn()
