"""Profiling timestamps in a plan: one stamp node after each block (or each kernel), beside the frame's path.

A stamp is a one-thread kernel that writes the GPU's global timer into a ring in host-mapped memory. It
depends on the nodes of the unit it times and nothing depends on it, so the frame's own chain of dependencies
is unchanged (an event-record node in the chain costs ~2.4 us of GPU time each on an H100). The frame's start
stamp (column 0) runs before the frame's first nodes (the CUDA layer makes them wait for it: it is the one
stamp on the frame's path). The time of a unit is its stamp minus the latest stamp of the units it waits for
(or the frame's start stamp), so it includes the launch of its first node. Units are top-level nodes: a
region, a captured library call or a GPU-driven batch is timed as one unit (no stamps inside conditional
bodies). Over several devices each device's plan gets stamps of its own (``rxcuda.plan._placement.split``):
its own start stamp, and a unit for each copy from another device (block None), so that a block after
that copy starts when the copy ends, not when the device's frame did. Pure: imports nothing from CUDA.
"""

from __future__ import annotations

import attrs

from ..model._describe import PipelineDescription
from ..model._graphplan import (
    CallNodePlan,
    GraphPlan,
    KernelNodePlan,
    PeerCopyNodePlan,
    RegionNodePlan,
    StampLayout,
    StampNodePlan,
)

PER = ("block", "kernel")


def add_stamps(gp: GraphPlan, desc: PipelineDescription, per: str) -> GraphPlan:
    """``gp`` with a stamp node per block (``per="block"``) or per kernel, call and region (``"kernel"``), and
    the frame's start stamp; ``gp.stamps`` says what each column measures."""
    if per not in PER:
        raise ValueError(f"stamps are per 'block' or per 'kernel' (got {per!r})")
    parents = gp.parents
    unit_of: dict[int, object] = {}  # node id -> unit key
    units: dict[object, list[int]] = {}  # unit key -> its nodes, in order
    names: dict[object, str] = {}
    blocks: dict[object, int | None] = {}  # None: a copy from another device
    known = {b.id for b in desc.blocks}
    for n in gp.nodes:
        if n.id in parents or not isinstance(n, KernelNodePlan | CallNodePlan | RegionNodePlan | PeerCopyNodePlan):
            continue
        if isinstance(n, PeerCopyNodePlan):  # a copy from another device: a unit of no block
            key: object = ("copy", n.id)
            unit_of[n.id] = key
            units[key] = [n.id]
            names[key], blocks[key] = n.label, None
            continue
        block = n.region if isinstance(n, RegionNodePlan) else n.block
        key = block if per == "block" else n.id
        unit_of[n.id] = key
        units.setdefault(key, []).append(n.id)
        if key not in names:
            label = desc.block(block).label() if block in known else str(block)
            names[key] = label if per == "block" or isinstance(n, RegionNodePlan) else n.label
            blocks[key] = block
    column = {key: i + 1 for i, key in enumerate(units)}
    preds: list[tuple[int, ...]] = [()]
    for key, members in units.items():
        before = {column[unit_of[d]] for nid in members for d in gp.deps[nid]
                  if d in unit_of and unit_of[d] != key}
        preds.append(tuple(sorted(before)) or (0,))
    nodes = list(gp.nodes)
    deps = list(gp.deps)
    first = len(nodes)
    nodes.append(StampNodePlan(first, 0, "stamp: frame start"))
    deps.append(())
    for key, members in units.items():
        nid = len(nodes)
        nodes.append(StampNodePlan(nid, column[key], f"stamp: {names[key]}"))
        deps.append(tuple(members))
    layout = StampLayout(per, ("frame", *names.values()), tuple(preds), (None, *blocks.values()))
    return attrs.evolve(gp, nodes=tuple(nodes), deps=tuple(deps), stamps=layout)


def has_units(gp: GraphPlan) -> bool:
    """Whether ``gp`` has a top-level node a stamp would time (a device's plan with none gets no stamps)."""
    return any(isinstance(n, KernelNodePlan | CallNodePlan | RegionNodePlan) and n.id not in gp.parents
               for n in gp.nodes)


def without_stamps(gp: GraphPlan) -> GraphPlan:
    """``gp`` without its stamp nodes and layout (they come last: every other node keeps its id)."""
    if gp.stamps is None and not any(isinstance(n, StampNodePlan) for n in gp.nodes):
        return gp
    keep = [i for i, n in enumerate(gp.nodes) if not isinstance(n, StampNodePlan)]
    assert keep == list(range(len(keep))), "stamp nodes come after every other node of a plan"
    return attrs.evolve(gp, nodes=gp.nodes[:len(keep)], deps=gp.deps[:len(keep)], stamps=None)
