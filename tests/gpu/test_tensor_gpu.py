"""rxcuda.tensor on the CUDA backend: the CPU tests' programs on cuda against NumPy on random data, fused and
unfused giving equal results, and autograd on cuda equal to the CPU backend's."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import rxcuda.tensor as rt  # noqa: E402
from rxcuda.tensor import Passes  # noqa: E402

RTOL = {np.float32: 1e-4, np.float64: 1e-10}


@pytest.fixture(autouse=True)
def fresh():
    rt.clear_cache()
    rt.reset_stats()


def pair(rng, *shape, dtype=np.float64):
    a = rng.standard_normal(shape).astype(dtype)
    return a, rt.tensor(a, device="cuda")


def check(t, expected, dtype=np.float64):
    out = t.numpy()
    assert out.shape == expected.shape and out.dtype == expected.dtype
    np.testing.assert_allclose(out, expected, rtol=RTOL.get(dtype, 1e-10), atol=RTOL.get(dtype, 1e-10))
    unfused = t.numpy(passes=Passes.none())
    np.testing.assert_allclose(unfused, expected, rtol=RTOL.get(dtype, 1e-10), atol=RTOL.get(dtype, 1e-10))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elementwise_chains_with_broadcasting(rng, dtype):
    a, x = pair(rng, 64, 33, dtype=dtype)
    b, y = pair(rng, 33, dtype=dtype)
    c, z = pair(rng, 64, 1, dtype=dtype)
    check(rt.tanh(x * 2 + y) - rt.exp(z) / (rt.abs(x) + 1), np.tanh(a * 2 + b) - np.exp(c) / (np.abs(a) + 1), dtype)
    check(rt.where(x > y, rt.maximum(x, z), rt.sqrt(rt.abs(y))), np.where(a > b, np.maximum(a, c),
                                                                          np.sqrt(np.abs(b))), dtype)
    check(rt.sin(x) ** 2 + rt.cos(x) ** 2, np.sin(a) ** 2 + np.cos(a) ** 2, dtype)
    check(rt.log(rt.abs(x) + 1).astype(np.int32) * 3 - 1, (np.log(np.abs(a) + 1).astype(np.int32) * 3 - 1))


def test_integer_and_bool_ops(rng):
    a = rng.integers(-50, 50, (17, 9)).astype(np.int32)
    x = rt.tensor(a, device="cuda")
    check(x * x - 3 * x, a * a - 3 * a)
    check((x > 0) == (x < 10), (a > 0) == (a < 10))
    check(rt.minimum(x, 5) ** 2, np.minimum(a, 5) ** 2)
    check((x / 7).sum(axis=0), (a / 7).sum(axis=0))
    check(x.sum(axis=1), a.sum(axis=1))
    check(x.max(axis=0, keepdims=True), a.max(axis=0, keepdims=True))


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), ((0, 2), False), ((0, 2), True),
                                           (-1, True)])
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_reductions_with_axes_and_keepdims(rng, op, axis, keepdims):
    a, x = pair(rng, 7, 300, 5)
    check(getattr(x * 2 - 1, op)(axis=axis, keepdims=keepdims) + 1,
          getattr(a * 2 - 1, op)(axis=axis, keepdims=keepdims) + 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_logsumexp_layernorm(rng, dtype):
    a, x = pair(rng, 40, 1000, dtype=dtype)
    e = np.exp(a - a.max(-1, keepdims=True))
    check(rt.softmax(x, axis=-1), e / e.sum(-1, keepdims=True), dtype)
    e0 = np.exp(a - a.max(0, keepdims=True))
    check(rt.softmax(x, axis=0), e0 / e0.sum(0, keepdims=True), dtype)
    m = a.max(-1, keepdims=True)
    check(rt.logsumexp(x, axis=-1), (np.log(np.exp(a - m).sum(-1, keepdims=True)) + m)[:, 0], dtype)
    mu, var = x.mean(-1, keepdims=True), ((x - x.mean(-1, keepdims=True)) ** 2).mean(-1, keepdims=True)
    am, av = a.mean(-1, keepdims=True), ((a - a.mean(-1, keepdims=True)) ** 2).mean(-1, keepdims=True)
    check((x - mu) / rt.sqrt(var + 1e-5), (a - am) / np.sqrt(av + 1e-5), dtype)
    assert float(rt.logsumexp(rt.tensor([1000.0, 1000.0], device="cuda")).numpy()) == pytest.approx(1000.6931471805599)


def test_softmax_is_one_launch(rng):
    _, x = pair(rng, 8, 50)
    rt.softmax(x, axis=-1).realize()
    assert rt.stats().launches == 2  # the copy to the device, then one fused kernel


def test_views_and_matmul(rng):
    a, x = pair(rng, 6, 8)
    b, y = pair(rng, 8, 5)
    c, z = pair(rng, 3, 8, 5)
    check(x @ y, a @ b)
    check(x.T[::2, 1:] * 2, a.T[::2, 1:] * 2)
    check(x @ z, a @ c)
    check(x[1] @ y, a[1] @ b)
    check((x @ y).sum(axis=0), (a @ b).sum(axis=0))
    check(x.reshape(2, 24).T + 1, a.reshape(2, 24).T + 1)
    check(x[:, None, ::-1] + 1, a[:, None, ::-1] + 1)


def test_small_mlp_forward(rng):
    a, x = pair(rng, 32, 20, dtype=np.float32)
    w1, W1 = pair(rng, 20, 64, dtype=np.float32)
    b1, B1 = pair(rng, 64, dtype=np.float32)
    w2, W2 = pair(rng, 64, 10, dtype=np.float32)
    h = rt.maximum(x @ W1 + B1, 0)
    out = rt.softmax(h @ W2, axis=-1)
    ha = np.maximum(a @ w1 + b1, 0)
    logits = ha @ w2
    e = np.exp(logits - logits.max(-1, keepdims=True))
    check(out, e / e.sum(-1, keepdims=True), np.float32)


def test_results_are_cupy_and_the_cache_works(rng):
    a = rng.standard_normal((100, 10))
    x = rt.tensor(cp.asarray(a))  # a copy held on the device: writable through the tensor
    y = (x * 3).sum(axis=1)
    assert isinstance(y.cupy(), cp.ndarray) and y.device == "cuda"
    launches = rt.stats().launches
    np.testing.assert_allclose(cp.asnumpy(y.cupy()), (a * 3).sum(axis=1))
    assert rt.stats().launches == launches and rt.stats().hits >= 1  # cached
    x[0, 0] = 100.0  # a write bumps the version
    np.testing.assert_allclose(y.numpy()[0], (a[0] * 3).sum() + (100.0 - a[0, 0]) * 3)
    d = cp.asarray(a)
    t = rt.asarray(d)
    assert t.device == "cuda"
    np.testing.assert_allclose((t + 1).numpy(), a + 1)
    back = (t * 2).to("cpu")
    assert back.device == "cpu" and isinstance(back.numpy(), np.ndarray)


def test_torch_cuda_tensors_are_held(rng):
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((4, 4))
    t = rt.asarray(torch.as_tensor(a, device="cuda"))
    np.testing.assert_allclose(rt.exp(t).numpy(), np.exp(a))


def test_a_repeat_structure_compiles_nothing(rng):
    """The same structure over other data: the runnable program of the first answers (no plan, no factory
    lookup, no compile); a new shape is a factory miss; that shape's kernel is then kept by its IR."""
    from rxcuda.tensor._cuda import FACTORY

    a, x = pair(rng, 10, 10)
    np.testing.assert_allclose((rt.exp(x) + 1).numpy(), np.exp(a) + 1, rtol=1e-12)
    misses, plans = FACTORY.misses, rt.stats().plans
    b, y = pair(rng, 10, 10)
    np.testing.assert_allclose((rt.exp(y) + 1).numpy(), np.exp(b) + 1, rtol=1e-12)
    assert FACTORY.misses == misses and rt.stats().plans == plans
    c, z = pair(rng, 10, 11)
    np.testing.assert_allclose((rt.exp(z) + 1).numpy(), np.exp(c) + 1, rtol=1e-12)
    assert FACTORY.misses == misses + 1


def test_autograd_on_cuda_matches_the_cpu_backend(rng):
    a, w, b = rng.standard_normal((8, 5)), rng.standard_normal((5, 3)), rng.standard_normal(3)
    grads = {}
    for device in ("cpu", "cuda"):
        x = rt.tensor(a, device=device, requires_grad=True)
        W = rt.tensor(w, device=device, requires_grad=True)
        B = rt.tensor(b, device=device, requires_grad=True)
        logits = rt.tanh(x @ W + B)
        loss = (rt.logsumexp(logits, axis=-1) - logits.mean(axis=-1)).sum()
        loss.backward()
        grads[device] = [x.grad.numpy(), W.grad.numpy(), B.grad.numpy()]
    for g_cpu, g_cuda in zip(grads["cpu"], grads["cuda"], strict=True):
        np.testing.assert_allclose(g_cuda, g_cpu, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mlp_softmax_cross_entropy_gradients_match_torch_on_cuda(rng, dtype):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device here")
    n, d, h, k = 32, 20, 16, 5
    x0 = rng.standard_normal((n, d)).astype(dtype)
    w1, b1 = (rng.standard_normal((d, h)) / np.sqrt(d)).astype(dtype), (0.1 * rng.standard_normal(h)).astype(dtype)
    w2, b2 = (rng.standard_normal((h, k)) / np.sqrt(h)).astype(dtype), (0.1 * rng.standard_normal(k)).astype(dtype)
    labels = rng.integers(0, k, n)
    onehot = np.eye(k, dtype=dtype)[labels]

    params = [rt.tensor(p, device="cuda", requires_grad=True) for p in (w1, b1, w2, b2)]
    W1, B1, W2, B2 = params
    x, y = rt.tensor(x0, device="cuda"), rt.tensor(onehot, device="cuda")
    z = rt.maximum(x @ W1 + B1, 0.0) @ W2 + B2
    m = z.max(axis=1, keepdims=True).detach()
    logp = z - m - rt.log(rt.exp(z - m).sum(axis=1, keepdims=True))
    loss = -(logp * y).sum() / float(n)
    loss.backward()

    dev = torch.device("cuda")
    tp = [torch.tensor(p, device=dev, requires_grad=True) for p in (w1, b1, w2, b2)]
    tz = torch.relu(torch.tensor(x0, device=dev) @ tp[0] + tp[1]) @ tp[2] + tp[3]
    tloss = torch.nn.functional.cross_entropy(tz, torch.tensor(labels, device=dev))
    tloss.backward()

    tol = RTOL[dtype] * (10 if dtype == np.float32 else 1)
    np.testing.assert_allclose(loss.numpy(), tloss.detach().cpu().numpy(), rtol=tol, atol=tol)
    for p, t in zip(params, tp, strict=True):
        assert p.grad.device == "cuda"
        np.testing.assert_allclose(p.grad.numpy(), t.grad.cpu().numpy(), rtol=tol, atol=tol)
    with rt.no_grad():
        stepped = [p - 0.1 * p.grad for p in params]
    assert not any(s.requires_grad for s in stepped)
    assert all(s.device == "cuda" for s in stepped)
