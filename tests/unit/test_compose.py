"""Composed kernels: tracing, type errors, generated CUDA C++ (golden), NVRTC compiles it, IR caching."""

import pytest

import rxcuda.sources._compose as rx
from rxcuda.sources import _nvrtc as nv
from rxcuda.sources._compose import f32, f64, i32, i64, u32, u64
from rxcuda.sources._ptx import parse_ptx


@pytest.fixture
def compiler(tmp_path):
    c = nv.Compiler(tmp_path / "cache")
    prev = nv.set_default_compiler(c)
    rx._clear_code_memo()
    yield c
    nv.set_default_compiler(prev)
    rx._clear_code_memo()


@rx.kernel
def saxpy(x: rx.In[f32], y: rx.In[f32], out: rx.Out[f32], a: f32 = 2.0):
    i = rx.thread_index()
    out[i] = a * x[i] + y[i]


SAXPY = """\
// rxcuda composed kernel 'saxpy' (generated; edit the Python, not this)
extern "C" __global__ void saxpy(const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, \
float a, long long size)
{
    // each thread takes up to 4 elements, a block apart: 1 when launched for size threads,
    // 4 when launched for size / 4 (their loads are then in flight together)
    const long long rx_threads = (long long)gridDim.x * blockDim.x;
    const int rx_per = rx_threads >= size ? 1 : 4;
    const long long rx_base = (long long)blockIdx.x * blockDim.x * rx_per + threadIdx.x;
    #pragma unroll
    for (int rx_k = 0; rx_k < 4; rx_k++) {
        const long long rx_i = rx_base + (long long)rx_k * blockDim.x;
        if (rx_k < rx_per && rx_i < size) {
            const float v0 = x[rx_i];
            const float v1 = a * v0;
            const float v2 = y[rx_i];
            const float v3 = v1 + v2;
            out[rx_i] = v3;
        }
    }
}
"""


def test_saxpy_golden_source_and_signature():
    assert saxpy.source == SAXPY
    assert [p.describe() for p in saxpy.signature.params] == [
        "f32* x (in)",
        "f32* y (in)",
        "f32* out (out)",
        "f32 a",
        "i64 size",
    ]
    assert saxpy.signature.params[3].default == 2.0
    assert saxpy.signature.params[4].default == "size"
    assert repr(saxpy).startswith("<ComposedKernel saxpy(x: In[f32], y: In[f32], out: Out[f32], a: f32, size)")
    assert saxpy.items_per_thread == rx.DEFAULT_ITEMS_PER_THREAD and saxpy.launch_threads(10) == 3


def test_kernels_tied_to_threads_get_one_element_per_thread():
    assert control.items_per_thread == 1  # guard=False, shared memory, thread index
    k = rx.compose(lambda out: out.__setitem__(rx.thread_index(), rx.thread_idx()), params={"out": rx.Out[i32]})
    assert k.items_per_thread == 1 and "rx_per" not in k.source and "if (rx_i < size)" in k.source
    k8 = rx.compose(saxpy.fn, items_per_thread=8)
    assert k8.items_per_thread == 8 and k8.fingerprint != saxpy.fingerprint and "rx_k < 8" in k8.source
    assert "rx_per" not in rx.compose(saxpy.fn, items_per_thread=1).source
    with pytest.raises(rx.ComposeError, match="items_per_thread must be an int from 1 to 16"):
        rx.compose(saxpy.fn, items_per_thread=0)
    with pytest.raises(rx.ComposeError, match="needs an elementwise kernel"):
        rx.compose(control.fn, guard=False, items_per_thread=2)


@rx.kernel(guard=False, block_size=128)
def control(x: rx.In[f64], acc: rx.InOut[f64], k: i32 = 3):
    i = rx.thread_index()
    t = rx.thread_idx()
    tile = rx.shared(f64, 128)
    with rx.if_(i < rx.size()):
        tile[t] = x[i]
    with rx.else_():
        tile[t] = 0.0
    rx.barrier()
    total = rx.var(0.0, f64)
    for j in rx.range(k):
        total += tile[(t + j) % 128] * 0.5
    with rx.if_(i < rx.size()):
        acc[i] = acc[i] + rx.where(total > 1.0, total, -total)


CONTROL_BODY = """\
extern "C" __global__ void control(const double* __restrict__ x, double* __restrict__ acc, int k, long long size)
{
    const long long rx_i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    __shared__ double rx_s0[128];
    const int v0 = (int)threadIdx.x;
    const bool v1 = rx_i < size;
    if (v1) {
        const double v2 = x[rx_i];
        rx_s0[v0] = v2;
    } else {
        rx_s0[v0] = 0.0;
    }
    __syncthreads();
    double r0 = 0.0;
    for (int j0 = 0; j0 < k; j0++) {
        const int v3 = v0 + j0;
        const int v4 = rx_mod(v3, 128);
        const double v5 = rx_s0[v4];
        const double v6 = v5 * 0.5;
        const double v7 = r0 + v6;
        r0 = v7;
    }
    const bool v8 = rx_i < size;
    if (v8) {
        const double v9 = acc[rx_i];
        const bool v10 = r0 > 1.0;
        const double v11 = -r0;
        const double v12 = v10 ? r0 : v11;
        const double v13 = v9 + v12;
        acc[rx_i] = v13;
    }
}
"""


def test_control_flow_golden_source():
    src = control.source
    assert src.endswith(CONTROL_BODY)
    assert "rx_mod" in src.split('extern "C"')[0]  # the helper it uses, and only those
    assert "rx_atomic_add" not in src and "rx_block_reduce" not in src
    assert control.ir.block_size == 128


def test_same_function_same_ir_and_source():
    def make(scale):
        def k(x: rx.In[f32], out: rx.Out[f32]):
            i = rx.thread_index()
            out[i] = rx.sin(x[i]) * scale

        return rx.compose(k)

    a, b, c = make(2.0), make(2.0), make(3.0)
    assert a.fingerprint == b.fingerprint and a.source == b.source
    assert a.fingerprint != c.fingerprint
    assert a.signature.same_layout(c.signature)  # a changed expression, same ports: Code tier


def test_fused_chain_is_one_kernel(compiler):
    def softplus(v):
        return rx.log(1.0 + rx.exp(v))

    @rx.kernel
    def chain(x: rx.In[f32], out: rx.Out[f32], a: f32, b: f32):
        i = rx.thread_index()
        v = x[i]
        for _ in range(3):  # Python range: unrolled while tracing
            v = softplus(v * a + b)
        out[i] = rx.tanh(v) * rx.sqrt(rx.abs(v))

    assert chain.source.count("__global__") == 1
    assert chain.source.count("x[rx_i]") == 1 and chain.source.count("out[rx_i] =") == 1
    ptx = chain.kernel_code(target="ptx", arch="sm_90").image.decode()
    assert list(parse_ptx(ptx)) == ["chain"]


# -- compiled by NVRTC ---------------------------------------------------------------------------------
def test_generated_code_compiles_to_ptx_with_expected_params(compiler):
    code = saxpy.kernel_code(arch="sm_90", target="ptx")
    params = parse_ptx(code.image.decode())["saxpy"]
    assert [p.ptx_type for p in params] == ["u64", "u64", "u64", "f32", "u64"]
    assert code.signature == saxpy.signature and code.origin == "<composed saxpy>"


def test_same_ir_never_compiles_twice(compiler):
    first = saxpy.kernel_code(arch="sm_90")
    again = rx.compose(saxpy.fn).kernel_code(arch="sm_90")  # traced anew, same IR
    assert again is first
    assert compiler.stats().misses == 1
    assert rx.code_cache_info()["hits"] >= 1
    rx._clear_code_memo()  # a new process: the disk cache answers
    fresh = nv.Compiler(compiler.directory)
    nv.set_default_compiler(fresh)
    assert saxpy.kernel_code(arch="sm_90").image == first.image
    assert (fresh.stats().disk_hits, fresh.stats().misses) == (1, 0)


UNARY = [
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "exp",
    "exp2",
    "exp10",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "sqrt",
    "rsqrt",
    "cbrt",
    "floor",
    "ceil",
    "trunc",
    "round",
    "erf",
    "erfc",
]


@pytest.mark.parametrize("t", [f32, f64])
def test_every_op_family_compiles(compiler, t):
    def body(x: rx.In[t], y: rx.In[t], out: rx.Out[t], flags: rx.Out[i32], hist: rx.Out[u32], s: t):
        i = rx.thread_index()
        a, b = x[i], y[i]
        v = a + b - a * b / (b + 1.0) + a // b + a % b + a**2 + a**b + -a + abs(b)
        for name in UNARY:
            v = v + getattr(rx, name)(a)
        v = v + rx.pow(a, b) + rx.atan2(a, b) + rx.fmod(a, b) + rx.hypot(a, b) + rx.copysign(a, b)
        v = v + rx.fma(a, b, s) + rx.min(a, b) + rx.max(a, s) + rx.clamp(a, 0.0, 1.0)
        c = (a < b) & ~(a >= s) | (a == b) ^ (a != 0.0)
        v = rx.where(c, v, a)
        n = rx.i32(a) // 3 + rx.i32(b) % 5 + (rx.i32(a) << 2) + (rx.i32(b) >> 1)
        flags[i] = n + rx.i32(rx.isnan(a)) + rx.i32(rx.isinf(b)) + rx.i32(rx.isfinite(v))
        rx.atomic_add(hist, rx.u32(n) % 16, 1)
        rx.atomic_max(out, 0, v)
        rx.atomic_min(out, 1, v)
        rx.reduce_add(out, v, 2)
        rx.reduce_min(out, a, 3)
        rx.reduce_max(out, b, 4)
        out[i + 5] = v + t(rx.thread_idx()) + t(rx.block_idx() * rx.block_dim() + rx.grid_dim())

    k = rx.compose(body, name=f"ops_{t.name}")
    ptx = k.kernel_code(arch="sm_90", target="ptx").image.decode()
    assert len(parse_ptx(ptx)[f"ops_{t.name}"]) == 7
    assert k.kernel_code(arch="sm_90", target="cubin").format == "cubin"


@pytest.mark.parametrize("t", [i32, i64, u32, u64, f32, f64])
def test_atomics_and_reductions_compile_for_every_type(compiler, t):
    def body(x: rx.In[t], out: rx.InOut[t]):
        i = rx.thread_index()
        rx.atomic_add(out, 0, x[i])
        rx.atomic_min(out, 1, x[i])
        rx.atomic_max(out, 2, x[i])
        rx.reduce_add(out, x[i], 3)
        rx.reduce_min(out, x[i], 4)
        rx.reduce_max(out, x[i], 5)

    rx.compose(body, name=f"red_{t.name}").kernel_code(arch="sm_90")


def test_elementwise_infers_the_output_type(compiler):
    k = rx.elementwise(lambda x, n: rx.f64(x) * n, x=rx.In[f32], n=f64)
    assert [p.describe() for p in k.signature.params] == ["f32* x (in)", "f64 n", "f64* out (out)", "i64 size"]
    two = rx.elementwise(lambda a, b: (a + b, a - b), a=rx.In[i64], b=rx.In[i64], out=("s", "d"), name="sumdiff")
    assert [p.name for p in two.signature.params] == ["a", "b", "s", "d", "size"]
    two.kernel_code(arch="sm_90")


def test_literals_adapt_and_ints_widen():
    @rx.kernel
    def k(x: rx.In[i32], y: rx.In[i64], out: rx.Out[i64], f: rx.Out[f32]):
        i = rx.thread_index()
        out[i] = x[i] + y[i] + 7  # i32 widens to i64
        f[i] = rx.f32(x[i]) * 3 + 0.25  # an int literal adapts to f32

    assert "(long long)(v0)" in k.source and "3.0f" in k.source and "7LL" in k.source


# -- errors before anything compiles -------------------------------------------------------------------
def _compose(fn, **kw):
    return rx.compose(fn, **kw)


def e_mixed(x: rx.In[f32], y: rx.In[f64], out: rx.Out[f64]):
    out[rx.thread_index()] = x[rx.thread_index()] + y[rx.thread_index()]


def e_int_div(x: rx.In[i32], out: rx.Out[i32]):
    out[rx.thread_index()] = x[rx.thread_index()] / 2


def e_sin_int(x: rx.In[i32], out: rx.Out[f32]):
    out[rx.thread_index()] = rx.sin(x[rx.thread_index()])


def e_python_if(x: rx.In[f32], out: rx.Out[f32]):
    i = rx.thread_index()
    if x[i] > 0:
        out[i] = 1.0


def e_store_input(x: rx.In[f32], out: rx.Out[f32]):
    x[rx.thread_index()] = 1.0


def e_load_output(x: rx.In[f32], out: rx.Out[f32]):
    out[rx.thread_index()] = out[rx.thread_index()]


def e_store_type(x: rx.In[f64], out: rx.Out[f32]):
    out[rx.thread_index()] = x[rx.thread_index()]


def e_float_index(x: rx.In[f32], out: rx.Out[f32]):
    out[rx.thread_index()] = x[x[0]]


def e_escape(x: rx.In[f32], out: rx.Out[f32]):
    i = rx.thread_index()
    with rx.if_(x[i] > 0.0):
        v = x[i] * 2.0
    out[i] = v


def e_loop_escape(x: rx.In[f32], out: rx.Out[f32]):
    i = rx.thread_index()
    for j in rx.range(4):
        v = x[i + j]
    out[i] = v


def e_break(x: rx.In[f32], out: rx.Out[f32]):
    for _j in rx.range(4):
        break


def e_barrier_guarded(x: rx.In[f32], out: rx.Out[f32]):
    rx.barrier()


def e_else_alone(x: rx.In[f32], out: rx.Out[f32]):
    with rx.else_():
        pass


def e_literal_range(x: rx.In[u32], out: rx.Out[u32]):
    out[rx.thread_index()] = x[rx.thread_index()] + -1


def e_float_literal_int(x: rx.In[i32], out: rx.Out[i32]):
    out[rx.thread_index()] = x[rx.thread_index()] * 0.5


def e_returns(x: rx.In[f32], out: rx.Out[f32]):
    return x[rx.thread_index()]


def e_bool_arith(x: rx.In[f32], out: rx.Out[f32]):
    c = x[0] > 1.0
    out[0] = rx.f32(c + c)


def e_where_cond(x: rx.In[f32], out: rx.Out[f32]):
    out[0] = rx.where(x[0], x[0], 1.0)


def e_reduce_index(x: rx.In[f32], out: rx.Out[f32]):
    rx.reduce_add(out, x[0], rx.thread_index())


def e_no_annotation(x, out: rx.Out[f32]):
    pass


def e_size_clash(size: rx.In[f32], out: rx.Out[f32]):
    pass


def e_reserved(v0: rx.In[f32], out: rx.Out[f32]):
    pass


def e_shared_too_big(x: rx.In[f64], out: rx.Out[f64]):
    rx.shared(f64, 10000)


def e_math_module(x: rx.In[f32], out: rx.Out[f32]):
    import math

    out[0] = math.sqrt(x[0])


@pytest.mark.parametrize(
    "fn, message",
    [
        (e_mixed, r"add \(\+\): operand types f32 and f64 differ"),
        (e_int_div, r"div \(/\): '/' on integers \(i32 and int literal 2\)"),
        (e_sin_int, "sin: needs f32 or f64, got i32"),
        (e_python_if, "no Python truth value"),
        (e_store_input, r"store: 'x' \(rx.In\[f32\]\) is an input"),
        (e_load_output, r"load: 'out' \(rx.Out\[f32\]\) is an output; declare it rx.InOut"),
        (e_store_type, "holds f32 but the value is f64"),
        (e_float_index, "an index must be an integer, got f32"),
        (e_escape, r"computed inside a 'with rx.if_\(...\)' block, which has ended"),
        (e_loop_escape, "computed inside an 'rx.range' loop, which has ended"),
        (e_break, "was never closed: 'break'"),
        (e_barrier_guarded, "guard=False"),
        (e_else_alone, r"rx.else_\(\) must directly follow"),
        (e_literal_range, "-1 does not fit u32"),
        (e_float_literal_int, "float literal 0.5"),
        (e_returns, "returns nothing"),
        (e_bool_arith, "arithmetic on bools"),
        (e_where_cond, "condition must be a bool"),
        (e_reduce_index, "index must be a non-negative Python int"),
        (e_no_annotation, "parameter 'x' has no type"),
        (e_size_clash, "clashes with the element-count parameter"),
        (e_reserved, "reserved in generated CUDA C"),
        (e_shared_too_big, "exceed the 49152 bytes"),
        (e_math_module, "use rx.f32"),
    ],
)
def test_type_errors_name_the_operation_and_types(fn, message):
    with pytest.raises(rx.ComposeError, match=message):
        _compose(fn)


def test_error_points_at_the_user_line():
    with pytest.raises(rx.ComposeError) as e:
        _compose(e_mixed)
    assert "test_compose.py" in str(e.value) and "x[rx.thread_index()] + y[rx.thread_index()]" in str(e.value)


def test_ops_outside_a_trace_are_errors():
    with pytest.raises(rx.ComposeError, match="only works inside a function traced"):
        rx.thread_index()


def test_composed_kernel_is_not_callable():
    with pytest.raises(TypeError, match="Block.from_kernel"):
        saxpy(1, 2)


def test_annotations_from_strings():
    ns = {}
    exec(  # noqa: S102 - a module with `from __future__ import annotations`
        "from __future__ import annotations\n"
        "import rxcuda.sources._compose as rx\n"
        "from rxcuda.sources._compose import f32\n"
        "def k(x: rx.In[f32], out: rx.Out[f32], s: f32 = 1.5):\n"
        "    out[rx.thread_index()] = x[rx.thread_index()] * s\n",
        ns,
    )
    k = rx.compose(ns["k"])
    assert [p.describe() for p in k.signature.params][:3] == ["f32* x (in)", "f32* out (out)", "f32 s"]


def test_params_mapping_instead_of_annotations():
    k = rx.compose(
        lambda x, out: out.__setitem__(rx.thread_index(), x[rx.thread_index()] * 2),
        params={"x": rx.In[i64], "out": rx.Out[i64]},
        name="twice",
    )
    assert k.name == "twice" and "2LL" in k.source


def test_unsigned_and_i64_literals_and_specials():
    @rx.kernel
    def k(x: rx.In[u64], out: rx.Out[u64]):
        i = rx.thread_index()
        out[i] = x[i] * 3 + (x[i] // 2) + (x[i] % 7)

    assert "3ull" in k.source and "v1 = v0 * 3ull" in k.source and "rx_floordiv" not in k.source
    assert " / 2ull;" in k.source and " % 7ull;" in k.source
