"""A resize applied to the running graph in place, when it can be.

A resize (``engine.resize``, ``engine.write(..., resize=True)``) is a structure change: the planner resolves
every shape again. When the new plan differs from the running one only in kernel launches, scalar values (the
"size" scalars that followed), the byte counts of delayed connections' copies and buffer sizes, and every
buffer whose size changed still fits the memory it has (its pool size class, or its shared allocation), the
running executable graph takes the new launches and values by exec-node updates (a value or a launch the
Parameters tier set since the build is compared with what the graph holds, not with the running plan's copy,
stale since)
(``cuGraphExecKernelNodeSetParams`` once per touched node, ``cuGraphExecMemcpyNodeSetParams`` per copy: the
Parameters tier), with no new graph, no instantiation and no allocation. Otherwise the Builder rebuilds:
buffers that no longer fit are reallocated (those that kept their size stay), and the new graph replaces the
running executable by ``cuGraphExecUpdate`` when the topology is the same (a resize keeps it), else by
instantiating.
"""

from __future__ import annotations

from ..model._describe import Launch
from ..plan import _shapes


def try_in_place(builder, desc, gp) -> bool:
    """Apply plan ``gp`` to the running graph in place if only shapes changed and everything still fits;
    True when it did (the build is then done). Sets ``builder.last_in_place``."""
    builder.last_in_place = False
    rt = builder.rt
    g = rt.graph
    if g is None or gp.shapes == g.plan.shapes:
        return False  # nothing was resized: a rebuild
    delta = _shapes.in_place(g.plan, gp)
    if delta is None:
        return False
    if not _fits(builder, g, gp, delta.buffers):
        return False
    for nid, (launch, values) in delta.nodes.items():
        node = g.nodes[nid]
        written = [_write(g, nid, i, value) for i, value in values]
        if launch is not None:
            g.set_launch(nid, launch)
        elif any(written):  # (a value that differs from the old plan's copy only, the graph holds already)
            g.mark(nid)
        node.plan = gp.nodes[nid]
    for key in tuple(g.patches):  # values written since the build: the old plan's copy of them is stale
        for nid, i in gp.slots.get(key, ()):
            if _write(g, nid, i, gp.nodes[nid].args[i].value):
                g.mark(nid)
    for entry in desc.blocks:  # launches set since the build (set_launch): the same
        for kernel in entry.launches:
            nid = gp.kernel_nodes.get((entry.id, kernel))
            if nid is not None and _launch_of(g.nodes[nid].params) != gp.nodes[nid].launch:
                g.set_launch(nid, gp.nodes[nid].launch)
    g.flush()
    for nid, nbytes in delta.copies.items():  # a delayed connection's end-of-frame copy of a resized buffer
        g.set_copy_bytes(nid, nbytes)
        g.nodes[nid].plan = gp.nodes[nid]
    _rekey(builder, g, gp, delta.buffers)
    g.plan = gp
    builder.last_in_place = True
    builder.resized_in_place += 1
    built = {b.id for b in desc.blocks}
    for b in rt.blocks.values():
        if b.id in built:
            b.state, b.message = "ok", ""
    rt.reporter.refresh()
    for w in gp.warnings:
        rt.reporter.warn(w.subject, w.message, rt.blocks.get(w.block) if w.block is not None else None)
    builder._on_built()  # host data written for the new shape waits for this
    return True


def _write(g, nid: int, i: int, value) -> bool:
    """Write argument ``i`` of kernel node ``nid`` into the graph's argument storage; whether it changed."""
    view, idx = g.nodes[nid].slots[i]
    was = view[idx]
    view[idx] = value
    return bool(view[idx] != was)


def _launch_of(p) -> Launch:
    """The launch geometry a kernel node's params hold now."""
    return Launch(grid=(p.gridDimX, p.gridDimY, p.gridDimZ), block=(p.blockDimX, p.blockDimY, p.blockDimZ),
                  shared_mem=p.sharedMemBytes)


def _fits(builder, g, gp, changed) -> bool:
    """Whether every changed buffer fits the memory it has now (a user array: the planner checked it)."""
    if not changed:
        return True
    by_ptr = {buf.ptr: buf for buf in builder.buffers.values()}
    need: dict[int, int] = {}  # pointer -> bytes the buffers there need now
    storage = getattr(gp, "storage", None) or {}
    for bid in changed:
        b = gp.buffers[bid]
        if b.kind == "external":
            continue
        members = [bid] if bid not in storage else [m for m, first in storage.items() if first == storage[bid]]
        ptr = g.pointers[bid]
        need[ptr] = max(need.get(ptr, 0), *(gp.buffers[m].nbytes for m in members))
    for ptr, nbytes in need.items():
        buf = by_ptr.get(ptr)
        if buf is None or buf.capacity < nbytes:
            return False
    return True


def _rekey(builder, g, gp, changed) -> None:
    """Builder.buffers is keyed by (buffer key, bytes): move the resized ones to their new size, so the next
    rebuild finds them."""
    if not changed:
        return
    old = g.plan
    moved = {(old.buffers[bid].key, old.buffers[bid].nbytes): (gp.buffers[bid].key, gp.buffers[bid].nbytes)
             for bid in changed if gp.buffers[bid].kind != "external"}
    if not moved:
        return
    rekeyed = {}
    for key, buf in builder.buffers.items():
        new_key = moved.get(key)
        if new_key is not None:
            buf.nbytes = new_key[1]
            key = new_key
        rekeyed[key] = buf
    builder.buffers = rekeyed
