"""The node of a lazy tensor program: pure data, one per operation.

The representation agreed with autograd (``_autograd.py`` builds its backward graph from these):

- :class:`Node` (attrs, frozen, ``eq=False``: identity hashing) with ``op`` (a name from :data:`OPS`),
  ``inputs`` (the nodes it reads), ``attrs`` (hashable op attributes: axes, keepdims, shape, index, dtype),
  ``shape`` (a tuple of ints, ``()`` for a scalar), ``dtype`` (a ``numpy.dtype``) and ``device``
  (``"cpu"`` or ``"cuda"``).
- Leaves: ``"const"`` holds an array by reference through its :class:`Buffer`, ``attrs == (buffer,)``
  (a Buffer hashes by identity and carries the version that the result cache keys on); ``"full"`` is a
  scalar fill, ``attrs == (value,)`` with ``value`` already of ``dtype`` (a tensor block's parameter adds its
  name, ``(value, name)``: never the same structure as a literal or another parameter).
- ``"copy"`` is a device transfer, ``attrs == (target device,)``.

Attributes per op (all tuples, so they hash and compare for common-subexpression elimination):
``sum/max/min/mean``: ``(axes, keepdims)`` with ``axes`` a sorted tuple of non-negative ints;
``reshape``/``broadcast_to``: ``(shape,)``; ``transpose``: ``(axes,)``; ``cast``: ``(dtype,)``;
``getitem``: ``(index,)`` where ``index`` is a tuple of ``("int", i)``, ``("slice", start, stop, step)``
(resolved against the axis length) and ``("new",)`` for ``None``; every other op: ``()``.

>>> import numpy as np
>>> a = Node("full", (), (np.float32(1),), (2, 3), np.dtype(np.float32), "cpu")
>>> a.op, a.shape, a.device
('full', (2, 3), 'cpu')
"""

from __future__ import annotations

import itertools

import numpy as np

from ..model._shapes import Shape

DEVICES = ("cpu", "cuda")
ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sqrt", "sin", "cos", "tanh", "abs",
                         "maximum", "minimum", "where", "eq", "ne", "lt", "le", "gt", "ge", "cast"})
REDUCTIONS = frozenset({"sum", "max", "min", "mean"})
VIEWS = frozenset({"reshape", "transpose", "broadcast_to", "getitem"})
LEAVES = frozenset({"const", "full"})
OPAQUE = frozenset({"floordiv", "mod", "bitand", "bitor", "bitxor", "invert", "argmax", "argmin", "prod", "cumsum",
                    "concat", "take"})
"""Ops no kernel generator fuses (``_numpy.py``): each is a group of its own, run by the array library."""
OPS = ELEMENTWISE | REDUCTIONS | VIEWS | LEAVES | OPAQUE | {"matmul", "copy"}

_serials = itertools.count()


class Buffer:
    """An array a ``const`` node reads, held by reference, and its version.

    ``owned``: the tensor made its own copy (``tensor(...)``), so only writes through rxcuda change it and
    each write bumps ``version``. Otherwise the array came from outside (``asarray``, CuPy, PyTorch) and
    counts as changed at every evaluation, unless ``unchanged`` is set (``Tensor.mark_unchanged()``).
    """

    __slots__ = ("array", "version", "owned", "unchanged", "serial")

    def __init__(self, array, owned: bool):
        self.array = array
        self.version = 0
        self.owned = owned
        self.unchanged = False
        self.serial = next(_serials)  # never reused, unlike id()

    def bump(self) -> None:
        self.version += 1

    def __repr__(self) -> str:
        kind = "owned" if self.owned else ("outside, marked unchanged" if self.unchanged else "outside")
        return f"Buffer(#{self.serial} v{self.version}, {kind})"


_SIDS: dict[tuple, int] = {}
_next_sid = itertools.count()
SID_LIMIT = 1 << 20
"""Structures remembered before the table is forgotten (new nodes then get fresh ids: a missed match, never a
false one)."""


def _leaf_layout(buf: Buffer) -> object:
    """What of a held array a kernel is specialised on besides shape and dtype: its strides."""
    strides = getattr(buf.array, "strides", None)
    return None if strides is None else tuple(strides)


class Node:
    """One operation of a lazy tensor program (see the module docstring for ``op`` and ``attrs``); immutable
    by convention, hashed by identity.

    Beside its fields a node has ``sid``, its **structural id**: equal ids mean equal programs up to which data
    the ``const`` leaves hold (op, attributes, shape, dtype, device and, through the inputs' ids, the whole
    subgraph; a leaf contributes its shape, dtype, device and strides, a fill its value), and ``leaves``: the
    distinct ``const`` leaves the node reads, in first-use order. The pair (``sid``, the leaves' data) says
    exactly what a node computes: it is the result cache's key (:func:`~._cache.keys`), and ``sid`` alone keys
    the compiled-plan cache, so a program traced again over new arrays of the same layout reuses its plan.
    Ids are interned once per structure when the node is made (a dict lookup).
    """

    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "device", "sid", "_leaves", "__weakref__")

    def __init__(self, op: str, inputs: tuple[Node, ...], attrs: tuple, shape: Shape, dtype: np.dtype,
                 device: str):
        self.op, self.inputs, self.attrs, self.shape, self.dtype, self.device = op, inputs, attrs, shape, dtype, device
        if op == "const":
            key: tuple = ("const", shape, dtype, device, _leaf_layout(attrs[0]))
            self._leaves: tuple[Node, ...] | None = None  # itself (see ``leaves``): no cycle keeps a leaf alive
        elif op == "full":
            v = attrs[0]
            key = ("full", np.asarray(v).tobytes(), attrs[1:], shape, dtype, device)  # -0.0 and 0.0 differ
            self._leaves = ()
        elif not inputs:  # a node made outside a program (to_host's copy): nothing below it
            key = (op, attrs, shape, dtype, device)
            self._leaves = ()
        elif len(inputs) == 1:
            key = (op, attrs, shape, dtype, device, inputs[0].sid)
            self._leaves = inputs[0].leaves
        else:
            leaves = list(inputs[0].leaves)
            maps = []
            for i in inputs[1:]:
                if _is_prefix(i.leaves, leaves):
                    maps.append(None)  # the same leaves in the same order (the common case): no map
                    continue
                at = {id(n): k for k, n in enumerate(leaves)}
                m = []
                for n in i.leaves:
                    k = at.get(id(n))
                    if k is None:
                        k = len(leaves)
                        leaves.append(n)
                    m.append(k)
                maps.append(tuple(m))
            key = (op, attrs, shape, dtype, device, tuple(i.sid for i in inputs), tuple(maps))
            self._leaves = tuple(leaves)
        sid = _SIDS.get(key)
        if sid is None:
            if len(_SIDS) >= SID_LIMIT:
                _SIDS.clear()
            sid = _SIDS[key] = next(_next_sid)
        self.sid: int = sid

    @property
    def leaves(self) -> tuple[Node, ...]:
        """The distinct ``const`` leaves this node reads, in first-use order (a leaf: itself)."""
        leaves = self._leaves
        return (self,) if leaves is None else leaves

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.shape}, {self.dtype}, {self.device})"


def _is_prefix(part: tuple, leaves: list) -> bool:
    """Whether ``part`` is the first ``len(part)`` nodes of ``leaves``."""
    return len(part) <= len(leaves) and all(a is b for a, b in zip(part, leaves, strict=False))


def topo(outputs) -> list[Node]:
    """Every node the ``outputs`` need, inputs before their users (iterative: deep chains do not recurse)."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in outputs:
        stack = [(root, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((i, False) for i in reversed(node.inputs) if id(i) not in seen)
    return order
