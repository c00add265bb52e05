"""The structural IR of a fused group: what both kernel generators walk (the CUDA C++ of ``_codegen`` and the
PTX of ``_ptx``), and what the :class:`~._factory.KernelFactory` keys its kernels on.

:func:`group_ir` describes a group as pure hashable data: its kind (``elementwise`` or ``reduce``), iteration
space and reduced axes, its inputs (``("scalar", dtype)`` for a fill, ``("array", shape, dtype, element
strides)``), its nodes (op, attributes, shape, dtype, and where each operand comes from: ``("i", k)`` input k,
``("n", j)`` node j) and which nodes it writes. :class:`Layout` places every node in the space and checks that a
fused operand is read where it is computed; :func:`levels` orders a reduce group's nodes by the reductions they
depend on. A group neither generator can express raises :class:`Unsupported` (the backend runs it op by op).

>>> ir = (("elementwise", (4,), None, (("array", (4,), "<f4", (1,)), ("scalar", "<f4")),
...        (("mul", (), (4,), "<f4", (("i", 0), ("i", 1))),), (0,)))
>>> lay = Layout(ir)
>>> lay.kind, lay.space, lay.reads
('elementwise', (4,), [[(0,), ()]])
"""

from __future__ import annotations

import numpy as np

from ._graph import Node

ENTRY = "rx_group"
"""The entry point of every generated kernel."""
REDUCE = ("sum", "max", "min", "mean")


class Unsupported(Exception):
    """The generator cannot express this group (the backend runs it op by op instead)."""


CTYPES = {
    "b1": "bool", "i1": "signed char", "u1": "unsigned char", "i2": "short", "u2": "unsigned short",
    "i4": "int", "u4": "unsigned int", "i8": "long long", "u8": "unsigned long long", "f4": "float",
    "f8": "double",
}


def ctype(dtype) -> str:
    """The CUDA C type of ``dtype``; Unsupported for a dtype no generated kernel takes."""
    dtype = np.dtype(dtype)
    key = dtype.str[1:]
    if key not in CTYPES or dtype.byteorder == ">":
        raise Unsupported(f"no CUDA C type for {dtype}")
    return CTYPES[key]


def group_ir(group, plan, values: list) -> tuple | None:
    """The structural IR of ``group`` (of ``plan``) whose inputs hold ``values`` (arrays with ``shape``,
    ``strides`` and ``dtype``, or a fill for a ``full`` input); None where the generator does not apply."""
    try:
        return _ir(group, plan, values)
    except Unsupported:
        return None


def _ir(group, plan, values: list) -> tuple:
    if group.kind not in ("elementwise", "reduce"):
        raise Unsupported(group.kind)
    slot = {n: ("i", k) for k, n in enumerate(group.inputs)}
    inputs: list[tuple] = []
    for n, v in zip(group.inputs, values, strict=True):
        ctype(n.dtype)
        if n.op == "full":
            inputs.append(("scalar", n.dtype.str))
        else:
            item = np.dtype(v.dtype).itemsize
            if any(s % item for s in v.strides):
                raise Unsupported("strides that are not whole elements")
            inputs.append(("array", tuple(n.shape), n.dtype.str, tuple(int(s) // item for s in v.strides)))
    nodes = []
    for j, n in enumerate(group.nodes):
        ctype(n.dtype)
        nodes.append((n.op, _attrs(n), tuple(n.shape), n.dtype.str, tuple(slot[i] for i in plan.inputs_of(n))))
        slot[n] = ("n", j)
    index = {n: j for j, n in enumerate(group.nodes)}
    kind = "reduce" if group.kind == "reduce" else "elementwise"
    ir = (kind, tuple(group.space), group.axes, tuple(inputs), tuple(nodes), tuple(index[o] for o in group.outputs))
    lay = Layout(ir)  # raises Unsupported where the coordinates do not line up
    if kind == "reduce":
        levels(lay)  # raises Unsupported for a per-row value computed without a reduction
    return ir


def _attrs(n: Node) -> tuple:
    if n.op == "cast":
        return (np.dtype(n.attrs[0]).str,)
    return tuple(n.attrs)


class Layout:
    """Where each node of an IR lives in the space: its coordinates (a space axis, or None for 0) and the
    coordinates each operand is read at, checked so that a fused operand is read where it is evaluated."""

    def __init__(self, ir: tuple):
        self.kind, self.space, axes, self.inputs, self.nodes, self.outputs = ir
        self.axes = tuple(axes or ())
        r = len(self.space)
        self.full = tuple(range(r))
        self.rowaxes = tuple(a for a in self.full if a not in self.axes)
        self.coords = [self._classify(shape) for _, _, shape, _, _ in self.nodes]
        self.reads: list[list[tuple]] = []
        for j, (op, _, shape, _, refs) in enumerate(self.nodes):
            reads = []
            for ref in refs:
                src_shape = self._shape(ref)
                if op in ("reshape", "sum", "max", "min", "mean"):
                    at = self._classify(src_shape)
                    if op != "reshape" and self._norm(at) != self._norm(self.full):
                        raise Unsupported("a reduction over a value that is not the whole space")
                else:
                    off = len(shape) - len(src_shape)
                    at = tuple(None if d == 1 else self.coords[j][k + off] for k, d in enumerate(src_shape))
                if ref[0] == "n" and self._norm(at) != self._norm(self.coords[ref[1]]):
                    raise Unsupported("a fused operand read at other coordinates than it is computed at")
                reads.append(at)
            self.reads.append(reads)
            if op in ("sum", "max", "min", "mean") and tuple(self.nodes[j][1][0]) != self.axes:
                raise Unsupported("reductions over different axes")

    def _shape(self, ref) -> tuple:
        if ref[0] == "i":
            spec = self.inputs[ref[1]]
            return () if spec[0] == "scalar" else spec[1]  # a scalar input ("scalar", dtype) has no shape
        return self.nodes[ref[1]][2]

    def _classify(self, shape: tuple) -> tuple:
        if shape == self.space:
            return self.full
        if self.axes and shape == tuple(1 if a in self.axes else d for a, d in enumerate(self.space)):
            return tuple(None if a in self.axes else a for a in self.full)
        if self.axes and shape == tuple(self.space[a] for a in self.rowaxes):
            return self.rowaxes
        raise Unsupported(f"shape {shape} is none of the forms of space {self.space} over axes {self.axes}")

    def _norm(self, coords: tuple) -> tuple:
        return tuple(None if a is None or self.space[a] == 1 else a for a in coords)

    def is_full(self, j: int) -> bool:
        """Whether node ``j`` varies along a reduced axis (it is computed per element, not per row)."""
        reduced = {a for a in self.axes if self.space[a] != 1}
        return any(a in reduced for a in self._norm(self.coords[j])) or not self.axes


def element_closure(nodes: tuple, full: set[int], targets) -> list[int]:
    """The per-element nodes (of ``full``) that ``targets`` need, themselves included, in node order: what a
    loop over the reduced axes must compute to reach them."""
    need, stack = set(), list(targets)
    while stack:
        j = stack.pop()
        if j in full and j not in need:
            need.add(j)
            stack.extend(r for s, r in nodes[j][4] if s == "n")
    return sorted(need)


def levels(lay: Layout) -> tuple[list[int], set[int], list[int]]:
    """For a reduce IR: each node's level (how many reductions it depends on, through each other), the
    per-element nodes (not reductions) and the per-row nodes; raises Unsupported for a per-row value
    computed from per-element values without a reduction."""
    nodes = lay.nodes
    level: list[int] = []
    for j, (op, _, _, _, refs) in enumerate(nodes):
        lv = max((level[r] for s, r in refs if s == "n"), default=0)
        if op in REDUCE:
            lv += 1
        elif not lay.is_full(j) and any(s == "n" and lay.is_full(r) and nodes[r][0] not in REDUCE
                                        for s, r in refs):
            raise Unsupported("a per-row value computed from per-element values without a reduction")
        level.append(lv)
    full = {j for j in range(len(nodes)) if lay.is_full(j) and nodes[j][0] not in REDUCE}
    rows = [j for j in range(len(nodes)) if j not in full and nodes[j][0] not in REDUCE]
    return level, full, rows
