"""rt.function on CUDA: each signature captured into one CUDA graph and replayed (rxcuda/tensor/_replay.py),
checked against NumPy and PyTorch on fresh random data: a repeat call is one graph launch, the outputs of an
earlier call stay valid, new buffers get their own graph, a changing batch size traces (and captures) once per
size, matmuls through cuBLAS under capture, and a training step (forward, backward, SGD with momentum or Adam)
matches PyTorch's gradients and updated weights."""

import time

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import rxcuda.tensor as rt  # noqa: E402


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _dev(a) -> rt.Tensor:
    return rt.tensor(cp.asarray(a))


def test_a_repeat_call_is_one_graph_launch_and_matches_numpy(rng):
    f = rt.function(lambda x, b: rt.softmax(x * 2.0 + b, axis=-1))
    a = rng.standard_normal((64, 300)).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    x, bias = _dev(a), _dev(b)
    np.testing.assert_allclose(f(x, bias).numpy(), _softmax(a * 2 + b), rtol=1e-5, atol=1e-7)
    assert (f.stats.traces, f.stats.captures, f.stats.graph_launches) == (1, 1, 1)
    before = rt.stats().launches
    for _ in range(5):
        a = rng.standard_normal((64, 300)).astype(np.float32)
        x[...] = cp.asarray(a)  # new data in the bound buffer: the same graph
        np.testing.assert_allclose(f(x, bias).numpy(), _softmax(a * 2 + b), rtol=1e-5, atol=1e-7)
    assert rt.stats().launches - before == 5  # one graph launch a call, no kernel launched one by one
    assert (f.stats.traces, f.stats.captures, f.stats.graph_launches, f.stats.replays) == (1, 1, 6, 5)
    trace = next(iter(f._traces.values()))
    (graph,) = trace.replay.graphs.values()
    assert graph.graph.launches == 6


def test_outputs_of_an_earlier_call_stay_valid(rng):
    f = rt.function(lambda x: rt.exp(x) - 1.0)
    a1, a2 = rng.standard_normal(1000), rng.standard_normal(1000)
    x = _dev(a1)
    y1 = f(x)
    x[...] = cp.asarray(a2)
    y2 = f(x)  # the replay writes the graph's output buffer: y1 got its own copy first
    np.testing.assert_allclose(y1.numpy(), np.exp(a1) - 1, rtol=1e-12)
    np.testing.assert_allclose(y2.numpy(), np.exp(a2) - 1, rtol=1e-12)
    assert f.stats.captures == 1


def test_new_buffers_get_their_own_graph(rng):
    f = rt.function(lambda x: (x * x).sum(axis=0))
    a, c = rng.standard_normal((50, 7)), rng.standard_normal((50, 7))
    xa, xc = _dev(a), _dev(c)
    np.testing.assert_allclose(f(xa).numpy(), (a * a).sum(0), rtol=1e-12)
    np.testing.assert_allclose(f(xc).numpy(), (c * c).sum(0), rtol=1e-12)
    np.testing.assert_allclose(f(xa).numpy(), (a * a).sum(0), rtol=1e-12)
    assert (f.stats.traces, f.stats.captures, f.stats.graph_launches) == (1, 2, 3)


def test_a_changing_batch_size_traces_once_per_size(rng):
    w = _dev(rng.standard_normal((16, 4)).astype(np.float32))
    f = rt.function(lambda x: rt.softmax(x @ w, axis=-1))
    wn = w.numpy()
    xs = {n: _dev(rng.standard_normal((n, 16)).astype(np.float32)) for n in (8, 32)}
    for n in (8, 32, 8, 32, 8):
        np.testing.assert_allclose(f(xs[n]).numpy(), _softmax(xs[n].numpy() @ wn), rtol=1e-4, atol=1e-6)
    assert f.stats.traces == 2 and f.stats.captures == 2 and f.stats.graph_launches == 5
    assert sorted(s[0][0] for s in f.signatures) == [(8, 16), (32, 16)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matmuls_under_capture_match_numpy(rng, dtype):
    a = rng.standard_normal((3, 20, 12)).astype(dtype)
    m = rng.standard_normal((20, 12)).astype(dtype)
    w = rng.standard_normal((12, 9)).astype(dtype)
    v = rng.standard_normal(12).astype(dtype)

    @rt.function
    def f(a, m, w, v):
        return a @ w, m.T @ m, m @ w.T.T, v @ w, m @ v, (m @ w).T @ m

    outs = f(_dev(a), _dev(m), _dev(w), _dev(v))
    want = (a @ w, m.T @ m, m @ w, v @ w, m @ v, (m @ w).T @ m)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for got, ref in zip(outs, want, strict=True):
        np.testing.assert_allclose(got.numpy(), ref, rtol=tol, atol=tol)
    assert f.stats.captures == 1


def test_new_ops_inside_a_graph(rng):
    a = rng.integers(-20, 20, size=(6, 5))
    b = rng.standard_normal((6, 5))

    @rt.function
    def f(a, b):
        return a // 3, a % 4, rt.argmax(b, axis=1), rt.cumsum(b, axis=0), rt.concatenate([b, b * 2], 1), \
            rt.std(b, axis=0), rt.prod(b, axis=1), rt.clip(b, -0.5, 0.5)

    outs = f(_dev(a), _dev(b))
    want = (a // 3, a % 4, b.argmax(1), np.cumsum(b, 0), np.concatenate([b, b * 2], 1), b.std(0), b.prod(1),
            np.clip(b, -0.5, 0.5))
    for got, ref in zip(outs, want, strict=True):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-12, atol=1e-12)


def test_torch_tensors_as_arguments(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device here")
    a = rng.standard_normal((10, 10)).astype(np.float32)
    t = torch.as_tensor(a, device="cuda")
    f = rt.function(lambda x: rt.tanh(x) * 2.0)
    for _ in range(2):
        np.testing.assert_allclose(f(rt.asarray(t)).numpy(), np.tanh(a) * 2, rtol=1e-6, atol=1e-6)
    assert f.stats.captures == 1


def test_host_cost_of_a_repeat_call_is_small(rng):
    x = _dev(rng.standard_normal(256).astype(np.float32))
    f = rt.function(lambda x: x * 2.0 + 1.0)
    f(x)
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        f(x)
        times.append(time.perf_counter() - t0)
    cp.cuda.Device().synchronize()
    assert f.stats.captures == 1
    assert np.median(times) < 200e-6, f"median host cost {np.median(times) * 1e6:.1f} us"  # target: 20 (bench)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_training_step_matches_torch(rng, kind):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch has no CUDA device here")
    n, d, h, k = 64, 32, 48, 10
    x0 = rng.standard_normal((n, d)).astype(np.float32)
    labels = rng.integers(0, k, n)
    onehot = np.eye(k, dtype=np.float32)[labels]
    init = [(rng.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32), (0.1 * rng.standard_normal(h)).astype(
        np.float32), (rng.standard_normal((h, k)) / np.sqrt(h)).astype(np.float32),
        (0.1 * rng.standard_normal(k)).astype(np.float32)]

    params = [rt.tensor(cp.asarray(p), requires_grad=True) for p in init]
    # Adam's eps of 1e-3 (both sides): with 1e-8 a gradient within float noise of 0 would flip a whole step
    opt = rt.SGD(params, lr=0.1, momentum=0.9) if kind == "sgd" else rt.Adam(params, lr=0.01, eps=1e-3)

    @rt.function
    def step(x, y):
        w1, b1, w2, b2 = params
        z = rt.maximum(x @ w1 + b1, 0.0) @ w2 + b2
        loss = (rt.logsumexp(z, axis=1) - (z * y).sum(axis=1)).mean()
        grads = rt.grad(loss, params)
        opt.step(grads)
        return loss, grads

    dev = torch.device("cuda")
    tp = [torch.tensor(p, device=dev, requires_grad=True) for p in init]
    topt = torch.optim.SGD(tp, lr=0.1, momentum=0.9) if kind == "sgd" else torch.optim.Adam(tp, lr=0.01, eps=1e-3)
    tx, tl = torch.tensor(x0, device=dev), torch.tensor(labels, device=dev)
    x, y = _dev(x0), _dev(onehot)
    losses = []
    for _ in range(4):
        loss, grads = step(x, y)
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(torch.relu(tx @ tp[0] + tp[1]) @ tp[2] + tp[3], tl)
        tloss.backward()
        topt.step()
        np.testing.assert_allclose(float(loss), tloss.item(), rtol=1e-4, atol=1e-5)
        for g, t in zip(grads, tp, strict=True):
            np.testing.assert_allclose(g.numpy(), t.grad.cpu().numpy(), rtol=1e-3, atol=1e-5)
        for p, t in zip(params, tp, strict=True):
            np.testing.assert_allclose(p.numpy(), t.detach().cpu().numpy(), rtol=1e-3, atol=1e-5)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    assert step.stats.traces == 1 and step.stats.captures == 1 and step.stats.graph_launches == 4


def test_graphs_off_replays_kernel_by_kernel(rng):
    a = rng.standard_normal((30, 20))
    f = rt.function(lambda x: rt.softmax(x @ x.T, axis=-1), graphs=False)
    for _ in range(2):
        np.testing.assert_allclose(f(_dev(a)).numpy(), _softmax(a @ a.T), rtol=1e-10, atol=1e-12)
    assert (f.stats.traces, f.stats.replays, f.stats.captures, f.stats.graph_launches) == (1, 1, 0, 0)


def test_a_host_copy_inside_is_refused_before_capture(rng):
    x = _dev(rng.standard_normal(3))
    f = rt.function(lambda t: t + rt.tensor(np.ones(3), device="cuda"))
    with pytest.raises(rt.CaptureError, match=r"copies a const \(3,\) from cpu to cuda"):
        f(x)
    g = rt.function(lambda t: t + rt.tensor(np.ones(3), device="cuda"), graphs=False)
    np.testing.assert_allclose(g(x).numpy(), x.numpy() + 1)


def test_host_data_moved_to_cuda_settles_on_the_device_for_the_optimizer(rng):
    w0 = rng.standard_normal((5, 1))
    xs, ys = rng.standard_normal((16, 5)), rng.standard_normal((16, 1))
    w = rt.tensor(w0, device="cuda", requires_grad=True)  # host data moved at each evaluation ...
    opt = rt.SGD([w], lr=0.1)  # ... until the optimizer puts it on the device for good
    assert w.node.op == "const" and w.device == "cuda" and w.requires_grad

    @rt.function
    def step(x, y):
        loss = ((x @ w - y) ** 2).mean()
        opt.step(rt.grad(loss, [w]))
        return loss

    ref = w0.copy()
    x, y = _dev(xs), _dev(ys)
    for _ in range(3):
        loss = step(x, y)
        np.testing.assert_allclose(float(loss), ((xs @ ref - ys) ** 2).mean(), rtol=1e-10)
        ref = ref - 0.1 * (2 * xs.T @ (xs @ ref - ys) / ys.size)
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-10, atol=1e-12)
    assert step.stats.captures == 1
