"""Placement: blocks on the devices of one host, and the plan of a whole pipeline split into one plan per device.

Pure, like the rest of the planner. ``PipelineDescription.placement`` maps a block id to the position of its
device in the engine's device list (absent: position 0). :func:`check_placement` refuses what cannot run:
a position past the list, a region whose body is placed apart from it. :func:`split` takes the plan of the
whole pipeline (``rxcuda.plan._plan.plan``) and makes one :class:`GraphPlan` per device:

- every node goes to the device of its block (a region with its bodies, a counter reset or a delayed
  connection's copy with the block whose buffer it sets);
- a buffer lives on the device of the block whose port (or internal buffer) it is; another device that reads
  it gets a replica of its own, refreshed once a frame by a :class:`PeerCopyNodePlan` in the reader's graph,
  after an :class:`EventWaitNodePlan` for the event the writer's graph records once the buffer is written
  (:class:`EventRecordNodePlan`). The reader's graph records a second event once the copy is done, and the
  writer's graph waits for it before writing the buffer again: a frame in flight never overwrites what the
  other device is still copying. No host sync anywhere;
- the graphs launch in :attr:`DeviceSplit.order` (a device before the devices it feeds), so each wait finds
  the record of its own frame. A placement whose copies go back and forth (device 0 feeds device 1 which
  feeds device 0) is refused: place the blocks so data flows one way.

>>> from rxcuda.model._describe import BlockEntry, Connection, PipelineDescription, PortRef
>>> from rxcuda.plan._plan import plan
>>> from rxcuda.plan._placement import split
>>> from rxcuda.blocks._blocks import Block
>>> a = Block.from_kernel("scalar_mul", size=8, name="a"); b = Block.from_kernel("scalar_mul", size=8, name="b")
>>> desc = PipelineDescription((BlockEntry(1, a.description), BlockEntry(2, b.description)),
...     (Connection(PortRef(1, "out"), PortRef(2, "x")),), fed=frozenset({PortRef(1, "x")}), placement={2: 1})
>>> s = split(plan(desc, reuse_memory=False), desc, 2)
>>> [type(n).__name__ for n in s.plans[1].nodes]
['EventWaitNodePlan', 'PeerCopyNodePlan', 'EventRecordNodePlan', 'KernelNodePlan']
>>> s.order, [str(link) for link in s.links]
((0, 1), ['a.out: device 0 -> 1 (32 B)'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import attrs

from ..model import _dtypes
from ..model._describe import CallSpec, PipelineDescription
from ..model._graphplan import (
    BufferArg,
    BufferPlan,
    CallNodePlan,
    CopyNodePlan,
    EventRecordNodePlan,
    EventWaitNodePlan,
    GraphPlan,
    HandleArg,
    KernelNodePlan,
    MemsetNodePlan,
    NodePlan,
    PeerCopyNodePlan,
    RegionNodePlan,
)
from ._order import Report, ordered
from ._profile import add_stamps, has_units, without_stamps

__all__ = ["DeviceSplit", "Link", "check_placement", "device_of", "split"]


class Link(NamedTuple):
    """A connection between devices: buffer ``src`` of device ``src_device``'s plan is copied into buffer
    ``dst`` of device ``dst_device``'s plan once a frame (``label``: the buffer's, e.g. ``a.out``)."""

    src_device: int
    src: int
    dst_device: int
    dst: int
    nbytes: int
    label: str

    def __str__(self) -> str:
        return f"{self.label}: device {self.src_device} -> {self.dst_device} ({_dtypes.format_bytes(self.nbytes)})"


@attrs.frozen
class DeviceSplit:
    """The plan of a pipeline over several devices: one GraphPlan per device (by position), the order the
    graphs launch in, the events that order them (a label each; the plans' event nodes index this tuple), the
    connections between devices, and where each node and buffer of the whole plan went: ``nodes``: node id
    -> (device, node id there); ``buffers``: buffer id -> (device, buffer id there), its home; ``recorders``:
    the device recording each event (whose context it belongs to)."""

    plans: tuple[GraphPlan, ...]
    order: tuple[int, ...]
    events: tuple[str, ...]
    links: tuple[Link, ...]
    nodes: Mapping[int, tuple[int, int]]
    buffers: Mapping[int, tuple[int, int]]
    recorders: tuple[int, ...] = ()  # event index -> the device whose graph records it (an event is a device's)

    def device_of_block(self, gp: GraphPlan, block: int) -> int | None:
        """The device the nodes of ``block`` run on (None: the block has no node)."""
        for (bid, _kernel), nid in gp.kernel_nodes.items():
            if bid == block:
                return self.nodes[nid][0]
        return None


def check_placement(desc: PipelineDescription, devices: int, report: Report | None = None,
                    ordinals: Sequence[int] | None = None) -> Report:
    """Report what the placement cannot do: a position past the ``devices`` an engine has, a block id that is
    not in the pipeline, a region body placed apart from its region, and, given the GPU ``ordinals`` of the
    positions, a library call placed on another GPU than the first position's (its handles are made and its
    calls captured there). Returns the report (raises nothing)."""
    report = report if report is not None else Report()
    names = {b.id: b.label() for b in desc.blocks}
    if ordinals is not None:
        for b in desc.blocks:
            pos = desc.placement.get(b.id, 0)
            if (isinstance(pos, int) and 0 <= pos < len(ordinals) and ordinals[pos] != ordinals[0]
                    and any(isinstance(k, CallSpec) for k in b.desc.kernels)):
                report.error(f"block '{b.label()}' is a library call placed on device {pos} (GPU {ordinals[pos]}), "
                             f"but its library handle lives on device 0 (GPU {ordinals[0]}), where library calls "
                             "are captured; place it on device 0", b.label(), b.id)
    for bid, pos in desc.placement.items():
        if bid not in names:
            report.error(f"the placement names block id {bid}, which is not in the pipeline; place blocks that "
                         "are added", f"<block {bid}>")
        elif not isinstance(pos, int) or isinstance(pos, bool) or not 0 <= pos < devices:
            report.error(f"block '{names[bid]}' is placed on device {pos!r}, but the engine has {devices} "
                         f"device{'s' if devices != 1 else ''} (positions 0..{devices - 1}); place it on one of "
                         "them", names[bid], bid)
    for region in desc.regions:
        where = desc.placement.get(region.id, 0)
        for member in region.members:
            there = desc.placement.get(member, 0)
            if there != where:
                r, m = names.get(region.id, f"<block {region.id}>"), names.get(member, f"<block {member}>")
                report.error(f"block '{m}' of the body of region '{r}' is placed on device {there}, region '{r}' "
                             f"on device {where}: a region's bodies run inside its graph node, on its device; "
                             f"place them together (engine.add(region, device={where}) places its bodies too)",
                             m, member)
    return report


def _home(b: BufferPlan, placement: Mapping[int, int]) -> int:
    """The device a buffer lives on: that of the block whose port, internal buffer or counter it is."""
    key = b.key
    return placement.get(key[1], 0) if len(key) > 1 and isinstance(key[1], int) else 0


def device_of(node: NodePlan, buffers: tuple[BufferPlan, ...], placement: Mapping[int, int]) -> int:
    """The device a node of the whole plan runs on."""
    if isinstance(node, (KernelNodePlan, CallNodePlan)):
        return placement.get(node.block, 0)
    if isinstance(node, RegionNodePlan):
        return placement.get(node.region, 0)
    if isinstance(node, MemsetNodePlan):
        return _home(buffers[node.buffer], placement)
    if isinstance(node, CopyNodePlan):
        return _home(buffers[node.src], placement)
    raise TypeError(f"a {type(node).__name__} has no device of its own")


def _uses(node) -> frozenset[int]:
    used = set(node.reads) | set(node.writes)
    for a in getattr(node, "args", ()):
        if isinstance(a, BufferArg):
            used.add(a.buffer)
    return frozenset(used)


def split(gp: GraphPlan, desc: PipelineDescription, devices: int,
          ordinals: Sequence[int] | None = None) -> DeviceSplit:
    """One plan per device for ``gp``, the plan of the whole pipeline ``desc`` (see the module's docstring).
    Raises one ValidationError naming what cannot be split (with the placement's own problems; ``ordinals``:
    the positions' GPUs, see :func:`check_placement`). A profiled ``gp`` (stamps per block or per kernel,
    ``rxcuda.plan._profile``) is split without its stamps, and each device's plan that runs a unit gets its
    own: a device's stamps are timed on that device, from its own start stamp."""
    per = gp.stamps.per if gp.stamps is not None else None
    gp = without_stamps(gp)
    report = check_placement(desc, devices, ordinals=ordinals)
    placement = desc.placement
    report.raise_errors()
    node_dev = [device_of(n, gp.buffers, placement) for n in gp.nodes]
    home = [_home(b, placement) for b in gp.buffers]
    top = [n for n in gp.nodes if n.id not in gp.parents]
    # who writes and who reads each buffer, in the frame's order (top-level nodes: a region node stands for
    # its bodies, which are on its device)
    writers: dict[int, list[int]] = {}
    readers: dict[int, list[int]] = {}
    for n in top:
        for x in n.writes:
            writers.setdefault(x, []).append(n.id)
        for x in _uses(n) - n.writes:
            readers.setdefault(x, []).append(n.id)
    for n in gp.nodes:  # a buffer is written on its own device only
        for x in n.writes:
            if home[x] != node_dev[n.id]:
                report.error(f"{n.label} on device {node_dev[n.id]} writes {gp.buffers[x].label}, which lives on "
                             f"device {home[x]}; a block writes (in place, too) only buffers on its own device: "
                             "place the two blocks on one device", n.label, getattr(n, "block", None))
    # (buffer, device) pairs: a device reading a buffer that lives on another
    wanted: dict[tuple[int, int], int] = {}  # -> the first reader there
    for x, rs in readers.items():
        for r in rs:
            if node_dev[r] != home[x]:
                wanted.setdefault((x, node_dev[r]), r)
    delayed = {x for x, b in enumerate(gp.buffers) if b.kind == "delay"}
    for (x, _d), r in wanted.items():
        if x in delayed:
            continue  # copied at the end of the frame: next frame's readers read it (see below)
        last = writers.get(x, [])
        late = [w for w in last if w > r]
        if late:
            w = gp.nodes[late[0]]
            report.error(f"{gp.nodes[r].label} on device {node_dev[r]} reads {gp.buffers[x].label} before "
                         f"{w.label} on device {home[x]} writes it again in the same frame; a connection between "
                         "devices copies a buffer once it is written: place the two blocks on one device",
                         gp.nodes[r].label, getattr(gp.nodes[r], "block", None))
    report.raise_errors()
    # the order the graphs launch in: a device before those it feeds
    succ: dict[int, list[int]] = {d: [] for d in range(devices)}
    via: dict[tuple[int, int], int] = {}
    for x, d in wanted:
        h = home[x]
        if d not in succ[h]:
            succ[h].append(d)
            via[(h, d)] = x
    order, left = ordered(succ, {d: d for d in range(devices)})
    if left:
        hops = [f"device {h} -> {d} ({gp.buffers[x].label})" for (h, d), x in sorted(via.items())
                if h in left and d in left]
        report.error("data goes back and forth between devices: " + ", ".join(hops) + "; the devices' graphs "
                     "launch one after another each frame, so copies must flow one way: place the blocks so "
                     "that no device feeds a device that feeds it", "placement")
        report.raise_errors()
    s = _Splitter(gp, devices, node_dev, home, writers, wanted, delayed, placement).run(tuple(order))
    if per is not None:  # profiled: each device times its own units
        s = attrs.evolve(s, plans=tuple(add_stamps(p, desc, per) if has_units(p) else p for p in s.plans))
    return s


class _Splitter:
    """Builds the per-device plans (see :func:`split`); node and buffer ids are renumbered per device."""

    def __init__(self, gp: GraphPlan, devices: int, node_dev: list[int], home: list[int],
                 writers: dict[int, list[int]], wanted: dict[tuple[int, int], int], delayed: set[int],
                 placement: Mapping[int, int]):
        self.placement = placement
        self.gp, self.devices, self.node_dev, self.home = gp, devices, node_dev, home
        self.writers, self.wanted, self.delayed = writers, wanted, delayed
        self.events: list[str] = []
        self.recorders: list[int] = []
        self.links: list[Link] = []
        self.node_map: dict[int, tuple[int, int]] = {}
        self.buffer_map: dict[int, tuple[int, int]] = {}

    def event(self, label: str, recorder: int) -> int:
        self.events.append(label)
        self.recorders.append(recorder)
        return len(self.events) - 1

    def run(self, order: tuple[int, ...]) -> DeviceSplit:
        gp = self.gp
        # buffers: each lives on its home device, and another device reading it gets a replica
        local: list[dict[int, int]] = [{} for _ in range(self.devices)]
        bufs: list[list[BufferPlan]] = [[] for _ in range(self.devices)]
        for x, b in enumerate(gp.buffers):
            d = self.home[x]
            local[d][x] = len(bufs[d])
            bufs[d].append(b._replace(id=len(bufs[d])))
            self.buffer_map[x] = (d, local[d][x])
        replica: dict[tuple[int, int], int] = {}
        for (x, d) in self.wanted:
            b = gp.buffers[x]
            replica[(x, d)] = rid = len(bufs[d])
            bufs[d].append(BufferPlan(rid, ("replica", *b.key), f"{b.label}@{d}", b.dtype, b.count, "port"))
            h = self.home[x]
            self.links.append(Link(h, local[h][x], d, rid, b.nbytes, b.label))
        # cross buffers by home: x -> devices reading it
        readers_of: dict[int, list[int]] = {}
        for (x, d) in self.wanted:
            readers_of.setdefault(x, []).append(d)
        # events: per (buffer, reader device), "ready" (home records, reader waits) and "copied" (the reverse)
        ready = {k: self.event(f"{gp.buffers[k[0]].label} ready for device {k[1]}", self.home[k[0]])
                 for k in self.wanted}
        copied = {k: self.event(f"{gp.buffers[k[0]].label} copied to device {k[1]}", k[1]) for k in self.wanted}
        plans = tuple(self._device_plan(d, local[d], bufs[d], replica, readers_of, ready, copied)
                      for d in range(self.devices))
        return DeviceSplit(plans, order, tuple(self.events), tuple(self.links), self.node_map, self.buffer_map,
                           tuple(self.recorders))

    def _device_plan(self, d: int, local: dict[int, int], bufs: list[BufferPlan], replica: dict,
                     readers_of: dict[int, list[int]], ready: dict, copied: dict) -> GraphPlan:
        gp, node_dev, home = self.gp, self.node_dev, self.home
        nodes: list = []
        deps: list[tuple[int, ...]] = []
        remap: dict[int, int] = {}  # whole plan's node -> node here
        copy_of: dict[int, int] = {}  # whole plan's buffer -> the copy node refreshing its replica here
        waited: dict[int, int] = {}  # cross buffer of this device -> node waiting for its last copies
        mine = [n for n in gp.nodes if node_dev[n.id] == d]
        last_writer = {x: ws[-1] for x, ws in self.writers.items() if home[x] == d and x in readers_of}
        first_writer = {x: ws[0] for x, ws in self.writers.items() if home[x] == d and x in readers_of}
        buf = {**local, **{x: rid for (x, dd), rid in replica.items() if dd == d}}

        def emit(node, after: tuple[int, ...]) -> int:
            nid = len(nodes)
            nodes.append(attrs.evolve(node, id=nid) if isinstance(node, MemsetNodePlan) else node._replace(id=nid))
            deps.append(tuple(dict.fromkeys(after)))
            return nid

        def record_ready(x: int, after: tuple[int, ...]) -> None:
            for dd in readers_of[x]:
                emit(EventRecordNodePlan(0, ready[(x, dd)], f"{gp.buffers[x].label} ready"), after)

        def copy_in(x: int, after: tuple[int, ...]) -> int:
            h = home[x]
            w = emit(EventWaitNodePlan(0, ready[(x, d)], f"wait {gp.buffers[x].label}"), ())
            rid = replica[(x, d)]
            c = emit(PeerCopyNodePlan(0, h, self.buffer_map[x][1], rid, gp.buffers[x].nbytes,
                                      f"{gp.buffers[x].label} -> device {d}", frozenset(), frozenset((rid,))),
                     (w, *after))
            emit(EventRecordNodePlan(0, copied[(x, d)], f"{gp.buffers[x].label} copied"), (c,))
            copy_of[x] = c
            return c

        # a cross buffer nobody on its device writes (fed from the host, bound): ready once the frame starts
        for x in readers_of:
            if home[x] == d and x not in last_writer:
                record_ready(x, ())
        for n in mine:
            extra: list[int] = []
            for x in _uses(n):
                if home[x] != d and x not in self.delayed and x not in copy_of and n.id not in gp.parents:
                    copy_in(x, ())
                if x in copy_of:
                    extra.append(copy_of[x])
            for x in n.writes:
                if first_writer.get(x) == n.id:
                    waits = [emit(EventWaitNodePlan(0, copied[(x, dd)], f"wait {gp.buffers[x].label} copied"), ())
                             for dd in readers_of[x]]
                    waited[x] = waits[-1]
                    extra.extend(waits)
            parent = gp.parents.get(n.id)
            after = tuple(remap[p] for p in gp.deps[n.id] if p in remap) + (() if parent else tuple(extra))
            nid = emit(self._remap(n, buf, remap), after)
            remap[n.id] = nid
            self.node_map[n.id] = (d, nid)
            for x in n.writes:
                if last_writer.get(x) == n.id:
                    record_ready(x, (nid,))
        # delayed connections' replicas: refreshed after this frame's readers (they read the previous frame's)
        for (x, dd) in self.wanted:
            if dd == d and x in self.delayed:
                rid = replica[(x, d)]
                users = tuple(i for i, n in enumerate(nodes) if rid in _uses(n))
                copy_in(x, users)
        for i, n in enumerate(nodes):  # a condition kernel passes its region's handle: the region's id here
            if any(isinstance(a, HandleArg) for a in getattr(n, "args", ())):
                nodes[i] = n._replace(args=tuple(a._replace(region=remap[a.region]) if isinstance(a, HandleArg)
                                                 else a for a in n.args))
        return self._plan(d, nodes, deps, remap, bufs, buf)

    @staticmethod
    def _remap(n, buf: dict[int, int], remap: dict[int, int]):
        """Node ``n`` with this device's buffer and node ids."""
        def ids(s):
            return frozenset(buf[x] for x in s)

        if isinstance(n, MemsetNodePlan):
            return attrs.evolve(n, buffer=buf[n.buffer], reads=ids(n.reads))
        fields: dict = {"reads": ids(n.reads), "writes": ids(n.writes)}
        if isinstance(n, CopyNodePlan):
            fields.update(src=buf[n.src], dst=buf[n.dst])
        if isinstance(n, (KernelNodePlan, CallNodePlan)):
            fields["args"] = tuple(BufferArg(buf[a.buffer]) if isinstance(a, BufferArg) else a for a in n.args)
        return n._replace(**fields)

    def _plan(self, d: int, nodes: list, deps: list, remap: dict[int, int], bufs: list[BufferPlan],
              buf: dict[int, int]) -> GraphPlan:
        gp = self.gp
        on_d = {nid for nid, (dd, _) in self.node_map.items() if dd == d}
        placement = self.placement

        def node_ids(pairs):
            return tuple((remap[nid], i) for nid, i in pairs if nid in on_d)

        shared = []
        crossing = {x for x, _ in self.wanted}
        for group in gp.shared:  # memory reuse stays per device, and never for a buffer another device copies
            members = tuple(buf[m] for m in group if self.home[m] == d and m not in crossing and m in buf)
            if len(members) > 1:
                shared.append(members)
        return GraphPlan(
            nodes=tuple(nodes),
            deps=tuple(deps),
            buffers=tuple(bufs),
            port_buffers={r: buf[x] for r, x in gp.port_buffers.items() if placement.get(r.block, 0) == d
                          and x in buf},
            counters={r: buf[x] for r, x in gp.counters.items() if x in buf and self.home[x] == d},
            slots={k: node_ids(v) for k, v in gp.slots.items() if node_ids(v)},
            device_scalars={k: buf[x] for k, x in gp.device_scalars.items() if self.home[x] == d},
            recapture={k: tuple(remap[n] for n in v if n in on_d) for k, v in gp.recapture.items()
                       if any(n in on_d for n in v)},
            kernel_nodes={k: remap[n] for k, n in gp.kernel_nodes.items() if n in on_d},
            warnings=gp.warnings if d == 0 else (),
            parents={remap[n]: (remap[p], i) for n, (p, i) in gp.parents.items() if n in on_d},
            delays={buf[o]: buf[p] for o, p in gp.delays.items() if self.home[o] == d},
            shared=tuple(shared),
            storage={m: g[0] for g in shared for m in g},
            shapes=gp.shapes,
        )
