"""The interpreter tier: one compiled kernel runs any covered elementwise group from a small program passed in
its parameters, so a new expression runs at once, without waiting for a JIT.

A new kernel costs the driver's PTX JIT (5-10 ms on an H200 host, most of it fixed: an empty kernel takes 5-8 ms)
or NVRTC (~70 ms). The interpreter is compiled once (NVRTC, cached on disk like any rxcuda kernel) and loaded once
per process; a group it covers is *translated* (microseconds) instead of compiled, and its own tuned kernel is
built in the background as before (:class:`~._factory.KernelFactory`), replacing it at a later launch.

Covered (:func:`program`): an ``elementwise`` group in float32 or float64 whose inputs have its dtype (arrays of
any layout: contiguous ones are read at the element's index, broadcast, strided or transposed ones through their
strides, up to :data:`MAX_DIMS` axes); nodes among :data:`OPS` (arithmetic, ``exp``/``log``/
``sqrt``/``sin``/``cos``/``tanh``, ``pow``, ``maximum``/``minimum``, ``abs``, comparisons and ``where``, same-shape
``reshape``/``broadcast_to`` and casts to the group's dtype); up to :data:`MAX_INPUTS` inputs, :data:`MAX_OUTPUTS`
outputs and :data:`MAX_NODES` nodes. Everything else (reductions, integers, mixed dtypes) takes the PTX tier, as
before. Each op's C++ is ``_codegen``'s, so the interpreter computes what the
tuned kernel computes (comparisons hold 1 or 0 in a register of the group's dtype).

>>> ir = (("elementwise", (4,), None, (("array", (4,), "<f4", (1,)), ("scalar", "<f4")),
...        (("mul", (), (4,), "<f4", (("i", 0), ("i", 1))),), (0,)))
>>> p = program(ir)
>>> p.dtype, p.inputs, p.listing
('f4', (True, False), 'r2 = mul r0 r1; out0 = r2')
"""

from __future__ import annotations

import math
import struct

import attrs
import numpy as np

from ..model._shapes import c_strides
from ._codegen import _PRELUDE, _expr
from ._ir import Layout, Unsupported

_UNARY = ("neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh")
_BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge")
_COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
OPS: tuple[str, ...] = ("copy", *_UNARY, *_BINARY, "where")
"""The interpreter's instruction set; an op's position is its opcode (``copy``: a same-shape reshape,
broadcast_to or cast)."""
_COPY = ("reshape", "broadcast_to", "cast")
MAX_INPUTS = 12
MAX_OUTPUTS = 4
MAX_NODES = 40
MAX_DIMS = 6
_REGS = MAX_INPUTS + MAX_NODES
_ARGS = 16  # the launch's values: the inputs (a pointer, or a scalar as a float64), then the outputs' pointers
_BLOCK = 256
_DTYPES = {"f4": "float", "f8": "double"}
ENTRIES = {"f4": "rx_interp_f4", "f8": "rx_interp_f8"}

# the parameter block (rx_prog below): a[16] | n | nin nout ncode arrays linear ndim | outreg[4] | dims[6] |
# strides[12][6] | code[MAX_NODES]
_STATIC = struct.Struct(f"<q6I{MAX_OUTPUTS}I{MAX_DIMS}q{MAX_INPUTS * MAX_DIMS}q{MAX_NODES}Q")
_STATIC_AT = 8 * _ARGS
_SIZE = _STATIC_AT + _STATIC.size


def _case(op: str, t: str) -> str:
    dtype = np.dtype("f4" if t == "float" else "f8")
    if op == "copy":
        return "a"
    if op == "where":
        return _expr("where", (), dtype, ["a != 0", "b", "c"], [np.dtype(bool), dtype, dtype])
    arity = 1 if op in _UNARY else 2
    return _expr(op, (), np.dtype(bool) if op in _COMPARE else dtype, ["a", "b"][:arity], [dtype] * arity)


def source() -> str:
    """The interpreter's CUDA C++: one kernel per dtype (``ENTRIES``), the switch generated from ``_codegen``'s
    expression of each op."""
    out = [_PRELUDE, f"""struct rx_prog {{
    unsigned long long a[{_ARGS}];  // inputs (a pointer, or a scalar's float64 bits), then the outputs' pointers
    long long n;
    unsigned int nin, nout, ncode, arrays, linear, ndim;  // bit k: input k is an array; read at the index
    unsigned int outreg[{MAX_OUTPUTS}];
    long long dims[{MAX_DIMS}];  // the group's shape
    long long strides[{MAX_INPUTS}][{MAX_DIMS}];  // each array input's element strides along the group's axes
    unsigned long long code[{MAX_NODES}];  // op | d << 8 | a << 16 | b << 24 | c << 32
}};
"""]
    for key, t in _DTYPES.items():
        cases = "\n".join(f"            case {k}: v = ({t})({_case(op, t)}); break;" for k, op in enumerate(OPS))
        out.append(f"""
extern "C" __global__ void __launch_bounds__({_BLOCK}) {ENTRIES[key]}(const rx_prog p)
{{
    {t} r[{_REGS}];
    for (unsigned int k = 0; k < p.nin; ++k)
        if (!((p.arrays >> k) & 1u)) r[k] = ({t})__longlong_as_double((long long)p.a[k]);
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += step) {{
        long long at[{MAX_DIMS}];
        if (p.arrays & ~p.linear) {{  // a broadcast or strided input: the element's coordinates
            long long rest = i;
            for (int d = (int)p.ndim - 1; d >= 0; --d) {{ at[d] = rest % p.dims[d]; rest /= p.dims[d]; }}
        }}
        for (unsigned int k = 0; k < p.nin; ++k) {{
            if (!((p.arrays >> k) & 1u)) continue;
            long long off = i;
            if (!((p.linear >> k) & 1u)) {{
                off = 0;
                for (unsigned int d = 0; d < p.ndim; ++d) off += at[d] * p.strides[k][d];
            }}
            r[k] = ((const {t}*)p.a[k])[off];
        }}
        for (unsigned int pc = 0; pc < p.ncode; ++pc) {{
            const unsigned long long w = p.code[pc];
            const {t} a = r[(w >> 16) & 255u], b = r[(w >> 24) & 255u], c = r[(w >> 32) & 255u];
            {t} v;
            switch ((unsigned int)(w & 255u)) {{
{cases}
            default: v = a;
            }}
            r[(w >> 8) & 255u] = v;
        }}
        for (unsigned int o = 0; o < p.nout; ++o) (({t}*)p.a[p.nin + o])[i] = r[p.outreg[o]];
    }}
}}
""")
    return "".join(out)


@attrs.frozen
class Program:
    """An elementwise group translated for the interpreter: ``dtype`` (``'f4'``/``'f8'``), ``shape`` (the
    group's), ``inputs`` (True for an array input, False for a scalar), ``strides`` (each input's element strides
    along the group's axes, 0 where it is broadcast; None for a scalar or an input read at the element's index),
    ``code`` (one word per node), ``outregs`` (the register of each output) and a readable ``listing``."""

    dtype: str
    shape: tuple[int, ...]
    inputs: tuple[bool, ...]
    strides: tuple[tuple[int, ...] | None, ...]
    code: tuple[int, ...]
    outregs: tuple[int, ...]
    listing: str

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def static(self) -> bytes:
        """The parameter block's fixed part (everything but the launch's values)."""
        arrays = sum(1 << k for k, a in enumerate(self.inputs) if a)
        linear = sum(1 << k for k, (a, s) in enumerate(zip(self.inputs, self.strides, strict=True)) if a and s is None)
        strides = [0] * (MAX_INPUTS * MAX_DIMS)
        for k, st in enumerate(self.strides):
            strides[k * MAX_DIMS:k * MAX_DIMS + len(st or ())] = st or ()
        dims = (*self.shape, *(1,) * (MAX_DIMS - len(self.shape)))
        return _STATIC.pack(self.size, len(self.inputs), len(self.outregs), len(self.code), arrays, linear,
                            len(self.shape), *self.outregs, *(0,) * (MAX_OUTPUTS - len(self.outregs)), *dims,
                            *strides, *self.code, *(0,) * (MAX_NODES - len(self.code)))


def program(ir: tuple) -> Program | None:
    """``ir`` as an interpreter :class:`Program`, or None where the interpreter does not cover it (see the
    module's docstring)."""
    try:
        return _program(ir)
    except Unsupported:
        return None


def _program(ir: tuple) -> Program:
    kind, space, _axes, inputs, nodes, outputs = ir
    if kind != "elementwise" or not inputs or not outputs:
        raise Unsupported(kind)
    key = nodes[outputs[0]][3][1:] if nodes else ""
    if key not in _DTYPES or len(inputs) > MAX_INPUTS or len(nodes) > MAX_NODES or len(outputs) > MAX_OUTPUTS:
        raise Unsupported("dtype or size")
    if len(space) > MAX_DIMS:
        raise Unsupported("too many axes")
    lay = Layout(ir)
    linear = c_strides(space)
    arrays, spaced = [], []
    for k, inp in enumerate(inputs):
        if (inp[1] if inp[0] == "scalar" else inp[2])[1:] != key:
            raise Unsupported("input dtype")
        arrays.append(inp[0] == "array")
        spaced.append(_space_strides(lay, k) if inp[0] == "array" else None)
        if spaced[-1] is not None and all(d == 1 or s == c for d, s, c in zip(space, spaced[-1], linear, strict=True)):
            spaced[-1] = None  # read at the element's index
    base = len(inputs)
    code, lines = [], []
    for j, (op, _attrs, _shape, dt, refs) in enumerate(nodes):  # Layout: every node has the group's shape
        regs = [ref if where == "i" else base + ref for where, ref in refs]
        dtypes = [_dtype_of(inputs, nodes, where, ref) for where, ref in refs]
        if op in _COMPARE:
            ok = dt == "|b1" and all(d == key for d in dtypes)
        elif op == "where":
            ok = dt[1:] == key and dtypes[0] in ("b1", key) and dtypes[1:] == [key, key]
        elif op in _COPY:
            op, ok = "copy", dt[1:] == key and dtypes[0] in ("b1", key)
        else:
            ok = op in OPS and dt[1:] == key and all(d == key for d in dtypes)
        if not ok:
            raise Unsupported(f"op {op}")
        ops = (regs + [0, 0, 0])[:3]
        code.append(OPS.index(op) | (base + j) << 8 | ops[0] << 16 | ops[1] << 24 | ops[2] << 32)
        lines.append(f"r{base + j} = {op} {' '.join(f'r{r}' for r in regs)}")
    outregs = tuple(base + o for o in outputs)
    if any(nodes[o][3][1:] != key for o in outputs):
        raise Unsupported("output dtype")
    listing = "; ".join(lines + [f"out{k} = r{r}" for k, r in enumerate(outregs)])
    return Program(key, tuple(int(d) for d in space), tuple(arrays), tuple(spaced), tuple(code), outregs, listing)


def _space_strides(lay: Layout, k: int) -> tuple[int, ...]:
    """Input ``k``'s element strides along the group's axes (0 where it is broadcast), from where the nodes read
    it (one place for an elementwise group: its axes right-aligned with the group's)."""
    reads = {lay.reads[j][m] for j, node in enumerate(lay.nodes) for m, ref in enumerate(node[4]) if ref == ("i", k)}
    if len(reads) != 1:
        raise Unsupported("an input read at several coordinates")
    (at,) = reads
    out = [0] * len(lay.space)
    for axis, stride in zip(at, lay.inputs[k][3], strict=True):
        if axis is not None:
            out[axis] = int(stride)
    return tuple(out)


def _dtype_of(inputs, nodes, where: str, ref: int) -> str:
    if where == "n":
        return nodes[ref][3][1:]
    inp = inputs[ref]
    return (inp[1] if inp[0] == "scalar" else inp[2])[1:]


class InterpLauncher:
    """Launches the interpreter's ``function`` (the entry of ``program.dtype``) for one :class:`Program`: a
    :class:`~rxcuda.cuda._kernels.BlockLauncher` whose parameter block holds the program, made once. A call takes
    the launch's values (``args``: each input's pointer or scalar value, then each output's pointer, as a
    :class:`~rxcuda.cuda._kernels.KernelLauncher` takes them) and uses the interpreter's own grid and block (a
    grid-stride loop of ``_BLOCK`` threads, at most 8 blocks per multiprocessor), whatever the caller passes."""

    def __init__(self, function, program: Program, *, sms: int = 132, api=None):
        from ..cuda._kernels import BlockLauncher

        values = struct.Struct("<" + "".join("Q" if a else "d" for a in program.inputs) + "Q" * len(program.outregs))
        self.program = program
        self.block = BlockLauncher(function, bytes(_STATIC_AT) + program.static(), values, api=api)
        self.grid = max(1, min(-(-program.size // _BLOCK), sms * 8))

    def __call__(self, grid, block, args, stream: int, shared_mem: int = 0) -> None:
        self.block(self.grid, _BLOCK, args, stream)


def compile_interpreter() -> dict:
    """The interpreter's :class:`~rxcuda.model.KernelCode` per dtype key, compiled through rxcuda's NVRTC path
    and its disk cache (the first time on a machine takes NVRTC's time; later processes read the cubin)."""
    from ..sources._nvrtc import compile_module

    module = compile_module(source(), name="rx_interp.cu", target="cubin")  # (the CUDA tensor backend's, a GPU's)
    return {key: module.kernel_code(entry, block_size=_BLOCK) for key, entry in ENTRIES.items()}
