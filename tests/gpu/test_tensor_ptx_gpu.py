"""The PTX kernels of rxcuda/tensor/_ptx.py on a GPU: every op and dtype they cover against NumPy on fresh random
inputs (bit for bit where NumPy's result is exactly rounded) and against the NVRTC kernel of the same group,
with the factory's counters showing which path compiled each; float32 exp/log accuracy in ulps over a million
values plus special values; broadcast, strided and per-row operands; reductions; and launches of the same
kernels with grids and blocks other than the launch shape's (they must be right for any)."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import rxcuda.tensor as rt  # noqa: E402
from rxcuda.tensor import _codegen as cg  # noqa: E402
from rxcuda.tensor import _cuda, _factory, _ir  # noqa: E402

F32 = np.float32
INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


@pytest.fixture(autouse=True)
def fresh():
    rt.clear_cache()
    rt._PROGRAMS.clear()
    yield
    rt._PROGRAMS.clear()


def evaluate(monkeypatch, build, ptx):
    """The results (NumPy arrays) of the program ``build()`` makes, run on cuda through a fresh kernel factory
    (PTX where covered, or NVRTC only); and that factory."""
    factory = _factory.KernelFactory(ptx=ptx)
    monkeypatch.setattr(_cuda, "FACTORY", factory)
    rt.clear_cache()
    rt._PROGRAMS.clear()  # a repeat of a program structure would reuse the other factory's kernel
    out = build()
    outs = out if isinstance(out, tuple) else (out,)
    rt.realize(*outs)
    return [t.numpy() for t in outs], factory


def both(monkeypatch, build, every: bool = True):
    """(PTX results, NVRTC results) of ``build()``; asserts every kernel of the first run was PTX (``every``;
    else at least one, the rest NVRTC's: a group with an op PTX lacks, such as float64 exp) and of the second
    NVRTC, so the comparison is between the two compilers."""
    ptx, f1 = evaluate(monkeypatch, build, True)
    if every:
        assert f1.misses >= 1 and f1.ptx_misses == f1.misses and f1.nvrtc_misses == 0, "the PTX path was not taken"
    else:
        assert f1.ptx_misses >= 1 and f1.ptx_misses + f1.nvrtc_misses == f1.misses, "the PTX path was not taken"
    nvrtc, f2 = evaluate(monkeypatch, build, False)
    assert f2.nvrtc_misses == f2.misses >= 1 and f2.ptx_misses == 0
    return ptx, nvrtc


def dev(a):
    return rt.tensor(a, device="cuda")


def exact(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if got.dtype.kind == "f":
        same = (got.view(f"u{got.itemsize}") == want.view(f"u{want.itemsize}")) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{(~same).sum()} differ, e.g. got {got[~same][:4]} want {want[~same][:4]}"
    else:
        np.testing.assert_array_equal(got, want)


def ulps(a, b):
    """Distance in float32 steps (0 for two NaNs)."""
    def ordered(v):
        i = v.astype(F32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return np.where(np.isnan(a) & np.isnan(b), 0, np.abs(ordered(a) - ordered(b)))


def floats(rng, shape, dtype):
    """Random floats of both signs over several binades (never all zeros)."""
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(dtype)


# -- elementwise, float ---------------------------------------------------------------------------------------
FLOAT_OPS = {
    "add": (lambda x, y: x + y, np.add), "sub": (lambda x, y: x - y, np.subtract),
    "mul": (lambda x, y: x * y, np.multiply), "div": (lambda x, y: x / y, np.divide),
    "maximum": (rt.maximum, np.maximum), "minimum": (rt.minimum, np.minimum),
    "neg": (lambda x, y: -x, lambda a, b: -a), "abs": (lambda x, y: abs(x), lambda a, b: np.abs(a)),
    "sqrt": (lambda x, y: rt.sqrt(abs(x)), lambda a, b: np.sqrt(np.abs(a))),
    "where": (lambda x, y: rt.where(x > y, x, y * 2), lambda a, b: np.where(a > b, a, b * 2)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op", list(FLOAT_OPS))
def test_float_ops_are_exact(monkeypatch, rng, op, dtype):
    """One op per kernel: PTX, NVRTC and NumPy agree bit for bit (IEEE add/mul/div/sqrt, NaN-propagating
    maximum/minimum), with broadcasting and NaNs, infinities, zeros and denormals mixed in."""
    a, b = floats(rng, (300, 257), dtype), floats(rng, (257,), dtype)
    a.flat[rng.integers(0, a.size, 40)] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e38]), 40)
    b[rng.integers(0, b.size, 5)] = rng.choice(np.array([np.nan, 0.0, -0.0, np.inf]), 5)
    f, g = FLOAT_OPS[op]
    (ptx,), (nvrtc,) = both(monkeypatch, lambda: f(dev(a), dev(b)))
    with np.errstate(all="ignore"):
        want = g(a, b)
    if op in ("maximum", "minimum"):  # NumPy's choice between +0 and -0 is its own: compare values there
        zeros = (ptx == 0) & (want == 0)
        ptx, nvrtc, want = (np.where(zeros, 0, v).astype(dtype) for v in (ptx, nvrtc, want))
    exact(ptx, want)
    exact(ptx, nvrtc)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_comparisons_and_casts_of_floats(monkeypatch, rng, dtype):
    a, b = floats(rng, (64, 130), dtype), floats(rng, (64, 130), dtype)
    b[:, :10] = a[:, :10]
    a[0, :6] = [np.nan, 0.0, -0.0, np.inf, -np.inf, 1e-40]

    def build():
        x, y = dev(a), dev(b)
        return (x == y, x != y, x < y, x <= y, x > y, x >= y, x.astype(bool), (x * 10).astype(np.int32),
                abs(x * 50).astype(np.uint8), x.astype(np.float32 if dtype == np.float64 else np.float64))

    ptx, nvrtc = both(monkeypatch, build)
    with np.errstate(all="ignore"):
        finite = np.isfinite(a)
        want = [a == b, a != b, a < b, a <= b, a > b, a >= b, a.astype(bool),
                np.where(finite, a * 10, 0).astype(np.int32), np.where(finite, np.abs(a * 50), 0).astype(np.uint8),
                a.astype(np.float32 if dtype == np.float64 else np.float64)]
    for k, (p, n, w) in enumerate(zip(ptx, nvrtc, want, strict=True)):
        if k in (7, 8):  # float -> int of inf/NaN is undefined in C++: compare where finite and in range
            ok = finite & (np.abs(a * (10 if k == 7 else 50)) < (2**31 if k == 7 else 256))
            p, n, w = p[ok], n[ok], w[ok]
        exact(p, w)
        exact(n, w)


# -- elementwise, integers and bools --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", INTS)
def test_integer_ops_wrap_like_numpy(monkeypatch, rng, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (50, 77), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (77,), dtype=dtype, endpoint=True)
    a[0, :3] = [info.min, info.max, 0]

    def build():
        x, y = dev(a), dev(b)
        return (x + y, x - y, x * y, -x, abs(x), rt.maximum(x, y), rt.minimum(x, y), x == y, x < y, x >= y,
                rt.where(x > y, x, y), x.astype(np.float64), x.astype(np.int8), x.astype(np.uint32),
                x.astype(bool), x * 3 - 1)

    ptx, nvrtc = both(monkeypatch, build)
    with np.errstate(all="ignore"):
        want = [a + b, a - b, a * b, -a, np.abs(a), np.maximum(a, b), np.minimum(a, b), a == b, a < b, a >= b,
                np.where(a > b, a, b), a.astype(np.float64), a.astype(np.int8), a.astype(np.uint32),
                a.astype(bool), a * dtype(3) - dtype(1)]
    for p, n, w in zip(ptx, nvrtc, want, strict=True):
        exact(p, w)
        exact(n, w)


def test_mixed_integer_and_float_operands(monkeypatch, rng):
    a = rng.integers(-1000, 1000, (40, 33)).astype(np.int32)
    b = rng.integers(0, 2**32, (33,), dtype=np.uint32)
    c = floats(rng, (40, 1), np.float32)
    d = rng.integers(-(2**40), 2**40, (40, 33), dtype=np.int64)

    def build():
        x, y, z, w = dev(a), dev(b), dev(c), dev(d)
        return x + z, x / y, x < y, w == y, (w > 0) + (x < 0), x * 2.5, y - z

    ptx, nvrtc = both(monkeypatch, build)
    want = [a + c, a / b, a < b, d == b, (d > 0) + (a < 0), a * 2.5, b - c]
    for p, n, w in zip(ptx, nvrtc, want, strict=True):
        exact(p, w)
        exact(n, w)


def test_bool_ops(monkeypatch, rng):
    a, b = rng.random((30, 41)) > 0.5, rng.random((41,)) > 0.3
    f = floats(rng, (30, 41), np.float32)

    def build():
        x, y, z = dev(a), dev(b), dev(f)
        return (x + y, x * y, rt.maximum(x, y), rt.minimum(x, y), x == y, x != y, x < y, x >= y, abs(x),
                rt.where(x, y, z > 0), rt.where(x, z, -z), x.astype(np.float32), x.astype(np.int64), x + 1)

    ptx, nvrtc = both(monkeypatch, build)
    want = [a + b, a * b, np.maximum(a, b), np.minimum(a, b), a == b, a != b, a < b, a >= b, np.abs(a),
            np.where(a, b, f > 0), np.where(a, f, -f), a.astype(np.float32), a.astype(np.int64), a + 1]
    for p, n, w in zip(ptx, nvrtc, want, strict=True):
        exact(p, w)
        exact(n, w)


def test_a_chain_of_ops_matches_numpy_and_nvrtc(monkeypatch, rng):
    """A long fused chain: PTX rounds every op like NumPy (no FMA contraction) so it equals NumPy exactly;
    NVRTC may contract a * b + c into one FMA, so it is compared with a tolerance."""
    a, b, c = floats(rng, (128, 300), F32), floats(rng, (300,), F32), floats(rng, (128, 1), F32)

    def build():
        x, y, z = dev(a), dev(b), dev(c)
        return rt.maximum(((x * 1.5 + y) - x / 3.0) * (z + 2.0), -x) + abs(y - 0.5) * rt.sqrt(abs(z))

    (ptx,), (nvrtc,) = both(monkeypatch, build)
    want = (np.maximum(((a * F32(1.5) + b) - a / F32(3.0)) * (c + F32(2.0)), -a)
            + np.abs(b - F32(0.5)) * np.sqrt(np.abs(c)))
    exact(ptx, want)
    np.testing.assert_allclose(nvrtc, want, rtol=1e-5, atol=1e-5)


# -- float32 exp, log, tanh -------------------------------------------------------------------------------------
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1e-45, -1e-45, 1e-40, 1.1754944e-38,
                    88.72283, 88.7229, 89.0, 1e30, -87.33655, -103.97208, -103.98, -104.0, -1e30, 3.4028235e38,
                    0.5, 2.0, 1e-8], F32)


def _math(monkeypatch, f, x):
    (ptx,), (nvrtc,) = both(monkeypatch, lambda: f(dev(x)))
    return ptx, nvrtc


def test_exp_f32_within_2_ulp_over_a_million_values(monkeypatch, rng):
    x = np.concatenate([rng.uniform(-104, 89, 600_000), rng.uniform(-1, 1, 200_000), rng.uniform(-105, -85, 100_000),
                        rng.uniform(85, 90, 100_000), SPECIAL]).astype(F32)
    ptx, nvrtc = _math(monkeypatch, rt.exp, x)
    with np.errstate(all="ignore"):
        want = np.exp(x.astype(np.float64)).astype(F32)
    assert np.array_equal(np.isnan(ptx), np.isnan(want))
    u = ulps(ptx, want)
    assert u.max() <= 2, f"exp({x[np.argmax(u)]!r}) = {ptx[np.argmax(u)]!r}, want {want[np.argmax(u)]!r}"
    s = ptx[-len(SPECIAL):]
    assert s[0] == 1 and s[2] == np.inf and s[3] == 0 and np.isnan(s[4]) and s[7] == 1
    assert np.array_equal(np.isnan(nvrtc), np.isnan(ptx)) and ulps(ptx, nvrtc).max() <= 4  # CUDA's expf: 2 ulp


def test_log_f32_within_2_ulp_over_a_million_values(monkeypatch, rng):
    positive = rng.integers(1, 0x7F800000, 700_000, dtype=np.uint32).view(F32)  # every binade, denormals too
    x = np.concatenate([positive, rng.uniform(0.5, 2, 200_000).astype(F32),
                        -rng.uniform(0, 10, 100_000).astype(F32), SPECIAL])
    ptx, nvrtc = _math(monkeypatch, rt.log, x)
    with np.errstate(all="ignore"):
        want = np.log(x.astype(np.float64)).astype(F32)
    assert np.array_equal(np.isnan(ptx), np.isnan(want))
    u = ulps(ptx, want)
    assert u.max() <= 2, f"log({x[np.argmax(u)]!r}) = {ptx[np.argmax(u)]!r}, want {want[np.argmax(u)]!r}"
    s = ptx[-len(SPECIAL):]
    assert s[0] == -np.inf and s[1] == -np.inf and s[2] == np.inf and np.isnan(s[3]) and np.isnan(s[6])
    assert np.isfinite(s[7]) and s[5] == 0
    assert ulps(ptx, nvrtc).max() <= 1  # the same sequence as CUDA's logf


def test_tanh_f32_is_cudas(monkeypatch, rng):
    x = np.concatenate([rng.uniform(-10, 10, 300_000), rng.uniform(-0.7, 0.7, 300_000), SPECIAL]).astype(F32)
    ptx, nvrtc = _math(monkeypatch, rt.tanh, x)
    with np.errstate(all="ignore"):
        want = np.tanh(x.astype(np.float64)).astype(F32)
    assert np.array_equal(np.isnan(ptx), np.isnan(want))
    assert ulps(ptx, want).max() <= 2
    assert ulps(ptx, nvrtc).max() <= 1  # the same sequence as CUDA's tanhf


@pytest.mark.parametrize("divisor", [3.0, 1.0001, -7.3, 0.1, 1e-3, 2.0 ** -120, 1e30, 1e35])
def test_nvrtc_divides_by_a_scalar_within_one_step_of_ieee(monkeypatch, rng, divisor):
    """The C++ kernels divide by a scalar as ``x * RN(1/s)`` (``rx_div_s``): within one float32 step of NumPy's
    correctly rounded ``x / s`` over a million values of every binade, infinities and NaNs where NumPy has them."""
    x = np.concatenate([floats(rng, 1_000_000, F32), rng.integers(1, 0x7F800000, 200_000, dtype=np.uint32).view(F32),
                        SPECIAL])
    (got,), factory = evaluate(monkeypatch, lambda: dev(x) / divisor, False)
    assert factory.nvrtc_misses == factory.misses == 1
    with np.errstate(all="ignore"):
        want = x / F32(divisor)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    u = ulps(got, want)
    assert u.max() <= 1, f"{x[np.argmax(u)]!r} / {divisor} = {got[np.argmax(u)]!r}, want {want[np.argmax(u)]!r}"


@pytest.mark.parametrize("divisor", [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3e38, -2e38])
def test_nvrtc_divides_by_a_scalar_whose_reciprocal_is_not_normal_as_ieee(monkeypatch, rng, divisor):
    x = np.concatenate([floats(rng, 100_000, F32), SPECIAL])
    (got,), _ = evaluate(monkeypatch, lambda: dev(x) / divisor, False)
    with np.errstate(all="ignore"):
        want = x / F32(divisor)
    exact(got, want)


def test_exp_log_tanh_in_a_chain(monkeypatch, rng):
    a, b = floats(rng, (64, 500), F32), floats(rng, (500,), F32)

    def build():
        x, y = dev(a), dev(b)
        return rt.tanh(rt.exp(-abs(x * 1.5 + y)) * 0.5 - rt.log(rt.sqrt(x * x + 1.0)) / 3.0)

    (ptx,), (nvrtc,) = both(monkeypatch, build)
    want = np.tanh(np.exp(-np.abs(a * F32(1.5) + b)) * F32(0.5) - np.log(np.sqrt(a * a + F32(1))) / F32(3))
    np.testing.assert_allclose(ptx, want, rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(nvrtc, want, rtol=2e-6, atol=2e-7)


# -- layouts: broadcast, strided views, per-row outputs --------------------------------------------------------
def test_broadcast_strided_and_per_row_operands(monkeypatch, rng):
    a, b, c = floats(rng, (64, 33), F32), floats(rng, (33,), F32), floats(rng, (64, 1), F32)
    t = floats(rng, (33, 64), np.float64)
    r = floats(rng, (301,), F32)

    def build():
        x, y, z, xt, v = dev(a), dev(b), dev(c), dev(t), dev(r)
        row = z + 1.0  # (64, 1): a per-row value, also an output of the row kernel
        return x * row - y, row, xt.T + x, v[::-3] * 2.0, x[::2, 1::3] + z[::2]

    ptx, nvrtc = both(monkeypatch, build)
    row = c + F32(1)
    want = [a * row - b, row, t.T + a, r[::-3] * F32(2), a[::2, 1::3] + c[::2]]
    for p, n, w in zip(ptx, nvrtc, want, strict=True):
        exact(p, w)
        np.testing.assert_allclose(n, w, rtol=1e-6)


# -- reductions -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7, 300, 5), (4096, 10), (64, 20000), (3, 1)])
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_reductions(monkeypatch, rng, op, shape):
    a = floats(rng, shape, np.float64)
    axes = [None, 0, -1, (0, len(shape) - 1)]

    def build():
        x = dev(a)
        return tuple(getattr(x * 2 - 1, op)(axis=ax, keepdims=k) + 1 for ax in axes for k in (False, True))

    ptx, nvrtc = both(monkeypatch, build)
    for (ax, k), p, n in zip([(ax, k) for ax in axes for k in (False, True)], ptx, nvrtc, strict=True):
        want = getattr(a * 2 - 1, op)(axis=ax, keepdims=k) + 1
        np.testing.assert_allclose(p, want, rtol=1e-10, atol=1e-8, err_msg=f"{op} axis={ax} keepdims={k}")
        np.testing.assert_allclose(p, n, rtol=1e-10, atol=1e-8)


@pytest.mark.parametrize("rows, cols", [(4096, 10), (500, 257), (64, 4096), (8, 30000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_logsumexp_layernorm(monkeypatch, rng, rows, cols, dtype):
    a = floats(rng, (rows, cols), dtype)
    rtol, atol = (1e-4, 1e-5) if dtype == np.float32 else (1e-10, 1e-12)

    def build():
        x = dev(a)
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) * (x - mu)).mean(-1, keepdims=True)
        return rt.softmax(x, axis=-1), rt.logsumexp(x, axis=-1), (x - mu) / rt.sqrt(var + 1e-5)

    ptx, nvrtc = both(monkeypatch, build, every=dtype == np.float32)  # float64 exp goes to NVRTC
    e = np.exp(a - a.max(-1, keepdims=True))
    m = a.max(-1, keepdims=True)
    am = a.mean(-1, keepdims=True)
    av = ((a - am) * (a - am)).mean(-1, keepdims=True)
    want = [e / e.sum(-1, keepdims=True), (np.log(np.exp(a - m).sum(-1, keepdims=True)) + m)[:, 0],
            (a - am) / np.sqrt(av + dtype(1e-5))]
    for p, n, w in zip(ptx, nvrtc, want, strict=True):
        np.testing.assert_allclose(p, w, rtol=rtol, atol=atol)
        np.testing.assert_allclose(p, n, rtol=rtol, atol=atol)


def test_integer_and_bool_reductions(monkeypatch, rng):
    a = rng.integers(-50, 50, (300, 40)).astype(np.int32)
    u = rng.integers(0, 255, (40, 300)).astype(np.uint8)
    f = floats(rng, (300, 40), F32)

    def build():
        x, y, z = dev(a), dev(u), dev(f)
        return (x.sum(axis=1), x.max(axis=0), x.min(axis=1, keepdims=True), x.mean(axis=1), y.max(axis=1),
                y.sum(axis=0), (z > 0).max(axis=1), (z > 0).min(axis=1), (z > -3).min(axis=0), (z > 0).sum(axis=1),
                (x * 3 > 1).sum(axis=1), rt.where(z > 0.5, z, -z).min(axis=-1))

    ptx, nvrtc = both(monkeypatch, build)
    want = [a.sum(axis=1), a.max(axis=0), a.min(axis=1, keepdims=True), a.mean(axis=1), u.max(axis=1), u.sum(axis=0),
            (f > 0).max(axis=1), (f > 0).min(axis=1), (f > -3).min(axis=0), (f > 0).sum(axis=1),
            (a * 3 > 1).sum(axis=1), np.where(f > 0.5, f, -f).min(axis=-1)]
    for p, n, w in zip(ptx, nvrtc, want, strict=True):
        if w.dtype.kind == "f":
            np.testing.assert_allclose(p, w, rtol=1e-12)
            np.testing.assert_allclose(n, w, rtol=1e-12)
        else:
            exact(p, w)
            exact(n, w)


# -- any grid, any block ---------------------------------------------------------------------------------------
def _group_of(y):
    p, _ = rt._program([y.node], None, False)
    (g,) = [g for g in p.groups if g.kind in ("elementwise", "reduce")]
    be = _cuda.backend(y.node)
    values = [be.leaf_value(n) for n in g.inputs]
    ir = _ir.group_ir(g, p, [v if isinstance(v, _cuda._Fill) else be.array(v) for v in values])
    args = [(np.uint8(bool(n.attrs[0])) if n.dtype == np.bool_ else n.dtype.type(n.attrs[0]))
            if isinstance(v, _cuda._Fill) else v for n, v in zip(g.inputs, values, strict=True)]
    return g, ir, args


@pytest.mark.parametrize("program", [
    lambda x: rt.exp(x * 0.5) / 3.0 + x,                     # elementwise
    lambda x: rt.softmax(x, axis=-1),                        # rows across a block, or lanes of a warp
    lambda x: x.max(axis=0),                                 # strided reduced axis
    lambda x: (x > 0).min(axis=1),                           # a bool reduction
    lambda x: x.astype(np.float64).sum(-1),                  # a float64 reduction
])
@pytest.mark.parametrize("shape", [(37, 1000), (1000, 9)])
def test_any_grid_and_block_size_is_right(rng, program, shape):
    """The kernel the factory made for the launch shape, launched with other grids and blocks (one thread, a
    partial warp, odd block sizes, 1024 threads, more blocks than work): the same results."""
    a = floats(rng, shape, F32)
    y = program(rt.asarray(cp.asarray(a)))
    g, ir, args = _group_of(y)
    factory = _factory.KernelFactory()
    kernel = factory.get(ir)
    assert factory.ptx_misses == 1
    module = cp.cuda.function.Module()
    module.load(kernel.code.image)
    function = module.get_function(kernel.code.entry)
    want = program(rt.tensor(a)).numpy()  # the CPU backend: NumPy
    for blocks, threads in [cg.launch_shape(ir), (1, 1), (1, 32), (3, 100), (2, 33), (7, 1024), (5000, 64),
                            (1, 1000)]:
        outs = [cp.full(n.shape, 7, n.dtype) for n in g.outputs]
        function((blocks,), (threads,), (*args, *outs))
        cp.cuda.runtime.deviceSynchronize()
        got = outs[0].get()
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=f"grid {blocks}, block {threads}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=f"grid {blocks}, block {threads}")
