"""Backward graphs by structure: a training loop builds the same gradient graph every step, so the second time
the walk's result is replayed from a template instead of running the vector-Jacobian rules again.

The walk (``_autograd._gradients``) depends only on the forward graph's shape: each node's structural id
(``Node.sid``), which nodes feed it, which nodes want a gradient and which are stopped. :func:`signature` is
exactly that, in the graph's topological order (inputs as positions, so sharing is part of it). After a walk,
:func:`record` keeps the gradient nodes it made as a template whose operands are positions in the forward order
or earlier template entries; nodes that read no forward node (fills, constants made by a rule) are kept as they
are and shared. :func:`replay` makes the same nodes over a new forward graph of that signature, calling the node
hooks (``no_grad``) and the pull records (``explain``) as the rules would have.

Replaying makes ~30 nodes in tens of microseconds where the rules took hundreds (the MLP step of
bench/tensor.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import _ops
from ._graph import Node, topo

LIMIT = 1024
"""Templates kept (a new structure beyond this forgets the oldest half)."""


class Template:
    """A walk's result over positions: ``steps`` make the new nodes (op, inputs as ``(True, k)`` for forward
    position k or ``(False, j)`` for step j, or a shared node), ``results`` map a forward position to the
    reference of its gradient, ``keep`` the forward positions on a path to a wanted node."""

    __slots__ = ("steps", "results", "keep")

    def __init__(self, steps: list, results: list[tuple[int, tuple]], keep: list[int]):
        self.steps, self.results, self.keep = steps, results, keep


_TEMPLATES: dict[tuple, Template] = {}


def signature(order: Sequence[Node], wanted: Callable[[Node], bool], stopped: Callable[[Node], bool]) -> tuple:
    """The forward graph as the walk sees it (``order``: topological, inputs first)."""
    at = {id(n): k for k, n in enumerate(order)}
    return tuple((n.sid, tuple(at[id(i)] for i in n.inputs), wanted(n), stopped(n)) for n in order)


def lookup(sig: tuple) -> Template | None:
    return _TEMPLATES.get(sig)


def record(sig: tuple, order: Sequence[Node], result: dict[Node, Any], keep: set[Node]) -> None:
    """Keep the walk's ``result`` (forward node -> gradient Tensor) and ``keep`` as a template for ``sig``."""
    at = {id(n): k for k, n in enumerate(order)}
    made: dict[int, int] = {}
    steps: list = []
    tops = [g.node for g in result.values()]
    for n in topo(tops):
        if id(n) in at:
            continue
        if not _reads_forward(n, at, made):
            continue  # a fill or constant: shared as it is
        ins = tuple(_ref(i, at, made) for i in n.inputs)
        made[id(n)] = len(steps)
        steps.append((n.op, ins, n.attrs, n.shape, n.dtype, n.device, _ops.PULLED.get(n)))
    results = [(at[id(leaf)], _ref(g.node, at, made)) for leaf, g in result.items()]
    if len(_TEMPLATES) >= LIMIT:
        for k in list(_TEMPLATES)[: LIMIT // 2]:
            del _TEMPLATES[k]
    _TEMPLATES[sig] = Template(steps, results, sorted(at[id(n)] for n in keep))


def _reads_forward(n: Node, at: dict[int, int], made: dict[int, int]) -> bool:
    return any(id(i) in at or id(i) in made for i in n.inputs)


def _ref(n: Node, at: dict[int, int], made: dict[int, int]) -> tuple:
    if id(n) in at:
        return (True, at[id(n)])
    if id(n) in made:
        return (False, made[id(n)])
    return (None, n)  # shared: reads nothing of the forward graph


def replay(template: Template, order: Sequence[Node]) -> tuple[dict[Node, Node], set[Node]]:
    """The template's gradient nodes over ``order`` (a forward graph of the template's signature): forward node
    -> gradient node, and the kept forward nodes."""
    made: list[Node] = []

    def get(ref: tuple) -> Node:
        kind, v = ref
        return order[v] if kind else made[v] if kind is False else v

    hooks = _ops.MADE
    for op, ins, attrs, shape, dtype, device, pulled in template.steps:
        node = Node(op, tuple(get(r) for r in ins), attrs, shape, dtype, device)
        for hook in hooks:
            hook(node)
        if pulled is not None:
            _ops.PULLED[node] = pulled
        made.append(node)
    return {order[k]: get(ref) for k, ref in template.results}, {order[k] for k in template.keep}
