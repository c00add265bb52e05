"""The passes between a tensor program and its evaluation, each one switchable (:class:`Passes`) and each
reported by ``explain()``:

- **dead nodes**: only what a requested output needs is kept; a node whose result the cache holds is a
  known value, and what only it needed is dead too;
- **common subexpressions**: nodes that compute the same thing (same op, attributes and inputs, the same
  data at the same version) become one;
- **vertical fusion**: chains of elementwise ops, and elementwise prologues and epilogues around reductions
  over one set of axes, become one group (one kernel); row-wise softmax and layernorm are one group each;
- **horizontal fusion**: independent elementwise groups over the same shape become one launch.

The result is a :class:`Plan`: groups in an order that respects their data, each with its inputs and the
outputs it writes. The CPU backend runs a group as one Python function; the CUDA backend will compile one
kernel per group from the same plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import attrs

from ..model._shapes import Shape
from ._graph import ELEMENTWISE, LEAVES, OPAQUE, REDUCTIONS, Node, topo


@attrs.frozen(cache_hash=True)
class Passes:
    """Which passes run (all by default). ``Passes.none()`` evaluates the graph as written.

    ``fast_math`` (off by default) lets the CUDA kernels use the GPU's approximate float32 math: ``exp``/``log``
    through ``ex2.approx``/``lg2.approx``, ``sqrt`` and ``/`` approximate, denormals flushed (NVRTC's
    ``--use_fast_math``). Results then differ from NumPy by a few ulp per op, which is what ``torch.compile``
    and XLA accept by default; a compute-heavy chain runs several times faster. The CPU backend ignores it.

    >>> Passes(cse=False)
    Passes(dead=True, cse=False, vertical=True, horizontal=True, fast_math=False)
    """

    dead: bool = True
    cse: bool = True
    vertical: bool = True
    horizontal: bool = True
    fast_math: bool = False

    @classmethod
    def none(cls) -> Passes:
        return cls(False, False, False, False)


@attrs.define(eq=False)
class Group:
    """Nodes that run as one launch: ``kind`` is ``elementwise``, ``reduce``, ``matmul``, ``view`` (no launch:
    a new layout of the same memory) or ``copy``; ``space`` is the shape it iterates over and ``axes`` the
    axes its reductions reduce (None without one); ``chains`` counts the independent groups horizontal fusion
    merged into it; ``pattern`` names a recognised whole (``softmax``, ``layernorm``)."""

    index: int
    kind: str
    nodes: list[Node]
    space: Shape
    axes: tuple[int, ...] | None = None
    chains: int = 1
    pattern: str = ""
    inputs: list[Node] = attrs.Factory(list)
    outputs: list[Node] = attrs.Factory(list)


@attrs.define(eq=False)
class Plan:
    """What the passes made of a program: ``outputs`` (after CSE), ``nodes`` (live, inputs first),
    ``groups`` (in run order), ``removed`` (dead), ``merged`` (CSE: a duplicate -> the node kept),
    ``known`` (nodes whose results the cache had: not run) and ``inputs_of`` (a node's inputs after CSE)."""

    passes: Passes
    outputs: list[Node]
    nodes: list[Node]
    groups: list[Group]
    removed: list[Node]
    merged: dict[Node, Node]
    known: set[Node]
    input_map: dict[Node, Node]

    def inputs_of(self, node: Node) -> tuple[Node, ...]:
        return tuple(self.input_map.get(i, i) for i in node.inputs)

    def group_of(self) -> dict[Node, Group]:
        return {n: g for g in self.groups for n in g.nodes}


FUSIBLE = ELEMENTWISE | REDUCTIONS | {"broadcast_to"}


def plan(outputs: Iterable[Node], *, roots: Iterable[Node] = (), passes: Passes = Passes(),
         keys: Mapping[Node, object] | None = None, cached: Callable[[Node], bool] = lambda n: False) -> Plan:
    """Run the passes over the program made of ``roots`` and ``outputs`` (the requested results).

    ``keys``: each node's structural key (``_cache.keys``), which CSE merges on; ``cached``: whether the result
    cache holds a node's result (such a node is not run, and what only it needed is dead)."""
    outputs = list(outputs)
    program = topo([*outputs, *roots])
    # -- common subexpressions
    rep: dict[Node, Node] = {}
    merged: dict[Node, Node] = {}
    if passes.cse:
        if keys is None:
            from ._cache import keys as _keys
            keys = _keys(program)
        first: dict[object, Node] = {}
        for n in program:
            kept = first.setdefault(keys[n], n)
            if kept is not n:
                rep[n] = kept
                merged[n] = kept
    outs = [rep.get(o, o) for o in outputs]
    out_set = set(outs)

    def ins(n: Node) -> tuple[Node, ...]:
        return tuple(rep.get(i, i) for i in n.inputs)

    # -- dead nodes (and the ones a cached result makes unnecessary)
    known = {n for n in program if n not in rep and n.op not in LEAVES and cached(n)}
    everything = [n for n in program if n not in rep]
    if passes.dead:
        live_set: set[Node] = set()
        stack = list(outs)
        while stack:
            n = stack.pop()
            if n in live_set:
                continue
            live_set.add(n)
            if n not in known:
                stack.extend(ins(n))
        live = [n for n in everything if n in live_set]
        removed = [n for n in everything if n not in live_set]
    else:
        live, removed = everything, []
    # -- groups
    todo = [n for n in live if n.op not in LEAVES and n not in known]
    consumers: dict[Node, list[Node]] = {n: [] for n in live}
    for n in todo:
        for i in ins(n):
            consumers[i].append(n)
    order = {n: k for k, n in enumerate(live)}
    group_of: dict[Node, Group] = {}
    groups: list[Group] = []
    for n in reversed(todo):
        target = None
        cons = {id(group_of[c]): group_of[c] for c in consumers[n]}
        if passes.vertical and (n.op in FUSIBLE or n.op == "reshape") and len(cons) == 1:
            (g,) = cons.values()
            if g.kind in ("elementwise", "reduce") and _join(g, n, ins(n)):
                target = g
        if target is None:
            target = _new_group(len(groups), n, ins(n))
            groups.append(target)
        target.nodes.append(n)
        group_of[n] = target
    for g in groups:
        g.nodes.sort(key=order.__getitem__)
    groups = _in_run_order(groups, group_of, ins)
    if passes.horizontal:
        groups = _in_run_order(_horizontal(groups, group_of, ins), group_of, ins)
    for k, g in enumerate(groups):
        g.index = k
        g.nodes.sort(key=order.__getitem__)
        members = set(g.nodes)
        g.inputs = list(dict.fromkeys(i for n in g.nodes for i in ins(n) if i not in members))
        g.outputs = [n for n in g.nodes if n in out_set or any(group_of[c] is not g for c in consumers[n])]
        g.pattern = _pattern(g)
    return Plan(passes, outs, live, groups, removed, merged, known, rep)


def _new_group(index: int, n: Node, inputs: tuple[Node, ...]) -> Group:
    if n.op in REDUCTIONS:
        return Group(index, "reduce", [], inputs[0].shape, n.attrs[0])
    if n.op in FUSIBLE:
        return Group(index, "elementwise", [], n.shape)
    kind = {"matmul": "matmul", "copy": "copy"}.get(n.op, "op" if n.op in OPAQUE else "view")
    return Group(index, kind, [], n.shape)


def _forms(g: Group) -> set[Shape]:
    """The shapes an elementwise member of ``g`` may have: its space, and with reductions the space with the
    reduced axes kept at length 1 or dropped."""
    if g.axes is None:
        return {g.space}
    return {g.space, tuple(1 if i in g.axes else d for i, d in enumerate(g.space)),
            tuple(d for i, d in enumerate(g.space) if i not in g.axes)}


def _join(g: Group, n: Node, inputs: tuple[Node, ...]) -> bool:
    """Whether ``n`` (every consumer of which is in ``g``) fits into ``g``; updates g's space if it does."""
    if n.op in REDUCTIONS:
        axes = n.attrs[0]
        if g.axes is None and n.shape == g.space:  # an epilogue over the reduced shape
            g.space, g.axes, g.kind = inputs[0].shape, axes, "reduce"
            return True
        if (g.axes is None or g.axes == axes) and inputs[0].shape == g.space:  # an epilogue over the full shape
            g.axes, g.kind = axes, "reduce"
            return True
        return False
    if n.op == "reshape":  # only between the kept and the dropped form of the reduced axes: same element order
        return g.axes is not None and n.shape in _forms(g) and inputs[0].shape in _forms(g)
    if n.shape in _forms(g):
        return True
    if g.axes is None and len(n.shape) == len(g.space):  # a per-row value (axes kept at 1) inside a row kernel
        axes = tuple(i for i, (a, b) in enumerate(zip(n.shape, g.space, strict=True)) if a != b)
        if all(n.shape[i] == 1 for i in axes):
            g.axes = axes
            return True
    return False


def _reaches(a: Group, b: Group, edges: Mapping[int, set[int]], by_id: Mapping[int, Group]) -> bool:
    """Whether ``b`` depends on ``a`` (a path a -> ... -> b)."""
    stack, seen = [id(a)], set()
    while stack:
        k = stack.pop()
        if k == id(b):
            return True
        if k not in seen:
            seen.add(k)
            stack.extend(edges.get(k, ()))
    return False


def _edges(groups: list[Group], group_of: Mapping[Node, Group], ins) -> dict[int, set[int]]:
    edges: dict[int, set[int]] = {id(g): set() for g in groups}
    for g in groups:
        for n in g.nodes:
            for i in ins(n):
                h = group_of.get(i)
                if h is not None and h is not g:
                    edges[id(h)].add(id(g))
    return edges


def _horizontal(groups: list[Group], group_of: dict[Node, Group], ins) -> list[Group]:
    """Merge independent elementwise groups over one shape (neither needs the other, even through others)."""
    out: list[Group] = []
    for k, g in enumerate(groups):
        merged = False
        if g.kind == "elementwise":
            edges = _edges(out + groups[k:], group_of, ins)
            by_id = {id(h): h for h in out}
            for h in out:
                if (h.kind == "elementwise" and h.space == g.space and h.nodes[0].device == g.nodes[0].device
                        and not _reaches(h, g, edges, by_id) and not _reaches(g, h, edges, by_id)):
                    h.nodes.extend(g.nodes)
                    h.chains += g.chains
                    for n in g.nodes:
                        group_of[n] = h
                    merged = True
                    break
        if not merged:
            out.append(g)
    return out


def _in_run_order(groups: list[Group], group_of: Mapping[Node, Group], ins) -> list[Group]:
    edges = _edges(groups, group_of, ins)
    indeg = {id(g): 0 for g in groups}
    for targets in edges.values():
        for t in targets:
            indeg[t] += 1
    by_id = {id(g): g for g in groups}
    ready = [g for g in reversed(groups) if indeg[id(g)] == 0]  # a stack: earlier groups first
    order = []
    while ready:
        g = ready.pop()
        order.append(g)
        for t in sorted(edges[id(g)], key=lambda k: -groups.index(by_id[k])):
            indeg[t] -= 1
            if indeg[t] == 0:
                ready.append(by_id[t])
    assert len(order) == len(groups), "fusion made a cycle"
    return order


def _pattern(g: Group) -> str:
    if g.kind != "reduce" or g.axes != (len(g.space) - 1,):
        return ""
    ops = [n.op for n in g.nodes]
    if {"max", "sub", "exp", "sum", "div"} <= set(ops):
        return "row-wise softmax"
    if ops.count("mean") >= 2 and ("sqrt" in ops or "pow" in ops):
        return "row-wise layernorm"
    if {"max", "sub", "exp", "sum", "log"} <= set(ops):
        return "row-wise logsumexp"
    return ""
