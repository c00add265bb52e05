"""The Structure tier over several devices (``rxcuda.engine._devices``): split the whole pipeline's plan,
build a graph per device from its own lane (module cache, memory pool, stream), producers first, and swap
them in together; a device whose plan and memory did not change keeps its running graph.
"""

from __future__ import annotations

import attrs
import numpy as np

from ..blocks._regions import stamp_code
from ..cuda._graph import CompiledGraph
from ..cuda._memory import DeviceBuffer
from ..cuda._peer import Crossing
from ..cuda._profile import StampRing
from ..cuda.nodes import kind_of
from ..model import _dtypes
from ..model._describe import KernelSpec, Launch, PipelineDescription, PortRef
from ..model._graphplan import (
    EventRecordNodePlan,
    EventWaitNodePlan,
    GraphPlan,
    KernelNodePlan,
    PeerCopyNodePlan,
    ScalarArg,
)
from ..plan._placement import split
from ..plan._profile import without_stamps
from ._devices import DeviceGraphs, Devices, Lane


def build(builder, desc: PipelineDescription, gp: GraphPlan, raise_errors: bool) -> bool:
    """The Structure tier over several devices: split ``gp`` (the whole pipeline's plan), load each device's
    code, allocate its buffers from its own pool, build and instantiate a graph per device (producers
    first: a reader's copy names the producer's memory), then swap them in together. A failure leaves the
    last good graphs running (the caller, ``Builder.build``, reports it)."""
    rt = builder.rt
    devices: Devices = rt.devices
    s = split(gp, desc, len(devices), devices.ordinals_of())  # profiled: stamps per device (see split)
    gp = attrs.evolve(without_stamps(gp), stamps=gp.stamps)  # the whole plan's ids, and whether it is stamped
    lanes = devices.lanes
    acquired: list[tuple[Lane, DeviceBuffer]] = []
    graphs: list[CompiledGraph | None] = [None] * len(lanes)
    buffers: dict[tuple, tuple[Lane, DeviceBuffer]] = {}
    old: dict = getattr(builder, "device_buffers", {})
    remote: dict[tuple[int, int], int] = {}
    contexts = [lane.device.context for lane in lanes]
    running = rt.graph if isinstance(rt.graph, DeviceGraphs) and len(rt.graph.graphs) == len(lanes) else None
    kept: set[int] = set()  # devices whose running graph stays: a structural change elsewhere leaves it alone
    try:
        for d in s.order:
            lane, p = lanes[d], s.plans[d]
            lane.device.make_current()
            functions = {}
            for node in p.nodes:
                if (n := kind_of(node).kernel_of(node)) is not None:
                    spec = desc.block(n.block).desc.kernel(n.kernel)
                    assert isinstance(spec, KernelSpec)
                    functions[n.code_key] = lane.modules.load(spec.code).function
            pointers: dict[int, int] = {}
            fresh = []
            for group in p.shared:
                nbytes = max(p.buffers[m].nbytes for m in group)
                key = (d, ("shared", p.buffers[group[0]].key), nbytes)
                got = old.get(key) or buffers.get(key)
                if got is None:
                    got = (lane, lane.pool.acquire(nbytes))
                    acquired.append(got)
                    fresh.append(got[1])
                buffers[key] = got
                for m in group:
                    pointers[m] = got[1].ptr
            for b in p.buffers:
                if b.kind == "external":
                    pointers[b.id] = rt.bindings[PortRef(b.key[1], b.key[2])].ptr
                    continue
                if b.id in p.storage:
                    continue
                key = (d, b.key, b.nbytes)
                got = old.get(key)
                if got is None:
                    got = (lane, lane.pool.acquire(b.nbytes, mapped=b.kind == "mapped"))
                    acquired.append(got)
                    fresh.append(got[1])
                buffers[key] = got
                pointers[b.id] = got[1].ptr
            for b in p.buffers:
                remote[(d, b.id)] = pointers[b.id]
            events = [devices.event(i, s.recorders[i]) for i in range(len(s.events))]
            lane.device.make_current()
            # what this device's graph reads of the others: their buffers its copies read, the events it uses
            sources = (tuple(remote[(n.src_device, n.src)] for n in p.nodes if isinstance(n, PeerCopyNodePlan)),
                       tuple(int(events[n.event]) for n in p.nodes if isinstance(n, (EventRecordNodePlan,
                                                                                      EventWaitNodePlan))))
            prev = running.graphs[d] if running is not None else None
            if (prev is not None and not fresh and _structure(prev.plan) == _structure(p) and prev.pointers == pointers
                    and getattr(prev, "sources", None) == sources):
                graphs[d] = prev  # the same plan over the same memory: nothing to rebuild on this device
                kept.add(d)
                continue
            if fresh:
                lane.pool.zero(fresh, lane.stream)
            for (bid, name), sid in p.device_scalars.items():
                host = np.array([desc.block(bid).value(name)], dtype=_dtypes.to_numpy(p.buffers[sid].dtype))
                DeviceBuffer(pointers[sid], host.nbytes, api=lane.api).upload(host, lane.stream)
            crossing = Crossing(d, events, remote,
                                {src: devices.routes.get((src, d), "local") for src in range(len(lanes))},
                                contexts)
            # profiled: this device's stamps write a ring of its own, read by the engine (DeviceGraphs.stamps)
            ring = StampRing(lane.api, lane.modules.load(stamp_code()).function, len(p.stamps.names)) \
                if p.stamps is not None else None
            try:
                g = CompiledGraph(p, functions, pointers, lane.device.context, capture=builder.capture,
                                  fast=lane.fast, api=lane.api, crossing=crossing, stamps=ring)
            except BaseException:
                if ring is not None:
                    ring.close()
                raise
            graphs[d] = g
            g.sources = sources  # type: ignore[attr-defined]  # the other devices' memory its copies read
            g.instantiate()
            lane.fast.wait(lane.stream_h)  # the zeroing and uploads on this lane, before the frames use them
    except Exception:
        for d, made in enumerate(graphs):
            if made is not None and d not in kept:
                made.close()
        for lane, buf in acquired:
            lane.pool.release(buf)
        rt.device.make_current()
        raise
    rt.device.make_current()
    built = DeviceGraphs(gp, s, [g for g in graphs if g is not None], devices)
    devices.rebuilt = tuple(d for d in range(len(lanes)) if d not in kept)
    _retire(builder, built, buffers, kept)
    devices.say_routes(s)
    return _finish(builder, desc, gp, built)


_NO_LAUNCH = Launch(grid=(1, 1, 1), block=(1, 1, 1))


def _structure(p: GraphPlan) -> GraphPlan:
    """A plan without what the lower tiers change in a running graph (scalar values, launch geometry): two
    plans equal here are one graph."""
    def plain(n):
        args = getattr(n, "args", None)
        if args is None:
            return n
        n = n._replace(args=tuple(a._replace(value=0) if isinstance(a, ScalarArg) else a for a in args))
        return n._replace(launch=_NO_LAUNCH) if isinstance(n, KernelNodePlan) else n

    return attrs.evolve(p, nodes=tuple(plain(n) for n in p.nodes), warnings=())


def _retire(builder, new: DeviceGraphs, buffers: dict, kept: set[int]) -> None:
    """Swap the new graphs in; free the old ones (but those ``kept``) and the buffers they alone used (each to
    its own pool)."""
    rt = builder.rt
    old_graph, rt.graph = rt.graph, new
    if old_graph is not None:
        for lane in rt.devices.lanes:
            lane.fast.wait(lane.stream_h)
        if isinstance(old_graph, DeviceGraphs):
            old_graph.close(keep=kept)
        else:
            old_graph.close()
    old: dict = getattr(builder, "device_buffers", {})
    for key, (lane, buf) in old.items():
        if key not in buffers:
            lane.pool.release(buf)
    builder.device_buffers = buffers


def release(builder) -> None:
    """Free every device's buffers (the engine is closing; its graphs were retired)."""
    for lane, buf in getattr(builder, "device_buffers", {}).values():
        lane.pool.release(buf)
    builder.device_buffers = {}


def _finish(builder, desc: PipelineDescription, gp: GraphPlan, built: DeviceGraphs) -> bool:
    """What a successful build does after the swap (as ``Builder._build``): delayed connections' frame-0
    values, library state of blocks that left, block states, the plan's warnings."""
    rt = builder.rt
    builder.delays.built(gp, desc, built.pointers, ())
    built.refresh_replicas(rt.stream)  # delayed connections into another device: from their frame-0 values
    builder.release_library_state(keep={b.id for b in desc.blocks})
    for d, g in enumerate(built.graphs):
        codes = {n.code_key for n in g.plan.nodes if isinstance(n, KernelNodePlan)}
        rt.devices.lanes[d].modules.prune(codes | ({stamp_code().key} if g.plan.stamps is not None else set()))
    builder.rebuilds += 1
    builder._occupancy_warnings = []  # none measured over several devices
    builder.report_built(gp, {b.id for b in desc.blocks})
    builder._on_built()
    builder.last_build_ms = None
    builder.last_in_place = False
    return True
