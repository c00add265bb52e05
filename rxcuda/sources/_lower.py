"""Lowering a :class:`KernelIR` to CUDA C++: readable, deterministic, one ``extern "C"`` kernel.

Layout of the generated source::

    // helpers, only those the kernel uses (Python-style // and %, atomics, block reduction)
    extern "C" __global__ void name(const float* __restrict__ x, float* __restrict__ out, float a,
                                    long long size)
    {
        __shared__ ...;                // shared arrays
        float rx_r0 = 0.0f;            // reduction accumulators, at their identity
        ...                            // items_per_thread = N > 1 (elementwise kernels):
        for (int rx_k = 0; rx_k < N; rx_k++) {     // unrolled: up to N elements per thread, loads
            ... if (rx_k < rx_per && rx_i < size) { // of all N in flight together
                ...                    //   the traced statements, one per line
        }                              // otherwise rx_i = blockIdx.x * blockDim.x + threadIdx.x and,
                                       // with guard=True, if (rx_i < size) { ... }
        rx_r0 = rx_block_reduce(rx_r0, RxAdd());         // reductions: block, then one atomic per block
        if (threadIdx.x == 0) rx_atomic_add(&out[0], rx_r0);
    }
"""

from __future__ import annotations

from ._ir import (
    C_TYPES,
    FLOATS,
    Accumulate,
    ArrayRef,
    Assign,
    Atomic,
    Barrier,
    DeclVar,
    For,
    If,
    KernelIR,
    Let,
    Operand,
    Store,
    literal,
)

_INFIX = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|", "xor": "^", "shl": "<<",
    "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
}
_INDENT = "    "

_PY_DIVMOD = """\
// Python semantics for // and % (floor division; the remainder takes the divisor's sign)
template <typename T> __device__ __forceinline__ T rx_floordiv(T a, T b)
{
    T q = a / b;
    return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T> __device__ __forceinline__ T rx_mod(T a, T b)
{
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ float rx_mod(float a, float b)
{
    float r = fmodf(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
__device__ __forceinline__ double rx_mod(double a, double b)
{
    double r = fmod(a, b);
    return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}
"""

_ATOMICS = """\
// atomics over every rxcuda type; float min/max by compare-and-swap
__device__ __forceinline__ float rx_atomic_add(float* p, float v) { return atomicAdd(p, v); }
__device__ __forceinline__ double rx_atomic_add(double* p, double v) { return atomicAdd(p, v); }
__device__ __forceinline__ int rx_atomic_add(int* p, int v) { return atomicAdd(p, v); }
__device__ __forceinline__ unsigned int rx_atomic_add(unsigned int* p, unsigned int v) { return atomicAdd(p, v); }
__device__ __forceinline__ unsigned long long rx_atomic_add(unsigned long long* p, unsigned long long v)
{
    return atomicAdd(p, v);
}
__device__ __forceinline__ long long rx_atomic_add(long long* p, long long v)
{
    return (long long)atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
template <typename T> __device__ __forceinline__ T rx_atomic_min(T* p, T v) { return atomicMin(p, v); }
template <typename T> __device__ __forceinline__ T rx_atomic_max(T* p, T v) { return atomicMax(p, v); }
template <> __device__ __forceinline__ float rx_atomic_min<float>(float* p, float v)
{
    unsigned int* a = (unsigned int*)p;
    unsigned int old = *a, assumed;
    do {
        assumed = old;
        if (__uint_as_float(assumed) <= v) break;
        old = atomicCAS(a, assumed, __float_as_uint(v));
    } while (old != assumed);
    return __uint_as_float(old);
}
template <> __device__ __forceinline__ float rx_atomic_max<float>(float* p, float v)
{
    unsigned int* a = (unsigned int*)p;
    unsigned int old = *a, assumed;
    do {
        assumed = old;
        if (__uint_as_float(assumed) >= v) break;
        old = atomicCAS(a, assumed, __float_as_uint(v));
    } while (old != assumed);
    return __uint_as_float(old);
}
template <> __device__ __forceinline__ double rx_atomic_min<double>(double* p, double v)
{
    unsigned long long* a = (unsigned long long*)p;
    unsigned long long old = *a, assumed;
    do {
        assumed = old;
        if (__longlong_as_double((long long)assumed) <= v) break;
        old = atomicCAS(a, assumed, (unsigned long long)__double_as_longlong(v));
    } while (old != assumed);
    return __longlong_as_double((long long)old);
}
template <> __device__ __forceinline__ double rx_atomic_max<double>(double* p, double v)
{
    unsigned long long* a = (unsigned long long*)p;
    unsigned long long old = *a, assumed;
    do {
        assumed = old;
        if (__longlong_as_double((long long)assumed) >= v) break;
        old = atomicCAS(a, assumed, (unsigned long long)__double_as_longlong(v));
    } while (old != assumed);
    return __longlong_as_double((long long)old);
}
"""

_REDUCE = """\
// block-wide reduction (any block size): warp shuffles, then one partial per warp in shared memory.
// Every thread of the block must call it; the result is valid in thread 0.
struct RxAdd {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct RxMin {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return b < a ? b : a; }
};
struct RxMax {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a < b ? b : a; }
};
template <typename T, typename Op> __device__ __forceinline__ T rx_block_reduce(T v, Op op)
{
    __shared__ T rx_partial[32];
    const unsigned int lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const unsigned int width = min(32u, blockDim.x - (warp << 5));
    const unsigned int mask = width == 32u ? 0xffffffffu : ((1u << width) - 1u);
    for (unsigned int o = 16; o > 0; o >>= 1) {
        T other = __shfl_down_sync(mask, v, o);
        if (lane + o < width) v = op(v, other);
    }
    __syncthreads();  // a previous reduction may still read rx_partial
    if (lane == 0) rx_partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const unsigned int nwarps = (blockDim.x + 31u) >> 5;
        v = rx_partial[lane < nwarps ? lane : 0];
        for (unsigned int o = 16; o > 0; o >>= 1) {
            T other = __shfl_down_sync(mask, v, o);
            if (lane + o < nwarps) v = op(v, other);
        }
    }
    return v;
}
"""


def _ref(x) -> str:
    if isinstance(x, Operand):
        return x.ref
    if isinstance(x, ArrayRef):
        return x.name
    return str(x)


def _expr(s: Let) -> str:
    a = s.args
    if s.op in _INFIX:
        return f"{_ref(a[0])} {_INFIX[s.op]} {_ref(a[1])}"
    if s.op == "floordiv":
        if s.type in FLOATS:
            return f"{'floorf' if s.type == 'f32' else 'floor'}({_ref(a[0])} / {_ref(a[1])})"
        if s.type.startswith("u"):
            return f"{_ref(a[0])} / {_ref(a[1])}"
        return f"rx_floordiv({_ref(a[0])}, {_ref(a[1])})"
    if s.op == "mod":
        if s.type.startswith("u"):
            return f"{_ref(a[0])} % {_ref(a[1])}"
        return f"rx_mod({_ref(a[0])}, {_ref(a[1])})"
    if s.op == "neg":
        return f"-{_ref(a[0])}"
    if s.op == "not":
        return f"!{_ref(a[0])}"
    if s.op == "invert":
        return f"~{_ref(a[0])}"
    if s.op == "call":
        return f"{a[0]}({', '.join(_ref(x) for x in a[1:])})"
    if s.op == "cast":
        return f"({C_TYPES[s.type]})({_ref(a[0])})" if a[0].type != s.type else _ref(a[0])
    if s.op == "select":
        return f"{_ref(a[0])} ? {_ref(a[1])} : {_ref(a[2])}"
    if s.op == "load":
        return f"{_ref(a[0])}[{_ref(a[1])}]"
    if s.op == "sreg":
        return f"({C_TYPES[s.type]}){a[0]}"
    raise AssertionError(s.op)


def _needs(ir: KernelIR) -> tuple[bool, bool, bool]:
    """(Python // and %, atomics, block reduction) helpers needed."""
    divmod_ = False
    atomics = bool(ir.reductions)

    def walk(stmts):
        nonlocal divmod_, atomics
        for s in stmts:
            if isinstance(s, Let) and (
                (s.op == "floordiv" and s.type in ("i32", "i64")) or (s.op == "mod" and s.type not in ("u32", "u64"))
            ):
                divmod_ = True
            elif isinstance(s, Atomic):
                atomics = True
            elif isinstance(s, If):
                walk(s.then)
                walk(s.orelse)
            elif isinstance(s, For):
                walk(s.body)

    walk(ir.body)
    return divmod_, atomics, bool(ir.reductions)


def _identity(op: str, dtype: str) -> str:
    if op == "add":
        return literal(0, dtype).ref
    if dtype in FLOATS:
        return literal(float("inf") if op == "min" else float("-inf"), dtype).ref
    bits = 32 if dtype.endswith("32") else 64
    if dtype.startswith("u"):
        return literal(2**bits - 1 if op == "min" else 0, dtype).ref
    return literal(2 ** (bits - 1) - 1 if op == "min" else -(2 ** (bits - 1)), dtype).ref


def lower(ir: KernelIR) -> str:
    """CUDA C++ source of the kernel, deterministic for equal IR."""
    out: list[str] = [f"// rxcuda composed kernel '{ir.name}' (generated; edit the Python, not this)"]
    divmod_, atomics, reduce_ = _needs(ir)
    for needed, text in ((divmod_, _PY_DIVMOD), (atomics, _ATOMICS), (reduce_, _REDUCE)):
        if needed:
            out.append(text.rstrip("\n"))
    params = []
    for p in ir.params:
        c = C_TYPES[p.dtype]
        if p.kind == "array":
            params.append(f"{'const ' if p.direction == 'in' else ''}{c}* __restrict__ {p.name}")
        else:
            params.append(f"{c} {p.name}")
    params.append(f"long long {ir.size_param}")
    out.append(f'extern "C" __global__ void {ir.name}({", ".join(params)})')
    out.append("{")
    body: list[str] = []
    size = ir.size_param
    per = ir.items_per_thread
    if per == 1:
        body.append(f"{_INDENT}const long long rx_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;")
    for s in ir.shared:
        body.append(f"{_INDENT}__shared__ {C_TYPES[s.dtype]} {s.name}[{s.count}];")
    for r in ir.reductions:
        body.append(f"{_INDENT}{C_TYPES[r.dtype]} {r.acc} = {_identity(r.op, r.dtype)};")
    if per > 1:
        body += [
            f"{_INDENT}// each thread takes up to {per} elements, a block apart: 1 when launched for {size} threads,",
            f"{_INDENT}// {per} when launched for {size} / {per} (their loads are then in flight together)",
            f"{_INDENT}const long long rx_threads = (long long)gridDim.x * blockDim.x;",
            f"{_INDENT}const int rx_per = rx_threads >= {size} ? 1 : {per};",
            f"{_INDENT}const long long rx_base = (long long)blockIdx.x * blockDim.x * rx_per + threadIdx.x;",
            f"{_INDENT}#pragma unroll",
            f"{_INDENT}for (int rx_k = 0; rx_k < {per}; rx_k++) {{",
            f"{_INDENT * 2}const long long rx_i = rx_base + (long long)rx_k * blockDim.x;",
            f"{_INDENT * 2}if (rx_k < rx_per && rx_i < {size}) {{",
        ]
        _stmts(ir.body, 3, body)
        body.append(f"{_INDENT * 2}}}")
        body.append(f"{_INDENT}}}")
    elif ir.guard:
        body.append(f"{_INDENT}if (rx_i < {size}) {{")
        _stmts(ir.body, 2, body)
        body.append(f"{_INDENT}}}")
    else:
        _stmts(ir.body, 1, body)
    for r in ir.reductions:
        op = {"add": "RxAdd", "min": "RxMin", "max": "RxMax"}[r.op]
        body.append(f"{_INDENT}{r.acc} = rx_block_reduce({r.acc}, {op}());")
        body.append(f"{_INDENT}if (threadIdx.x == 0) rx_atomic_{r.op}(&{r.array}[{r.index}], {r.acc});")
    out.extend(body)
    out.append("}")
    return "\n".join(out) + "\n"


def _stmts(stmts: list, depth: int, out: list[str]) -> None:
    pad = _INDENT * depth
    for s in stmts:
        if isinstance(s, Let):
            out.append(f"{pad}const {C_TYPES[s.type]} {s.dst} = {_expr(s)};")
        elif isinstance(s, Store):
            out.append(f"{pad}{s.array.name}[{s.index.ref}] = {s.value.ref};")
        elif isinstance(s, Atomic):
            out.append(f"{pad}const {C_TYPES[s.type]} {s.dst} = rx_atomic_{s.op}(&{s.array.name}[{s.index.ref}], "
                       f"{s.value.ref});")
        elif isinstance(s, DeclVar):
            out.append(f"{pad}{C_TYPES[s.type]} {s.name} = {s.init.ref};")
        elif isinstance(s, Assign):
            out.append(f"{pad}{s.name} = {s.value.ref};")
        elif isinstance(s, Barrier):
            out.append(f"{pad}__syncthreads();")
        elif isinstance(s, Accumulate):
            if s.op == "add":
                out.append(f"{pad}{s.acc} += {s.value.ref};")
            else:
                cmp = "<" if s.op == "min" else ">"
                out.append(f"{pad}{s.acc} = {s.value.ref} {cmp} {s.acc} ? {s.value.ref} : {s.acc};")
        elif isinstance(s, If):
            out.append(f"{pad}if ({s.cond.ref}) {{")
            _stmts(s.then, depth + 1, out)
            if s.orelse:
                out.append(f"{pad}}} else {{")
                _stmts(s.orelse, depth + 1, out)
            out.append(f"{pad}}}")
        elif isinstance(s, For):
            if s.unroll is not None:
                out.append(f"{pad}#pragma unroll {s.unroll}" if s.unroll > 0 else f"{pad}#pragma unroll")
            cmp = "<" if s.step > 0 else ">"
            step = f"{s.var}++" if s.step == 1 else f"{s.var} += {s.step}"
            out.append(f"{pad}for ({C_TYPES[s.type]} {s.var} = {s.start.ref}; {s.var} {cmp} {s.stop.ref}; "
                       f"{step}) {{")
            _stmts(s.body, depth + 1, out)
            out.append(f"{pad}}}")
        else:
            raise AssertionError(type(s))
