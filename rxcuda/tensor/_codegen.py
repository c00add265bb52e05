"""CUDA C++ for a planned group: one kernel per fused group, generated from the group's ops (no GPU needed).

A group is first described by its structural IR (:func:`group_ir`): its kind, iteration space and reduced
axes, its inputs (a scalar fill, or an array with its shape, dtype and element strides), its nodes (op,
attributes, shape, dtype, and where each input comes from) and which nodes it writes. The IR is pure hashable
data, so the :class:`KernelFactory` keys compiled kernels on it: the same structure again is a dict hit.

Two kernel shapes come out of :func:`generate`:

- **elementwise** (one thread per element of the space, grid-stride): every node is evaluated at the
  element; a per-row value (reduced axes kept at 1, or dropped) is written once per row;
- **reduce** (one block of 256 threads per row of the non-reduced axes): each reduction is a strided loop
  over the reduced axes and a tree in shared memory; nodes that need a reduction run after it (softmax is
  max, then sum of exp, then the divide: three loops in one kernel), per-row values once per row.

A group the generator cannot express (a dtype without a CUDA C type, an operand read at coordinates other than
the ones it is evaluated at) gives ``None``; the backend then runs that group op by op.

>>> import numpy as np
>>> ir = (("elementwise", (4,), None, (("array", (4,), "<f4", (1,)), ("scalar", "<f4")),
...        (("mul", (), (4,), "<f4", (("i", 0), ("i", 1))),), (0,)))
>>> "v0 = (float)(((float)(in0[(c0 * 1)]) * (float)(s1)))" in generate(ir)
True
"""

from __future__ import annotations

import math

import numpy as np

from ._graph import Node

BLOCK = 256
ENTRY = "rx_group"
_MAX_GRID = 1 << 20

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
    _Layout(ir)  # raises Unsupported where the coordinates do not line up
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


def _decompose(var: str, axes: tuple, space: tuple, indent: str) -> list[str]:
    """Lines setting ``c<axis>`` for ``axes`` (row-major) from the linear index ``var``."""
    lines = [f"{indent}long long t_ = {var};"]
    for a in reversed(axes):
        lines.append(f"{indent}const long long c{a} = t_ % {space[a]}LL; t_ /= {space[a]}LL;")
    return lines


def generate(ir: tuple) -> str:
    """The CUDA C++ source of one kernel (entry ``rx_group``) for ``ir``."""
    lay = _Layout(ir)
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
    body = _reduce_body(lay) if kind == "reduce" else _elementwise_body(lay)
    return (_PRELUDE + f'\nextern "C" __global__ void __launch_bounds__({BLOCK}) {ENTRY}(' + ", ".join(params)
            + ")\n{\n" + "\n".join(body) + "\n}\n")


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


def _node_line(lay: _Layout, j: int, indent: str) -> str:
    op, attrs, _, dt, refs = lay.nodes[j]
    args = [_operand(lay, j, k) for k in range(len(refs))]
    arg_dtypes = [np.dtype(lay.inputs[r][-2] if lay.inputs[r][0] == "array" else lay.inputs[r][1]) if s == "i"
                  else np.dtype(lay.nodes[r][3]) for s, r in refs]
    t = ctype(dt)
    return f"{indent}const {t} v{j} = ({t})({_expr(op, attrs, np.dtype(dt), args, arg_dtypes)});"


def _row_index(lay: _Layout) -> str:
    rowspace = tuple(lay.space[a] for a in lay.rowaxes)
    terms = [f"c{a} * {s}LL" for a, s in zip(lay.rowaxes, _strides(rowspace), strict=True)]
    return " + ".join(terms) or "0LL"


def _elementwise_body(lay: _Layout) -> list[str]:
    size = math.prod(lay.space)
    lines = [f"    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {size}LL;"
             " i += (long long)gridDim.x * blockDim.x) {"]
    lines += _decompose("i", lay.full, lay.space, "        ")
    lines += [_node_line(lay, j, "        ") for j in range(len(lay.nodes))]
    reduced = [a for a in lay.axes if lay.space[a] != 1]
    for k, j in enumerate(lay.outputs):
        if lay.is_full(j):
            lines.append(f"        out{k}[i] = v{j};")
        else:
            first = " && ".join(f"c{a} == 0" for a in reduced) or "true"
            lines.append(f"        if ({first}) out{k}[{_row_index(lay)}] = v{j};")
    return lines + ["    }"]


def _reduce_body(lay: _Layout) -> list[str]:
    nodes = lay.nodes
    red_ops = ("sum", "max", "min", "mean")
    nred = math.prod(lay.space[a] for a in lay.axes)
    nrows = math.prod(lay.space[a] for a in lay.rowaxes)
    level = []
    for j, (op, _, _, _, refs) in enumerate(nodes):
        lv = max((level[r] for s, r in refs if s == "n"), default=0)
        if op in red_ops:
            lv += 1
        elif not lay.is_full(j) and any(s == "n" and lay.is_full(r) and nodes[r][0] not in red_ops
                                        for s, r in refs):
            raise Unsupported("a per-row value computed from per-element values without a reduction")
        level.append(lv)
    full = {j for j in range(len(nodes)) if lay.is_full(j) and nodes[j][0] not in red_ops}
    rows = [j for j in range(len(nodes)) if j not in full and nodes[j][0] not in red_ops]

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
        reds = [j for j in range(len(nodes)) if nodes[j][0] in red_ops and level[j] == lv]
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
    kind, space, axes = ir[0], ir[1], tuple(ir[2] or ())
    if kind == "reduce":
        rows = math.prod(d for a, d in enumerate(space) if a not in axes)
        return min(rows, _MAX_GRID), BLOCK
    return min(-(-math.prod(space) // BLOCK), _MAX_GRID), BLOCK


# -- the factory -----------------------------------------------------------------------------------------------
class KernelFactory:
    """Compiled kernels by structural IR: ``get(ir)`` generates and compiles once (through rxcuda's NVRTC
    path and its cache, which keys on the source), then returns the same :class:`GroupKernel`."""

    def __init__(self):
        self._kernels: dict[tuple, GroupKernel] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._kernels)

    def __contains__(self, ir: tuple) -> bool:
        return ir in self._kernels

    def get(self, ir: tuple) -> GroupKernel:
        kernel = self._kernels.get(ir)
        if kernel is not None:
            self.hits += 1
            return kernel
        from ..sources._nvrtc import compile_cuda

        self.misses += 1
        source = generate(ir)
        kernel = GroupKernel(ir, source, compile_cuda(source, entry=ENTRY, name=f"{ENTRY}.cu"))
        self._kernels[ir] = kernel
        return kernel


class GroupKernel:
    """One generated kernel: its IR, source, compiled code, and (once loaded on a device) its function."""

    __slots__ = ("ir", "source", "code", "function", "module")

    def __init__(self, ir: tuple, source: str, code):
        self.ir, self.source, self.code = ir, source, code
        self.function = self.module = None

