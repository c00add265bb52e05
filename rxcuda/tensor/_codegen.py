"""CUDA C++ for a planned group: one kernel per fused group, generated from the group's ops (no GPU needed).

A group is first described by its structural IR (:func:`group_ir`): its kind, iteration space and reduced
axes, its inputs (a scalar fill, or an array with its shape, dtype and element strides), its nodes (op,
attributes, shape, dtype, and where each input comes from) and which nodes it writes. The IR is pure hashable
data, so the :class:`KernelFactory` keys compiled kernels on it: the same structure again is a dict hit.

Three kernel shapes come out of :func:`generate`; :func:`launch_shape` gives each its grid and block (the
only launch contract: callers launch exactly that), and both come from one plan per IR (:func:`_planned`):

- **elementwise**: blocks of 256 threads, each thread doing 4 elements 256 apart (coalesced) per grid-stride
  step, with no bounds checks on whole tiles. An input laid out like the space is read as ``in[i]``; the
  linear index is decomposed into coordinates only where an operand is strided or broadcast, or a per-row
  value (reduced axes kept at 1, or dropped) is written once per row;
- **rows** (register-resident reduce, rows of up to 16384 elements of 4 bytes, 8192 of 8): each row of the
  non-reduced axes belongs to a group of lanes: a whole block for long rows (64..1024 threads, sized from
  the row length so a thread holds at most 16 elements, 8 of 8 bytes) or 1..32 lanes of a warp for short
  ones (several rows per block: the MLP's 10-class softmax does not waste a block a row). The row is cut into
  chunks of V consecutive elements, V = 16 bytes (float4, double2) where the row is contiguous in an operand
  and a run-time check finds the pointers 16-byte aligned (else the same chunks are read element by
  element); lane ``l`` holds chunks ``k * G + l`` in registers (compile-time count, unrolled). So every input
  element is read from global memory once and every per-element output written once: softmax loads the
  row, folds the max, exps and folds the sum, divides and stores; layernorm loads, folds the mean, forms
  ``d = x - mean`` and the mean of ``d * d``, and stores. A reduction is a per-lane fold, a
  ``__shfl_xor_sync`` butterfly over the group and, across the warps of a block, one shared slot per warp.
  Indices are 32-bit wherever every index fits;
- **loop** (rows too long for registers, or an empty reduced extent): one block of 256 threads per row;
  each reduction level is a strided loop over the reduced axes and a tree in shared memory, recomputing the
  per-element values it needs from global memory (softmax reads the row three times).

Math stays precise (``expf``, ``logf``, ``sqrtf``, IEEE division; no fast-math), and f32 kernels stay in f32:
literals are cast to the kernel's type and float functions take their ``f`` names.

A group the generator cannot express (a dtype without a CUDA C type, an operand read at coordinates other than
the ones it is evaluated at) gives ``None``; the backend then runs that group op by op.

>>> import numpy as np
>>> ir = (("elementwise", (4,), None, (("array", (4,), "<f4", (1,)), ("scalar", "<f4")),
...        (("mul", (), (4,), "<f4", (("i", 0), ("i", 1))),), (0,)))
>>> "v0 = (float)(((float)(in0[i]) * (float)(s1)))" in generate(ir)
True
>>> launch_shape(ir)
(1, 256)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ._graph import Node

BLOCK = 256
ENTRY = "rx_group"
_MAX_GRID = 1 << 20
_INT32 = 2**31 - 1
_REDUCE = ("sum", "max", "min", "mean")
#: register-resident rows: at most this many elements per thread (half for 8-byte values) and at most
#: ``_MAX_THREADS`` threads per row, so rows of up to 16384 (4-byte) / 8192 (8-byte) elements are read once
_ELEMS_PER_THREAD = 16
_MAX_THREADS = 1024
#: rows of at most this many chunks are handled by 1..32 lanes of a warp (several rows per block)
_SHORT_ROW = 128
#: short rows shrink the block (down to one warp) until the grid has this many blocks (2 per SM of an H100)
_MIN_BLOCKS = 264
#: elementwise: threads per block and elements per thread (``threads`` apart, coalesced)
_EW_THREADS, _EW_UNROLL = 256, 4
_VECTOR = {"float": "float4", "int": "int4", "unsigned int": "uint4", "double": "double2", "long long": "longlong2",
           "unsigned long long": "ulonglong2"}
_FIELDS = "xyzw"

CTYPES = {
    "b1": "bool", "i1": "signed char", "u1": "unsigned char", "i2": "short", "u2": "unsigned short",
    "i4": "int", "u4": "unsigned int", "i8": "long long", "u8": "unsigned long long", "f4": "float",
    "f8": "double",
}
_MATH = ("exp", "log", "sqrt", "sin", "cos", "tanh")
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

_PRELUDE = """\
template <typename T> __device__ __forceinline__ T rx_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T rx_min(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T rx_ipow(T b, T e)
{
    T r = 1;
    while (e > 0) { if (e & 1) r *= b; b *= b; e >>= 1; }
    return r;
}
"""


class Unsupported(Exception):
    """The generator cannot express this group (the backend runs it op by op instead)."""


def ctype(dtype) -> str:
    dtype = np.dtype(dtype)
    key = dtype.str[1:]
    if key not in CTYPES or dtype.byteorder == ">":
        raise Unsupported(f"no CUDA C type for {dtype}")
    return CTYPES[key]


# -- the IR -------------------------------------------------------------------------------------------------------
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
    inputs = []
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
    lay = _Layout(ir)  # raises Unsupported where the coordinates do not line up
    if kind == "reduce":
        _levels(lay)  # raises Unsupported for a per-row value computed without a reduction
    return ir


def _attrs(n: Node) -> tuple:
    if n.op == "cast":
        return (np.dtype(n.attrs[0]).str,)
    return tuple(n.attrs)


class _Layout:
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


# -- code ------------------------------------------------------------------------------------------------------
def _lit(value, dtype: np.dtype) -> str:
    t = ctype(dtype)
    if dtype.kind == "f":
        if np.isinf(value):
            inf = "__int_as_float(0x7f800000)" if t == "float" else "__longlong_as_double(0x7ff0000000000000LL)"
            return f"({'-' if value < 0 else ''}{inf})"
        return f"(({t}){float(value)!r})"
    if dtype.kind == "b":
        return "true" if value else "false"
    if dtype.kind == "u":
        return f"(({t}){int(value)}ULL)"
    v = int(value)
    return f"(({t})({v + 1}LL - 1))" if v < 0 else f"(({t}){v}LL)"


def _identity(op: str, dtype: np.dtype) -> str:
    if op in ("sum", "mean"):
        return _lit(0, dtype)
    if dtype.kind == "f":
        return _lit(-np.inf if op == "max" else np.inf, dtype)
    if dtype.kind == "b":
        return _lit(op == "min", dtype)
    info = np.iinfo(dtype)
    return _lit(info.min if op == "max" else info.max, dtype)


def _combine(op: str, a: str, b: str) -> str:
    return {"sum": f"({a} + {b})", "mean": f"({a} + {b})", "max": f"rx_max({a}, {b})", "min": f"rx_min({a}, {b})"}[op]


def _expr(op: str, attrs: tuple, dtype: np.dtype, args: list[str], arg_dtypes: list[np.dtype]) -> str:
    t = ctype(dtype)
    if op in ("reshape", "broadcast_to"):
        return args[0]
    if op == "cast":
        return f"({t})({args[0]})"
    if op in _COMPARE:
        ct = ctype(np.result_type(*arg_dtypes))
        return f"(({ct})({args[0]}) {_COMPARE[op]} ({ct})({args[1]}))"
    if op == "where":
        return f"(({args[0]}) ? ({t})({args[1]}) : ({t})({args[2]}))"
    a = [f"({t})({x})" for x in args]
    if op in _BINARY:
        return f"({a[0]} {_BINARY[op]} {a[1]})"
    if op == "neg":
        return f"(-{a[0]})"
    if op in ("maximum", "minimum"):
        return f"rx_{op[:3]}<{t}>({a[0]}, {a[1]})"
    if op == "abs":
        if dtype.kind == "f":
            return f"{'fabsf' if t == 'float' else 'fabs'}({a[0]})"
        return a[0] if dtype.kind in "ub" else f"({a[0]} < 0 ? -{a[0]} : {a[0]})"
    if op == "pow":
        if dtype.kind == "f":
            return f"{'powf' if t == 'float' else 'pow'}({a[0]}, {a[1]})"
        return f"rx_ipow<{t}>({a[0]}, {a[1]})"
    if op in _MATH:
        if dtype.kind != "f":
            raise Unsupported(f"{op} of {dtype}")
        return f"{op}{'f' if t == 'float' else ''}({a[0]})"
    raise Unsupported(f"op {op}")


def _strides(shape: tuple) -> tuple:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def _pow2ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _axis_strides(lay: _Layout, k: int, at: tuple) -> dict[int, int]:
    """The element stride of input ``k`` along each space axis it is read at (at ``at``); axes of length 1
    and stride 0 (broadcast) are left out, so an axis missing from the map does not move the address."""
    return {a: s for a, s in zip(at, lay.inputs[k][3], strict=True) if a is not None and lay.space[a] != 1 and s}


def _index_type(lay: _Layout, bound: int) -> str:
    """``int`` where every index the kernel forms (up to ``bound``, and every input offset) fits in 31 bits."""
    extent = max((sum((d - 1) * abs(s) for d, s in zip(i[1], i[3], strict=True)) for i in lay.inputs
                  if i[0] == "array"), default=0)
    return "int" if max(bound, extent) <= _INT32 else "long long"


def _coord(a: int, var: str, axes: list[int], strides: dict[int, int], space: tuple) -> str:
    """Coordinate ``a`` of the row-major linear index ``var`` over ``axes`` (compile-time divisors)."""
    if len(axes) == 1:
        return var
    e = var if strides[a] == 1 else f"({var} / {strides[a]})"
    return e if a == axes[0] else f"({e} % {space[a]})"


def _levels(lay: _Layout) -> tuple[list[int], set[int], list[int]]:
    """For a reduce IR: each node's level (how many reductions it depends on, through each other), the
    per-element nodes (not reductions) and the per-row nodes; raises Unsupported for a per-row value
    computed from per-element values without a reduction."""
    nodes = lay.nodes
    level = []
    for j, (op, _, _, _, refs) in enumerate(nodes):
        lv = max((level[r] for s, r in refs if s == "n"), default=0)
        if op in _REDUCE:
            lv += 1
        elif not lay.is_full(j) and any(s == "n" and lay.is_full(r) and nodes[r][0] not in _REDUCE
                                        for s, r in refs):
            raise Unsupported("a per-row value computed from per-element values without a reduction")
        level.append(lv)
    full = {j for j in range(len(nodes)) if lay.is_full(j) and nodes[j][0] not in _REDUCE}
    rows = [j for j in range(len(nodes)) if j not in full and nodes[j][0] not in _REDUCE]
    return level, full, rows


def _decompose(var: str, axes: tuple, space: tuple, indent: str, idx: str = "long long") -> list[str]:
    """Lines setting ``c<axis>`` for ``axes`` (row-major) from the linear index ``var``."""
    sfx = "LL" if idx == "long long" else ""
    lines = [f"{indent}{idx} t_ = {var};"]
    for a in reversed(axes):
        lines.append(f"{indent}const {idx} c{a} = t_ % {space[a]}{sfx}; t_ /= {space[a]}{sfx};")
    return lines


@dataclass(frozen=True)
class _Shape:
    """How one kernel maps onto the GPU: its mode (``elementwise``, ``rows``: register-resident rows,
    ``loop``: strided loops over long rows), ``threads`` per block and ``blocks``; for ``rows`` the lanes
    per row (``group``), chunks per lane (``per``) and elements per chunk (``vec``); the index type."""

    mode: str
    threads: int
    blocks: int
    group: int = 0
    per: int = 0
    vec: int = 1
    idx: str = "long long"


@functools.lru_cache(maxsize=4096)
def _planned(ir: tuple) -> tuple[_Layout, _Shape, _Rows | None]:
    """The layout, launch shape and (for register-resident rows) row plan of ``ir``: computed once per IR,
    so :func:`launch_shape` and :func:`generate` agree and a launch does not re-plan."""
    lay = _Layout(ir)
    size = math.prod(lay.space)
    if lay.kind != "reduce":
        threads, per_block = _EW_THREADS, _EW_THREADS * _EW_UNROLL
        blocks = min(-(-size // per_block), _MAX_GRID)
        return lay, _Shape("elementwise", threads, blocks, idx=_index_type(lay, size + (blocks + 1) * per_block)), None
    rows = _Rows(lay)
    if rows.shape is not None:
        return lay, rows.shape, rows
    nrows = math.prod(lay.space[a] for a in lay.rowaxes)
    return lay, _Shape("loop", BLOCK, min(nrows, _MAX_GRID)), None


class _Rows:
    """The register-resident row kernel for a reduce IR (``shape`` None where the row is too long for it).

    Each row of the non-reduced axes is handled by a group of ``G`` lanes: a whole block (64..1024 threads)
    for long rows, or 1..32 lanes of a warp for short ones (several rows per block). The row is cut into
    chunks of ``V`` consecutive elements (``V`` = 16 bytes when the row is contiguous in every operand, read
    as float4/double2 after a run-time alignment check; else 1); lane ``l`` holds chunks ``k*G + l`` for
    ``k < PER`` in registers. Every input element is loaded once, every reduction is a per-lane fold then
    ``__shfl_xor_sync`` across the group (and a shared slot per warp across a block), and every per-element
    output is stored once."""

    def __init__(self, lay: _Layout):
        sp = lay.space
        self.lay = lay
        self.red = [a for a in sorted(lay.axes) if sp[a] != 1]
        self.rowax = [a for a in lay.rowaxes if sp[a] != 1]
        self.nred = math.prod(sp[a] for a in self.red)
        self.nrows = math.prod(sp[a] for a in self.rowax)
        self.level, self.full, self.rows = _levels(lay)
        self.rs = dict(zip(self.red, _strides(tuple(sp[a] for a in self.red)), strict=True))
        self.rrs = dict(zip(self.rowax, _strides(tuple(sp[a] for a in self.rowax)), strict=True))
        self.keys: dict[tuple, int] = {}  # (input, coordinates it is read at) -> q: one load per key
        for j, (_, _, _, _, refs) in enumerate(lay.nodes):
            for k, (s, r) in enumerate(refs):
                if s == "i" and lay.inputs[r][0] == "array":
                    self.keys.setdefault((r, lay.reads[j][k]), len(self.keys))
        self.st = {key: _axis_strides(lay, *key) for key in self.keys}
        self.full_read = {key for key in self.keys if any(a in self.st[key] for a in self.red)}
        space_strides = _strides(sp)
        self.ost = {a: space_strides[a] for a in self.red + self.rowax}
        self.full_out = [(o, j) for o, j in enumerate(lay.outputs) if j in self.full]
        self.shape = self._plan()

    def contiguous(self, st: dict[int, int]) -> bool:
        """Whether element ``r`` of a row is at offset ``r`` from the row's start."""
        return all(st.get(a) == self.rs[a] for a in self.red)

    def _plan(self) -> _Shape | None:
        lay, nred, nrows = self.lay, self.nred, self.nrows
        held = [np.dtype(lay.inputs[k][2]).itemsize for k, _ in self.full_read]
        held += [np.dtype(lay.nodes[j][3]).itemsize for j in self.full]
        most = _ELEMS_PER_THREAD if max(held, default=1) <= 4 else _ELEMS_PER_THREAD // 2
        if nred == 0 or nred > most * _MAX_THREADS:
            return None
        sizes = {np.dtype(lay.inputs[k][2]).itemsize for k, _ in self.full_read}
        sizes |= {np.dtype(lay.nodes[j][3]).itemsize for _, j in self.full_out}
        self.vector_keys, self.vector_outs, vec = [], [], 1
        if len(sizes) == 1 and (size := sizes.pop()) in (4, 8) and nred % (16 // size) == 0:
            v = 16 // size
            self.vector_keys = [key for key in self.keys if key in self.full_read and self.contiguous(self.st[key])
                                and all(s % v == 0 for a, s in self.st[key].items() if a in self.rrs)]
            self.vector_outs = [(o, j) for o, j in self.full_out if self.contiguous(self.ost)]
            if self.vector_keys or self.vector_outs:
                vec = v
        chunks = -(-nred // vec)
        if chunks <= _SHORT_ROW:  # short rows: 1..32 lanes of a warp per row, several rows per block
            group = min(32, _pow2ceil(-(-chunks // 4)))
            threads = 256
            while threads > 32 and -(-nrows // (threads // group)) < _MIN_BLOCKS:
                threads //= 2
        else:  # one block per row, sized so each thread holds at most `most` elements
            threads = group = min(_MAX_THREADS, max(64, _pow2ceil(-(-nred // most))))
        per = -(-chunks // group)
        rows_per_block = threads // group
        blocks = min(-(-nrows // rows_per_block), _MAX_GRID)
        idx = _index_type(lay, max(nrows * nred, nrows + (blocks + 1) * rows_per_block))
        return _Shape("rows", threads, blocks, group, per, vec, idx)

    # -- code --------------------------------------------------------------------------------------------
    def body(self) -> list[str]:
        lay, sh = self.lay, self.shape
        nodes, idx = lay.nodes, sh.idx
        G, V, E = sh.group, sh.vec, sh.per * sh.vec
        R = sh.threads // G
        sfx = "LL" if idx == "long long" else ""
        nred, nrows = self.nred, self.nrows
        exact = sh.per * G * V == nred  # every element slot of every lane is in the row: no masks
        reds = [j for j in range(len(nodes)) if nodes[j][0] in _REDUCE]
        q_of = self.keys
        lines = []
        if G > 32:
            for j in reds:
                lines.append(f"    __shared__ {ctype(nodes[j][3])} sh{j}[{G // 32}];")
        ptrs = [f"(unsigned long long)in{k}" for k, _ in self.vector_keys]
        ptrs += [f"(unsigned long long)out{o}" for o in dict.fromkeys(o for o, _ in self.vector_outs)]
        if V > 1:
            lines.append(f"    const bool vec = (({' | '.join(ptrs)}) & 15ULL) == 0ULL;  // 16-byte aligned")
        lane = "0" if G == 1 else "(int)threadIdx.x" if sh.threads == G else f"(int)(threadIdx.x & {G - 1}u)"
        lines.append(f"    const int lane = {lane};")
        lines.append(f"    for ({idx} base = ({idx})blockIdx.x * {R}; base < {nrows}{sfx}; "
                     f"base += ({idx})gridDim.x * {R}) {{")
        i1, i2 = "        ", "            "
        row = "base" if R == 1 else f"base + ({idx})(threadIdx.x / {G}u)"
        lines.append(f"{i1}const {idx} row = {row};")
        guarded = R > 1 and nrows % R != 0
        if guarded:
            lines.append(f"{i1}const bool valid = row < {nrows}{sfx};")

        def when(*conds: str) -> str:
            return " && ".join(c for c in conds if c) or "true"

        def guard_if(*conds: str) -> str:
            return "" if when(*conds) == "true" else f"if ({when(*conds)}) "

        def guarded_load(load: str, t: str) -> str:
            return load if when(live, in_row) == "true" else f"({when(live, in_row)}) ? {load} : ({t})0"

        live = "valid" if guarded else ""  # a lane of a row past the end (short rows, last block) does nothing
        in_row = "" if exact else f"r < {nred}"
        in_chunks = "" if exact else f"c < {nred // V}"
        for a in self.rowax:
            lines.append(f"{i1}const {idx} c{a} = {_coord(a, 'row', self.rowax, self.rrs, lay.space)};")

        def base_of(st: dict[int, int]) -> str:
            return " + ".join(f"c{a} * {st[a]}" for a in self.rowax if a in st) or "0"

        def offset(st: dict[int, int]) -> str:
            if self.contiguous(st):
                return "r"
            return " + ".join(f"{_coord(a, 'r', self.red, self.rs, lay.space)} * {st[a]}"
                              for a in self.red if a in st) or "0"

        slot = f"((e / {V}) * {G} + lane) * {V} + e % {V}" if V > 1 else f"e * {G} + lane"
        for key, q in q_of.items():
            k = key[0]
            t = ctype(lay.inputs[k][2])
            if key not in self.full_read:
                load = f"in{k}[{base_of(self.st[key])}]"
                lines.append(f"{i1}const {t} l{q} = {f'valid ? {load} : ({t})0' if live else load};")
                continue
            lines.append(f"{i1}const {idx} rb{q} = {base_of(self.st[key])};")
            lines.append(f"{i1}{t} x{q}[{E}];")
            scalar = ["#pragma unroll", f"for (int e = 0; e < {E}; ++e) {{",
                      f"    const int r = {slot};",
                      f"    x{q}[e] = {guarded_load(f'in{k}[rb{q} + {offset(self.st[key])}]', t)};", "}"]
            if key in self.vector_keys:
                vt = _VECTOR[t]
                fill = " ".join(f"x{q}[k * {V} + {f}] = v_.{_FIELDS[f]};" for f in range(V))
                zero = " ".join(f"x{q}[k * {V} + {f}] = ({t})0;" for f in range(V))
                vector = ["#pragma unroll", f"for (int k = 0; k < {sh.per}; ++k) {{",
                          f"    const int c = k * {G} + lane;",
                          f"    if ({when(live, in_chunks)}) {{ const {vt} v_ = "
                          f"reinterpret_cast<const {vt}*>(in{k} + rb{q})[c]; {fill} }}",
                          f"    else {{ {zero} }}", "}"]
                lines.append(f"{i1}if (vec) {{")
                lines += [i2 + x for x in vector]
                lines.append(f"{i1}}} else {{")
                lines += [i2 + x for x in scalar]
                lines.append(f"{i1}}}")
            else:
                lines += [i1 + x for x in scalar]

        def operand(j: int, k: int, e: bool) -> str:
            s, r = nodes[j][4][k]
            if s == "n":
                return f"v{r}[e]" if r in self.full and e else f"v{r}"
            inp = lay.inputs[r]
            if inp[0] == "scalar":
                return f"(bool)s{r}" if inp[1] == "|b1" else f"s{r}"
            key = (r, lay.reads[j][k])
            return f"x{q_of[key]}[e]" if key in self.full_read else f"l{q_of[key]}"

        def compute(j: int) -> list[str]:
            t = ctype(nodes[j][3])
            if j not in self.full:
                return [f"{i1}const {t} v{j} = ({t})({_node_expr(lay, j, lambda k: operand(j, k, False))});"]
            expr = _node_expr(lay, j, lambda k: operand(j, k, True))
            return [f"{i1}{t} v{j}[{E}];", f"{i1}#pragma unroll",
                    f"{i1}for (int e = 0; e < {E}; ++e) v{j}[e] = ({t})({expr});"]

        def stage(lv: int) -> list[str]:
            out = []
            for j in self.rows:
                if self.level[j] == lv:
                    out += compute(j)
            for j in sorted(self.full):
                if self.level[j] == lv:
                    out += compute(j)
            return out

        lines += stage(0)
        for lv in range(1, max(self.level, default=0) + 1):
            here = [j for j in reds if self.level[j] == lv]
            for j in here:
                t, op = ctype(nodes[j][3]), nodes[j][0]
                value = f"({t})({operand(j, 0, True)})"
                lines += [f"{i1}{t} a{j} = {_identity(op, np.dtype(nodes[j][3]))};", f"{i1}#pragma unroll",
                          f"{i1}for (int e = 0; e < {E}; ++e) {{"]
                if not exact:
                    lines.append(f"{i2}const int r = {slot};")
                guard = "" if exact else f"if (r < {nred}) "
                lines += [f"{i2}{guard}a{j} = {_combine(op, f'a{j}', value)};", f"{i1}}}"]
            for off in _halves(min(G, 32)):
                for j in here:
                    t, op = ctype(nodes[j][3]), nodes[j][0]
                    lines.append(f"{i1}a{j} = {_combine(op, f'a{j}', _shuffle(f'a{j}', t, off))};")
            if G > 32 and here:
                for j in here:
                    lines.append(f"{i1}if ((threadIdx.x & 31u) == 0u) sh{j}[threadIdx.x >> 5] = a{j};")
                lines.append(f"{i1}__syncthreads();")
                for j in here:
                    op = nodes[j][0]
                    lines += [f"{i1}a{j} = sh{j}[0];", f"{i1}#pragma unroll",
                              f"{i1}for (int w = 1; w < {G // 32}; ++w) a{j} = {_combine(op, f'a{j}', f'sh{j}[w]')};"]
                if nrows > sh.blocks:  # a block does another row: its slots are written again
                    lines.append(f"{i1}__syncthreads();")
            for j in here:
                t, op = ctype(nodes[j][3]), nodes[j][0]
                lines.append(f"{i1}const {t} v{j} = ({t})({f'a{j} / ({t}){nred}' if op == 'mean' else f'a{j}'});")
            lines += stage(lv)
        if self.full_out:
            lines.append(f"{i1}const {idx} ob = {base_of(self.ost)};")
        for o, j in self.full_out:
            t = ctype(nodes[j][3])
            scalar = ["#pragma unroll", f"for (int e = 0; e < {E}; ++e) {{", f"    const int r = {slot};",
                      f"    {guard_if(live, in_row)}out{o}[ob + {offset(self.ost)}] = v{j}[e];", "}"]
            if (o, j) in self.vector_outs:
                vt = _VECTOR[t]
                fill = " ".join(f"v_.{_FIELDS[f]} = v{j}[k * {V} + {f}];" for f in range(V))
                vector = ["#pragma unroll", f"for (int k = 0; k < {sh.per}; ++k) {{",
                          f"    const int c = k * {G} + lane;",
                          f"    if ({when(live, in_chunks)}) {{ {vt} v_; {fill} "
                          f"reinterpret_cast<{vt}*>(out{o} + ob)[c] = v_; }}", "}"]
                lines.append(f"{i1}if (vec) {{")
                lines += [i2 + x for x in vector]
                lines.append(f"{i1}}} else {{")
                lines += [i2 + x for x in scalar]
                lines.append(f"{i1}}}")
            else:
                lines += [i1 + x for x in scalar]
        for o, j in enumerate(lay.outputs):
            if j not in self.full:
                lines.append(f"{i1}if ({when('lane == 0' if G > 1 else '', live)}) out{o}[row] = v{j};")
        return lines + ["    }"]


def _halves(n: int) -> list[int]:
    """The shuffle distances of a butterfly over ``n`` lanes: n/2, n/4, ..., 1."""
    out = []
    while n > 1:
        n //= 2
        out.append(n)
    return out


def _shuffle(var: str, t: str, off: int) -> str:
    if t in ("bool", "signed char", "unsigned char", "short", "unsigned short"):
        return f"({t})__shfl_xor_sync(0xffffffffu, (int){var}, {off})"
    return f"__shfl_xor_sync(0xffffffffu, {var}, {off})"


def generate(ir: tuple) -> str:
    """The CUDA C++ source of one kernel (entry ``rx_group``) for ``ir``."""
    lay, shape, rows = _planned(ir)
    kind, space, _, inputs, nodes, outputs = ir
    params = []
    for k, inp in enumerate(inputs):
        t = ctype(inp[-2] if inp[0] == "array" else inp[1])
        if inp[0] == "scalar":
            params.append(f"{'unsigned char' if t == 'bool' else t} s{k}")
        else:
            params.append(f"const {t}* __restrict__ in{k}")
    for k, j in enumerate(outputs):
        params.append(f"{ctype(nodes[j][3])}* __restrict__ out{k}")
    if rows is not None:
        body = rows.body()
    elif kind == "reduce":
        body = _loop_body(lay)
    else:
        body = _elementwise_body(lay, shape)
    return (_PRELUDE + f'\nextern "C" __global__ void __launch_bounds__({shape.threads}) {ENTRY}('
            + ", ".join(params) + ")\n{\n" + "\n".join(body) + "\n}\n")


def _operand(lay: _Layout, j: int, k: int) -> str:
    kind, ref = lay.nodes[j][4][k]
    if kind == "n":
        return f"v{ref}"
    inp = lay.inputs[ref]
    if inp[0] == "scalar":
        return f"(bool)s{ref}" if inp[1] == "|b1" else f"s{ref}"
    at, strides = lay.reads[j][k], inp[3]
    terms = [f"c{a} * {s}" for a, s in zip(at, strides, strict=True) if a is not None and s != 0]
    return f"in{ref}[{' + '.join(f'({x})' for x in terms) or '0'}]"


def _node_expr(lay: _Layout, j: int, operand) -> str:
    """The C++ expression of node ``j``; ``operand(k)`` gives the expression of its k-th operand."""
    op, attrs, _, dt, refs = lay.nodes[j]
    args = [operand(k) for k in range(len(refs))]
    arg_dtypes = [np.dtype(lay.inputs[r][-2] if lay.inputs[r][0] == "array" else lay.inputs[r][1]) if s == "i"
                  else np.dtype(lay.nodes[r][3]) for s, r in refs]
    return _expr(op, attrs, np.dtype(dt), args, arg_dtypes)


def _node_line(lay: _Layout, j: int, indent: str, operand=None) -> str:
    t = ctype(lay.nodes[j][3])
    expr = _node_expr(lay, j, operand or (lambda k: _operand(lay, j, k)))
    return f"{indent}const {t} v{j} = ({t})({expr});"


def _row_index(lay: _Layout, sfx: str = "LL") -> str:
    rowspace = tuple(lay.space[a] for a in lay.rowaxes)
    terms = [f"c{a} * {s}{sfx}" for a, s in zip(lay.rowaxes, _strides(rowspace), strict=True)]
    return " + ".join(terms) or "0"


def _elementwise_body(lay: _Layout, shape: _Shape) -> list[str]:
    """A tile of ``threads * _EW_UNROLL`` elements per block and step (grid-stride): each thread does
    ``_EW_UNROLL`` elements ``threads`` apart (coalesced), without bounds checks on whole tiles. An input
    laid out like the space is read at the linear index; coordinates are formed only where an operand is
    strided or broadcast, or a per-row value is written."""
    size, idx = math.prod(lay.space), shape.idx
    sfx = "LL" if idx == "long long" else ""
    T, U = shape.threads, _EW_UNROLL
    space_strides = dict(enumerate(_strides(lay.space)))
    dense = {a: s for a, s in space_strides.items() if lay.space[a] != 1}
    coords = any(not lay.is_full(j) for j in lay.outputs)

    def operand(j: int, k: int) -> str:
        nonlocal coords
        s, r = lay.nodes[j][4][k]
        if s == "i" and lay.inputs[r][0] == "array":
            if _axis_strides(lay, r, lay.reads[j][k]) == dense:
                return f"in{r}[i]"
            coords = True
        return _operand(lay, j, k)

    work = [_node_line(lay, j, "", lambda k, j=j: operand(j, k)) for j in range(len(lay.nodes))]
    reduced = [a for a in lay.axes if lay.space[a] != 1]
    for k, j in enumerate(lay.outputs):
        if lay.is_full(j):
            work.append(f"out{k}[i] = v{j};")
        else:
            first = " && ".join(f"c{a} == 0" for a in reduced) or "true"
            work.append(f"if ({first}) out{k}[{_row_index(lay, sfx)}] = v{j};")
    if coords:
        work = [x.strip() for x in _decompose("i", lay.full, lay.space, "", idx)] + work

    def tile(indent: str, checked: bool) -> list[str]:
        inner = indent + ("        " if checked else "    ")
        out = [f"{indent}#pragma unroll", f"{indent}for (int u = 0; u < {U}; ++u) {{",
               f"{indent}    const {idx} i = b + u * {T} + ({idx})threadIdx.x;"]
        if checked:
            out.append(f"{indent}    if (i < {size}{sfx}) {{")
        out += [inner + x for x in work]
        if checked:
            out.append(f"{indent}    }}")
        return out + [f"{indent}}}"]

    lines = [f"    for ({idx} b = ({idx})blockIdx.x * {T * U}; b < {size}{sfx}; b += ({idx})gridDim.x * {T * U}) {{"]
    if size < T * U:
        lines += tile("        ", True)
    elif size % (T * U):
        lines.append(f"        if (b + {T * U} <= {size}{sfx}) {{")
        lines += tile("            ", False)
        lines.append("        } else {")
        lines += tile("            ", True)
        lines.append("        }")
    else:
        lines += tile("        ", False)
    return lines + ["    }"]


def _loop_body(lay: _Layout) -> list[str]:
    """Rows too long for registers: each reduction level is a strided loop over the reduced axes (the row is
    read again at each level, and once more to store per-element outputs) and a tree in shared memory."""
    nodes = lay.nodes
    nred = math.prod(lay.space[a] for a in lay.axes)
    nrows = math.prod(lay.space[a] for a in lay.rowaxes)
    level, full, rows = _levels(lay)

    def closure(targets: list[int]) -> list[int]:
        need, stack = set(), list(targets)
        while stack:
            j = stack.pop()
            if j in full and j not in need:
                need.add(j)
                stack.extend(r for s, r in nodes[j][4] if s == "n")
        return sorted(need)

    def loop(js: list[int], tail: list[str]) -> list[str]:
        out = [f"        for (long long r_ = threadIdx.x; r_ < {nred}LL; r_ += blockDim.x) {{"]
        out += _decompose("r_", lay.axes, lay.space, "            ")
        out += [_node_line(lay, j, "            ") for j in closure(js)]
        return out + tail + ["        }"]

    lines = [f"    __shared__ __align__(8) unsigned char rx_sh[{BLOCK} * 8];",
             f"    for (long long row = blockIdx.x; row < {nrows}LL; row += gridDim.x) {{"]
    lines += _decompose("row", lay.rowaxes, lay.space, "        ")
    lines += [f"        const long long c{a} = 0;" for a in lay.axes if lay.space[a] == 1]
    lines += [_node_line(lay, j, "        ") for j in rows if level[j] == 0]
    for lv in range(1, max(level, default=0) + 1):
        reds = [j for j in range(len(nodes)) if nodes[j][0] in _REDUCE and level[j] == lv]
        if not reds:
            continue
        for j in reds:
            lines.append(f"        {ctype(nodes[j][3])} a{j} = {_identity(nodes[j][0], np.dtype(nodes[j][3]))};")
        srcs = [nodes[j][4][0] for j in reds]
        tail = []
        for j, (s, r) in zip(reds, srcs, strict=True):
            t = ctype(nodes[j][3])
            value = f"({t})({_operand(lay, j, 0)})" if s == "i" else f"({t})(v{r})"
            tail.append(f"            a{j} = {_combine(nodes[j][0], f'a{j}', value)};")
        lines += loop([r for s, r in srcs if s == "n"], tail)
        for j in reds:
            t, op = ctype(nodes[j][3]), nodes[j][0]
            lines += [f"        {{ {t}* sh = reinterpret_cast<{t}*>(rx_sh); sh[threadIdx.x] = a{j}; __syncthreads();",
                      "          for (int s = blockDim.x / 2; s > 0; s >>= 1) {",
                      f"              if (threadIdx.x < s) sh[threadIdx.x] = "
                      f"{_combine(op, 'sh[threadIdx.x]', 'sh[threadIdx.x + s]')};",
                      "              __syncthreads(); }",
                      f"          a{j} = sh[0]; __syncthreads(); }}"]
            value = f"a{j} / ({t}){nred}" if op == "mean" else f"a{j}"
            lines.append(f"        const {t} v{j} = ({t})({value});")
        lines += [_node_line(lay, j, "        ") for j in rows if level[j] == lv]
    row_index = _row_index(lay)
    writes_full = [(k, j) for k, j in enumerate(lay.outputs) if j in full]
    if writes_full:
        space_index = " + ".join(f"c{a} * {s}LL" for a, s in zip(lay.full, _strides(lay.space), strict=True))
        stores = [f"            out{k}[{space_index}] = v{j};" for k, j in writes_full]
        lines += loop([j for _, j in writes_full], stores)
    for k, j in enumerate(lay.outputs):
        if j not in full:
            lines.append(f"        if (threadIdx.x == 0) out{k}[{row_index}] = v{j};")
    return lines + ["    }"]


def launch_shape(ir: tuple) -> tuple[int, int]:
    """(blocks, threads per block) for ``ir``; 0 blocks when there is nothing to do."""
    shape = _planned(ir)[1]
    return shape.blocks, shape.threads


# -- the factory -----------------------------------------------------------------------------------------------
class KernelFactory:
    """Compiled kernels by structural IR: ``get(ir)`` makes each kernel once, then returns the same
    :class:`GroupKernel`.

    A miss first asks ``_ptx.emit`` for PTX written straight from the IR (under a millisecond; the driver
    JITs it when the kernel is loaded); where the PTX emitter does not cover the group (``Unsupported``) the
    C++ of :func:`generate` is compiled through rxcuda's NVRTC path and its cache. ``ptx_misses`` and
    ``nvrtc_misses`` count which way each miss went. ``ptx``: True (PTX where covered), False (always NVRTC,
    to compare the two), or the kinds (``("elementwise",)``) that may use PTX.

    >>> ir = (("elementwise", (4,), None, (("array", (4,), "<f4", (1,)), ("scalar", "<f4")),
    ...        (("mul", (), (4,), "<f4", (("i", 0), ("i", 1))),), (0,)))
    >>> factory = KernelFactory()
    >>> kernel = factory.get(ir)
    >>> kernel.code.cached, factory.ptx_misses, factory.nvrtc_misses, factory.get(ir) is kernel
    ('ptx', 1, 0, True)
    """

    def __init__(self, ptx: bool | tuple[str, ...] = True):
        self._kernels: dict[tuple, GroupKernel] = {}
        self.ptx = ptx
        self.hits = 0
        self.misses = 0
        self.ptx_misses = 0
        self.nvrtc_misses = 0

    def __len__(self) -> int:
        return len(self._kernels)

    def __contains__(self, ir: tuple) -> bool:
        return ir in self._kernels

    def get(self, ir: tuple) -> GroupKernel:
        kernel = self._kernels.get(ir)
        if kernel is not None:
            self.hits += 1
            return kernel
        self.misses += 1
        if self.ptx is True or (self.ptx and ir[0] in self.ptx):
            from ._ptx import PtxCode, emit

            try:
                text = emit(ir)
            except Unsupported:
                pass
            else:
                self.ptx_misses += 1
                kernel = self._kernels[ir] = GroupKernel(ir, text, PtxCode(ENTRY, text.encode() + b"\0"))
                return kernel
        from ..sources._nvrtc import compile_cuda

        source = generate(ir)
        kernel = GroupKernel(ir, source, compile_cuda(source, entry=ENTRY, name=f"{ENTRY}.cu"))
        self.nvrtc_misses += 1
        self._kernels[ir] = kernel
        return kernel


class GroupKernel:
    """One generated kernel: its IR, source (PTX text or CUDA C++), compiled code (``code.image`` and
    ``code.entry`` to load), and (once loaded on a device) its function."""

    __slots__ = ("ir", "source", "code", "function", "module")

    def __init__(self, ir: tuple, source: str, code):
        self.ir, self.source, self.code = ir, source, code
        self.function = self.module = None
