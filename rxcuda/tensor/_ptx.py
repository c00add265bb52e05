"""PTX for a fused group, emitted straight from its structural IR: a kernel factory miss without NVRTC.

Why: a factory miss through NVRTC pays its C++ front end and then ptxas inside it: ``compile_cuda`` of a
small group's C++ takes 45-135 ms on the 2-core build machine (~40 ms where the GPU facts were measured),
while writing the same kernel as PTX here takes 0.1-0.3 ms and assembling that PTX for sm_90 takes ptxas
5-11 ms of compile time (its ``-v`` report; 15-25 ms with the process start) - about what the driver's JIT
pays when ``cuModuleLoadData`` loads it. So :func:`emit` writes the kernel in PTX (``.target sm_70``, which
every newer GPU JITs) and :class:`~._factory.KernelFactory` tries it before NVRTC; what it does not cover
raises :class:`~._ir.Unsupported` and the factory compiles the C++ of ``_codegen.generate`` as before.
JIT time grows with the code, so the emitter keeps it small and straight: float32 division without
``div.rn.f32`` (whose slow-path subroutine alone costs ptxas 6-10 ms), fewer unrolled copies of heavy bodies,
no unrolling of short loops.

The kernels have the C++ kernels' signature (one parameter per IR input in order: a scalar by value, a bool
scalar as one unsigned byte, an array as a pointer; then one pointer per output, each output contiguous) and
the same semantics, and they are right for any grid and any block of up to 1024 threads (grid-stride loops,
``%ntid`` and ``%nctaid`` read at run time, ``.maxntid 1024``); the launch shape of ``_tuning.launch_shape``
only tunes them:

- **elementwise**: a grid-stride loop over tiles of ``ntid * U`` elements per block, a thread's U elements
  ``ntid`` apart, all their loads issued before any arithmetic; U is the launch shape's elements per thread
  (up to 4; 2 or 1 with heavy math). An operand laid out like the space is read at the linear index, others
  through the coordinates (32-bit where they fit); a per-row value is written where the reduced coordinates
  are 0;
- **reduce**: rows of the non-reduced axes, each either a whole block's (a grid-stride loop over rows) or,
  where the launch shape puts several rows in a block, a group of G = 1..32 lanes of a warp (G shrinks at
  run time to fit a block smaller than the launch shape's; lanes past the last whole group idle). Each reduction
  level is a strided loop over the reduced axes (the per-element values it needs recomputed from the inputs),
  then a fold: a ``shfl.sync.bfly`` butterfly within a lane group, or across a block ``shfl.sync.down`` within
  each warp (mask and clamp name only the lanes that exist), one shared slot per warp and warp 0's fold of
  those (two barriers); per-row values after the reductions they need, per-element outputs in a last loop.

Arithmetic is NumPy's: ``add.rn``/``mul.rn`` (never contracted into an FMA), IEEE division and ``sqrt.rn``,
NaN-propagating maximum/minimum, integer results wrapped to their width. float32 ``a / b`` is computed in
float64 and rounded once, which gives exactly ``div.rn.f32``'s result (:func:`divf`). ``exp``, ``log`` and
``tanh`` (float32) are the sequences of CUDA's own ``expf``, ``logf`` and ``tanhf`` (libdevice; exp is one
``ex2.approx`` of the fraction of x log2 e, reduced with log2 e in two parts, times 2**k: 2 ulp). Ops without a
PTX form here (``pow``, ``sin``, ``cos``, float64 ``exp``/``log``/``tanh``) raise Unsupported.

>>> ir = (("elementwise", (4,), None, (("array", (4,), "<f4", (1,)), ("scalar", "<f4")),
...        (("mul", (), (4,), "<f4", (("i", 0), ("i", 1))),), (0,)))
>>> text = emit(ir)
>>> ".visible .entry rx_group(" in text and "mul.rn.f32" in text
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..model._shapes import c_strides
from ._ir import ENTRY, Layout, Unsupported, element_closure
from ._ir import levels as node_levels
from ._ptxwriter import (
    _CLS,
    _DECL,
    _HEAVY,
    _ITEM,
    _RED_OPS,
    _REGION,
    _SLOT,
    _SUPPORTED,
    _UNROLL,
    MAX_THREADS,
    TARGET,
    VERSION,
    _Ctx,
    _Fn,
    _identity,
    _imm,
)
from ._tuning import launch_shape


@dataclass(frozen=True)
class PtxCode:
    """The loadable code of an emitted kernel, as the CUDA backend loads it: ``image`` (the PTX text,
    NUL-terminated, for ``cuModuleLoadData``, which JITs it) and ``entry``; ``cached`` says where it came from
    (``"ptx"``: emitted here, no NVRTC)."""

    entry: str
    image: bytes
    format: str = "ptx"
    cached: str = "ptx"


def _check_ops(lay: Layout) -> None:
    for op, _, _, dtype, _ in lay.nodes:
        if op not in _SUPPORTED:
            raise Unsupported(f"op {op} has no PTX form here")
        if op in ("exp", "log", "tanh") and dtype[1:] != "f4":
            raise Unsupported(f"{op} of {dtype} has no PTX form here")


def emit(ir: tuple, unroll: int = _UNROLL) -> str:
    """The PTX text of one kernel (entry ``rx_group``) for ``ir``; Unsupported where this emitter does not
    cover the group (the factory then compiles the C++ of ``_codegen.generate`` through NVRTC). ``unroll``:
    elementwise elements per thread and trip at most; 1 for a first tier that a tuned build replaces (each copy
    of the body costs the driver's JIT ~0.5 ms; an empty kernel alone ~6 ms on the H100)."""
    lay = Layout(ir)
    _check_ops(lay)
    fn = _Fn(ir, lay)
    fn.unroll = unroll
    params = fn.params()
    fn.special()
    if lay.kind == "reduce":
        _reduce(fn)
    else:
        _elementwise(fn)
    decls = [f"\t.reg {_DECL[c]} %{c}<{n + 1}>;" for c, n in fn.count.items() if n]
    if fn.shared:
        decls.append(f"\t.shared .align 8 .b8 rx_sh[{fn.shared}];")
    # .maxntid: ptxas keeps to 64 registers a thread, so any block of up to 1024 threads can launch it
    return "\n".join([f".version {VERSION}", f".target {TARGET}", ".address_size 64", "",
                      f".visible .entry {ENTRY}(", ",\n".join(params), f") .maxntid {MAX_THREADS}, 1, 1", "{",
                      *decls, *fn.lines, "\tret;", "}", ""])


def _full_terms(lay: Layout, key: str) -> list[tuple[int, int]]:
    """(axis, bytes) of a contiguous array of the whole space (an output written per element)."""
    item = _ITEM[key]
    return [(a, s * item) for a, s in enumerate(c_strides(lay.space)) if lay.space[a] != 1]


def _row_terms(lay: Layout, key: str) -> list[tuple[int, int]]:
    """(axis, bytes) of a contiguous array of the row axes (an output written once per row)."""
    item = _ITEM[key]
    rows = c_strides(tuple(lay.space[a] for a in lay.rowaxes))
    return [(a, s * item) for a, s in zip(lay.rowaxes, rows, strict=True) if lay.space[a] != 1]


def _reads(lay: Layout, js) -> list[tuple[int, tuple]]:
    """(input, coordinates) of every array read by the nodes ``js``."""
    out = []
    for j in js:
        for k, (s, r) in enumerate(lay.nodes[j][4]):
            if s == "i" and lay.inputs[r][0] == "array":
                out.append((r, lay.reads[j][k]))
    return out


def _elementwise(fn: _Fn) -> None:
    """A grid-stride loop over tiles of ``ntid * U`` elements per block: a thread's U elements are ``ntid``
    apart (coalesced), U from the launch shape's elements per thread (1..4; 2 with one or two heavy ops such as
    exp or a float32 division, 1 with more: each copy of the body costs JIT time); all U elements' loads are
    issued before any arithmetic, the later ones predicated on being inside the space."""
    lay = fn.lay
    size = math.prod(lay.space)
    blocks, threads = launch_shape(fn.ir)
    unroll = min(fn.unroll, max(1, -(-size // (blocks * threads)))) if blocks and threads else 1
    heavy = sum(op in _HEAVY or (op == "div" and dt[1:] == "f4") for op, _, _, dt, _ in lay.nodes)
    unroll = min(unroll, 4 if heavy == 0 else 2 if heavy <= 2 else 1)  # the JIT's time grows with the copies
    reduced = [a for a in lay.axes if lay.space[a] != 1]
    per_row = [(k, j) for k, j in enumerate(lay.outputs) if not lay.is_full(j)]
    reads = list(dict.fromkeys(_reads(lay, range(len(lay.nodes)))))
    probe = _Ctx(lay.space, lay.full)
    need: set[int] = set()
    for k, at in reads:
        need |= fn.needs(probe, fn.terms(k, at))
    if per_row:
        need |= set(reduced)
        for _, j in per_row:
            need |= fn.needs(probe, _row_terms(lay, fn.nodekeys[j]))
    start, step, t = fn.reg("rd"), fn.reg("rd"), fn.reg("rd")
    fn.op(f"mul.wide.u32 {start}, {fn.ctaid}, {fn.ntid}")
    if unroll > 1:
        fn.op(f"mul.lo.s64 {start}, {start}, {unroll}")
    fn.op(f"cvt.u64.u32 {t}, {fn.tid}")
    fn.op(f"add.s64 {start}, {start}, {t}")
    fn.op(f"mul.wide.u32 {step}, {fn.nctaid}, {fn.ntid}")
    if unroll > 1:
        fn.op(f"mul.lo.s64 {step}, {step}, {unroll}")
    apart = []
    for u in range(1, unroll):
        d = fn.reg("rd")
        fn.op(f"mul.wide.u32 {d}, {fn.ntid}, {u}")
        apart.append(d)
    i0 = fn.reg("rd")
    top, done = fn.loop_head(i0, start, size)
    elements = []
    for u in range(unroll):  # coordinates and loads of every element first
        ctx = _Ctx(lay.space, lay.full)
        inside = ""
        if u == 0:
            ctx.lin = i0
        else:
            ctx.lin, inside = fn.reg("rd"), fn.reg("p")
            fn.op(f"add.s64 {ctx.lin}, {i0}, {apart[u - 1]}")
            fn.op(f"setp.lt.u64 {inside}, {ctx.lin}, {size}")
        fn.scopes.append({})
        fn.guard = inside
        fn.decompose(ctx, need)
        for k, at in reads:
            fn.load(k, at, [ctx])
        fn.guard = ""
        elements.append((ctx, inside, fn.scopes.pop()))
    for ctx, inside, scope in elements:
        fn.scopes.append(scope)
        for j in range(len(lay.nodes)):
            fn.node(j, [ctx])
        first = inside
        if per_row:
            for a in reduced:  # a per-row value is written where the reduced coordinates are all 0
                p = fn.reg("p")
                ty = "u64" if ctx.wide else "u32"
                fn.op(f"setp.eq.and.{ty} {p}, {ctx.coords[a]}, 0, {first}" if first else
                      f"setp.eq.{ty} {p}, {ctx.coords[a]}, 0")
                first = p
        for k, j in enumerate(lay.outputs):
            key = fn.nodekeys[j]
            value = fn.find(("node", j))
            if lay.is_full(j):
                fn.store(key, fn.address(fn.outbase[k], [ctx], _full_terms(lay, key)), value, inside)
            else:
                fn.store(key, fn.address(fn.outbase[k], [ctx], _row_terms(lay, key)), value, first)
        fn.scopes.pop()
    fn.loop_tail(i0, step, size, top, done)


def _reduce(fn: _Fn) -> None:
    lay = fn.lay
    nodes = lay.nodes
    n = len(nodes)
    level, full, rows = node_levels(lay)  # Unsupported for a per-row value computed without a reduction
    levels = [[j for j in range(n) if nodes[j][0] in _RED_OPS and level[j] == lv]
              for lv in range(1, max(level, default=0) + 1)]
    fn.shared = max((len(r) for r in levels), default=0) * _REGION

    def closure(targets) -> list[int]:
        return element_closure(nodes, full, targets)

    nrows = math.prod(lay.space[a] for a in lay.rowaxes)
    nred = math.prod(lay.space[a] for a in lay.axes)
    rctx, ictx = _Ctx(lay.space, lay.rowaxes), _Ctx(lay.space, lay.axes)
    writes_full = [(k, j) for k, j in enumerate(lay.outputs) if j in full]
    loops = [closure([nodes[j][4][0][1] for j in reds if nodes[j][4][0][0] == "n"]) for reds in levels]
    store_loop = closure([j for _, j in writes_full])
    reads = _reads(lay, [j for js in loops for j in js] + store_loop + rows + [j for reds in levels for j in reds])
    need_row: set[int] = set()
    for k, at in reads:
        need_row |= fn.needs(rctx, fn.terms(k, at))
    for _, j in writes_full:
        need_row |= fn.needs(rctx, _full_terms(lay, fn.nodekeys[j]))
    for j in lay.outputs:
        if j not in full:
            need_row |= fn.needs(rctx, _row_terms(lay, fn.nodekeys[j]))

    # who does which row: a whole block per row, or (several rows per block in the launch shape) groups of
    # G lanes of a warp, G a power of two up to 32, decided here and correct for any block size at run time
    blocks, threads = launch_shape(fn.ir)
    group = 0
    if blocks and nrows > blocks and threads // -(-nrows // blocks) <= 32:
        group = 1 << max(0, (threads // -(-nrows // blocks)).bit_length() - 1)
    lead, row0, rstep, istart = fn.reg("p"), fn.reg("rd"), fn.reg("rd"), fn.reg("rd")
    if group:
        w = _group_values(fn, group)
        g, lane, per, t = fn.reg("r"), fn.reg("r"), fn.reg("r"), fn.reg("p")
        fn.op(f"shr.u32 {g}, {fn.tid}, {w['lg']}")
        fn.op(f"and.b32 {lane}, {fn.tid}, {w['gm1']}")
        fn.op(f"shr.u32 {per}, {fn.ntid}, {w['lg']}")  # whole groups in a block; lanes past them stay idle
        fn.op(f"setp.eq.u32 {lead}, {lane}, 0")
        fn.op(f"setp.lt.u32 {t}, {g}, {per}")
        c, gg = fn.reg("rd"), fn.reg("rd")
        fn.op(f"mul.wide.u32 {c}, {fn.ctaid}, {per}")
        fn.op(f"cvt.u64.u32 {gg}, {g}")
        fn.op(f"add.s64 {c}, {c}, {gg}")
        fn.op(f"selp.b64 {row0}, {c}, {nrows}, {t}")  # an idle lane starts past the last row
        fn.op(f"mul.wide.u32 {rstep}, {fn.nctaid}, {per}")
        fn.op(f"cvt.u64.u32 {istart}, {lane}")
        istep = fn.reg("rd")
        fn.op(f"cvt.u64.u32 {istep}, {w['size']}")
        fn.shared = 0
    else:
        fn.op(f"setp.eq.u32 {lead}, {fn.tid}, 0")
        w = _warp_values(fn)
        fn.op(f"cvt.u64.u32 {row0}, {fn.ctaid}")
        fn.op(f"cvt.u64.u32 {rstep}, {fn.nctaid}")
        fn.op(f"cvt.u64.u32 {istart}, {fn.tid}")
        istep = fn.reg("rd")
        fn.op(f"cvt.u64.u32 {istep}, {fn.ntid}")

    # for (row = row0; row < nrows; row += rstep)
    rctx.lin = fn.reg("rd")
    rtop, rdone = fn.loop_head(rctx.lin, row0, nrows)
    fn.scopes.append({})
    fn.decompose(rctx, need_row)
    for k, at in reads:  # each array read's address at the row's coordinates
        if (k, at) not in fn.rowbase:
            fn.rowbase[(k, at)] = fn.address(fn.base[k], [rctx], fn.terms(k, at))
    outrow = {k: fn.address(fn.outbase[k], [rctx], _full_terms(lay, fn.nodekeys[j])) for k, j in writes_full}

    def inner_loop(js: list[int], readers: list[int], stores: list[tuple[int, int]], body) -> None:
        """for (r = istart; r < nred; r += istep) { the nodes js at (row, r); body() }; ``readers``: other nodes
        whose inputs body reads, ``stores``: outputs body writes (their coordinates are computed too)."""
        ictx.lin = fn.reg("rd")
        top, done = fn.loop_head(ictx.lin, istart, nred, unroll=not group)
        fn.scopes.append({})
        need: set[int] = set()
        for k, at in _reads(lay, js + readers):
            need |= fn.needs(ictx, fn.terms(k, at))
        for _, j in stores:
            need |= fn.needs(ictx, _full_terms(lay, fn.nodekeys[j]))
        fn.decompose(ictx, need)
        for j in js:
            fn.node(j, [ictx])
        body()
        fn.scopes.pop()
        fn.loop_tail(ictx.lin, istep, nred, top, done)

    for j in rows:
        if level[j] == 0:
            fn.node(j, [])
    for lv, reds in enumerate(levels, start=1):
        if not reds:
            continue
        accs = {j: fn.mov(fn.nodekeys[j], _identity(nodes[j][0], fn.nodekeys[j])) for j in reds}

        def accumulate(reds=reds, accs=accs) -> None:
            for j in reds:
                s, r = nodes[j][4][0]
                if s == "n":
                    value, vkey = fn.find(("node", r)), fn.nodekeys[r]
                else:
                    value, vkey = fn.operand(j, 0, [ictx])
                key = fn.nodekeys[j]
                new = fn.combine(nodes[j][0], key, accs[j], fn.conv(value, vkey, key))
                fn.op(f"mov.{_DECL[_CLS[key]][1:]} {accs[j]}, {new}")

        inner_loop(loops[lv - 1], reds, [], accumulate)
        if group:
            _group_reduce(fn, reds, accs, group, w)
        else:
            _block_reduce(fn, reds, accs, w)
        for j in reds:
            key, v = fn.nodekeys[j], accs[j]
            if nodes[j][0] == "mean":  # the sum / n, IEEE division as the C++ a / (T)n
                v = fn.binary("div", key, v, fn.mov(key, nred))
            fn.scopes[-1][("node", j)] = v
        for j in rows:
            if level[j] == lv:
                fn.node(j, [])

    def store_full() -> None:
        for k, j in writes_full:
            key = fn.nodekeys[j]
            fn.store(key, fn.address(outrow[k], [ictx], _full_terms(lay, key)), fn.find(("node", j)))

    if writes_full:
        inner_loop(store_loop, [], writes_full, store_full)
    for k, j in enumerate(lay.outputs):
        if j not in full:
            key = fn.nodekeys[j]
            fn.store(key, fn.address(fn.outbase[k], [rctx], _row_terms(lay, key)), fn.find(("node", j)), lead)
    fn.scopes.pop()
    fn.rowbase = {}
    fn.loop_tail(rctx.lin, rstep, nrows, rtop, rdone)


def _warp_values(fn: _Fn) -> dict[str, str]:
    """Registers the block reduction uses: the shuffle mask and clamp of this thread's warp (its lanes that
    exist: min(32, ntid - warp * 32)), whether it is lane 0 / in warp 0 / a lane with a warp's value to read,
    and the shared addresses of its warp's slot and its lane's slot."""
    w = {k: fn.reg("r") for k in ("lane", "warp", "n", "mask", "clamp", "sh", "warp_slot", "lane_slot", "nw")}
    w.update({k: fn.reg("p") for k in ("lane0", "warp0", "has_warp")})
    fn.op(f"and.b32 {w['lane']}, {fn.tid}, 31")
    fn.op(f"shr.u32 {w['warp']}, {fn.tid}, 5")
    fn.op(f"sub.s32 {w['n']}, {fn.tid}, {w['lane']}")
    fn.op(f"sub.s32 {w['n']}, {fn.ntid}, {w['n']}")
    fn.op(f"min.u32 {w['n']}, {w['n']}, 32")
    fn.op(f"shl.b32 {w['mask']}, 1, {w['n']}")  # shifts of 32 give 0: the mask of all 32 lanes is then -1
    fn.op(f"sub.s32 {w['mask']}, {w['mask']}, 1")
    fn.op(f"sub.s32 {w['clamp']}, {w['n']}, 1")
    fn.op(f"setp.eq.u32 {w['lane0']}, {w['lane']}, 0")
    fn.op(f"setp.eq.u32 {w['warp0']}, {w['warp']}, 0")
    fn.op(f"add.s32 {w['nw']}, {fn.ntid}, 31")
    fn.op(f"shr.u32 {w['nw']}, {w['nw']}, 5")
    fn.op(f"setp.lt.u32 {w['has_warp']}, {w['lane']}, {w['nw']}")
    fn.op(f"mov.u32 {w['sh']}, rx_sh")
    fn.op(f"mad.lo.s32 {w['warp_slot']}, {w['warp']}, {_SLOT}, {w['sh']}")
    fn.op(f"mad.lo.s32 {w['lane_slot']}, {w['lane']}, {_SLOT}, {w['sh']}")
    return w


def _group_values(fn: _Fn, group: int) -> dict[str, str]:
    """Registers of the lane groups: their size G = min(``group``, the largest power of two <= ntid: a block
    smaller than the launch shape's still works), its log2 and G - 1, this thread's group's shuffle mask (its
    G lanes, aligned in the warp) and clamp, and per butterfly step (``group`` / 2 ... 1) whether it is < G."""
    w = {k: fn.reg("r") for k in ("lg", "size", "gm1", "mask", "clamp")}
    z, base, t = fn.reg("r"), fn.reg("r"), fn.reg("r")
    fn.op(f"clz.b32 {z}, {fn.ntid}")
    fn.op(f"sub.s32 {w['lg']}, 31, {z}")
    fn.op(f"min.u32 {w['lg']}, {w['lg']}, {group.bit_length() - 1}")
    fn.op(f"shl.b32 {w['size']}, 1, {w['lg']}")
    fn.op(f"sub.s32 {w['gm1']}, {w['size']}, 1")
    fn.op(f"and.b32 {t}, {fn.tid}, {w['gm1']}")
    fn.op(f"sub.s32 {base}, {fn.tid}, {t}")  # the group's first thread
    fn.op(f"and.b32 {base}, {base}, 31")  # ... as a lane of its warp
    fn.op(f"shl.b32 {w['mask']}, 1, {w['size']}")  # a shift by 32 gives 0: all 32 lanes' mask is then -1
    fn.op(f"sub.s32 {w['mask']}, {w['mask']}, 1")
    fn.op(f"shl.b32 {w['mask']}, {w['mask']}, {base}")
    fn.op(f"sub.s32 {t}, 32, {w['size']}")
    fn.op(f"shl.b32 {t}, {t}, 8")
    fn.op(f"or.b32 {w['clamp']}, {t}, 31")
    off = group // 2
    while off:
        p = fn.reg("p")
        fn.op(f"setp.lt.u32 {p}, {off}, {w['size']}")
        w[f"step{off}"] = p
        off //= 2
    return w


def _shuffle(fn: _Fn, mode: str, key: str, v: str, off: int, w: dict[str, str], pred: bool,
             guard: str = "") -> tuple[str, str]:
    """``shfl.sync.<mode>`` of a value of any class: (the value read, its in-range predicate or ''); under
    ``guard`` (a predicate the whole group agrees on) the shuffle may not happen, and the value read is then
    ``v`` itself."""
    cls = _CLS[key]
    p = fn.reg("p") if pred else ""
    dp = f"|{p}" if pred else ""
    tail = f"{off}, {w['clamp']}, {w['mask']}"
    at = f"@{guard} " if guard else ""
    if cls == "p":
        r, o, q = fn.reg("r"), fn.reg("r"), fn.reg("p")
        fn.op(f"selp.u32 {r}, 1, 0, {v}")
        if guard:
            fn.op(f"mov.u32 {o}, {r}")
        fn.op(f"{at}shfl.sync.{mode}.b32 {o}{dp}, {r}, {tail}")
        fn.op(f"setp.ne.u32 {q}, {o}, 0")
        return q, p
    if cls in ("rd", "fd"):
        lo, hi, lo2, hi2, o = fn.reg("r"), fn.reg("r"), fn.reg("r"), fn.reg("r"), fn.reg(cls)
        fn.op(f"mov.b64 {{{lo}, {hi}}}, {v}")
        if guard:
            fn.op(f"mov.b64 {{{lo2}, {hi2}}}, {v}")
        fn.op(f"{at}shfl.sync.{mode}.b32 {lo2}{dp}, {lo}, {tail}")
        fn.op(f"{at}shfl.sync.{mode}.b32 {hi2}, {hi}, {tail}")
        fn.op(f"mov.b64 {o}, {{{lo2}, {hi2}}}")
        return o, p
    o = fn.reg(cls)
    if guard:
        fn.op(f"mov.{_DECL[cls][1:]} {o}, {v}")
    fn.op(f"{at}shfl.sync.{mode}.b32 {o}{dp}, {v}, {tail}")
    return o, p


def _group_reduce(fn: _Fn, reds: list[int], accs: dict[int, str], group: int, w: dict[str, str]) -> None:
    """Each ``accs[j]`` folded over its group of lanes by a butterfly (every lane gets the result); the steps
    at offsets the run-time group size does not reach are skipped."""
    for j in reds:
        key, op = fn.nodekeys[j], fn.lay.nodes[j][0]
        cls = _CLS[key]
        v = accs[j]
        off = group // 2
        while off:
            step = w[f"step{off}"]
            o, _ = _shuffle(fn, "bfly", key, v, off, w, False, guard=step)
            v = fn.select(cls, step, fn.combine(op, key, v, o), v)
            off //= 2
        fn.op(f"mov.{_DECL[cls][1:]} {accs[j]}, {v}")


def _block_reduce(fn: _Fn, reds: list[int], accs: dict[int, str], w: dict[str, str]) -> None:
    """Each ``accs[j]`` folded over the block, the result in ``accs[j]`` of every thread.

    Each warp folds its lanes with ``shfl.sync.down`` (the mask and the clamp name only the lanes that exist,
    so a last, partial warp is folded right), lane 0 writes the warp's value to shared memory, warp 0 folds
    those the same way and lane 0 writes the result: two barriers, any block size up to MAX_THREADS."""
    nodes = fn.lay.nodes

    def warp_fold(j: int, v: str) -> str:
        key, op = fn.nodekeys[j], nodes[j][0]
        cls = _CLS[key]
        for off in (16, 8, 4, 2, 1):
            o, p = _shuffle(fn, "down", key, v, off, w, True)
            t = fn.reg(cls)
            if cls == "p":  # a lane past the clamp reads the identity
                fn.op(f"and.pred {t}, {o}, {p}" if op == "max" else f"or.pred {t}, {o}, !{p}")
            else:
                fn.op(f"selp.{_DECL[cls][1:]} {t}, {o}, {_imm(_identity(op, key), key)}, {p}")
            v = fn.combine(op, key, v, t)
        return v

    def st(key: str, addr: str, value: str, pred: str) -> None:
        if _CLS[key] == "p":
            r = fn.reg("r")
            fn.op(f"selp.u32 {r}, 1, 0, {value}")
            fn.op(f"@{pred} st.shared.u32 [{addr}], {r}")
        else:
            fn.op(f"@{pred} st.shared.{_DECL[_CLS[key]][1:]} [{addr}], {value}")

    def ld(j: int, addr: str, pred: str = "") -> str:
        """The value at ``addr`` (where ``pred`` holds; the identity of reduction ``j`` elsewhere)."""
        key = fn.nodekeys[j]
        cls = _CLS[key]
        guard = f"@{pred} " if pred else ""
        if cls == "p":
            r, d = fn.reg("r"), fn.reg("p")
            fn.op(f"mov.u32 {r}, {1 if nodes[j][0] == 'min' else 0}")
            fn.op(f"{guard}ld.shared.u32 {r}, [{addr}]")
            fn.op(f"setp.ne.u32 {d}, {r}, 0")
            return d
        d = fn.reg(cls)
        if pred:
            fn.op(f"mov.{_DECL[cls][1:]} {d}, {_imm(_identity(nodes[j][0], key), key)}")
        fn.op(f"{guard}ld.shared.{_DECL[cls][1:]} {d}, [{addr}]")
        return d

    for s, j in enumerate(reds):
        st(fn.nodekeys[j], f"{w['warp_slot']}+{s * _REGION}", warp_fold(j, accs[j]), w["lane0"])
    fn.op("bar.sync 0")
    skip = fn.label()
    fn.op(f"@!{w['warp0']} bra {skip}")
    for s, j in enumerate(reds):
        key = fn.nodekeys[j]
        v = warp_fold(j, ld(j, f"{w['lane_slot']}+{s * _REGION}", w["has_warp"]))
        st(key, f"{w['sh']}+{s * _REGION + 32 * _SLOT}", v, w["lane0"])
    fn.lines.append(f"{skip}:")
    fn.op("bar.sync 0")
    for s, j in enumerate(reds):
        key = fn.nodekeys[j]
        v = ld(j, f"{w['sh']}+{s * _REGION + 32 * _SLOT}")
        fn.op(f"mov.{_DECL[_CLS[key]][1:]} {accs[j]}, {v}")
