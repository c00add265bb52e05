"""One pipeline over the devices of one host: the engine's devices, a graph per device, and the frame that
launches them all (``Engine(devices=[0, 1])``, ``engine.add(block, device=1)``).

Each device position has a :class:`Lane`: its device, stream, memory pool and module cache (position 0's is
the engine's own runtime). A rebuild plans the whole pipeline, splits the plan per device
(``rxcuda.plan._placement.split``: replicas of the buffers another device reads, peer copy nodes, event
record and wait nodes), and builds one CUDA graph per device (``rxcuda.engine._devbuild``).
:class:`DeviceGraphs` is what the rest of the engine sees as the running graph: the whole pipeline's plan,
node and buffer ids, each call sent to the graph of the device concerned -- a parameter of a block on
device 1 is an exec-node update of device 1's graph only.

A frame (:meth:`DeviceGraphs.launcher`): the engine's stream records a start event; each device's stream
waits for it and launches its graph (producers first, so each event wait finds this frame's record;
pipelined, the readers first); the engine's stream then waits for every other device's end. So what the
engine queues after a frame (outputs read back, host data written) is ordered after all devices' work, and
no host sync is added (see docs/devices.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..cuda._device import Device
from ..cuda._fast import FastDriver
from ..cuda._graph import CompiledGraph
from ..cuda._memory import BufferPool, PoolStats, copy_dtod_async
from ..cuda._modules import ModuleCache
from ..cuda._peer import describe_route, lost, route
from ..cuda._stream import destroy_event, destroy_stream, synchronize, wait_event
from ..cuda.nodes import PeerCopyNode
from ..model._errors import NoDeviceError
from ..model._graphplan import (
    GraphPlan,
    KernelNodePlan,
)
from ..plan._liveness import BufferStats, buffer_stats
from ..plan._placement import DeviceSplit
from ._records import Diagnostic


def check_devices(devices, device: int = 0) -> tuple[int, ...]:
    """``Engine(devices=...)``: a non-empty sequence of GPU ordinals (an ordinal may repeat: two positions
    on one GPU, each with its own graph and stream; ``"cpu"`` entries were made the CPU device's ordinal 0 by
    ``rxcuda.cuda._cpuchoice.choose_driver``); ``device``, the engine's other spelling, left alone."""
    if device != 0:
        raise ValueError(f"give Engine either device={device!r} or devices={devices!r}, not both (devices[0] is "
                         "the engine's first device)")
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or not devices:
        raise ValueError(f"devices takes a non-empty list of GPU ordinals, e.g. devices=[0, 1] (got {devices!r})")
    for d in devices:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise ValueError(f"devices takes GPU ordinals (ints >= 0), or 'cpu' for positions on the CPU device; "
                             f"got {d!r} in {list(devices)!r}")
    return tuple(devices)


def check_position(position, count: int) -> int:
    """``engine.add(block, device=...)``: a position in the engine's device list."""
    if not isinstance(position, int) or isinstance(position, bool) or not 0 <= position < count:
        raise ValueError(f"device={position!r} is not one of this engine's devices: it has {count} (positions "
                         f"0..{count - 1}, as given to Engine(devices=[...]))")
    return position


class Lane:
    """What one device position of an engine owns: device, streams, memory pool, module cache, fast driver
    and the events that join it to the frame."""

    def __init__(self, device: Device, stream, capture_stream, pool: BufferPool, modules: ModuleCache,
                 fast: FastDriver, own: bool):
        self.device = device
        self.api = device.api
        self.stream = stream
        self.stream_h = int(stream)
        self.capture_stream = capture_stream
        self.pool = pool
        self.modules = modules
        self.fast = fast
        self.own = own  # made here (position > 0), so released here
        self.done = device.create_event(timing=False)  # the end of this device's frame
        self.done_h = int(self.done)
        # profiling: this device's part of a frame, between two timing events (``Devices.gpu_us``)
        self.began, self.ended = device.create_event(), device.create_event()
        self.began_h, self.ended_h = int(self.began), int(self.ended)

    @classmethod
    def open(cls, device: Device) -> Lane:
        api = device.api
        return cls(device, device.create_stream(), device.create_stream(), BufferPool(api), ModuleCache(api),
                   FastDriver(api=api), True)

    def release(self) -> None:
        from ._runtime import quietly

        for ev in (self.done, self.began, self.ended):
            quietly(lambda ev=ev: destroy_event(ev, api=self.api))
        if self.own:
            self.device.make_current()
            quietly(self.modules.close)
            quietly(self.pool.close)
            for s in (self.stream, self.capture_stream):
                quietly(lambda s=s: destroy_stream(s, api=self.api))
            quietly(self.device.close)


class Devices:
    """The devices of an engine, by position: their lanes, the route of a copy between each two, the events
    of the frame. Made by ``Engine(devices=[...])``; ``rt.devices`` of its runtime."""

    def __init__(self, rt, ordinals: tuple[int, ...], driver=None, pipelined: bool = False):
        self.rt = rt
        self.ordinals = ordinals
        self.pipelined = pipelined
        lanes = [Lane(rt.device, rt.stream, rt.capture_stream, rt.pool, rt.modules, rt.fast, False)]
        try:
            for pos, ordinal in enumerate(ordinals[1:], start=1):
                try:
                    dev = Device(ordinal, api=driver)
                except NoDeviceError as e:
                    raise NoDeviceError(f"Engine(devices={list(ordinals)!r}): position {pos}: {e}") from None
                lanes.append(Lane.open(dev))
            rt.device.make_current()
            self.routes = {(s, d): route(lanes[s].device, lanes[d].device)
                           for s in range(len(lanes)) for d in range(len(lanes)) if s != d}
        except BaseException:
            for lane in lanes:
                lane.release()
            raise
        rt.device.make_current()
        self.lanes = lanes
        self.start = rt.device.create_event(timing=False)  # the frame's start on the engine's stream
        self.start_h = int(self.start)
        self.events: dict[tuple[int, int], object] = {}  # (the split's event, its recorder) -> CUevent
        self.told: set[tuple[int, int]] = set()  # routes said once (an info diagnostic each)
        self.rebuilt: tuple[int, ...] = ()  # the positions whose graph the last rebuild made anew
        self.timed = False  # profiling: time each device's part of a frame (FrameRunner.configure)
        self.timed_frames = 0  # frames launched with those timings
        self.timed_lanes: frozenset[int] = frozenset()  # the positions the last of them launched a graph on

    def __len__(self) -> int:
        return len(self.lanes)

    def describe(self) -> list[dict]:
        """Each position's ordinal and card name."""
        return [{"position": i, "ordinal": lane.device.ordinal, "name": lane.device.name}
                for i, lane in enumerate(self.lanes)]

    def ordinals_of(self) -> tuple[int, ...]:
        return tuple(lane.device.ordinal for lane in self.lanes)

    def event(self, i: int, recorder: int):
        """The split's event ``i``, made in the context of the device that records it (``recorder``): an
        event belongs to one device. Kept across rebuilds, so a graph that stays keeps its events."""
        key = (i, recorder)
        ev = self.events.get(key)
        if ev is None:
            lane = self.lanes[recorder]
            lane.device.make_current()
            ev = self.events[key] = lane.device.create_event(timing=False)
        return ev

    def faulted(self) -> int | None:
        """The position of the first device whose stream reports a lost context, or None."""
        for i, lane in enumerate(self.lanes):
            if lost(lane.stream, api=lane.api):
                return i
        return None

    def gpu_us(self) -> tuple[float | None, ...]:
        """Each device's GPU time in the last profiled frame (microseconds; None for a device whose part is
        not done yet, or when no frame was profiled): never waits."""
        if not self.timed_frames:
            return (None,) * len(self.lanes)
        out: list[float | None] = []
        for i, lane in enumerate(self.lanes):
            done = i in self.timed_lanes and lane.fast.done(lane.ended_h)
            out.append(lane.fast.elapsed_us(lane.began_h, lane.ended_h) if done else None)
        return tuple(out)

    def fault(self, g, kernels: tuple[str, ...]) -> tuple[int, tuple[str, ...]]:
        """For a lost context: the GPU ordinal of the device that faulted (the engine's first when none says
        so) and, of ``kernels``, those that ran there."""
        pos = self.faulted()
        if pos is None:
            return self.lanes[0].device.ordinal, kernels
        if isinstance(g, DeviceGraphs):
            there = {n.label for n in g.plan.nodes if g.split.nodes[n.id][0] == pos}
            kernels = tuple(k for k in kernels if k in there) or kernels
        return self.lanes[pos].device.ordinal, kernels

    def say_routes(self, s: DeviceSplit) -> None:
        """Say once per pair of devices how their copies go (an info diagnostic)."""
        for link in s.links:
            pair = (link.src_device, link.dst_device)
            if pair not in self.told:
                self.told.add(pair)
                how = describe_route(self.routes[pair], self.rt.api)
                self.rt.reporter.publish(Diagnostic("info", "devices", f"copies from device {pair[0]} to device "
                                                    f"{pair[1]}: {how}", self.rt.frame))

    def close_healthy(self) -> list[int]:
        """After a device was lost: release the lanes of the devices whose context is fine (their graphs,
        streams, pools, modules); returns their positions."""
        from ._runtime import quietly

        g = self.rt.graph
        healthy = [i for i, lane in enumerate(self.lanes) if i and lane.own and not lost(lane.stream, api=lane.api)
                   and lane.device.ordinal != self.lanes[0].device.ordinal]
        if isinstance(g, DeviceGraphs):
            for i in healthy:
                quietly(g.graphs[i].close)
        for i in healthy:
            self.lanes[i].release()
        return healthy

    def close(self) -> None:
        from ._runtime import quietly

        for ev in (self.start, *self.events.values()):
            quietly(lambda ev=ev: destroy_event(ev, api=self.rt.api))
        self.events = {}
        for lane in reversed(self.lanes):
            lane.release()
        self.rt.device.make_current()


class _Patches(dict):
    """``DeviceGraphs.patches``: (block, parameter) -> (targets, plain) as ``CompiledGraph.patches``, the
    targets' node ids those of the whole plan; each device's own table does the work."""

    def __init__(self, owner: DeviceGraphs):
        super().__init__()
        self._owner = owner

    def __missing__(self, key):
        o = self._owner
        targets: list = []
        plain = True
        for d, g in enumerate(o.graphs):
            p = g.plan
            if key in p.slots or key in p.device_scalars or key in p.recapture:
                t, pl = g.patches[key]
                back = o.to_global[d]
                targets.extend((back[nid], view, idx, upd) for nid, view, idx, upd in t)
                plain = plain and pl
        value = self[key] = (tuple(targets), plain)
        return value


class _Rings:
    """``DeviceGraphs.stamps`` when profiled per block or per kernel: every device's stamp ring, as one ring to
    the profiler. ``launches`` counts this DeviceGraphs' frames and advances each ring with it (a ring kept
    from an earlier build goes on from its own count); ``parts(launch)`` gives each device's row."""

    def __init__(self, graphs: list[CompiledGraph]):
        self._rings = [(d, g.stamps, g.plan.stamps, g.stamps.launches) for d, g in enumerate(graphs)
                       if g.stamps is not None]
        self._launches = 0

    @property
    def launches(self) -> int:
        return self._launches

    @launches.setter
    def launches(self, n: int) -> None:
        for _d, ring, _layout, _base in self._rings:
            ring.launches += n - self._launches
        self._launches = n

    def parts(self, launch: int) -> list[tuple[int, object, object]]:
        """(device position, stamp layout, timestamps) of the ``launch``-th frame on each stamped device."""
        return [(d, layout, ring.row(base + launch)) for d, ring, layout, base in self._rings]


class DeviceGraphs:
    """The running graphs of an engine over several devices, as one graph to the rest of the engine (see the
    module's docstring): ``plan`` and every id are the whole pipeline's; ``graphs[d]`` is device ``d``'s."""

    regions = False

    def __init__(self, plan: GraphPlan, s: DeviceSplit, graphs: list[CompiledGraph], devices: Devices):
        self.plan = plan
        self.split = s
        self.graphs = graphs
        self.keeps: frozenset[str] = frozenset()  # (CompiledGraph.keeps: these graphs are never shrunk in place)
        self.devices = devices
        self.fast = devices.lanes[0].fast
        self.api = devices.rt.api
        self.to_global: list[dict[int, int]] = [{} for _ in graphs]
        for nid, (d, local) in s.nodes.items():
            self.to_global[d][local] = nid
        self.nodes = [graphs[d].nodes[local] for d, local in (s.nodes[n.id] for n in plan.nodes)]
        self.pointers = {x: graphs[d].pointers[local] for x, (d, local) in s.buffers.items()}
        self.patches = _Patches(self)
        # profiled per block or per kernel: each device's stamps, read together (None: not stamped)
        self.stamps = _Rings(graphs) if any(g.stamps is not None for g in graphs) else None
        self.buffer_stats: tuple[BufferStats, ...] | None = None  # each device's buffers (engine.devices.buffers)
        self.exec = graphs[0].exec
        self._consumers: dict[int, list[int]] | None = None
        # pipelined, the readers launch first: each event wait then finds the previous frame's record, so a
        # device works on its frame while the one feeding it works on the next (see docs/devices.md)
        launch = reversed(s.order) if devices.pipelined else s.order
        # (a device with no node this frame launches nothing)
        self._order = [(d, graphs[d], devices.lanes[d]) for d in launch if graphs[d].plan.nodes]
        self._positions = frozenset(d for d, _g, _lane in self._order)
        self.latency = latency(s) if devices.pipelined else 0

    def device_of(self, nid: int) -> int:
        return self.split.nodes[nid][0]

    # -- a frame -------------------------------------------------------------------------------------
    def launcher(self, stream: int) -> int:
        """Launch every device's graph (see the module's docstring); returns a CUresult as an int."""
        fast, api, devices = self.fast, self.api, self.devices
        start, timed = devices.start_h, devices.timed
        fast.record(start, stream)
        for _d, g, lane in self._order:
            s = lane.stream_h
            if s != stream:
                wait_event(s, start, api=api)
            if timed:
                lane.fast.record(lane.began_h, s)
            err = g.launcher(s)
            if err:
                return err
            if timed:
                lane.fast.record(lane.ended_h, s)
        if timed:
            devices.timed_frames += 1
            devices.timed_lanes = self._positions
        for _d, _g, lane in self._order:
            if lane.stream_h != stream:
                lane.fast.record(lane.done_h, lane.stream_h)
                wait_event(stream, lane.done_h, api=api)
        return 0

    def launch_frames(self, stream: int, k: int) -> int:
        """``engine.run_batch(k)`` over several devices: ``k`` frames, each launched as :meth:`launcher`
        launches one, back to back from the host with no wait between them (the caller waits once, after the
        last). A GPU-driven loop cannot span devices: a conditional body takes no event record or wait node
        and runs in one context, so the frames are queued from the host. Every device's graph runs ``k``
        times, in frame order, ordered by the same events as ``k`` ticks; returns a CUresult as an int."""
        launcher = self.launcher
        for _ in range(k):
            err = launcher(stream)
            if err:
                return err
        return 0

    def run_eagerly(self, stream, *, check_each: bool = False, around=None) -> None:
        """Every device's nodes, one device after another, each on its own stream after the work queued on
        the engine's (``Engine(debug=True)``)."""
        synchronize(stream, api=self.api)
        for _d, g, lane in self._order:
            s = stream if lane.stream_h == int(stream) else lane.stream
            g.run_eagerly(s, check_each=check_each, around=around)
            synchronize(s, api=self.api)

    # -- the tiers, by device ----------------------------------------------------------------------------
    @property
    def consumers(self) -> dict[int, list[int]]:
        if self._consumers is None:
            out: dict[int, list[int]] = {}
            for x, (d, local) in self.split.buffers.items():
                out[x] = [self.to_global[d][n] for n in self.graphs[d].consumers.get(local, ())]
            self._consumers = out
        return self._consumers

    def _local(self, nid: int) -> tuple[CompiledGraph, int]:
        d, local = self.split.nodes[nid]
        return self.graphs[d], local

    def mark(self, nid: int) -> None:
        g, local = self._local(nid)
        g.mark(local)

    def discard(self, nid: int) -> None:
        g, local = self._local(nid)
        g.discard(local)

    def set_launch(self, nid: int, launch) -> None:
        g, local = self._local(nid)
        g.set_launch(local, launch)

    def set_function(self, nid: int, function) -> None:
        """The Code tier on the node's own device: ``function`` was loaded in the engine's first device's
        module cache; another device loads the same code in its own (for its context, and so the first
        device's pruning never unloads what another device's graph runs)."""
        d, local = self.split.nodes[nid]
        lanes = self.devices.lanes
        code = lanes[0].modules.code_of(function)
        if code is not None and d != 0:  # its own module cache, whose modules live as long as its graph
            function = lanes[d].modules.load(code).function
        g = self.graphs[d]
        g.set_function(local, function)
        node = g.plan.nodes[local]
        if code is not None and isinstance(node, KernelNodePlan):  # the device's plan says which code runs
            nodes = list(g.plan.nodes)
            nodes[local] = node._replace(code_key=code.key)
            g.plan = attrs.evolve(g.plan, nodes=tuple(nodes))

    def set_copy_bytes(self, nid: int, nbytes: int) -> None:
        g, local = self._local(nid)
        g.set_copy_bytes(local, nbytes)

    def set_buffer(self, buffer_id: int, ptr: int) -> list[int]:
        """A rebound array: its own device's nodes, and the copies other devices make of it."""
        d, local = self.split.buffers[buffer_id]
        self.pointers[buffer_id] = ptr
        calls = [self.to_global[d][n] for n in self.graphs[d].set_buffer(local, ptr)]
        for link in self.split.links:
            if (link.src_device, link.src) == (d, local):
                g = self.graphs[link.dst_device]
                for node in g.nodes:
                    if isinstance(node, PeerCopyNode) and node.plan.src == local and node.plan.src_device == d:
                        node.set_source(self.api, g.exec, ptr, g._ctx)
        return calls

    def flush(self) -> None:
        for g in self.graphs:
            g.flush()

    def recapture(self, nid: int, capture) -> None:
        g, local = self._local(nid)
        g.recapture(local, capture)

    def refresh_replicas(self, stream) -> None:
        """Delayed connections into another device: the reader's replica takes what the previous-frame buffer
        holds now (after a build or ``engine.reset_delays()``: its frame-0 value), one copy each on
        ``stream`` (the engine's), so the next frame reads it there."""
        s = self.split
        for link in s.links:
            if s.plans[link.src_device].buffers[link.src].kind == "delay":
                copy_dtod_async(self.graphs[link.dst_device].pointers[link.dst],
                                self.graphs[link.src_device].pointers[link.src], link.nbytes, stream, api=self.api)

    def debug_dot(self, path, *, verbose: bool = False) -> None:
        """The driver's picture of device 0's graph (``path``) and of each other device's (``path`` + ``.N``)."""
        for d, g in enumerate(self.graphs):
            g.debug_dot(path if d == 0 else f"{path}.{d}", verbose=verbose)

    def close(self, keep: set[int] | frozenset[int] = frozenset()) -> None:
        """Free every device's graph but those of the positions in ``keep`` (a rebuild kept them)."""
        for d, g in enumerate(self.graphs):
            if d not in keep:
                g.close()


def open_devices(engine, devices, driver, pipelined: bool = False) -> Devices:
    """``Engine(devices=..., pipelined=...)``: the engine's Devices, in its runtime (``rt.devices``). When one
    cannot be opened (an ordinal that does not exist, say), the engine is closed and the error raised."""
    rt = engine._rt
    try:
        if devices is None:
            raise ValueError("pipelined=True pipelines frames over several devices: give them, e.g. "
                             "Engine(devices=[0, 1], pipelined=True)")
        rt.devices = Devices(rt, check_devices(devices), driver, bool(pipelined))
    except BaseException:
        engine.close()
        raise
    return rt.devices


def add_on(engine, rt, block, device):
    """``engine.add(block, device=...)``: add it (a composite's or a region's members too: placed as a whole)
    on ``device``, a position in the engine's device list."""
    position = check_position(device, len(rt.devices) if rt.devices is not None else 1)
    with rt.lock:  # the blocks and their placement arrive together
        before = set(rt.blocks)
        added = engine.add(block)
        for bid in rt.blocks:
            if bid not in before:
                rt.placement[bid] = position
    return added


def check_batch(rt, until) -> None:
    """``engine.run_batch(k, until=...)`` over several devices: refused. The frames of a batch are queued
    from the host there (see :meth:`DeviceGraphs.launch_frames`), so nothing reads the flag between them."""
    if rt.devices is not None and until is not None:
        raise ValueError("run_batch(until=...) needs a GPU-driven loop, which cannot span devices: over several "
                         "devices a batch's frames are launched from the host without a wait between them, so no "
                         "frame can stop the next. Call run_batch(k) without until, or tick() and read the flag")


def latency(s: DeviceSplit) -> int:
    """Pipelined, how many frames the last device lags the first: the most copies on a path between devices."""
    depth = dict.fromkeys(s.order, 0)
    for d in s.order:  # producers first
        for link in s.links:
            if link.src_device == d:
                depth[link.dst_device] = max(depth[link.dst_device], depth[d] + 1)
    return max(depth.values(), default=0)


@attrs.frozen
class DeviceReport:
    """``engine.devices``: each position's GPU (``ordinals``, ``names``), how a copy goes from one position to
    another (``routes``: (src, dst) -> "local", "peer" or "host"), whether frames are ``pipelined``, and
    ``latency``: how many frames the outputs of the last device trail the inputs of the first (0 unless
    pipelined; known once the pipeline is built), which positions the last rebuild made anew, and with a
    profiling level (``Engine(timing=True)``, ``engine.profile = "summary"``) each device's GPU time in the
    last frame (``gpu_us``, microseconds; None until that frame's part is done). Each position's memory:
    ``memory``, its pool's statistics (as ``engine.memory``, which sums them), and ``buffers``, what its
    graph's buffers take, the replicas of other devices' buffers included (as ``engine.stats``, the sum).

    >>> import numpy as np, rxcuda
    >>> from rxcuda.cuda import NullDriver
    >>> with rxcuda.Engine(devices=[0, 1], pipelined=True, driver=NullDriver(devices=2)) as engine:
    ...     a = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=256))
    ...     b = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=256, name="b"), device=1)
    ...     engine.connect(a["out"], b["x"])
    ...     engine.write(a["x"], np.ones(256, np.float32))
    ...     _ = engine.tick()
    ...     report = engine.devices
    >>> report.ordinals, report.routes[(0, 1)], report.pipelined, report.latency
    ((0, 1), 'peer', True, 1)
    """

    ordinals: tuple[int, ...]
    names: tuple[str, ...]
    routes: dict
    pipelined: bool
    latency: int
    rebuilt: tuple[int, ...]
    gpu_us: tuple[float | None, ...] = ()  # profiled: each device's GPU time in the last frame
    memory: tuple[PoolStats, ...] = ()  # each position's memory pool (engine.memory: their totals)
    buffers: tuple[BufferStats, ...] = ()  # each position's graph buffers (engine.stats: their totals)


def report(rt) -> DeviceReport:
    """What ``engine.devices`` says (one device when the engine was not given several)."""
    devs: Devices | None = rt.devices
    if devs is None:
        return DeviceReport((rt.device.ordinal,), (rt.device.name,), {}, False, 0, (), (),
                            (attrs.evolve(rt.pool.stats),), (buffers(rt),))
    g = rt.graph
    lanes = devs.lanes
    return DeviceReport(tuple(lane.device.ordinal for lane in lanes), tuple(lane.device.name for lane in lanes),
                        dict(devs.routes), devs.pipelined, g.latency if isinstance(g, DeviceGraphs) else 0,
                        devs.rebuilt, devs.gpu_us(), tuple(attrs.evolve(lane.pool.stats) for lane in lanes),
                        per_device_buffers(rt))


def per_device_buffers(rt) -> tuple[BufferStats, ...]:
    """Each position's graph buffers (zeros before the first build)."""
    g = rt.graph
    if isinstance(g, DeviceGraphs):
        if g.buffer_stats is None:  # once per build (engine.devices is read every frame by a trace)
            g.buffer_stats = tuple(buffer_stats(dg.plan) for dg in g.graphs)
        return g.buffer_stats
    return tuple(BufferStats() for _ in rt.devices.lanes)


def memory(rt) -> PoolStats:
    """``engine.memory``: the pool's statistics; over several devices, the totals of every position's pool
    (``peak_bytes``: the sum of each pool's peak)."""
    if rt.devices is None:
        return rt.pool.stats
    total = PoolStats()
    for lane in rt.devices.lanes:
        for f in attrs.fields(PoolStats):
            setattr(total, f.name, getattr(total, f.name) + getattr(lane.pool.stats, f.name))
    return total


def buffers(rt) -> BufferStats:
    """``engine.stats``: the running graph's buffers; over several devices, every device's together (the
    replicas a device keeps of another's buffers included)."""
    if rt.devices is None:
        return buffer_stats(rt.graph.plan if rt.graph is not None else None)
    parts = per_device_buffers(rt)
    return BufferStats(*(sum(getattr(p, f.name) for p in parts) for f in attrs.fields(BufferStats)))
