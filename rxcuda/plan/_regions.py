"""Planning regions: blocks whose nodes run inside the bodies of CUDA conditional nodes.

The pipeline becomes a tree of levels: the top level, and each body of each region. Every block lives at
exactly one level (its region body, or the top); a region block lives at the level around it and its body
members one level down. Connections order the items of each level (a block, or a whole region seen from
outside); nodes are emitted level by level, a region's node before the nodes of its bodies (the CUDA layer
needs the body graph before it can add to it), and dependencies come from buffer hazards within each level,
with a region node standing for everything its bodies read and write.

Pure: imports nothing from CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..model import _dtypes
from ..model._describe import BlockEntry, PipelineDescription, PortRef, step_params
from ..model._graphplan import (
    BufferArg,
    BufferKind,
    CopyNodePlan,
    HandleArg,
    KernelNodePlan,
    MemsetNodePlan,
    NodePlan,
    RegionNodePlan,
    ScalarArg,
)
from ..model._regions import CONDITION_DTYPES, RegionSpec
from ._order import hazard_deps, ordered

Level = tuple[int, int] | None  # (region id, body index), or None for the top level
# ``planner`` below is _plan's _Planner (its nodes, buffers, report and emit_block), passed in: _plan imports
# this module, so naming its class here would make an import circle.

# The region block's kernels and ports, as rxcuda.blocks._regions declares them.
SET, INIT, STEP, CLEAR = "set", "init", "step", "clear"
CONDITION = "condition"
COUNTER = "counter"
BOUND = "loop_bound"  # the key of a While's host-mapped copy of its counter: (BOUND, region id)


def check_regions(desc: PipelineDescription, report) -> dict[int, tuple[int, int]]:
    """Validate the regions' membership; returns block id -> (region id, body index) for every body member.

    Reports: a region that is not a block of the pipeline, a member that is not, a block in two bodies (or
    twice in one), a region inside its own body (directly or through nesting)."""
    ids = {b.id for b in desc.blocks}
    where: dict[int, tuple[int, int]] = {}
    regions = {r.id: r for r in desc.regions}

    def name(bid: int) -> str:
        return desc.block(bid).label() if bid in ids else f"<block {bid}>"

    for r in desc.regions:
        if r.id not in ids:
            report.error(f"a {r.kind} region (id {r.id}) is not a block of the pipeline; add it with engine.add",
                         f"<region {r.id}>")
            continue
        for bi, body in enumerate(r.bodies):
            for m in body:
                if m not in ids:
                    report.error(f"region {name(r.id)} names block id {m} in its body, which is not in the pipeline;"
                                 " add the block to the engine (or drop it from the region)", name(r.id), r.id)
                elif m == r.id:
                    report.error(f"region {name(r.id)} lists itself in its own body; a region holds other blocks",
                                 name(r.id), r.id)
                elif m in where:
                    other = where[m][0]
                    report.error(f"block {name(m)} is in the body of {name(other)} and of {name(r.id)}; a block runs"
                                 " in one place: remove it from one of them", name(m), m)
                else:
                    where[m] = (r.id, bi)
    # nesting must be a tree: walking up from any region reaches the top
    for r in desc.regions:
        seen, at = {r.id}, where.get(r.id)
        while at is not None:
            if at[0] in seen:
                report.error(f"region {name(r.id)} is (through nesting) inside its own body; regions nest as a tree",
                             name(r.id), r.id)
                for rid in seen:  # report the loop once
                    where.pop(rid, None)
                break
            seen.add(at[0])
            at = where.get(at[0]) if at[0] in regions else None
    return where


def _chain(bid: int, where: Mapping[int, tuple[int, int]]) -> list[tuple[Level, int]]:
    """(level, item at that level) from the block's own level up to the top."""
    out: list[tuple[Level, int]] = []
    item = bid
    while True:
        lvl = where.get(item)
        out.append((lvl, item))
        if lvl is None:
            return out
        item = lvl[0]


def plan_levels(planner: Any, order: tuple[BlockEntry, ...], sources: Mapping[PortRef, PortRef],
                where: Mapping[int, tuple[int, int]]) -> None:
    """Emit every block's nodes into ``planner`` level by level, regions as conditional nodes; sets
    ``planner.parents`` and ``planner.region_setters`` (their dependencies: :func:`region_deps`)."""
    desc, report = planner.desc, planner.report
    regions: dict[int, RegionSpec] = {r.id: r for r in desc.regions if r.id in {b.id for b in order}}
    rank = {b.id: i for i, b in enumerate(order)}
    label = {b.id: b.label() for b in order}
    items: dict[Level, list[int]] = {}
    for b in order:
        items.setdefault(where.get(b.id), []).append(b.id)
    edges: dict[Level, set[tuple[int, int]]] = {}
    for c in desc.connections:
        if getattr(c, "delay", 0) or c.src.block not in rank or c.dst.block not in rank:
            continue
        src_chain = dict(_chain(c.src.block, where))
        for lvl, item in _chain(c.dst.block, where):  # the deepest level both ends are at
            if lvl in src_chain:
                if src_chain[lvl] != item:
                    edges.setdefault(lvl, set()).add((src_chain[lvl], item))
                break
        _check_crossing(c, where, regions, label, report)
    order_at: dict[Level, list[int]] = {}
    for lvl, members in items.items():
        order_at[lvl] = _order_level(lvl, members, edges.get(lvl, set()), rank, label, report)

    parents: dict[int, tuple[int, int]] = {}
    nodes = planner.nodes

    def emit(lvl: Level, parent: tuple[int, int] | None) -> None:
        for item in order_at.get(lvl, ()):
            entry = desc.block(item)
            if item in regions:
                _emit_region(planner, entry, regions[item], sources, parent, parents, emit, where)
                continue
            first = len(nodes)
            planner.emit_block(entry, sources)
            if parent is not None:
                for nid in range(first, len(nodes)):
                    parents[nid] = parent

    emit(None, None)
    planner.parents = parents


def _check_crossing(c, where, regions, label, report) -> None:
    """A connection between the two bodies of one ifelse: the bodies never both run in a frame."""
    src, dst = dict(_chain(c.src.block, where)), dict(_chain(c.dst.block, where))
    for rid, spec in regions.items():
        if spec.kind != "ifelse":
            continue
        sb = next((lvl[1] for lvl in src if lvl is not None and lvl[0] == rid), None)
        db = next((lvl[1] for lvl in dst if lvl is not None and lvl[0] == rid), None)
        if sb is not None and db is not None and sb != db:
            report.error(f"{label[c.src.block]}.{c.src.port} (in the {('then', 'else')[sb]} body of {label[rid]}) "
                         f"feeds {label[c.dst.block]}.{c.dst.port} (in the {('then', 'else')[db]} body): the two "
                         "bodies of an IfElse never both run in a frame; connect from a block outside the region",
                         label[c.dst.block], c.dst.block)


def _order_level(lvl: Level, members: list[int], edges: set[tuple[int, int]], rank: Mapping[int, int],
                 label: Mapping[int, str], report) -> list[int]:
    """Topological order of one level's items (ties in the pipeline's order); a cycle is reported."""
    succ: dict[int, list[int]] = {m: [] for m in members}
    for a, b in edges:
        if a in succ and b in succ:
            succ[a].append(b)
    out, stuck = ordered(succ, rank)
    if stuck:
        where = "the top level" if lvl is None else f"the body of {label[lvl[0]]}"
        names = ", ".join(label[m] for m in stuck)
        report.error(f"at {where}, {names} depend on each other through connections that leave a region and come "
                     "back into it; a region runs as one step: move the blocks so data flows into the region and out "
                     "of it once", label[stuck[0]], stuck[0])
        out.extend(stuck)
    return out


def _condition_source(planner: Any, region: BlockEntry, sources) -> PortRef | None:
    return sources.get(PortRef(region.id, CONDITION))


def _emit_region(planner: Any, entry: BlockEntry, spec: RegionSpec, sources, parent, parents: dict,
                 emit, where) -> None:
    """The region block's setter (before), zero-fills of an If's outputs, the conditional node, its bodies,
    and for loops the step kernel closing each pass."""
    desc, report, nodes = planner.desc, planner.report, planner.nodes
    d = entry.desc
    label = entry.label()
    cond_src = _condition_source(planner, entry, sources) if any(p.name == CONDITION for p in d.ports) else None
    inside = False
    size = 4
    if cond_src is not None:
        src_chain = dict(_chain(cond_src.block, where))
        inside = any(lvl is not None and lvl[0] == spec.id for lvl in src_chain)
        src = desc.block(cond_src.block)
        try:
            port = src.desc.port(cond_src.port)
        except KeyError:
            port = None
        if port is not None:
            dt = port.dtype
            if dt is None or _dtypes.dtype_name(dt) not in CONDITION_DTYPES or port.count != 1:
                shown = f"{dt or 'untyped'}[{port.count}]"
                report.error(f"the condition of {label} comes from {src.label()}.{cond_src.port} ({shown}); a "
                             "condition is one integer or bool value (a u32 or bool port of size 1), nonzero meaning "
                             "true: have a kernel write a flag", label, entry.id)
            else:
                size = _dtypes.itemsize(dt)
        if inside and spec.kind in ("if", "ifelse"):
            report.error(f"the condition of {label} is computed inside its own body (by {src.label()}); an "
                         f"{'If' if spec.kind == 'if' else 'IfElse'} decides before its body runs: compute the "
                         "condition before the region", label, entry.id)
    if spec.kind == "while" and cond_src is not None and not inside:
        body_blocks = _all_members(spec, {r.id: r for r in desc.regions})
        if cond_src.block not in body_blocks:
            report.warning(f"the condition of While {label} is computed outside its body, so the body cannot change "
                           f"it: the loop runs its {entry.value('max_iterations')} passes or none; compute the "
                           "condition inside the body", label, entry.id)

    def emit_kernel(kernel: str, level_parent) -> int:
        one = BlockEntry(entry.id, _only_kernel(d, kernel), entry.values, entry.launches)
        first = len(nodes)
        planner.emit_block(one, sources)
        nid = first
        for i in range(first, len(nodes)):
            if level_parent is not None:
                parents[i] = level_parent
        return nid

    setter_kernel = SET if spec.kind in ("if", "ifelse") else INIT
    # zero-fill the outputs of an If's bodies, so a consumer reads zeros in a frame the body did not run
    if spec.kind in ("if", "ifelse"):
        regions = {r.id: r for r in desc.regions}
        for bid in sorted(_all_members(spec, regions)):
            bdesc = desc.block(bid).desc
            for p in bdesc.ports:
                if p.direction != "out" or p.counter is not None or _is_state(bdesc, p):
                    continue  # state a block reads and writes (inout) keeps its value; counters are reset anyway
                kind: BufferKind = "external" if PortRef(bid, p.name) in desc.bindings else "port"
                buf = planner.buffer(("port", bid, p.name), f"{desc.block(bid).label()}.{p.name}", p.dtype,
                                     p.count, kind)
                nbytes = planner.buffers[buf].nbytes
                element = 4 if nbytes % 4 == 0 else 1
                nid = len(nodes)
                nodes.append(MemsetNodePlan(nid, buf, 0, nbytes // element,
                                            f"zero {desc.block(bid).label()}.{p.name} (before {label})",
                                            element=element))
                if parent is not None:
                    parents[nid] = parent
    setter = emit_kernel(setter_kernel, parent)
    if len(nodes) == setter:  # the kernel was refused (reported): nothing to hang the bodies on
        return
    node_id = len(nodes)
    nodes.append(RegionNodePlan(node_id, spec.id, spec.kind, len(spec.bodies), frozenset(), frozenset(), label))
    if parent is not None:
        parents[node_id] = parent
    # the setter passes the conditional handle; a do-while's setter does not read the flag (the body makes it)
    s = nodes[setter]
    assert isinstance(s, KernelNodePlan)
    args = list(s.args)
    args[0] = HandleArg(node_id)
    reads = s.reads
    if spec.kind == "while" and inside:
        flag = args[3]
        args[3] = ScalarArg(entry.id, None, "u64", 8, 0)
        if isinstance(flag, BufferArg):
            reads = reads - {flag.buffer}
    if cond_src is not None:  # the flag's width, from the port that makes it
        idx = 2 if setter_kernel == SET else 4
        args[idx] = ScalarArg(entry.id, None, "u32", 4, size)
    nodes[setter] = s._replace(args=tuple(args), reads=reads)

    def emit_step(level_parent, handle_of: int) -> int | None:
        """The step kernel closing a pass at ``level_parent``, setting the handle of region node ``handle_of``."""
        step = emit_kernel(STEP, level_parent)
        if len(nodes) == step:
            return None
        st = nodes[step]
        assert isinstance(st, KernelNodePlan)
        sargs = list(st.args)
        sargs[0] = HandleArg(handle_of)
        if cond_src is not None:
            sargs[3] = ScalarArg(entry.id, None, "u32", 4, size)
        nodes[step] = st._replace(args=tuple(sargs))
        return step

    if spec.loops and spec.unroll > 1:
        _emit_unrolled(planner, spec, entry, node_id, emit, emit_kernel, emit_step, parents)
    else:
        for bi in range(len(spec.bodies)):
            emit((spec.id, bi), (node_id, bi))
        if spec.loops:
            step = emit_step((node_id, 0), node_id)
            if step is not None:
                planner.region_steps[node_id] = step
    # the region node stands for everything inside it
    used: set[int] = set()
    written: set[int] = set()
    for nid in _descendants(node_id, parents, len(nodes)):
        used |= nodes[nid].reads
        written |= nodes[nid].writes
    nodes[node_id] = nodes[node_id]._replace(reads=frozenset(used), writes=frozenset(written))  # type: ignore[union-attr]
    planner.region_setters[node_id] = setter
    if spec.kind == "while":
        _emit_bound(planner, entry, parent, parents)


def _emit_bound(planner: Any, entry: BlockEntry, parent, parents: dict) -> None:
    """After a While's node, at its level: a copy of its pass counter into host-mapped memory (a ``mapped``
    buffer keyed ``(BOUND, region id)``), which the engine reads after the frame without a driver call. The
    kernels count the counter down from ``max_iterations``; 0 after the loop means it ran every pass
    (rxcuda.engine._loops)."""
    counter = planner.by_key.get(("internal", entry.id, COUNTER))
    if counter is None:
        return
    label = entry.label()
    bound = planner.buffer((BOUND, entry.id), f"{label}/passes left", "u32", 1, "mapped")
    nid = len(planner.nodes)
    planner.nodes.append(CopyNodePlan(nid, counter, bound, 4, f"{label} (passes left, for the host)",
                                      frozenset((counter,)), frozenset((bound,))))
    if parent is not None:
        parents[nid] = parent


def _emit_unrolled(planner: Any, spec: RegionSpec, entry: BlockEntry, node_id: int, emit, emit_kernel, emit_step,
                   parents: dict) -> None:
    """A loop's body copied ``spec.unroll`` times into one relaunch of its WHILE node::

        WHILE loop { clear(loop)                      the loop's handle to 0: no next round unless the last copy
                     body; step(if2)                  counts down; if2 = more passes to run
                     IF if2 { body; step(if3)
                              IF if3 { ... body; step(loop) } } }   the last copy decides on another round

    so the loop stops after any pass, as with one copy. ``clear`` reads the counter the steps write, so it runs
    before them (a hazard); each IF follows the step that sets it (its setter). The body's kernels get one node
    per copy: their parameters reach every copy through the patch table; a change of their code or launch
    rebuilds (they are left out of ``kernel_nodes``)."""
    nodes = planner.nodes
    label = entry.label()
    clear = emit_kernel(CLEAR, (node_id, 0))
    if len(nodes) > clear:
        c = nodes[clear]
        assert isinstance(c, KernelNodePlan)
        nodes[clear] = c._replace(args=(HandleArg(node_id),) + c.args[1:])
    level = (node_id, 0)
    inner_ifs: list[int] = []
    for i in range(spec.unroll):
        emit((spec.id, 0), level)
        if i == spec.unroll - 1:
            step = emit_step(level, node_id)
            if step is not None:
                planner.region_steps[node_id] = step
            break
        inner = len(nodes) + 1  # the IF comes right after this copy's step
        step = emit_step(level, inner)
        if step is None or inner != len(nodes):
            return  # the step kernel was refused (reported)
        nodes.append(RegionNodePlan(inner, spec.id, "if", 1, frozenset(), frozenset(),
                                    f"{label} (pass {i + 2} of {spec.unroll})"))
        parents[inner] = level
        planner.region_setters[inner] = step
        inner_ifs.append(inner)
        level = (inner, 0)
    for inner in reversed(inner_ifs):  # an IF stands for everything inside it (innermost first)
        used: set[int] = set()
        written: set[int] = set()
        for nid in _descendants(inner, parents, len(nodes)):
            used |= nodes[nid].reads
            written |= nodes[nid].writes
        nodes[inner] = nodes[inner]._replace(reads=frozenset(used), writes=frozenset(written))  # type: ignore[union-attr]
    members = _all_members(spec, {r.id: r for r in planner.desc.regions})
    for key in [k for k in planner.kernel_nodes if k[0] in members]:
        del planner.kernel_nodes[key]


def _is_state(d, port) -> bool:
    """An output whose kernels also read it (an inout parameter): the block's own state."""
    for pin in port.pins:
        step = next((k for k in d.kernels if k.name == pin.kernel), None)
        params = step_params(step) if step is not None else ()
        if pin.param < len(params) and params[pin.param].direction == "inout":
            return True
    return False


def _descendants(node_id: int, parents: Mapping[int, tuple[int, int]], upto: int) -> list[int]:
    out = []
    inside = {node_id}
    for nid in range(node_id + 1, upto):
        p = parents.get(nid)
        if p is not None and p[0] in inside:
            out.append(nid)
            inside.add(nid)
    return out


def _all_members(spec: RegionSpec, regions: Mapping[int, RegionSpec]) -> set[int]:
    out: set[int] = set()
    todo = list(spec.members)
    while todo:
        b = todo.pop()
        if b in out:
            continue
        out.add(b)
        inner = regions.get(b)
        if inner is not None:
            todo.extend(inner.members)
    return out


def _only_kernel(d, kernel: str):
    import attrs

    return attrs.evolve(d, kernels=tuple(k for k in d.kernels if k.name == kernel))


def region_deps(nodes: list[NodePlan], parents: Mapping[int, tuple[int, int]], setters: Mapping[int, int],
                steps: Mapping[int, int]) -> tuple[tuple[int, ...], ...]:
    """Dependencies from buffer hazards within each level (the top, each body), in node order, plus each
    region node's dependency on the kernel that sets its condition (they share no buffer for an If)."""
    by_level: dict[tuple[int, int] | None, list[NodePlan]] = {}
    for n in nodes:
        by_level.setdefault(parents.get(n.id), []).append(n)
    deps: list[tuple[int, ...]] = [()] * len(nodes)
    for members in by_level.values():
        local = hazard_deps(members)
        for n, d in zip(members, local, strict=True):
            deps[n.id] = d
    for region_node, setter in setters.items():
        if setter not in deps[region_node]:
            deps[region_node] = tuple(sorted((*deps[region_node], setter)))
    # A loop's step kernel needs nothing but the hazards: it reads a While's flag (so it follows the kernel
    # that makes it) and a For's counter only; the handle it sets is read when the whole pass is done, so a
    # For's step runs beside the body instead of adding a launch after it.
    del steps
    return tuple(deps)
