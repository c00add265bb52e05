"""Structural edits at the end of a running graph, made in place: ``grow`` (nodes added to its template, which is
instantiated anew), ``shrink`` (nodes removed: disabled in its executable graph, nothing instantiated) and ``extend``
(nodes added into its spare nodes: nothing instantiated). Each returns the new CompiledGraph, which takes over the
old one's template (and, for ``shrink`` and ``extend``, its executable graph), or None where it does not apply; the
engine tries them in the order shrink, extend, grow before it builds anew (rxcuda.engine._build).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import is_

from ..model._errors import CudaError
from ..model._graphplan import GraphPlan
from ._driver import check
from ._graph import CompiledGraph, _Table
from .nodes import ArgStorage, BuildContext, Capture, GraphNode, KernelNode, kind_of


def grow(old: CompiledGraph, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
         present: frozenset | set, capture: Capture | None = None) -> CompiledGraph | None:
    """``plan``'s graph made from ``old``'s template graph in place, or None where that does not apply.

    For the common live edit, nodes added after or removed from the end of a plan that begins with
    ``old``'s nodes (the same node plans: the planner's ``Replanner`` keeps them): the leading nodes stay
    in ``old``'s template graph as they are (a node whose buffers moved, as an output that became an
    intermediate and now shares memory, gets its new pointers there: ``cuGraphKernelNodeSetParams``),
    the new nodes are added after their dependencies, the old trailing nodes are destroyed
    (``cuGraphDestroyNode``), and the template is instantiated anew; ``old``'s executable graph is
    independent of its template once instantiated and keeps running until it is retired. The template,
    and the nodes kept, are the new graph's from then on (``old.close`` leaves them).

    Applies only on the thread that runs ``old`` (its template is touched; a CUgraph is not thread-safe),
    to flat graphs of kernel nodes without regions or stamps whose executable graph still matches the
    template (``growable``, ``touched``), whose functions are the same objects, and where every node
    removed belongs to a block no longer in the pipeline (``present``: the ids of those that are), so
    that nothing will update it in ``old``'s executable graph again. On failure, the nodes added are
    destroyed, the kept nodes' arguments are restored and ``old`` keeps running (it takes no more grows).
    """
    k = _kept(old, plan, functions, pointers, present)
    if k is None:
        return None
    drv, graph, ctx = old.api, old.graph, old._ctx
    g = _successor(old, plan, functions, pointers, k, frozenset())  # (instantiated anew: no others' code)
    g.exec, g._exec_h = None, 0
    kept = old.nodes[:k]
    gone = old.nodes[k:]
    tail = plan.nodes[k:]
    kinds = [kind_of(n) for n in tail]
    b = BuildContext(drv, ctx, graph, functions, pointers, capture)
    by_kind: dict[type[GraphNode], list] = {}
    for n, kd in zip(tail, kinds, strict=True):
        by_kind.setdefault(kd, []).append(n)
    for kd, plans in by_kind.items():
        kd.prepare(plans, b)
    g.args = b.args
    g.held = _held(old, kept)
    # kept nodes whose buffers moved: the new pointers in their arguments and in the template's node
    moved = _moved(old, pointers)
    saved: list = []  # (node, [(view, index, old word)]) to restore on failure
    nodes = list(kept)
    added: list = []
    spares_had = len(old.spares)
    try:
        while old.spares:  # (the template is instantiated anew: they would run there)
            check(drv.cuGraphDestroyNode(old.spares[-1][0]), "cuGraphDestroyNode (spare)")
            old.spares.pop()
        if moved:
            saved = _repoint(kept, moved, pointers)
            for node, _ in saved:
                node.set_template(drv)
        for n, kd in zip(tail, kinds, strict=True):
            node = kd.make(n, b)
            node.add(drv, graph, [nodes[d].handle for d in plan.deps[n.id]], ctx)
            nodes.append(node)
            added.append(node)
        if isinstance(g.args, ArgStorage):
            g.args.seal()
        for node in gone:
            node.remove(drv)
        g.spares, code = CompiledGraph._make_spares(drv, graph, plan, nodes)
        if code is not None:
            g.keeps = frozenset((code,))
        g.exec = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        g._disable_spares()
    except BaseException:
        if g.exec is not None:
            drv.cuGraphExecDestroy(g.exec)
        for h, _ in g.spares:
            drv.cuGraphDestroyNode(h)
        for node in added:
            drv.cuGraphDestroyNode(node.handle)  # (an undo: its own error would hide the first)
            node.release(drv)
        for node in _restore(saved):
            drv.cuGraphKernelNodeSetParams(node.handle, node.params)
        if any(node.handle is None for node in gone) or len(old.spares) < spares_had:
            old.growable = False  # its template lost nodes its executable graph still runs
            old._consumers = None
        raise
    g.nodes = nodes
    old.graph = None  # the template is the new graph's now
    g.graph = graph
    g._exec_h = int(g.exec)
    g._arm()
    return g


def shrink(old: CompiledGraph, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
           present: frozenset | set) -> CompiledGraph | None:
    """``plan``'s graph made from ``old``'s by taking its trailing nodes out, without instantiating anything;
    None where that does not apply.

    For the other half of the common live edit, nodes removed from the end of a plan that is otherwise
    ``old``'s (the same node plans, in the same order, with the same dependencies): the removed nodes are
    disabled in ``old``'s executable graph (``cuGraphNodeSetEnabled``: a disabled node does nothing when the
    graph runs, so the buffers it named may go) and stay in its template as spares (``spares``: a block added
    at the end again takes one over, see ``extend``; a later ``grow`` destroys them before it instantiates the
    template anew), a kept node whose buffers moved gets its new pointers in both
    (``cuGraphExecKernelNodeSetParams``, ``cuGraphKernelNodeSetParams``), and the new graph takes both over: a
    removal costs a few driver calls per node instead of an instantiation, an upload and the old executable
    graph's destruction.

    Applies where ``grow`` does (see there: the thread that runs ``old``, flat graphs of kernel nodes, a
    template that matches the executable graph, nodes removed only of blocks that left), where the removed
    nodes run code that a kept node runs too (``keeps``: their modules stay loaded while the executable graph
    lives, and nothing would unload them now anyway). Where the driver refuses a call, ``old`` is left as it
    was (the nodes disabled so far enabled again, the arguments restored) and None is returned (the caller
    builds otherwise).
    """
    k = _kept(old, plan, functions, pointers, present)
    if k is None or k != len(plan.nodes):
        return None
    drv, exec_h = old.api, old.exec
    kept, gone = old.nodes[:k], old.nodes[k:]
    # a removed node names its function in the executable graph as long as it lives: only where a kept node runs
    # the same code (its module stays loaded anyway), so that removing a block still unloads code nothing runs
    codes = {node.plan.code_key for node in gone}
    if not codes <= {n.code_key for n in plan.nodes}:
        return None
    moved = _moved(old, pointers)
    off: list = []
    saved: list = []  # (node, [(view, index, old word)]) to restore on failure
    try:
        for node in gone:
            check(drv.cuGraphNodeSetEnabled(exec_h, node.handle, 0), f"cuGraphNodeSetEnabled ({node.plan.label})")
            off.append(node)
        if moved:
            _repoint_both(saved, kept, moved, pointers, drv, exec_h, old._ctx)
    except BaseException as e:
        _undo(drv, exec_h, off, 1, saved)
        if isinstance(e, CudaError):
            return None
        raise
    # the removed nodes stay in the template, disabled in the executable graph: spares for blocks added at the
    # end again (``extend``), each after what it depended on
    deps = old.plan.deps
    spares = [(node.handle, frozenset(deps[node.plan.id])) for node in gone] + old.spares
    g = _successor(old, plan, functions, pointers, k, old.keeps | codes)
    g.args = None  # (no node of its own: the kept nodes' arguments are in the storages it holds)
    g.held = old.held + ((old.args,) if old.args is not None else ())
    return _take_over(g, old, list(kept), spares)


def extend(old: CompiledGraph, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
           present: frozenset | set, capture: Capture | None = None) -> CompiledGraph | None:
    """``plan``'s graph made from ``old``'s by giving the kernel nodes added after its end to ``old``'s spare
    nodes, without instantiating anything; None where that does not apply.

    For the common live edit, blocks added at the end of a plan that is otherwise ``old``'s: each new node
    takes the next spare over (``spares``: disabled nodes of the executable graph that the template still
    holds, made after the end by ``instantiate``/``grow`` or left by ``shrink``), where that spare runs after
    every node the new one depends on: its parameters in the template and the executable graph
    (``cuGraphKernelNodeSetParams``, ``cuGraphExecKernelNodeSetParams``), then ``cuGraphNodeSetEnabled``. A
    kept node whose buffers moved gets its new pointers in both. The new graph takes the executable graph and
    the template over: nothing is instantiated, uploaded or destroyed, as with ``shrink``.

    Applies where ``grow`` does (see there), to new plain kernel nodes only, as many as there are spares that
    fit. Where the driver refuses a call, the nodes enabled so far are disabled again, the kept nodes'
    arguments restored, and None is returned (the caller grows or builds otherwise).
    """
    spares = old.spares
    if not spares or len(plan.nodes) <= len(old.nodes) or len(plan.nodes) - len(old.nodes) > len(spares):
        return None
    k = _kept(old, plan, functions, pointers, present)
    if k is None or k != len(old.nodes):
        return None
    tail = plan.nodes[k:]
    deps = plan.deps
    for i, n in enumerate(tail):
        after = spares[i][1]
        if kind_of(n) is not KernelNode or (after is not None and not after.issuperset(deps[k + i])):
            return None
    drv, exec_h, ctx = old.api, old.exec, old._ctx
    b = BuildContext(drv, ctx, old.graph, functions, pointers, capture)
    KernelNode.prepare(list(tail), b)
    made = [KernelNode.make(n, b) for n in tail]
    if any(node.handle_slots for node in made):
        return None
    kept = old.nodes[:k]
    moved = _moved(old, pointers)
    saved: list = []
    on: list = []
    try:
        if moved:
            _repoint_both(saved, kept, moved, pointers, drv, exec_h, ctx)
        for node, (h, _) in zip(made, spares, strict=False):
            node.adopt(h)
            node.set_template(drv)
            node.apply(drv, exec_h, h, ctx)
            check(drv.cuGraphNodeSetEnabled(exec_h, h, 1), f"cuGraphNodeSetEnabled ({node.plan.label})")
            on.append(node)
    except BaseException as e:
        _undo(drv, exec_h, on, 0, saved)
        if isinstance(e, CudaError):
            return None
        raise
    if isinstance(b.args, ArgStorage):
        b.args.seal()
    g = _successor(old, plan, functions, pointers, k, old.keeps)
    g.args = b.args
    g.held = _held(old, kept)
    return _take_over(g, old, kept + made, spares[len(made):])


def _successor(old: CompiledGraph, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
               k: int, keeps: frozenset) -> CompiledGraph:
    """A new CompiledGraph of ``plan`` beside ``old``, its first ``k`` nodes ``old``'s (plain kernel nodes), with
    nothing changed since its build: its graphs, nodes and arguments are the caller's to set."""
    g = CompiledGraph.__new__(CompiledGraph)
    g.plan, g.stamps, g.api, g.fast, g._ctx = plan, None, old.api, old.fast, old._ctx
    g.pointers = dict(pointers)
    g.built = g.pointers.copy()
    g._dirty, g.functions, g.regions = set(), functions, False
    g.growable, g.touched, g.plain, g.keeps = True, set(), k, keeps
    g.patches, g._consumers, g.spares = _Table(g), None, []
    return g


def _held(old: CompiledGraph, kept: list) -> tuple:
    """The argument storages a graph that keeps ``old``'s nodes ``kept`` holds: ``old``'s, but only those some kept
    node points into once there are more than four."""
    held = old.held + ((old.args,) if old.args is not None else ())
    if len(held) > 4:
        live = {id(n.storage) for n in kept}
        held = tuple(st for st in held if id(st) in live)
    return held


def _take_over(g: CompiledGraph, old: CompiledGraph, nodes: list, spares: list) -> CompiledGraph:
    """``g`` takes ``old``'s template and executable graph over, with ``nodes`` and ``spares`` (closing ``old``
    frees neither from then on)."""
    g.nodes, g.spares = nodes, spares
    g.graph, g.exec = old.graph, old.exec
    old.graph = old.exec = None
    old.spares = []
    g._exec_h = int(g.exec)
    g._arm()
    return g


def _repoint(nodes, moved: set[int], pointers: Mapping[int, int]) -> list:
    """Write the new address (``pointers``) of each buffer in ``moved`` into the arguments of the ``nodes`` that
    use it; [(node, [(view, index, old word), ...]), ...] for the nodes changed (what ``_restore`` undoes)."""
    saved: list = []
    if not moved:  # (the common case: every buffer kept its address; no node's buffer_args made for nothing)
        return saved
    for node in nodes:
        if moved.isdisjoint(node.buffer_args):
            continue
        words = []
        for bid in moved.intersection(node.buffer_args):
            for i in node.buffer_args[bid]:
                view, idx = node.slots[i]
                words.append((view, idx, int(view[idx])))
                view[idx] = pointers[bid]
        saved.append((node, words))
    return saved


def _repoint_both(saved: list, nodes, moved: set[int], pointers: Mapping[int, int], drv, exec_h, ctx) -> None:
    """``_repoint`` the running graph's ``nodes`` (into ``saved``, first: what ``_undo`` restores if a driver call
    below fails) and give each node changed its new arguments in the executable graph and the template."""
    saved.extend(_repoint(nodes, moved, pointers))
    for node, _ in saved:
        node.apply(drv, exec_h, node.handle, ctx)
        node.set_template(drv)


def _undo(drv, exec_h, toggled: list, enabled: int, saved: list) -> None:
    """After a driver call of ``shrink`` or ``extend`` failed: the ``toggled`` nodes set back to ``enabled`` in the
    executable graph, and the repointed nodes' arguments (``saved``) restored in both graphs. (Its own errors are
    not checked: they would hide the first.)"""
    for node in toggled:
        drv.cuGraphNodeSetEnabled(exec_h, node.handle, enabled)
    for node in _restore(saved):
        drv.cuGraphExecKernelNodeSetParams(exec_h, node.handle, node.params)
        drv.cuGraphKernelNodeSetParams(node.handle, node.params)


def _restore(saved: list) -> list:
    """Put back the words ``_repoint`` replaced; the nodes whose arguments it restored."""
    for _, words in saved:
        for view, idx, word in words:
            view[idx] = word
    return [node for node, _ in saved]


def _moved(old: CompiledGraph, pointers: Mapping[int, int]) -> set[int]:
    """The buffers ``old`` was built with that have another address in ``pointers`` (the items' difference
    is taken in C; a buffer ``old`` lacked has not moved)."""
    built = old.built
    return {bid for bid, _ in pointers.items() - built.items() if bid in built}


def _kept(old: CompiledGraph, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
          present: frozenset | set) -> int | None:
    """How many leading nodes ``grow`` keeps of ``old``'s (None: it does not apply; see there)."""
    if (old.exec is None or old.graph is None or not old.growable or old.regions or plan.parents
            or plan.stamps is not None or old.plan.stamps is not None):
        return None
    was, now = old.plan.nodes, plan.nodes
    limit = min(len(was), len(now))
    k = limit
    if not all(map(is_, now[:limit], was[:limit])):  # (in C: an edit at the end keeps every one)
        k = 0
        while now[k] is was[k]:
            k += 1
    if not k or (k == len(was) and k == len(now)) or plan.deps[:k] != old.plan.deps[:k]:
        return None  # nothing kept, or nothing changed (the exec update's case)
    plain, nodes = old.plain, old.nodes
    while plain < k and type(nodes[plain]) is KernelNode and not nodes[plain].handle_slots:
        plain += 1
    old.plain = plain
    if plain < k or (old.touched and min(old.touched) < k):
        return None
    for node in old.nodes[k:]:
        if type(node) is not KernelNode or node.plan.block in present:
            return None
    for n in now[k:]:
        kd = kind_of(n)
        if kd.conditional or kd.starts_frame(n):
            return None
    for key, f in old.functions.items():
        if functions.get(key, f) is not f:
            return None
    return k
