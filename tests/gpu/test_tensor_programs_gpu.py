"""rxcuda.tensor's runnable programs on the CUDA backend: a program traced again over new CuPy arrays reuses its
plan and its loaded kernels (``stats().plans``) and matches NumPy every time; a new layout (a transposed array)
gets its own program; a training step on cuda plans once and its gradients equal the CPU backend's."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import rxcuda.tensor as rt  # noqa: E402


@pytest.fixture(autouse=True)
def fresh():
    rt.clear_cache()
    rt.reset_stats()


def test_repeats_over_new_arrays_reuse_the_program_and_match_numpy(rng):
    for _ in range(6):
        a = rng.standard_normal((33, 70)).astype(np.float32)
        b = rng.standard_normal(70).astype(np.float32)
        y = rt.softmax(rt.asarray(cp.asarray(a)) * 1.5 + rt.asarray(cp.asarray(b)), axis=-1)
        z = a * np.float32(1.5) + b
        e = np.exp(z - z.max(-1, keepdims=True))
        np.testing.assert_allclose(cp.asnumpy(y.cupy()), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
    s = rt.stats()
    assert s.plans == 1 and s.evaluations == 6


def test_a_transposed_input_gets_its_own_program(rng):
    a = rng.standard_normal((40, 24))
    outs = []
    for arr in (cp.asarray(a), cp.asarray(np.ascontiguousarray(a.T)).T, cp.asarray(a)):
        outs.append(cp.asnumpy((rt.exp(rt.asarray(arr)) - 1).sum(axis=0).cupy()))
    for out in outs:
        np.testing.assert_allclose(out, (np.exp(a) - 1).sum(axis=0), rtol=1e-12)
    assert rt.stats().plans == 2  # C order, then the transposed layout; the third is a repeat of the first


def test_a_training_step_plans_once_on_cuda_and_matches_the_cpu_backend(rng):
    w1, w2 = rng.standard_normal((12, 16)) / 4, rng.standard_normal((16, 5)) / 4
    dev = [rt.tensor(cp.asarray(p), requires_grad=True) for p in (w1, w2)]
    host = [rt.tensor(p, requires_grad=True) for p in (w1, w2)]

    def step(x, y, params, wrap):
        W1, W2 = params
        z = rt.maximum(wrap(x) @ W1, 0.0) @ W2
        m = z.max(axis=1, keepdims=True).detach()
        logp = z - m - rt.log(rt.exp(z - m).sum(axis=1, keepdims=True))
        loss = -(logp * wrap(y)).sum() / float(len(x))
        grads = rt.grad(loss, params)
        rt.realize(loss, *grads)
        return [loss, *grads]

    plans = []
    for _ in range(4):
        x = rng.standard_normal((9, 12))
        y = np.eye(5)[rng.integers(0, 5, 9)]
        on_gpu = step(cp.asarray(x), cp.asarray(y), dev, rt.asarray)
        plans.append(rt.stats().plans)
        on_cpu = step(x, y, host, rt.asarray)
        for g, c in zip(on_gpu, on_cpu, strict=True):
            np.testing.assert_allclose(cp.asnumpy(g.cupy()), c.numpy(), rtol=1e-10, atol=1e-12)
    assert plans[1] == plans[-1]  # later steps plan nothing new on either backend
