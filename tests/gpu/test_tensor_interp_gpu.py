"""The tensor interpreter (rxcuda/tensor/_interp.py) on a GPU: every op it covers, in float32 and float64, against
NumPy on fresh random inputs (bit for bit where the operation is exactly rounded), special values (NaN, inf,
division by zero), several outputs, the factory's counters showing the interpreter answered each miss, the tuned
build replacing it with the same results, a group it does not cover taking PTX, and a traced function."""

import math

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import rxcuda.tensor as rt  # noqa: E402
from rxcuda.tensor import _cuda, _factory  # noqa: E402


@pytest.fixture
def factory(monkeypatch):
    """A fresh process factory that interprets, its interpreter built before the first miss."""
    f = _factory.KernelFactory(upgrade=True, interpret=True)
    assert f.interpreter(wait=True) is not None, "the interpreter did not build"
    monkeypatch.setattr(_cuda, "FACTORY", f)
    rt.clear_cache()
    rt._PROGRAMS.clear()
    yield f
    f.wait(120)
    rt._PROGRAMS.clear()


@pytest.fixture
def rng():
    return np.random.default_rng()


def dev(a):
    return rt.tensor(a, device="cuda")


def run(*ys):
    rt.realize(*ys)
    return [y.numpy() for y in ys]


def test_the_benchmark_expression_is_interpreted_and_right(factory, rng):
    x = rng.standard_normal((7, 1 + int(rng.integers(1000, 5000)))).astype(np.float32)
    (got,) = run(rt.exp(dev(x) * 1.5 + 0.25) / 3.0)
    want = np.exp(x * np.float32(1.5) + np.float32(0.25)) / np.float32(3.0)
    assert factory.interp_misses == factory.misses == 1 and factory.ptx_misses == 0
    np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exactly_rounded_ops_match_numpy_bit_for_bit(factory, rng, dtype):
    shape = (3, 5, int(rng.integers(50, 300)))
    x, y, z = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    s = dtype(rng.uniform(0.5, 4.0))
    ys = [dev(x) + dev(y) * dev(z) - dev(x) / dev(y), rt.maximum(dev(x), dev(y)) - rt.minimum(dev(y), dev(z)) * s,
          rt.sqrt(abs(dev(x))) + (-dev(z)), rt.where(dev(x) > dev(y), dev(x), dev(z) * 2.0)]
    got = [run(y)[0] for y in ys]
    want = [x + y * z - x / y, np.maximum(x, y) - np.minimum(y, z) * s, np.sqrt(np.abs(x)) + (-z),
            np.where(x > y, x, z * dtype(2.0))]
    assert factory.interp_misses == factory.misses == len(ys) and factory.ptx_misses == factory.nvrtc_misses == 0
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 2e-6), (np.float64, 1e-13)])
def test_math_functions_match_numpy(factory, rng, dtype, rtol):
    x = rng.uniform(-3, 3, int(rng.integers(10_000, 40_000))).astype(dtype)
    p = rng.uniform(0.1, 3, x.size).astype(dtype)
    fns = [(rt.exp, np.exp), (rt.sin, np.sin), (rt.cos, np.cos), (rt.tanh, np.tanh)]
    for f, g in fns:
        (got,) = run(f(dev(x)) * 2.0)
        np.testing.assert_allclose(got, g(x) * dtype(2.0), rtol=rtol, atol=rtol, err_msg=f.__name__)
    (got,) = run(rt.log(dev(p)) + dev(p) ** dev(x))
    np.testing.assert_allclose(got, np.log(p) + p ** x, rtol=rtol * 4, atol=rtol)
    assert factory.interp_misses == factory.misses == len(fns) + 1


def test_special_values_follow_numpy(factory):
    x = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3.0], np.float32)
    y = np.array([0.0, 1.0, np.nan, 0.0, 2.0, np.inf, 1.0, -0.0], np.float32)
    with np.errstate(all="ignore"):
        want = [x / y, np.maximum(x, y), np.minimum(x, y), np.where(x >= y, x, y), x / np.float32(0.0)]
        got = [run(e)[0] for e in (dev(x) / dev(y), rt.maximum(dev(x), dev(y)), rt.minimum(dev(x), dev(y)),
                                   rt.where(dev(x) >= dev(y), dev(x), dev(y)), dev(x) / 0.0)]
    assert factory.interp_misses == factory.misses == 5
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_two_outputs_of_one_group(factory, rng):
    x, y = (rng.standard_normal((64, 129)).astype(np.float32) for _ in range(2))
    t = dev(x) * dev(y)
    a, b = t + 1.0, t * 3.0
    got_a, got_b = run(a, b)
    np.testing.assert_array_equal(got_a, x * y + np.float32(1.0))
    np.testing.assert_array_equal(got_b, x * y * np.float32(3.0))
    assert factory.interp_misses >= 1 and factory.ptx_misses == factory.nvrtc_misses == 0


def test_the_tuned_build_replaces_it_with_the_same_results(factory, rng):
    x = rng.standard_normal((33, 257)).astype(np.float32)
    results = []
    for _ in range(2):  # the interpreter twice: the second launch starts the tuned build
        results.append(run(rt.exp(dev(x) * 0.5) - dev(x) / 7.0)[0])
    (kernel,) = factory._kernels.values()
    assert kernel.interp is not None
    assert factory.wait(120) == 0
    results.append(run(rt.exp(dev(x) * 0.5) - dev(x) / 7.0)[0])  # swaps in the tuned build
    assert kernel.interp is None and factory.upgrades == 1 and kernel.failed is None
    want = np.exp(x * np.float32(0.5)) - x / np.float32(7.0)
    for r in results:
        np.testing.assert_allclose(r, want, rtol=3e-7, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_broadcast_transposed_and_reversed_inputs(factory, rng, dtype):
    x = rng.standard_normal((6, 50, 37)).astype(dtype)
    row, col = rng.standard_normal(37).astype(dtype), rng.standard_normal((50, 1)).astype(dtype)
    t = rng.standard_normal((37, 50)).astype(dtype)
    dx, dt = cp.asarray(x), cp.asarray(t)
    views = [rt.asarray(dx[:, ::-1, :]), rt.asarray(dt.T), rt.asarray(dx[::2, :, 1:30:3])]
    got = [run(views[0] * dev(row) + dev(col))[0], run(views[1] - dev(col) * 3.0)[0],
           run(rt.maximum(views[2], dev(row)[1:30:3]))[0]]
    want = [x[:, ::-1, :] * row + col, t.T - col * dtype(3.0), np.maximum(x[::2, :, 1:30:3], row[1:30:3])]
    assert factory.interp_misses == factory.misses and factory.ptx_misses == factory.nvrtc_misses == 0
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_group_it_does_not_cover_takes_ptx(factory, rng):
    x = rng.standard_normal((16, 40)).astype(np.float32)
    (got,) = run(rt.sum(rt.exp(dev(x)), axis=1))
    np.testing.assert_allclose(got, np.exp(x).sum(axis=1), rtol=2e-6)
    assert factory.ptx_misses == 1 and factory.interp_misses == 0


def test_a_traced_function_replays_the_tuned_kernel(factory, rng):
    @rt.function
    def f(a, b):
        return rt.tanh(a * 2.0 + b) / 3.0

    for _ in range(3):
        a, b = (rng.standard_normal((128, 300)).astype(np.float32) for _ in range(2))
        got = f(dev(a), dev(b)).numpy()
        np.testing.assert_allclose(got, np.tanh(a * np.float32(2.0) + b) / np.float32(3.0), rtol=3e-7, atol=1e-7)
    assert factory.interp_misses >= 1 and all(k.interp is None for k in factory._kernels.values())


def test_the_process_factory_interprets():
    assert _cuda.FACTORY.interpret and _cuda.FACTORY.interpreter(wait=True) is not None
    rng = np.random.default_rng()
    shape = (5, 100_003 + 2 * int(rng.integers(0, 100_000)))  # a shape no other test uses: a new IR, a miss
    x = rng.standard_normal(math.prod(shape)).astype(np.float32).reshape(shape)
    before = _cuda.FACTORY.interp_misses
    (got,) = run(dev(x) * 1.25 - 0.5)
    np.testing.assert_array_equal(got, x * np.float32(1.25) - np.float32(0.5))
    assert _cuda.FACTORY.interp_misses == before + 1
