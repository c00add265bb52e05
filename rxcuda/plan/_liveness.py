"""Memory reuse by liveness: intermediate buffers whose lifetimes never overlap share one allocation.

A pure pass over a finished :class:`GraphPlan` (no CUDA). Two buffers may share memory only when every use
of one *happens before* every use of the other: each node using the first is an ancestor, in the graph's
dependency DAG, of each node using the second. Two nodes the graph may run concurrently are never ordered,
so their buffers never share. Nodes inside a region body count as their region's node (it reads and writes
everything its bodies do), so the rule holds across levels.

A buffer shares only when it holds nothing from one frame to the next: a node that writes it without reading
it (a kernel, a library call, a memset covering it) runs before every other use in the same frame, at the
top level (a write inside a region body may not run). Never shared, besides:

- buffers that are not a port's or a block's internal buffer (user arrays, zero-filled inputs, counters,
  device scalars, previous-frame buffers of delayed connections);
- ports the user reads, observes, binds, writes or feeds (``PipelineDescription.kept``, ``fed``,
  ``bindings``), and outputs nothing consumes (the ones a user most likely reads);
- an append output's data, the two ends of a delayed connection (``GraphPlan.delays``);
- anything a region that may run its body more than once in a frame (``while``, ``for``) uses.

The planner trusts parameter directions: a kernel that writes only part of a parameter it declares ``out``
would leave another buffer's data in the rest (without sharing, the rest would keep older frames' values).
Declare such a parameter ``inout`` (state: never shared), keep its port (``engine.keep``), or turn reuse off
(``Engine(reuse_memory=False)``).

Assignment is greedy over the buffers in topological order of their first use: each takes the slot (a
future allocation) whose every user is an ancestor of its first writer, preferring the smallest slot it fits,
else the largest (which then grows). Ancestor sets are bitsets in Python ints, so a 1000-block chain plans in
about a millisecond; on a chain the intermediates take two slots, the minimum.

>>> from rxcuda.lowlevel import BlockEntry, Connection, PipelineDescription, PortRef, plan
>>> import rxcuda
>>> code = rxcuda.load_kernel_file(rxcuda.kernels.path("scalar_mul"))
>>> blocks = [rxcuda.Block.from_kernel(code, size=1024, name=f"m{i}") for i in range(6)]
>>> desc = PipelineDescription(
...     blocks=tuple(BlockEntry(b.id, b.description) for b in blocks),
...     connections=tuple(Connection(PortRef(a.id, "out"), PortRef(b.id, "x")) for a, b in zip(blocks, blocks[1:])),
...     fed=frozenset({PortRef(blocks[0].id, "x")}))
>>> gp = plan(desc)
>>> [[gp.buffers[b].label for b in group] for group in gp.shared]
[['m0.out', 'm2.out', 'm4.out'], ['m1.out', 'm3.out']]
>>> str(buffer_stats(gp))
'7 buffers in 4 allocations (2 shared groups): 16 KiB allocated, 28 KiB without sharing, 12 KiB saved'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter

import attrs

from ..model import _dtypes
from ..model._describe import PipelineDescription, PortRef
from ..model._graphplan import GraphPlan, MemsetNodePlan, NodePlan, sizes_in_bytes

_SHAREABLE = ("port", "internal")
_SOURCE = attrgetter("src")
# above this many top-level nodes no buffer shares: the ancestor bits would take n * n / 16 bytes
MAX_NODES = 20_000


@attrs.frozen
class BufferStats:
    """What the graph's buffers cost in device memory, and what memory reuse saved (``engine.stats``).

    ``buffers``: the buffers the engine allocates for the graph (user arrays bound to ports are not
    counted); ``allocations``: how many allocations hold them; ``shared_groups``: allocations that hold more
    than one buffer. ``bytes_allocated``: device memory the engine holds for them; ``bytes_unshared``: what
    the plan would take with a buffer each; ``bytes_saved``: the difference. Sizes are what the plan asks
    for (the pool rounds each allocation up to its size class: ``engine.memory`` tells what it reserved).

    >>> print(BufferStats(buffers=4, allocations=3, shared_groups=1, bytes_allocated=3 << 20,
    ...                   bytes_unshared=4 << 20))
    4 buffers in 3 allocations (1 shared group): 3 MiB allocated, 4 MiB without sharing, 1 MiB saved
    """

    buffers: int = 0
    allocations: int = 0
    shared_groups: int = 0
    bytes_allocated: int = 0
    bytes_unshared: int = 0

    @property
    def bytes_saved(self) -> int:
        """Device memory memory reuse saved: ``bytes_unshared - bytes_allocated``."""
        return self.bytes_unshared - self.bytes_allocated

    def __str__(self) -> str:
        groups = f"{self.shared_groups} shared group" + ("" if self.shared_groups == 1 else "s")
        size = _dtypes.format_bytes
        return (f"{self.buffers} buffers in {self.allocations} allocations ({groups}): "
                f"{size(self.bytes_allocated)} allocated, {size(self.bytes_unshared)} without sharing, "
                f"{size(self.bytes_saved)} saved")


def buffer_stats(gp: GraphPlan | None) -> BufferStats:
    """Buffers, allocations and bytes of a plan, with and without its shared storage (None: nothing built)."""
    if gp is None:
        return BufferStats()
    buffers = gp.buffers
    owned = [b for b in buffers if b.kind != "external"]
    unshared = sum(b.nbytes for b in owned)
    allocated, members = unshared, 0
    for group in gp.shared:
        sizes = [buffers[m].nbytes for m in group]
        allocated -= sum(sizes) - max(sizes)
        members += len(group)
    return BufferStats(len(owned), len(owned) - members + len(gp.shared), len(gp.shared), allocated, unshared)


def holds_own_value(gp: GraphPlan, buffer: int) -> bool:
    """Whether ``buffer``'s memory still holds its own value after a frame: it shares none, or it is the last
    of its group to use the memory."""
    root = gp.storage.get(buffer)
    if root is None:
        return True
    return any(group[0] == root and group[-1] == buffer for group in gp.shared)


def share_memory(gp: GraphPlan, desc: PipelineDescription) -> GraphPlan:
    """``gp`` with ``storage``/``shared`` filled in: which buffers share an allocation (see the module)."""
    groups = shared_groups(gp, desc)
    return with_groups(gp, groups) if groups else gp


def with_groups(gp: GraphPlan, groups: tuple[tuple[int, ...], ...]) -> GraphPlan:
    """``gp`` with the buffers of each group sharing its first one's memory (a group at a time, in C: a
    chain's groups hold hundreds of buffers each)."""
    storage: dict[int, int] = {}
    for group in groups:
        storage.update(dict.fromkeys(group, group[0]))
    return attrs.evolve(gp, storage=storage, shared=groups)


def pinned_buffers(gp: GraphPlan, desc: PipelineDescription) -> set[int]:
    """Buffers that never share, whatever their lifetimes: ports the user touches or most likely reads, append
    data, both ends of a delayed connection, and everything a looping region uses."""
    port_buffers = gp.port_buffers
    pinned: set[int] = set()
    for refs in (desc.kept, desc.fed, desc.bindings, gp.counters):
        pinned.update(b for b in map(port_buffers.get, refs) if b is not None)
    delays: Mapping[int, int] = getattr(gp, "delays", {})
    pinned.update(delays)
    pinned.update(delays.values())
    # the sources as PortRefs, collected in C; a plain (block, port) tuple equals its PortRef and hashes alike
    consumed = set(map(_SOURCE, desc.connections))
    ports = outs = None  # (the output names of one ports tuple, worked out once per run of blocks sharing it)
    for entry in desc.blocks:
        if entry.desc.ports is not ports:
            ports = entry.desc.ports
            outs = tuple(p.name for p in ports if p.direction == "out")
        bid = entry.id
        for name in outs:  # type: ignore[union-attr]
            if (bid, name) not in consumed:
                b = port_buffers.get(PortRef(bid, name))
                if b is not None:
                    pinned.add(b)
    for n in gp.nodes if desc.regions else ():  # (no region nodes without regions)
        if getattr(n, "loops", False):  # a while/for region: its reads/writes are all its bodies use
            pinned.update(n.reads)
            pinned.update(n.writes)
    return pinned


def shared_groups(gp: GraphPlan, desc: PipelineDescription) -> tuple[tuple[int, ...], ...]:
    """The groups of buffers that can share one allocation (two or more each), every group in the order its
    members use the memory; buffers in no group keep their own."""
    buffers = gp.buffers
    candidates = [b.id for b in buffers if b.kind in _SHAREABLE]
    if len(candidates) < 2:
        return ()
    pinned = pinned_buffers(gp, desc)
    candidates = [b for b in candidates if b not in pinned]
    if len(candidates) < 2:
        return ()
    nodes = gp.nodes
    top, looped = _lift(nodes, gp.parents)
    order = _top_order(nodes, gp.deps, top)
    if len(order) > MAX_NODES:
        return ()  # the ancestor sets would take too much memory: every buffer keeps its own
    pos = {nid: i for i, nid in enumerate(order)}
    anc = _ancestors(order, gp.deps)

    # who uses each buffer (top-level positions); ``clean``: the first position of a top-level node that writes
    # it whole without reading it (a definite write: its value then never comes from an earlier frame)
    uses: dict[int, list[int]] = {}
    clean: dict[int, int] = {}
    excluded: set[int] = set()
    for n in nodes:
        nid = n.id
        at = pos[top[nid]]
        reads, writes = n.reads, n.writes
        if nid in looped:  # inside a while/for body (its region node should say so too)
            excluded.update(reads)
            excluded.update(writes)
        note_uses(uses, clean, n, at, buffers, top[nid] == nid and not hasattr(n, "bodies"))

    # each candidate with the position of its first writer, which must come before all its other uses. An
    # ancestor test is a shift of the later node's ancestor bits by the earlier position: it costs the
    # distance between the two, short for the short lifetimes of intermediates.
    ready: list[tuple[int, int]] = []
    for b in candidates:
        used = uses.get(b)
        if not used or b in excluded:
            continue
        first = min(used)
        if clean.get(b) != first:
            continue  # read (or only conditionally written) before written: it carries a value across frames
        for v in used:
            if v != first and not (anc[v] >> first) & 1:
                break
        else:
            ready.append((first, b))
    if len(ready) < 2:
        return ()
    ready.sort()

    # A slot is free for b when every node using its last member is an ancestor of b's first write: the
    # members before it were, in turn, before the last one's first write.
    slot_last: list[list[int]] = []  # per slot: the positions using its last member
    slot_size: list[int] = []
    slot_members: list[list[int]] = []
    assign(ready, anc, uses, sizes_in_bytes(buffers[b] for _, b in ready), slot_last, slot_size, slot_members)
    return tuple(tuple(m) for m in slot_members if len(m) > 1)


def note_uses(uses: dict[int, list[int]], clean: dict[int, int], n: NodePlan, at: int, buffers, definite: bool
              ) -> None:
    """Record that node ``n`` uses its buffers at position ``at`` (``uses``: each buffer's positions, in order), and
    where it writes one whole without reading it (``definite``: its writes happen whenever the frame runs, see
    _writes_whole), the buffer's first such write (``clean``: its value then never comes from an earlier frame)."""
    reads, writes = n.reads, n.writes
    for group in (reads, writes):
        for b in group:
            used = uses.get(b)
            if used is None:
                uses[b] = [at]
            elif used[-1] != at:
                used.append(at)
    if definite:
        for b in writes:
            if (b not in reads and clean.get(b, at) >= at
                    and (not isinstance(n, MemsetNodePlan) or _covers(n, buffers[b]))):
                clean[b] = at


def assign(ready: list[tuple[int, int]], anc: list[int], uses: Mapping[int, list[int]], needs: list[int],
           slot_last: list[list[int]], slot_size: list[int], slot_members: list[list[int]]) -> list[int]:
    """Put each buffer of ``ready`` ((position of its first write, buffer), in that order; ``needs``: their sizes
    in bytes) into a slot, greedily, and return the slot each took. A slot is free for a buffer when every
    position using its last member is an ancestor of the buffer's first write (its bit in ``anc``); of the free
    ones it takes the smallest that fits, else the largest (growing it), else a new slot. One loop, the choice
    inline: a chain's thousand buffers each ask it (``_liveshare`` continues it after a re-plan)."""
    chosen = []
    for (first, b), need in zip(ready, needs, strict=True):
        before = anc[first]
        best, best_key = -1, None
        for s, last in enumerate(slot_last):
            for u in last:
                if not (before >> u) & 1:
                    break
            else:
                size = slot_size[s]
                key = (0, size) if size >= need else (1, -size)  # the smallest that fits, else the largest
                if best_key is None or key < best_key:
                    best, best_key = s, key
                    if size == need:
                        break
        used = uses[b]
        if best < 0:
            best = len(slot_members)
            slot_last.append(used)
            slot_size.append(need)
            slot_members.append([b])
        else:
            slot_last[best] = used
            if need > slot_size[best]:
                slot_size[best] = need
            slot_members[best].append(b)
        chosen.append(best)
    return chosen


def _writes_whole(n: NodePlan) -> bool:
    """Whether a node's writes are definite: a kernel, call, copy or memset node (not a region, whose body
    may not run)."""
    return not hasattr(n, "bodies")


def _covers(n: MemsetNodePlan, buffer) -> bool:
    size = _dtypes.itemsize(buffer.dtype) if buffer.dtype else 1
    return n.count * getattr(n, "element", 4) >= size * buffer.count


def _lift(nodes: Iterable[NodePlan], parents: Mapping[int, tuple[int, int]]) -> tuple[dict[int, int], set[int]]:
    """Each node's top-level node (itself, or the region node its body sits in, through nesting), and the
    nodes inside the body of a looping region."""
    top: dict[int, int] = {}
    looped: set[int] = set()
    if not parents:
        return {n.id: n.id for n in nodes}, looped
    loops = {n.id for n in nodes if getattr(n, "loops", False)}
    for n in nodes:
        at, inside = n.id, False
        while at in parents:
            at = parents[at][0]
            inside = inside or at in loops
        top[n.id] = at
        if inside:
            looped.add(n.id)
    return top, looped


def _top_order(nodes: tuple[NodePlan, ...], deps: tuple[tuple[int, ...], ...], top: Mapping[int, int]) -> list[int]:
    """The top-level nodes in a topological order: their order in the plan when every dependency comes
    earlier (the planner emits them so), else Kahn's order."""
    level = [n.id for n in nodes if top[n.id] == n.id]
    seen: set[int] = set()
    for nid in level:
        if not seen.issuperset(deps[nid]):
            break
        seen.add(nid)
    else:
        return level
    indeg = {nid: len(set(deps[nid])) for nid in level}
    succ: dict[int, list[int]] = {nid: [] for nid in level}
    for nid in level:
        for d in set(deps[nid]):
            succ[d].append(nid)
    out = [nid for nid in level if not indeg[nid]]
    i = 0
    while i < len(out):
        for s in succ[out[i]]:
            indeg[s] -= 1
            if not indeg[s]:
                out.append(s)
        i += 1
    if len(out) != len(level):
        raise ValueError("the plan's top-level dependencies form a cycle; memory reuse needs a DAG")
    return out


def _ancestors(order: list[int], deps: tuple[tuple[int, ...], ...]) -> list[int]:
    """Per top-level position, the bits of the positions of its ancestors (strict)."""
    pos = {nid: i for i, nid in enumerate(order)}
    anc: list[int] = []
    for nid in order:
        a = 0
        for d in deps[nid]:
            p = pos[d]
            a |= anc[p] | (1 << p)
        anc.append(a)
    return anc
