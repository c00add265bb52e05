"""CUDA C++ for a planned group: one kernel per fused group, generated from the group's ops (no GPU needed).

A group is first described by its structural IR (:func:`group_ir`): its kind, iteration space and reduced
axes, its inputs (a scalar fill, or an array with its shape, dtype and element strides), its nodes (op,
attributes, shape, dtype, and where each input comes from) and which nodes it writes. The IR is pure hashable
data, so the :class:`~._factory.KernelFactory` keys compiled kernels on it: the same structure again is a dict hit.

Three kernel shapes come out of :func:`generate`; :func:`launch_shape` gives each its grid and block (the
only launch contract: callers launch exactly that), and both come from one plan per IR (:func:`_planned`):

- **elementwise**: blocks of 256 threads, each thread doing 4 units 256 apart (coalesced) per grid-stride
  step, with no bounds checks on whole tiles. A unit is a 16-byte vector (float4, double2...: the operands
  read at the linear index and the per-element outputs loaded and stored whole, behind a run-time check that
  their pointers are 16-byte aligned, with a scalar tail) or, where the check fails or the item sizes differ,
  one element. An input laid out like the space is read as ``in[i]``; the linear index is decomposed into
  coordinates only where an operand is strided or broadcast, or a per-row value (reduced axes kept at 1, or
  dropped) is written once per row;
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

These numbers are the defaults of :class:`Tuning` (threads, units and vectors, elements a thread holds, rows a
block, occupancy, cache hints); ``bench/kernel_sweep.py`` times the alternatives on a GPU.

Math stays precise (``expf``, ``logf``, ``sqrtf``, IEEE division; no fast-math), and f32 kernels stay in f32:
literals are cast to the kernel's type and float functions take their ``f`` names.

A group the generator cannot express (a dtype without a CUDA C type, an operand read at coordinates other than
the ones it is evaluated at) gives ``None``; the backend then runs that group op by op.

>>> import numpy as np
>>> ir = (("elementwise", (4,), None, (("array", (4,), "<f4", (1,)), ("scalar", "<f4")),
...        (("mul", (), (4,), "<f4", (("i", 0), ("i", 1))),), (0,)))
>>> "v0 = (float)(((float)(__ldcs(in0 + (i))) * (float)(s1)))" in generate(ir)  # a streaming load (TUNING)
True
>>> launch_shape(ir)
(1, 256)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from ..model._shapes import c_strides
from ._graph import Node

BLOCK = 256
ENTRY = "rx_group"
_MAX_GRID = 1 << 20
_INT32 = 2**31 - 1
_REDUCE = ("sum", "max", "min", "mean")
#: register-resident rows: at most ``_MAX_THREADS`` threads per row (with ``Tuning.row_elems`` elements a thread,
#: rows of up to 16384 4-byte / 8192 8-byte elements are read once)
_MAX_THREADS = 1024
#: rows of at most this many chunks are handled by 1..32 lanes of a warp (several rows per block)
_SHORT_ROW = 128
#: register-resident rows hold at most this many 4-byte elements a thread (half of 8 bytes)
_ELEMS_PER_THREAD = 16
#: short rows shrink the block (down to one warp) until the grid has this many blocks (2 per SM of an H100)
_MIN_BLOCKS = 264
_HINTS = {"plain": None, "ldg": "__ldg", "ldcs": "__ldcs", "stcs": "__stcs"}


@dataclass(frozen=True)
class Tuning:
    """The generator's knobs (one process-wide instance, :data:`TUNING`; change it with :func:`set_tuning`).

    - ``ew_threads``, ``ew_unroll``: elementwise threads per block and, per thread and grid-stride step, that many
      16-byte vectors (vector path) or elements (scalar path), ``ew_threads`` apart (coalesced);
    - ``ew_vector``: 16-byte loads and stores (float4, double2...) where every array operand the kernel reads at
      the linear index and every per-element output have one item size of 4 or 8 bytes, behind a run-time check
      that those pointers are 16-byte aligned (else the scalar path; a scalar tail for sizes not a multiple of
      the vector);
    - ``ew_max_blocks``: 0 for one tile per block (up to 2^20 blocks), else at most this many blocks, each
      looping over tiles;
    - ``row_elems``: register rows: elements of 4 bytes a thread holds at most (half of 8 bytes), so a row of
      ``n`` elements gets ``n / row_elems`` threads (a power of two, ``row_min_threads``..1024); rows longer than
      ``row_elems * 1024`` use strided loops;
    - ``row_block_threads``: block-wide rows (more than 32 lanes) share a block until it has this many threads
      (0: a block per row);
    - ``row_occupancy``: threads per SM that register-row kernels ask ``__launch_bounds__`` to fit (its min
      blocks = this / threads; 0: none);
    - ``late_loads``: a row input first needed after a reduction (layernorm's gamma and beta) is loaded there,
      not held in registers across it;
    - ``loads``: ``plain``, ``ldg`` (``__ldg``: the read-only path) or ``ldcs`` (``__ldcs``: evict first) for the
      elementwise and register-row kernels' array loads; ``stores``: ``plain`` or ``stcs`` (``__stcs``).

    The kernel factory keys on the IR only: a tuning holds for kernels made after it is set (the sweep clears the
    factory); each source names its tuning in a comment, so NVRTC's cache keys on it."""

    ew_threads: int = 256
    ew_unroll: int = 4
    ew_vector: bool = True
    ew_max_blocks: int = 0
    row_elems: int = 16
    row_min_threads: int = 64
    row_block_threads: int = 0
    row_occupancy: int = 0
    late_loads: bool = False
    loads: str = "plain"
    stores: str = "plain"

    def __post_init__(self):
        if self.ew_threads not in (32, 64, 128, 256, 512, 1024) or self.ew_unroll < 1:
            raise ValueError(f"ew_threads must be a power of two in 32..1024 and ew_unroll >= 1: {self}")
        if self.row_elems not in (1, 2, 4, 8, 16, 32, 64) or self.row_min_threads not in (32, 64, 128, 256, 512,
                                                                                           1024):
            raise ValueError(f"row_elems must be a power of two up to 64, row_min_threads 32..1024: {self}")
        if self.loads not in ("plain", "ldg", "ldcs") or self.stores not in ("plain", "stcs"):
            raise ValueError(f"loads is plain, ldg or ldcs; stores plain or stcs: {self}")

    def changes(self) -> str:
        """The fields that differ from the defaults, as ``name=value`` pairs (``default`` where none do)."""
        base = Tuning()
        return ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__dataclass_fields__
                         if getattr(self, f) != getattr(base, f)) or "default"


#: the tuning :func:`generate` and :func:`launch_shape` read (the lead sets the default here, in ``Tuning``)
TUNING = Tuning(loads="ldcs", stores="stcs")  # the best of bench/kernel_sweep.py on an H100 (98 % of a copy)


def set_tuning(tuning: Tuning | None = None, **fields) -> Tuning:
    """Make ``tuning`` (or :data:`TUNING` with ``fields`` replaced) the process's tuning and return the previous
    one. Kernels already in a factory stay as they were made: clear it (and the programs holding them) first."""
    global TUNING
    previous = TUNING
    TUNING = dataclasses.replace(tuning or TUNING, **fields)
    _planned.cache_clear()
    return previous


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
    per row (``group``), chunks per lane (``per``) and elements per chunk (``vec``; for ``elementwise`` the
    elements per 16-byte vector of the vector path, 1 for none); the index type; the tuning it was planned with."""

    mode: str
    threads: int
    blocks: int
    group: int = 0
    per: int = 0
    vec: int = 1
    idx: str = "long long"
    tuning: Tuning = Tuning()


@functools.lru_cache(maxsize=4096)
def _planned(ir: tuple) -> tuple[_Layout, _Shape, _Rows | None]:
    """The layout, launch shape and (for register-resident rows) row plan of ``ir``: computed once per IR,
    so :func:`launch_shape` and :func:`generate` agree and a launch does not re-plan."""
    lay, tuning = _Layout(ir), TUNING
    size = math.prod(lay.space)
    if lay.kind != "reduce" and _heavy(lay):
        # libdevice's sin/cos/pow (and float64 exp/log/tanh) are long: unrolled and vectorized they make NVRTC
        # take ~0.5 s per kernel, and such a kernel is compute-bound anyway: one element a thread, no vectors
        tuning = dataclasses.replace(tuning, ew_unroll=1, ew_vector=False)
    if lay.kind != "reduce":
        vec = _ew_vector(lay, tuning)[1]
        threads = tuning.ew_threads
        per_block = threads * tuning.ew_unroll * vec
        blocks = min(-(-size // per_block), tuning.ew_max_blocks or _MAX_GRID, _MAX_GRID)
        idx = _index_type(lay, size + (blocks + 1) * per_block)
        return lay, _Shape("elementwise", threads, blocks, vec=vec, idx=idx, tuning=tuning), None
    rows = _Rows(lay, tuning)
    if rows.shape is not None:
        return lay, rows.shape, rows
    nrows = math.prod(lay.space[a] for a in lay.rowaxes)
    return lay, _Shape("loop", BLOCK, min(nrows, _MAX_GRID), tuning=tuning), None


_HEAVY = frozenset({"sin", "cos", "pow"})


def _heavy(lay: _Layout) -> bool:
    """Whether ``lay`` calls a long libdevice function (see :func:`_planned`)."""
    return any(op in _HEAVY or (op in _MATH and dt[-1] == "8") for op, _, _, dt, _ in lay.nodes)


def _ew_vector(lay: _Layout, tuning: Tuning) -> tuple[list[tuple], int]:
    """The elementwise vector path: the (input, coordinates) reads at the linear index that it loads as 16-byte
    vectors (with the per-element outputs it stores so), and the elements per vector; ([], 1) where the tuning
    or the operands' item sizes (one size of 4 or 8 bytes for all of them) rule it out."""
    dense = {a: s for a, s in enumerate(c_strides(lay.space)) if lay.space[a] != 1}
    keys = list(dict.fromkeys((r, lay.reads[j][k]) for j, node in enumerate(lay.nodes)
                              for k, (s, r) in enumerate(node[4]) if s == "i" and lay.inputs[r][0] == "array"))
    keys = [key for key in keys if _axis_strides(lay, *key) == dense]
    sizes = {np.dtype(lay.inputs[r][2]).itemsize for r, _ in keys}
    sizes |= {np.dtype(lay.nodes[j][3]).itemsize for j in lay.outputs if lay.is_full(j)}
    size = math.prod(lay.space)
    if not tuning.ew_vector or len(sizes) != 1 or (item := sizes.pop()) not in (4, 8) or size < 32 // item:
        return [], 1  # no operand to vectorize, mixed or narrow item sizes, or fewer than two vectors
    types = {ctype(lay.inputs[r][2]) for r, _ in keys} | {ctype(lay.nodes[j][3]) for j in lay.outputs}
    if not all(t in _VECTOR for t in types):
        return [], 1
    return keys, 16 // item


def _vector_or_scalar(i1: str, i2: str, vector: list[str], scalar: list[str]) -> list[str]:
    """``vector`` lines where the row is 16-byte aligned (the kernel's run-time ``vec``), else ``scalar``."""
    return [f"{i1}if (vec) {{", *(i2 + x for x in vector), f"{i1}}} else {{", *(i2 + x for x in scalar), f"{i1}}}"]


class _Rows:
    """The register-resident row kernel for a reduce IR (``shape`` None where the row is too long for it).

    Each row of the non-reduced axes is handled by a group of ``G`` lanes: a whole block (64..1024 threads)
    for long rows, or 1..32 lanes of a warp for short ones (several rows per block). The row is cut into
    chunks of ``V`` consecutive elements (``V`` = 16 bytes when the row is contiguous in every operand, read
    as float4/double2 after a run-time alignment check; else 1); lane ``l`` holds chunks ``k*G + l`` for
    ``k < PER`` in registers. Every input element is loaded once, every reduction is a per-lane fold then
    ``__shfl_xor_sync`` across the group (and a shared slot per warp across a block), and every per-element
    output is stored once."""

    def __init__(self, lay: _Layout, tuning: Tuning):
        sp = lay.space
        self.lay, self.tuning = lay, tuning
        self.red = [a for a in sorted(lay.axes) if sp[a] != 1]
        self.rowax = [a for a in lay.rowaxes if sp[a] != 1]
        self.nred = math.prod(sp[a] for a in self.red)
        self.nrows = math.prod(sp[a] for a in self.rowax)
        self.level, self.full, self.rows = _levels(lay)
        self.rs = dict(zip(self.red, c_strides(tuple(sp[a] for a in self.red)), strict=True))
        self.rrs = dict(zip(self.rowax, c_strides(tuple(sp[a] for a in self.rowax)), strict=True))
        self.keys: dict[tuple, int] = {}  # (input, coordinates it is read at) -> q: one load per key
        for j, (_, _, _, _, refs) in enumerate(lay.nodes):
            for k, (s, r) in enumerate(refs):
                if s == "i" and lay.inputs[r][0] == "array":
                    self.keys.setdefault((r, lay.reads[j][k]), len(self.keys))
        self.st = {key: _axis_strides(lay, *key) for key in self.keys}
        self.full_read = {key for key in self.keys if any(a in self.st[key] for a in self.red)}
        space_strides = c_strides(sp)
        self.ost = {a: space_strides[a] for a in self.red + self.rowax}
        self.full_out = [(o, j) for o, j in enumerate(lay.outputs) if j in self.full]
        self.shape = self._plan()

    def contiguous(self, st: dict[int, int]) -> bool:
        """Whether element ``r`` of a row is at offset ``r`` from the row's start."""
        return all(st.get(a) == self.rs[a] for a in self.red)

    def _plan(self) -> _Shape | None:
        lay, nred, nrows, tn = self.lay, self.nred, self.nrows, self.tuning
        held = [np.dtype(lay.inputs[k][2]).itemsize for k, _ in self.full_read]
        held += [np.dtype(lay.nodes[j][3]).itemsize for j in self.full]
        wide = max(held, default=1) > 4
        most = _ELEMS_PER_THREAD // 2 if wide else _ELEMS_PER_THREAD  # what fits: rows up to most * 1024
        want = max(1, tn.row_elems // 2 if wide else tn.row_elems)  # what the tuning asks for
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
        else:  # a block's lanes per row, sized so each thread holds `want` elements (at most `most`)
            threads = group = min(_MAX_THREADS, max(tn.row_min_threads, _pow2ceil(-(-nred // want))))
            if tn.row_block_threads > group:  # several rows a block
                threads = min(_MAX_THREADS, _pow2ceil(tn.row_block_threads))
            while threads > group and -(-nrows // (threads // group)) < _MIN_BLOCKS:
                threads //= 2
        per = -(-chunks // group)
        rows_per_block = threads // group
        blocks = min(-(-nrows // rows_per_block), _MAX_GRID)
        idx = _index_type(lay, max(nrows * nred, nrows + (blocks + 1) * rows_per_block))
        return _Shape("rows", threads, blocks, group, per, vec, idx, tn)

    # -- code --------------------------------------------------------------------------------------------
    def body(self) -> list[str]:
        lay, sh, tn = self.lay, self.shape, self.tuning
        nodes, idx = lay.nodes, sh.idx
        G, V, E = sh.group, sh.vec, sh.per * sh.vec
        R = sh.threads // G
        sfx = "LL" if idx == "long long" else ""
        nred, nrows = self.nred, self.nrows
        exact = sh.per * G * V == nred  # every element slot of every lane is in the row: no masks
        reds = [j for j in range(len(nodes)) if nodes[j][0] in _REDUCE]
        q_of = self.keys
        lines = []
        if G > 32:  # a slot per warp of the block; a row's slots start at its first warp's
            for j in reds:
                lines.append(f"    __shared__ {ctype(nodes[j][3])} sh{j}[{sh.threads // 32}];")
        ptrs = [f"(unsigned long long)in{k}" for k, _ in self.vector_keys]
        ptrs += [f"(unsigned long long)out{o}" for o in dict.fromkeys(o for o, _ in self.vector_outs)]
        if V > 1:
            lines.append(f"    const bool vec = (({' | '.join(ptrs)}) & 15ULL) == 0ULL;  // 16-byte aligned")
        lane = "0" if G == 1 else "(int)threadIdx.x" if sh.threads == G else f"(int)(threadIdx.x & {G - 1}u)"
        lines.append(f"    const int lane = {lane};")
        if G > 32 and R > 1:
            lines.append(f"    const unsigned int w0 = (threadIdx.x / {G}u) * {G // 32}u;  // the row's first warp")
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
        loads: dict[int, list[str]] = {}  # level -> the loads of the inputs first needed at that level
        for key, q in q_of.items():
            k = key[0]
            t = ctype(lay.inputs[k][2])
            # the first level reading it (a reduction of level n reads its operand at level n - 1)
            first = min(self.level[j] - (node[0] in _REDUCE) for j, node in enumerate(nodes)
                        if any(s == "i" and (r, lay.reads[j][m]) == key for m, (s, r) in enumerate(node[4])))
            out = loads.setdefault(first if tn.late_loads else 0, [])
            if key not in self.full_read:
                load = _ld(None, t, f"in{k}", base_of(self.st[key]))
                out.append(f"{i1}const {t} l{q} = {f'valid ? {load} : ({t})0' if live else load};")
                continue
            out.append(f"{i1}const {idx} rb{q} = {base_of(self.st[key])};")
            out.append(f"{i1}{t} x{q}[{E}];")
            hint = tn if any(a in self.rrs for a in self.st[key]) else None  # a weight shared by rows: plain
            scalar = ["#pragma unroll", f"for (int e = 0; e < {E}; ++e) {{",
                      f"    const int r = {slot};",
                      f"    x{q}[e] = {guarded_load(_ld(hint, t, f'in{k}', f'rb{q} + {offset(self.st[key])}'), t)};",
                      "}"]
            if key in self.vector_keys:
                vt = _VECTOR[t]
                fill = " ".join(f"x{q}[k * {V} + {f}] = v_.{_FIELDS[f]};" for f in range(V))
                zero = " ".join(f"x{q}[k * {V} + {f}] = ({t})0;" for f in range(V))
                vector = ["#pragma unroll", f"for (int k = 0; k < {sh.per}; ++k) {{",
                          f"    const int c = k * {G} + lane;",
                          f"    if ({when(live, in_chunks)}) {{ const {vt} v_ = "
                          f"{_ld(hint, vt, f'reinterpret_cast<const {vt}*>(in{k} + rb{q})', 'c')}; {fill} }}",
                          f"    else {{ {zero} }}", "}"]
                out += _vector_or_scalar(i1, i2, vector, scalar)
            else:
                out += [i1 + x for x in scalar]

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
            out = list(loads.get(lv, []))
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
                    at = "" if R == 1 else "w0 + "
                    fold = _combine(op, f"a{j}", f"sh{j}[{at}w]")
                    lines += [f"{i1}a{j} = sh{j}[{at}0];", f"{i1}#pragma unroll",
                              f"{i1}for (int w = 1; w < {G // 32}; ++w) a{j} = {fold};"]
                if nrows > sh.blocks * R:  # a block does another row: its slots are written again
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
                      f"    {guard_if(live, in_row)}{_st(tn, t, f'out{o}', f'ob + {offset(self.ost)}', f'v{j}[e]')};",
                      "}"]
            if (o, j) in self.vector_outs:
                vt = _VECTOR[t]
                fill = " ".join(f"v_.{_FIELDS[f]} = v{j}[k * {V} + {f}];" for f in range(V))
                vector = ["#pragma unroll", f"for (int k = 0; k < {sh.per}; ++k) {{",
                          f"    const int c = k * {G} + lane;",
                          f"    if ({when(live, in_chunks)}) {{ {vt} v_; {fill} "
                          f"{_st(tn, vt, f'reinterpret_cast<{vt}*>(out{o} + ob)', 'c', 'v_')}; }}", "}"]
                lines += _vector_or_scalar(i1, i2, vector, scalar)
            else:
                lines += [i1 + x for x in scalar]
        for o, j in enumerate(lay.outputs):
            if j not in self.full:
                lines.append(f"{i1}if ({when('lane == 0' if G > 1 else '', live)}) out{o}[row] = v{j};")
        return lines + ["    }"]


def _ld(tuning: Tuning | None, t: str, pointer: str, index: str) -> str:
    """``pointer[index]`` (a ``t``), loaded with the tuning's cache hint (none for bool: no intrinsic takes one;
    none without a tuning: operands read by many threads, such as broadcast weights, keep the default caching)."""
    hint = _HINTS[tuning.loads] if tuning else None
    return f"{hint}({pointer} + ({index}))" if hint and t != "bool" else f"{pointer}[{index}]"


def _st(tuning: Tuning, t: str, pointer: str, index: str, value: str) -> str:
    """``pointer[index] = value`` (a ``t``), stored with the tuning's cache hint."""
    hint = _HINTS[tuning.stores]
    return f"{hint}({pointer} + ({index}), {value})" if hint and t != "bool" else f"{pointer}[{index}] = {value}"


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
    bounds = f"{shape.threads}"
    if shape.mode == "rows" and shape.tuning.row_occupancy >= 2 * shape.threads:
        bounds += f", {shape.tuning.row_occupancy // shape.threads}"
    return (_PRELUDE + f"// tuning: {shape.tuning.changes()}\n"
            + f'\nextern "C" __global__ void __launch_bounds__({bounds}) {ENTRY}('
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
    terms = [f"c{a} * {s}{sfx}" for a, s in zip(lay.rowaxes, c_strides(rowspace), strict=True)]
    return " + ".join(terms) or "0"


def _elementwise_body(lay: _Layout, shape: _Shape) -> list[str]:
    """Grid-stride tiles of ``threads * ew_unroll`` units per block and step: each thread does ``ew_unroll`` units
    ``threads`` apart (coalesced), without bounds checks on whole tiles. A unit is an element, or (the vector
    path, ``shape.vec`` > 1, taken where a run-time check finds its pointers 16-byte aligned) a 16-byte vector of
    ``vec`` elements: a whole tile loads all its vectors first, computes element by element, then stores vectors;
    the last ``size % vec`` elements are a scalar tail. An input laid out like the space is read at the linear
    index (or from its vector); coordinates are formed only where an operand is strided or broadcast, or a
    per-row value is written."""
    size, idx, tn = math.prod(lay.space), shape.idx, shape.tuning
    sfx = "LL" if idx == "long long" else ""
    T, U, V = shape.threads, tn.ew_unroll, shape.vec
    dense = {a: s for a, s in enumerate(c_strides(lay.space)) if lay.space[a] != 1}
    reduced = [a for a in lay.axes if lay.space[a] != 1]

    def key(j: int, k: int) -> tuple | None:
        """(input, coordinates) of operand ``k`` of node ``j`` where it is an array read at the linear index."""
        s, r = lay.nodes[j][4][k]
        if s != "i" or lay.inputs[r][0] != "array" or _axis_strides(lay, r, lay.reads[j][k]) != dense:
            return None
        return r, lay.reads[j][k]

    arrays = [(j, k) for j, node in enumerate(lay.nodes) for k, (s, r) in enumerate(node[4])
              if s == "i" and lay.inputs[r][0] == "array"]
    coords = any(not lay.is_full(j) for j in lay.outputs) or any(key(j, k) is None for j, k in arrays)
    first = " && ".join(f"c{a} == 0" for a in reduced) or "true"

    def work(read, write) -> list[str]:
        """One element's lines at the linear index ``i``: ``read(j, k)`` is a dense operand's expression,
        ``write(k, j)`` the store of a per-element output."""
        out = [x.strip() for x in _decompose("i", lay.full, lay.space, "", idx)] if coords else []
        for j in range(len(lay.nodes)):
            out.append(_node_line(lay, j, "", lambda k, j=j: read(j, k) if key(j, k) else _operand(lay, j, k)))
        for k, j in enumerate(lay.outputs):
            out.append(write(k, j) if lay.is_full(j) else f"if ({first}) out{k}[{_row_index(lay, sfx)}] = v{j};")
        return out

    def tiles(n: int, unit: int, whole, checked) -> list[str]:
        """The grid-stride loop over ``n`` units in tiles of ``T * U``: ``whole(indent)`` for a whole tile,
        ``checked(indent)`` for the last, partial one."""
        out = [f"    for ({idx} b = ({idx})blockIdx.x * {T * U}; b < {n}{sfx}; b += ({idx})gridDim.x * {T * U}) {{"]
        if n < T * U:
            out += checked("        ")
        elif n % (T * U):
            out.append(f"        if (b + {T * U} <= {n}{sfx}) {{")
            out += whole("            ")
            out.append("        } else {")
            out += checked("            ")
            out.append("        }")
        else:
            out += whole("        ")
        return out + ["    }"]

    def unrolled(indent: str, var: str, body: list[str], check: str = "", unroll: str = "#pragma unroll") -> list[str]:
        inner = indent + ("        " if check else "    ")
        out = [f"{indent}{unroll}", f"{indent}for (int u = 0; u < {U}; ++u) {{",
               f"{indent}    const {idx} {var} = b + u * {T} + ({idx})threadIdx.x;"]
        if check:
            out.append(f"{indent}    if ({check}) {{")
        out += [inner + x for x in body]
        if check:
            out.append(f"{indent}    }}")
        return out + [f"{indent}}}"]

    def out_type(j: int) -> str:
        return ctype(lay.nodes[j][3])

    scalar = work(lambda j, k: _ld(tn, ctype(lay.inputs[key(j, k)[0]][2]), f"in{key(j, k)[0]}", "i"),
                  lambda k, j: _st(tn, out_type(j), f"out{k}", "i", f"v{j}") + ";")
    scalar_loop = tiles(size, 1, lambda ind: unrolled(ind, "i", scalar),
                        lambda ind: unrolled(ind, "i", scalar, f"i < {size}{sfx}"))
    if V == 1:
        return scalar_loop

    vkeys = {kq: q for q, kq in enumerate(_ew_vector(lay, tn)[0])}
    vin = {q: _VECTOR[ctype(lay.inputs[kq[0]][2])] for kq, q in vkeys.items()}
    fulls = [(k, j) for k, j in enumerate(lay.outputs) if lay.is_full(j)]
    n = size // V  # whole vectors

    def vector(names: dict[int, str]) -> list[str]:
        """One vector at vector index ``c`` whose loaded inputs are ``names[q]``: element by element, then stored."""
        out = [f"{_VECTOR[out_type(j)]} o{k};" for k, j in fulls]
        for e in range(V):
            f = _FIELDS[e]
            out.append("{")
            if coords:
                out.append(f"    const {idx} i = c * {V} + {e};")
            out += ["    " + x for x in work(lambda j, k, f=f: f"{names[vkeys[key(j, k)]]}.{f}",
                                             lambda k, j, f=f: f"o{k}.{f} = v{j};")]
            out.append("}")
        for k, j in fulls:
            vt = _VECTOR[out_type(j)]
            out.append(_st(tn, vt, f"reinterpret_cast<{vt}*>(out{k})", "c", f"o{k}") + ";")
        return out

    def load(q: int, r: int) -> str:
        return _ld(tn, vin[q], f"reinterpret_cast<const {vin[q]}*>(in{r})", "c")

    def whole(indent: str) -> list[str]:
        out = [f"{indent}{vin[q]} w{q}[{U}];" for q in vin]
        if vkeys:
            out += unrolled(indent, "c", [f"w{q}[u] = {load(q, r)};" for (r, _), q in vkeys.items()])
        return out + unrolled(indent, "c", vector({q: f"w{q}[u]" for q in vin}))

    def checked(indent: str) -> list[str]:
        body = [f"const {vin[q]} w{q} = {load(q, r)};" for (r, _), q in vkeys.items()]
        return unrolled(indent, "c", body + vector({q: f"w{q}" for q in vin}), f"c < {n}{sfx}", "#pragma unroll 1")

    pointers = [f"(unsigned long long)in{r}" for r in dict.fromkeys(r for r, _ in vkeys)]
    pointers += [f"(unsigned long long)out{k}" for k, _ in fulls]
    lines = [f"    if ((({' | '.join(pointers)}) & 15ULL) == 0ULL) {{  // 16-byte aligned: vectors of {V}"]
    lines += ["    " + x for x in tiles(n, V, whole, checked)]
    if size % V:  # the last few elements, one a thread of the first block
        lines += [f"        if (blockIdx.x == 0u && threadIdx.x < {size % V}u) {{",
                  f"            const {idx} i = {n * V}{sfx} + ({idx})threadIdx.x;"]
        lines += ["            " + x for x in scalar]
        lines.append("        }")
    lines.append("    } else {")
    lines += ["    " + x for x in scalar_loop]
    return lines + ["    }"]


def _loop_body(lay: _Layout) -> list[str]:
    """Rows too long for registers: each reduction level is a strided loop over the reduced axes (the row is
    read again at each level, and once more to store per-element outputs) and a tree in shared memory."""
    nodes = lay.nodes
    nred = math.prod(lay.space[a] for a in lay.axes)
    nrows = math.prod(lay.space[a] for a in lay.rowaxes)
    level, full, rows = _levels(lay)

    def closure(targets: list[int]) -> list[int]:
        return element_closure(nodes, full, targets)

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
        space_index = " + ".join(f"c{a} * {s}LL" for a, s in zip(lay.full, c_strides(lay.space), strict=True))
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
