"""How a generated kernel maps onto the GPU, for both generators: the process's :class:`Tuning`, and per IR one
plan (:func:`_planned`: the layout, the launch shape, and for a register-resident reduce the :class:`RowPlan`).
:func:`launch_shape` is the only launch contract: the CUDA C++ of ``_codegen`` is written for it, the PTX of
``_ptx`` is right for any shape and tuned for it, and the backend launches exactly it.

>>> ir = (("elementwise", (4,), None, (("array", (4,), "<f4", (1,)), ("scalar", "<f4")),
...        (("mul", (), (4,), "<f4", (("i", 0), ("i", 1))),), (0,)))
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
from ._ir import Layout, ctype, levels

BLOCK = 256
_MAX_GRID = 1 << 20
_INT32 = 2**31 - 1
#: register-resident rows: at most ``_MAX_THREADS`` threads per row (with ``Tuning.row_elems`` elements a thread,
#: rows of up to 16384 4-byte / 8192 8-byte elements are read once)
_MAX_THREADS = 1024
#: rows of at most this many chunks are handled by 1..32 lanes of a warp (several rows per block)
_SHORT_ROW = 128
#: register-resident rows hold at most this many 4-byte elements a thread (half of 8 bytes)
_ELEMS_PER_THREAD = 16
#: short rows shrink the block (down to one warp) until the grid has this many blocks (2 per SM of an H100)
_MIN_BLOCKS = 264


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
_MATH = ("exp", "log", "sqrt", "sin", "cos", "tanh")


def _pow2ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _axis_strides(lay: Layout, k: int, at: tuple) -> dict[int, int]:
    """The element stride of input ``k`` along each space axis it is read at (at ``at``); axes of length 1
    and stride 0 (broadcast) are left out, so an axis missing from the map does not move the address."""
    return {a: s for a, s in zip(at, lay.inputs[k][3], strict=True) if a is not None and lay.space[a] != 1 and s}


def _index_type(lay: Layout, bound: int) -> str:
    """``int`` where every index the kernel forms (up to ``bound``, and every input offset) fits in 31 bits."""
    extent = max((sum((d - 1) * abs(s) for d, s in zip(i[1], i[3], strict=True)) for i in lay.inputs
                  if i[0] == "array"), default=0)
    return "int" if max(bound, extent) <= _INT32 else "long long"


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
def _planned(ir: tuple) -> tuple[Layout, _Shape, RowPlan | None]:
    """The layout, launch shape and (for register-resident rows) row plan of ``ir``: computed once per IR,
    so :func:`launch_shape` and :func:`generate` agree and a launch does not re-plan."""
    lay, tuning = Layout(ir), TUNING
    size = math.prod(lay.space)
    if lay.kind != "reduce" and _heavy(lay):
        # libdevice's sin/cos/pow (and float64 exp/log/tanh) are long: unrolled and vectorized they make NVRTC
        # take ~0.5 s per kernel, and such a kernel is compute-bound anyway: one element a thread, no vectors.
        # So is a body of many float32 math ops: the 100-op chain of bench/tensor.py (67 exp/log/sqrt/div) took
        # 710 us with 4 vectors a thread and 534 us with one element a thread (H200, 2^24 float32)
        tuning = dataclasses.replace(tuning, ew_unroll=1, ew_vector=False)
    if lay.kind != "reduce":
        vec = _ew_vector(lay, tuning)[1]
        threads = tuning.ew_threads
        per_block = threads * tuning.ew_unroll * vec
        blocks = min(-(-size // per_block), tuning.ew_max_blocks or _MAX_GRID, _MAX_GRID)
        idx = _index_type(lay, size + (blocks + 1) * per_block)
        return lay, _Shape("elementwise", threads, blocks, vec=vec, idx=idx, tuning=tuning), None
    rows = RowPlan(lay, tuning)
    if rows.shape is not None:
        return lay, rows.shape, rows
    nrows = math.prod(lay.space[a] for a in lay.rowaxes)
    return lay, _Shape("loop", BLOCK, min(nrows, _MAX_GRID), tuning=tuning), None


_HEAVY = frozenset({"sin", "cos", "pow"})


_COMPUTE_BOUND = 8  # float32 math functions and divisions from which an elementwise body is compute-bound


def _heavy(lay: Layout) -> bool:
    """Whether ``lay`` calls a long libdevice function, or enough float32 math (``exp``, ``log``, ``sqrt``...
    and divisions: ~10-27 instructions each) to be compute-bound on any GPU (see :func:`_planned`)."""
    math_ops = 0
    for op, _, _, dt, _ in lay.nodes:
        if op in _HEAVY or (op in _MATH and dt[-1] == "8"):
            return True
        math_ops += op in _MATH or op == "div"
    return math_ops >= _COMPUTE_BOUND


def _ew_vector(lay: Layout, tuning: Tuning) -> tuple[list[tuple], int]:
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


class RowPlan:
    """The plan of the register-resident row kernel for a reduce IR (``_codegen`` writes its body; ``shape``
    None where the row is too long for it).

    Each row of the non-reduced axes is handled by a group of ``G`` lanes: a whole block (64..1024 threads)
    for long rows, or 1..32 lanes of a warp for short ones (several rows per block). The row is cut into
    chunks of ``V`` consecutive elements (``V`` = 16 bytes when the row is contiguous in every operand, read
    as float4/double2 after a run-time alignment check; else 1); lane ``l`` holds chunks ``k*G + l`` for
    ``k < PER`` in registers. Every input element is loaded once, every reduction is a per-lane fold then
    ``__shfl_xor_sync`` across the group (and a shared slot per warp across a block), and every per-element
    output is stored once."""

    def __init__(self, lay: Layout, tuning: Tuning):
        sp = lay.space
        self.lay, self.tuning = lay, tuning
        self.red = [a for a in sorted(lay.axes) if sp[a] != 1]
        self.rowax = [a for a in lay.rowaxes if sp[a] != 1]
        self.nred = math.prod(sp[a] for a in self.red)
        self.nrows = math.prod(sp[a] for a in self.rowax)
        self.level, self.full, self.rows = levels(lay)
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


def launch_shape(ir: tuple) -> tuple[int, int]:
    """(blocks, threads per block) for ``ir``; 0 blocks when there is nothing to do."""
    shape = _planned(ir)[1]
    return shape.blocks, shape.threads
