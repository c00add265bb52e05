"""Composed kernels on a GPU, against NumPy on fresh random inputs (never zeros), fp32 and fp64.

Kernels are launched directly with cuda.core (one launch per check), so these tests depend on the
compose/NVRTC layers only; the last test runs a composition inside an Engine and swaps it in place.
"""

import math

import numpy as np
import pytest


def _device():
    try:
        from cuda.core import Device

        dev = Device(0)
        dev.set_current()
        return dev, ""
    except Exception as e:  # no driver (cuda.pathfinder DynamicLibNotFoundError), no device, driver refused
        return None, f"{type(e).__name__}: {e}"


DEV, WHY = _device()
if DEV is None:
    pytest.skip(f"needs a CUDA device: {WHY}", allow_module_level=True)

import cupy as cp  # noqa: E402
from cuda.core import LaunchConfig, ObjectCode, launch  # noqa: E402

import rxcuda.sources._compose as rx  # noqa: E402
from rxcuda.sources._compose import f32, f64, i32, u32  # noqa: E402

ARCH = "sm_" + "".join(str(v) for v in DEV.compute_capability)
STREAM = DEV.create_stream()
TOL = {"f32": dict(rtol=2e-6 * 8, atol=1e-6), "f64": dict(rtol=1e-13, atol=1e-15)}
# sums of several terms can cancel to near zero: bound the absolute error by the terms' size instead
SUM_TOL = {"f32": dict(rtol=2e-6 * 8, atol=1e-4), "f64": dict(rtol=1e-13, atol=1e-12)}
NP = {"f32": np.float32, "f64": np.float64}


def run(kernel, n, block=None, threads=None, **args):
    """Launch a composed kernel over ``n`` elements with ``threads`` threads (default ``n``); arrays (CuPy)
    are updated in place."""
    code = kernel.kernel_code(arch=ARCH)
    fn = ObjectCode.from_cubin(code.image).get_kernel(code.entry)
    values = []
    for p in code.signature.params:
        if p.is_pointer:
            values.append(args[p.name].data.ptr)
        elif p.name == kernel.ir.size_param:
            values.append(np.int64(n))
        else:
            dtype = np.dtype(
                {
                    "f32": np.float32,
                    "f64": np.float64,
                    "i32": np.int32,
                    "i64": np.int64,
                    "u32": np.uint32,
                    "u64": np.uint64,
                }[p.dtype]
            )
            values.append(dtype.type(args.get(p.name, p.default)))
    bs = block or code.block_size
    cp.cuda.Device().synchronize()
    launch(STREAM, LaunchConfig(grid=max(1, -(-(n if threads is None else threads) // bs)), block=bs), fn, *values)
    STREAM.sync()


@pytest.fixture
def rng():
    return np.random.default_rng()


def nonzero(rng, n, dtype, lo=0.5, hi=2.0, signed=True):
    v = rng.uniform(lo, hi, n)
    if signed:
        v *= rng.choice([-1.0, 1.0], n)
    return v.astype(dtype)


# -- elementwise families ------------------------------------------------------------------------------
@pytest.mark.parametrize("t", ["f32", "f64"])
def test_arithmetic(rng, t):
    T = rx.DType(t)

    @rx.kernel
    def arith(x: rx.In[T], y: rx.In[T], out: rx.Out[T], a: T = 1.5):
        i = rx.thread_index()
        u, v = x[i], y[i]
        out[i] = a * u + v - u / v + u**3 - -v * abs(u) + abs(u) ** 0.5

    n = 100_003
    x, y = nonzero(rng, n, NP[t]), nonzero(rng, n, NP[t])
    out = cp.empty(n, NP[t])
    run(arith, n, x=cp.asarray(x), y=cp.asarray(y), out=out, a=1.25)
    xd, yd = x.astype(np.float64), y.astype(np.float64)
    want = 1.25 * xd + yd - xd / yd + xd**3 + yd * np.abs(xd) + np.abs(xd) ** 0.5
    np.testing.assert_allclose(out.get(), want, **SUM_TOL[t])


@pytest.mark.parametrize("t", ["f32", "f64", "i32"])
def test_python_floor_division_and_modulo(rng, t):
    T = rx.DType(t)

    @rx.kernel
    def divmod_(x: rx.In[T], y: rx.In[T], q: rx.Out[T], r: rx.Out[T]):
        i = rx.thread_index()
        q[i] = x[i] // y[i]
        r[i] = x[i] % y[i]

    n = 50_001
    if t == "i32":
        x = rng.integers(-1000, 1000, n).astype(np.int32)
        y = rng.integers(1, 50, n).astype(np.int32) * rng.choice([-1, 1], n).astype(np.int32)
        want_q, want_r = x // y, x % y
    else:
        x, y = nonzero(rng, n, NP[t], 0.5, 20.0), nonzero(rng, n, NP[t])
        want_q, want_r = np.floor(x / y), np.mod(x, y)
    q, r = cp.empty(n, x.dtype), cp.empty(n, x.dtype)
    run(divmod_, n, x=cp.asarray(x), y=cp.asarray(y), q=q, r=r)
    np.testing.assert_array_equal(q.get(), want_q)
    if t == "i32":
        np.testing.assert_array_equal(r.get(), want_r)
    else:
        np.testing.assert_allclose(r.get(), want_r, **TOL[t])


_ERF = np.vectorize(math.erf)
_ERFC = np.vectorize(math.erfc)
UNARY = {  # name: (numpy reference, domain)
    "sin": (np.sin, (-3, 3)),
    "cos": (np.cos, (-3, 3)),
    "tan": (np.tan, (-1, 1)),
    "asin": (np.arcsin, (-0.9, 0.9)),
    "acos": (np.arccos, (-0.9, 0.9)),
    "atan": (np.arctan, (-5, 5)),
    "sinh": (np.sinh, (-3, 3)),
    "cosh": (np.cosh, (-3, 3)),
    "tanh": (np.tanh, (-3, 3)),
    "asinh": (np.arcsinh, (-5, 5)),
    "acosh": (np.arccosh, (1.5, 5)),
    "atanh": (np.arctanh, (-0.9, 0.9)),
    "exp": (np.exp, (-5, 5)),
    "exp2": (np.exp2, (-5, 5)),
    "exp10": (lambda v: 10.0**v, (-3, 3)),
    "expm1": (np.expm1, (-2, 2)),
    "log": (np.log, (0.1, 10)),
    "log2": (np.log2, (0.1, 10)),
    "log10": (np.log10, (0.1, 10)),
    "log1p": (np.log1p, (0.1, 10)),
    "sqrt": (np.sqrt, (0.1, 10)),
    "rsqrt": (lambda v: 1 / np.sqrt(v), (0.1, 10)),
    "cbrt": (np.cbrt, (-10, 10)),
    "floor": (np.floor, (-10, 10)),
    "ceil": (np.ceil, (-10, 10)),
    "trunc": (np.trunc, (-10, 10)),
    "round": (np.rint, (-10, 10)),
    "erf": (_ERF, (-2, 2)),
    "erfc": (_ERFC, (-2, 2)),
}


@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_math_functions(rng, t, name):
    T = rx.DType(t)
    fn = getattr(rx, name)

    @rx.kernel(name=f"math_{name}")
    def k(x: rx.In[T], out: rx.Out[T]):
        i = rx.thread_index()
        out[i] = fn(x[i])

    ref, (lo, hi) = UNARY[name]
    n = 4099
    x = rng.uniform(lo, hi, n).astype(NP[t])
    x[x == 0] = NP[t](0.25)
    out = cp.empty(n, NP[t])
    run(k, n, x=cp.asarray(x), out=out)
    want = ref(x.astype(np.float64))
    tol = dict(TOL[t])
    if t == "f32":
        tol["atol"] = 2e-6 * max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(out.get(), want, **tol)


@pytest.mark.parametrize("t", ["f32", "f64"])
def test_binary_math_min_max_clamp_fma(rng, t):
    T = rx.DType(t)

    @rx.kernel
    def k2(x: rx.In[T], y: rx.In[T], out: rx.Out[T], s: T = 0.75):
        i = rx.thread_index()
        u, v = x[i], y[i]
        out[i] = (
            rx.atan2(u, v)
            + rx.fmod(u, v)
            + rx.hypot(u, v)
            + rx.copysign(u, v)
            + rx.pow(abs(u), v)
            + rx.fma(u, v, s)
            + rx.min(u, v) * 2.0
            + rx.max(u, v) * 3.0
            + rx.clamp(u, -1.0, s)
        )

    n = 30_011
    x, y = nonzero(rng, n, NP[t]), nonzero(rng, n, NP[t])
    out = cp.empty(n, NP[t])
    run(k2, n, x=cp.asarray(x), y=cp.asarray(y), out=out, s=0.5)
    u, v = x.astype(np.float64), y.astype(np.float64)
    want = (
        np.arctan2(u, v)
        + np.fmod(u, v)
        + np.hypot(u, v)
        + np.copysign(u, v)
        + np.abs(u) ** v
        + (u * v + 0.5)
        + np.minimum(u, v) * 2
        + np.maximum(u, v) * 3
        + np.clip(u, -1.0, 0.5)
    )
    np.testing.assert_allclose(out.get(), want, rtol=SUM_TOL[t]["rtol"] * 4, atol=SUM_TOL[t]["atol"])


def test_comparisons_select_logic_bits_and_casts(rng):
    @rx.kernel
    def logic(
        x: rx.In[f32],
        y: rx.In[f64],
        k: rx.In[i32],
        sel: rx.Out[f32],
        bits: rx.Out[i32],
        conv: rx.Out[f64],
        u: rx.Out[u32],
        s: f32 = 0.25,
    ):
        i = rx.thread_index()
        a, b, m = x[i], rx.f32(y[i]), k[i]
        c = ((a < b) & ~(a >= s)) | (a == b) | ((a != s) ^ (b > 1.0))
        sel[i] = rx.where(c, a, b)
        bits[i] = (m << 3) ^ (m >> 1) | (m & 0xF0) + rx.i32(a > b)
        conv[i] = rx.f64(rx.i32(a * 10.0)) + rx.f64(m) + y[i]
        u[i] = rx.u32(rx.abs(m)) * 3 + 7

    n = 65_537
    x, y = nonzero(rng, n, np.float32), nonzero(rng, n, np.float64)
    k = rng.integers(-1000, 1000, n).astype(np.int32)
    sel, bits, conv, u = cp.empty(n, np.float32), cp.empty(n, np.int32), cp.empty(n, np.float64), cp.empty(n, np.uint32)
    run(logic, n, x=cp.asarray(x), y=cp.asarray(y), k=cp.asarray(k), sel=sel, bits=bits, conv=conv, u=u)
    b = y.astype(np.float32)
    c = ((x < b) & ~(x >= 0.25)) | (x == b) | ((x != 0.25) ^ (b > 1.0))
    np.testing.assert_array_equal(sel.get(), np.where(c, x, b))
    np.testing.assert_array_equal(bits.get(), (k << 3) ^ (k >> 1) | ((k & 0xF0) + (x > b).astype(np.int32)))
    np.testing.assert_allclose(conv.get(), np.trunc(x * np.float32(10)).astype(np.int32) + k + y, rtol=1e-15)
    np.testing.assert_array_equal(u.get(), np.abs(k).astype(np.uint32) * 3 + 7)


def test_loads_and_stores_with_indexing(rng):
    @rx.kernel
    def gather_scatter(
        x: rx.In[f64], idx: rx.In[i32], perm: rx.In[i32], g: rx.Out[f64], r: rx.Out[f64], s: rx.Out[f64]
    ):
        i = rx.thread_index()
        g[i] = x[idx[i]]
        r[i] = x[rx.size() - 1 - i]
        s[perm[i]] = x[i] * 2.0

    n = 10_007
    x = nonzero(rng, n, np.float64)
    idx = rng.integers(0, n, n).astype(np.int32)
    perm = rng.permutation(n).astype(np.int32)
    g, r, s = (cp.empty(n, np.float64) for _ in range(3))
    run(gather_scatter, n, x=cp.asarray(x), idx=cp.asarray(idx), perm=cp.asarray(perm), g=g, r=r, s=s)
    np.testing.assert_array_equal(g.get(), x[idx])
    np.testing.assert_array_equal(r.get(), x[::-1])
    want = np.empty(n)
    want[perm] = x * 2.0
    np.testing.assert_array_equal(s.get(), want)


def test_thread_and_block_indices():
    @rx.kernel(block_size=96)
    def ids(gi: rx.Out[i32], bi: rx.Out[i32], ti: rx.Out[i32], dims: rx.Out[i32]):
        i = rx.thread_index()
        gi[i] = rx.block_idx() * rx.block_dim() + rx.thread_idx()
        bi[i] = rx.block_idx()
        ti[i] = rx.thread_idx()
        dims[i] = rx.grid_dim() * 1000 + rx.block_dim()

    n = 1000
    gi, bi, ti, dims = (cp.empty(n, np.int32) for _ in range(4))
    run(ids, n, gi=gi, bi=bi, ti=ti, dims=dims)
    ar = np.arange(n)
    np.testing.assert_array_equal(gi.get(), ar)
    np.testing.assert_array_equal(bi.get(), ar // 96)
    np.testing.assert_array_equal(ti.get(), ar % 96)
    assert set(dims.get().tolist()) == {11 * 1000 + 96}


@pytest.mark.parametrize("t", ["f32", "f64"])
def test_if_else_var_and_loop(rng, t):
    T = rx.DType(t)

    @rx.kernel
    def poly(x: rx.In[T], out: rx.Out[T], k: i32 = 5):
        i = rx.thread_index()
        v = x[i]
        acc = rx.var(0.0, T)
        p = rx.var(1.0, T)
        for _j in rx.range(k):
            acc += p
            p *= v
        with rx.if_(v > 0.0):
            out[i] = acc
        with rx.else_():
            with rx.if_(v < -1.0):
                out[i] = -acc
            with rx.else_():
                out[i] = acc * 2.0

    n = 20_000
    x = nonzero(rng, n, NP[t])
    out = cp.empty(n, NP[t])
    run(poly, n, x=cp.asarray(x), out=out, k=6)
    xd = x.astype(np.float64)
    acc = sum(xd**j for j in range(6))
    want = np.where(xd > 0, acc, np.where(xd < -1, -acc, 2 * acc))
    np.testing.assert_allclose(out.get(), want, rtol=SUM_TOL[t]["rtol"] * 4, atol=SUM_TOL[t]["atol"])


def test_shared_memory_and_barrier(rng):
    bs = 128

    @rx.kernel(guard=False, block_size=bs)
    def block_reverse(x: rx.In[f32], out: rx.Out[f32]):
        i = rx.thread_index()
        t = rx.thread_idx()
        tile = rx.shared(f32, bs)
        with rx.if_(i < rx.size()):
            tile[t] = x[i]
        with rx.else_():
            tile[t] = 0.0
        rx.barrier()
        with rx.if_(i < rx.size()):
            out[i] = tile[bs - 1 - t]

    n = 1000  # not a multiple of the block size
    x = nonzero(rng, n, np.float32)
    out = cp.empty(n, np.float32)
    run(block_reverse, n, x=cp.asarray(x), out=out)
    padded = np.zeros(-(-n // bs) * bs, np.float32)
    padded[:n] = x
    want = padded.reshape(-1, bs)[:, ::-1].reshape(-1)[:n]
    np.testing.assert_array_equal(out.get(), want)


# -- atomics and reductions ----------------------------------------------------------------------------
def test_atomics(rng):
    @rx.kernel
    def hist(x: rx.In[f32], k: rx.In[i32], counts: rx.Out[u32], sums: rx.Out[f64], lo: rx.Out[f32], hi: rx.Out[i32]):
        i = rx.thread_index()
        b = k[i] % 64
        rx.atomic_add(counts, b, 1)
        rx.atomic_add(sums, b, rx.f64(x[i]))
        rx.atomic_min(lo, b, x[i])
        rx.atomic_max(hi, b, k[i])

    n = 200_003
    x = nonzero(rng, n, np.float32)
    k = rng.integers(0, 10_000, n).astype(np.int32)
    counts = cp.zeros(64, np.uint32)
    sums = cp.zeros(64, np.float64)
    lo = cp.full(64, np.inf, np.float32)
    hi = cp.full(64, -(2**31), np.int32)
    run(hist, n, x=cp.asarray(x), k=cp.asarray(k), counts=counts, sums=sums, lo=lo, hi=hi)
    b = k % 64
    np.testing.assert_array_equal(counts.get(), np.bincount(b, minlength=64))
    want = np.zeros(64)
    np.add.at(want, b, x.astype(np.float64))
    np.testing.assert_allclose(sums.get(), want, rtol=1e-12)
    w_lo = np.full(64, np.inf, np.float32)
    np.minimum.at(w_lo, b, x)
    np.testing.assert_array_equal(lo.get(), w_lo)
    w_hi = np.full(64, -(2**31), np.int32)
    np.maximum.at(w_hi, b, k)
    np.testing.assert_array_equal(hi.get(), w_hi)


@pytest.mark.parametrize("t", ["f32", "f64", "i32"])
@pytest.mark.parametrize("n", [1, 31, 257, 1000, 100_003, 1_048_583])
@pytest.mark.parametrize("block", [256, 100])
def test_reductions_at_non_power_of_two_sizes(rng, t, n, block):
    T = rx.DType(t)

    @rx.kernel(name=f"reduce_{t}", block_size=block)
    def red(x: rx.In[T], total: rx.InOut[T], lo: rx.InOut[T], hi: rx.InOut[T]):
        i = rx.thread_index()
        rx.reduce_add(total, x[i])
        rx.reduce_min(lo, x[i])
        rx.reduce_max(hi, x[i])

    if t == "i32":
        x = rng.integers(-1000, 1000, n).astype(np.int32)
        x[x == 0] = 7
        big, small = np.iinfo(np.int32).max, np.iinfo(np.int32).min
    else:
        x = nonzero(rng, n, NP[t])
        big, small = np.inf, -np.inf
    dt = x.dtype
    total, lo, hi = cp.zeros(1, dt), cp.full(1, big, dt), cp.full(1, small, dt)
    run(red, n, x=cp.asarray(x), total=total, lo=lo, hi=hi)
    assert lo.get()[0] == x.min() and hi.get()[0] == x.max()
    want = x.astype(np.float64).sum()
    if t == "i32":
        assert total.get()[0] == want
    else:
        bound = (1e-5 if t == "f32" else 1e-12) * np.abs(x.astype(np.float64)).sum()
        assert abs(float(total.get()[0]) - want) <= bound


@pytest.mark.parametrize("items", [0.5, 1, 2, 3, 4])
def test_elementwise_kernels_cover_every_element_from_size_to_size_over_4_threads(rng, items):
    @rx.kernel
    def axpy_sum(x: rx.In[f32], y: rx.In[f32], out: rx.Out[f32], total: rx.InOut[f64], a: f32 = 3.0):
        i = rx.thread_index()
        out[i] = a * x[i] + y[i]
        rx.reduce_add(total, rx.f64(x[i]))

    assert axpy_sum.items_per_thread == 4
    n = 100_003
    x, y = nonzero(rng, n, np.float32), nonzero(rng, n, np.float32)
    out, total = cp.full(n, np.nan, np.float32), cp.zeros(1, np.float64)
    threads = int(np.ceil(n / items))  # items < 1: more threads than elements
    run(axpy_sum, n, threads=threads, x=cp.asarray(x), y=cp.asarray(y), out=out, total=total, a=-0.5)
    np.testing.assert_allclose(out.get(), -0.5 * x.astype(np.float64) + y, rtol=1e-6, atol=1e-6)
    assert abs(total.get()[0] - x.astype(np.float64).sum()) <= 1e-9 * np.abs(x).sum()


def test_fused_elementwise_chain(rng):
    def step(v, a, b):
        return rx.tanh(v * a + b)

    chain = rx.elementwise(
        lambda x, a, b: step(step(step(x, a, b), a, b), a, b) * rx.exp(x), x=rx.In[f32], a=f32, b=f32, name="chain3"
    )
    assert chain.source.count("__global__") == 1
    n = 1 << 20
    x = nonzero(rng, n, np.float32)
    out = cp.empty(n, np.float32)
    run(chain, n, x=cp.asarray(x), out=out, a=0.7, b=-0.2)
    v = x.astype(np.float64)
    for _ in range(3):
        v = np.tanh(v * 0.7 - 0.2)
    np.testing.assert_allclose(out.get(), v * np.exp(x.astype(np.float64)), rtol=1e-5, atol=1e-5)


# -- in a running pipeline -----------------------------------------------------------------------------
def test_changed_composition_swaps_in_place_in_a_running_engine(rng):
    rxcuda = pytest.importorskip("rxcuda")

    def make(expr):
        def k(x: rx.In[f32], y: rx.In[f32], out: rx.Out[f32], a: f32 = 2.0):
            i = rx.thread_index()
            out[i] = expr(x[i], y[i], a)

        return rx.compose(k, name="blend")

    first = make(lambda x, y, a: a * x + y)
    second = make(lambda x, y, a: rx.sin(x) * a - y)
    assert first.signature.same_layout(second.signature)
    n = 50_001
    x, y = nonzero(rng, n, np.float32), nonzero(rng, n, np.float32)
    with rxcuda.Engine() as engine:
        block = engine.add(rxcuda.Block.from_kernel(first.kernel_code(arch=ARCH), size=n))
        engine.write(block["x"], x)
        engine.write(block["y"], y)
        engine.tick()
        np.testing.assert_allclose(engine.read(block["out"]), 2 * x + y, rtol=1e-6)
        for _ in range(3):
            engine.tick()
        assert block.set_code(None, second.kernel_code(arch=ARCH)) == "code"
        frame = engine.tick()
        assert "code" in frame.tiers and "structure" not in frame.tiers
        np.testing.assert_allclose(
            engine.read(block["out"]), np.sin(x.astype(np.float64)) * 2 - y, rtol=1e-5, atol=1e-5
        )
