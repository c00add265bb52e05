"""CUDA C++ for a planned group: one kernel per fused group, generated from the group's ops (no GPU needed).

A group is first described by its structural IR (``_ir.group_ir``, the IR the PTX emitter walks too): its kind,
iteration space and reduced axes, its inputs (a scalar fill, or an array with its shape, dtype and element
strides), its nodes (op, attributes, shape, dtype, and where each input comes from) and which nodes it writes.
The IR is pure hashable data, so the :class:`~._factory.KernelFactory` keys compiled kernels on it.

Three kernel shapes come out of :func:`generate`; ``_tuning.launch_shape`` gives each its grid and block (the
only launch contract: callers launch exactly that), and both come from one plan per IR (``_tuning._planned``):

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

Math stays precise (``expf``, ``logf``, ``sqrtf``, IEEE division; no fast-math; a division by a scalar multiplies by
the scalar's correctly rounded reciprocal, as XLA and TorchInductor divide by a constant), and f32 kernels stay in f32:
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

import math

import numpy as np

from ..model._shapes import c_strides
from ._divide import DIV_S, split_scalar_divisions
from ._ir import ENTRY, REDUCE, Layout, Unsupported, ctype, element_closure, levels
from ._tuning import (  # noqa: F401 - Tuning, set_tuning, launch_shape, _planned: the generator's knobs, from here
    _MATH,
    _VECTOR,
    BLOCK,
    TUNING,
    RowPlan,
    Tuning,
    _axis_strides,
    _ew_vector,
    _index_type,
    _planned,
    _Shape,
    launch_shape,
    set_tuning,
)

_HINTS = {"plain": None, "ldg": "__ldg", "ldcs": "__ldcs", "stcs": "__stcs"}
_FIELDS = "xyzw"

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


def _expr(op: str, attrs: tuple, dtype: np.dtype, args: list[str], arg_dtypes: list[np.dtype],
          scalar_divisor: bool = False) -> str:
    """The C++ expression of one op; ``scalar_divisor``: a ``div`` whose divisor is a scalar input (see
    ``rx_div_s`` in the prelude)."""
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
    if op == "div" and scalar_divisor and t in ("float", "double"):
        return f"rx_div_s({a[0]}, {a[1]})"
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



def _coord(a: int, var: str, axes: list[int], strides: dict[int, int], space: tuple) -> str:
    """Coordinate ``a`` of the row-major linear index ``var`` over ``axes`` (compile-time divisors)."""
    if len(axes) == 1:
        return var
    e = var if strides[a] == 1 else f"({var} / {strides[a]})"
    return e if a == axes[0] else f"({e} % {space[a]})"


def _decompose(var: str, axes: tuple, space: tuple, indent: str, idx: str = "long long") -> list[str]:
    """Lines setting ``c<axis>`` for ``axes`` (row-major) from the linear index ``var``."""
    sfx = "LL" if idx == "long long" else ""
    lines = [f"{indent}{idx} t_ = {var};"]
    for a in reversed(axes):
        lines.append(f"{indent}const {idx} c{a} = t_ % {space[a]}{sfx}; t_ /= {space[a]}{sfx};")
    return lines



def _vector_or_scalar(i1: str, i2: str, vector: list[str], scalar: list[str]) -> list[str]:
    """``vector`` lines where the row is 16-byte aligned (the kernel's run-time ``vec``), else ``scalar``."""
    return [f"{i1}if (vec) {{", *(i2 + x for x in vector), f"{i1}}} else {{", *(i2 + x for x in scalar), f"{i1}}}"]


def _rows_body(rows: RowPlan) -> list[str]:
    """The register-resident row kernel's body for ``rows`` (see :class:`~._tuning.RowPlan`)."""
    lay, sh, tn = rows.lay, rows.shape, rows.tuning
    nodes, idx = lay.nodes, sh.idx
    G, V, E = sh.group, sh.vec, sh.per * sh.vec
    R = sh.threads // G
    sfx = "LL" if idx == "long long" else ""
    nred, nrows = rows.nred, rows.nrows
    exact = sh.per * G * V == nred  # every element slot of every lane is in the row: no masks
    reds = [j for j in range(len(nodes)) if nodes[j][0] in REDUCE]
    q_of = rows.keys
    lines = []
    if G > 32:  # a slot per warp of the block; a row's slots start at its first warp's
        for j in reds:
            lines.append(f"    __shared__ {ctype(nodes[j][3])} sh{j}[{sh.threads // 32}];")
    ptrs = [f"(unsigned long long)in{k}" for k, _ in rows.vector_keys]
    ptrs += [f"(unsigned long long)out{o}" for o in dict.fromkeys(o for o, _ in rows.vector_outs)]
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
    for a in rows.rowax:
        lines.append(f"{i1}const {idx} c{a} = {_coord(a, 'row', rows.rowax, rows.rrs, lay.space)};")

    def base_of(st: dict[int, int]) -> str:
        return " + ".join(f"c{a} * {st[a]}" for a in rows.rowax if a in st) or "0"

    def offset(st: dict[int, int]) -> str:
        if rows.contiguous(st):
            return "r"
        return " + ".join(f"{_coord(a, 'r', rows.red, rows.rs, lay.space)} * {st[a]}"
                          for a in rows.red if a in st) or "0"

    slot = f"((e / {V}) * {G} + lane) * {V} + e % {V}" if V > 1 else f"e * {G} + lane"
    loads: dict[int, list[str]] = {}  # level -> the loads of the inputs first needed at that level
    for key, q in q_of.items():
        k = key[0]
        t = ctype(lay.inputs[k][2])
        # the first level reading it (a reduction of level n reads its operand at level n - 1)
        first = min(rows.level[j] - (node[0] in REDUCE) for j, node in enumerate(nodes)
                    if any(s == "i" and (r, lay.reads[j][m]) == key for m, (s, r) in enumerate(node[4])))
        out = loads.setdefault(first if tn.late_loads else 0, [])
        if key not in rows.full_read:
            load = _ld(None, t, f"in{k}", base_of(rows.st[key]))
            out.append(f"{i1}const {t} l{q} = {f'valid ? {load} : ({t})0' if live else load};")
            continue
        out.append(f"{i1}const {idx} rb{q} = {base_of(rows.st[key])};")
        out.append(f"{i1}{t} x{q}[{E}];")
        hint = tn if any(a in rows.rrs for a in rows.st[key]) else None  # a weight shared by rows: plain
        scalar = ["#pragma unroll", f"for (int e = 0; e < {E}; ++e) {{",
                  f"    const int r = {slot};",
                  f"    x{q}[e] = {guarded_load(_ld(hint, t, f'in{k}', f'rb{q} + {offset(rows.st[key])}'), t)};",
                  "}"]
        if key in rows.vector_keys:
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
            return f"v{r}[e]" if r in rows.full and e else f"v{r}"
        inp = lay.inputs[r]
        if inp[0] == "scalar":
            return f"(bool)s{r}" if inp[1] == "|b1" else f"s{r}"
        key = (r, lay.reads[j][k])
        return f"x{q_of[key]}[e]" if key in rows.full_read else f"l{q_of[key]}"

    def compute(j: int) -> list[str]:
        t = ctype(nodes[j][3])
        if j not in rows.full:
            return [f"{i1}const {t} v{j} = ({t})({_node_expr(lay, j, lambda k: operand(j, k, False))});"]
        expr = _node_expr(lay, j, lambda k: operand(j, k, True))
        return [f"{i1}{t} v{j}[{E}];", f"{i1}#pragma unroll",
                f"{i1}for (int e = 0; e < {E}; ++e) v{j}[e] = ({t})({expr});"]

    def stage(lv: int) -> list[str]:
        out = list(loads.get(lv, []))
        for j in rows.rows:
            if rows.level[j] == lv:
                out += compute(j)
        for j in sorted(rows.full):
            if rows.level[j] == lv:
                out += compute(j)
        return out

    lines += stage(0)
    for lv in range(1, max(rows.level, default=0) + 1):
        here = [j for j in reds if rows.level[j] == lv]
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
    if rows.full_out:
        lines.append(f"{i1}const {idx} ob = {base_of(rows.ost)};")
    for o, j in rows.full_out:
        t = ctype(nodes[j][3])
        scalar = ["#pragma unroll", f"for (int e = 0; e < {E}; ++e) {{", f"    const int r = {slot};",
                  f"    {guard_if(live, in_row)}{_st(tn, t, f'out{o}', f'ob + {offset(rows.ost)}', f'v{j}[e]')};",
                  "}"]
        if (o, j) in rows.vector_outs:
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
        if j not in rows.full:
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
        body = _rows_body(rows)
    elif kind == "reduce":
        body = _loop_body(lay)
    else:
        body = _elementwise_body(lay, shape)
    bounds = f"{shape.threads}"
    if shape.mode == "rows" and shape.tuning.row_occupancy >= 2 * shape.threads:
        bounds += f", {shape.tuning.row_occupancy // shape.threads}"
    text = split_scalar_divisions("\n".join(body))
    return (_PRELUDE + (DIV_S if "rx_div_" in text else "") + f"// tuning: {shape.tuning.changes()}\n"
            + f'\nextern "C" __global__ void __launch_bounds__({bounds}) {ENTRY}('
            + ", ".join(params) + ")\n{\n" + text + "\n}\n")


def _operand(lay: Layout, j: int, k: int) -> str:
    kind, ref = lay.nodes[j][4][k]
    if kind == "n":
        return f"v{ref}"
    inp = lay.inputs[ref]
    if inp[0] == "scalar":
        return f"(bool)s{ref}" if inp[1] == "|b1" else f"s{ref}"
    at, strides = lay.reads[j][k], inp[3]
    terms = [f"c{a} * {s}" for a, s in zip(at, strides, strict=True) if a is not None and s != 0]
    return f"in{ref}[{' + '.join(f'({x})' for x in terms) or '0'}]"


def _node_expr(lay: Layout, j: int, operand) -> str:
    """The C++ expression of node ``j``; ``operand(k)`` gives the expression of its k-th operand."""
    op, attrs, _, dt, refs = lay.nodes[j]
    args = [operand(k) for k in range(len(refs))]
    arg_dtypes = [np.dtype(lay.inputs[r][-2] if lay.inputs[r][0] == "array" else lay.inputs[r][1]) if s == "i"
                  else np.dtype(lay.nodes[r][3]) for s, r in refs]
    by_scalar = op == "div" and refs[1][0] == "i" and lay.inputs[refs[1][1]][0] == "scalar"
    return _expr(op, attrs, np.dtype(dt), args, arg_dtypes, by_scalar)


def _node_line(lay: Layout, j: int, indent: str, operand=None) -> str:
    t = ctype(lay.nodes[j][3])
    expr = _node_expr(lay, j, operand or (lambda k: _operand(lay, j, k)))
    return f"{indent}const {t} v{j} = ({t})({expr});"


def _row_index(lay: Layout, sfx: str = "LL") -> str:
    rowspace = tuple(lay.space[a] for a in lay.rowaxes)
    terms = [f"c{a} * {s}{sfx}" for a, s in zip(lay.rowaxes, c_strides(rowspace), strict=True)]
    return " + ".join(terms) or "0"


def _elementwise_body(lay: Layout, shape: _Shape) -> list[str]:
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


def _loop_body(lay: Layout) -> list[str]:
    """Rows too long for registers: each reduction level is a strided loop over the reduced axes (the row is
    read again at each level, and once more to store per-element outputs) and a tree in shared memory."""
    nodes = lay.nodes
    nred = math.prod(lay.space[a] for a in lay.axes)
    nrows = math.prod(lay.space[a] for a in lay.rowaxes)
    level, full, rows = levels(lay)

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
        reds = [j for j in range(len(nodes)) if nodes[j][0] in REDUCE and level[j] == lv]
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

