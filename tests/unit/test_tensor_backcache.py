"""Backward graphs replayed by structure (rxcuda/tensor/_backcache.py): the second walk over a forward graph of
the same structure makes the same gradient graph from the template, and gives the rules' numbers; anything the
walk depends on (which tensors want a gradient, detach, the sharing of nodes, a seed) changes the signature."""

import numpy as np
import pytest

import rxcuda.tensor as rt
from rxcuda.tensor import _backcache


@pytest.fixture(autouse=True)
def fresh():
    _backcache._TEMPLATES.clear()
    rt.clear_cache()


@pytest.fixture
def rng():
    return np.random.default_rng(77)


def loss_of(x, w, b, detach=False):
    z = rt.tanh(rt.asarray(x) @ w + b)
    m = z.max(axis=1, keepdims=True)
    if detach:
        m = m.detach()
    return (rt.exp(z - m).sum(axis=1) ** 2).mean()


def walk_without_templates(loss, params):
    saved = dict(_backcache._TEMPLATES)
    _backcache._TEMPLATES.clear()
    try:
        return rt.grad(loss, params)
    finally:
        _backcache._TEMPLATES.clear()
        _backcache._TEMPLATES.update(saved)


@pytest.mark.parametrize("detach", [False, True])
def test_a_replayed_gradient_equals_the_walk(rng, detach):
    w = rt.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    b = rt.tensor(rng.standard_normal(3), requires_grad=True)
    rt.grad(loss_of(rng.standard_normal((5, 4)), w, b, detach), [w, b])  # records the template
    assert len(_backcache._TEMPLATES) == 1
    for _ in range(3):
        x = rng.standard_normal((5, 4))
        replayed = rt.grad(loss_of(x, w, b, detach), [w, b])
        walked = walk_without_templates(loss_of(x, w, b, detach), [w, b])
        for r, k in zip(replayed, walked, strict=True):
            assert r.shape == k.shape and r.dtype == k.dtype
            np.testing.assert_allclose(r.numpy(), k.numpy(), rtol=1e-13)
    assert len(_backcache._TEMPLATES) == 1


def test_what_the_walk_depends_on_is_in_the_signature(rng):
    w = rt.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    b = rt.tensor(rng.standard_normal(3), requires_grad=True)
    x = rng.standard_normal((5, 4))
    gw, = rt.grad(loss_of(x, w, b), [w])
    gw2, = rt.grad(loss_of(x, w, b, detach=True), [w])       # detach stops a path: another walk
    gwb = rt.grad(loss_of(x, w, b), [w, b])                   # the first walk's template (it reached b too)
    assert len(_backcache._TEMPLATES) == 2
    np.testing.assert_allclose(gw.numpy(), gwb[0].numpy(), rtol=1e-13)
    np.testing.assert_allclose(gwb[1].numpy(), walk_without_templates(loss_of(x, w, b), [b])[0].numpy(),
                               rtol=1e-13)
    h = rt.asarray(x) @ w                                      # an intermediate asked for: wanted, another walk
    rt.grad((rt.tanh(h + b) ** 2).sum(), [h])
    assert len(_backcache._TEMPLATES) == 3
    walked = walk_without_templates(loss_of(x, w, b, detach=True), [w])[0]
    np.testing.assert_allclose(gw2.numpy(), walked.numpy(), rtol=1e-13)


def test_sharing_is_part_of_the_signature(rng):
    w = rt.tensor(rng.standard_normal(3), requires_grad=True)
    shared = rt.exp(w)
    one = (shared * shared).sum()                  # one exp node used twice
    two = (rt.exp(w) * rt.exp(w)).sum()           # two exp nodes of the same structure
    (g1,) = rt.grad(one, [w])
    (g2,) = rt.grad(two, [w])
    assert len(_backcache._TEMPLATES) == 2
    expected = 2 * np.exp(2 * w.numpy())
    np.testing.assert_allclose(g1.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(g2.numpy(), expected, rtol=1e-12)


def test_a_seed_is_never_replayed(rng):
    w = rt.tensor(rng.standard_normal(3), requires_grad=True)
    y = w * 2.0
    for seed in ([1.0, 0.0, 1.0], [0.0, 5.0, 0.0]):
        (g,) = rt.grad(y, [w], gradient=np.array(seed))
        np.testing.assert_array_equal(g.numpy(), 2 * np.array(seed))
    assert len(_backcache._TEMPLATES) == 0


def test_backward_accumulates_through_replays(rng):
    w = rt.tensor(rng.standard_normal(3), requires_grad=True)
    for _ in range(3):
        (rt.sin(w) * 3.0).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), 9 * np.cos(w.numpy()), rtol=1e-12)
    assert len(_backcache._TEMPLATES) == 1


def test_no_grad_marks_replayed_nodes_too(rng):
    w = rt.tensor(rng.standard_normal(3), requires_grad=True)
    (g,) = rt.grad(rt.exp(w).sum(), [w])       # walked: the template
    assert g.requires_grad                      # a gradient graph built with gradients on carries them
    loss = rt.exp(w).sum()
    with rt.no_grad():
        (g,) = rt.grad(loss, [w])               # replayed inside no_grad: its nodes carry none
    assert len(_backcache._TEMPLATES) == 1 and not g.requires_grad
    np.testing.assert_allclose(g.numpy(), np.exp(w.numpy()), rtol=1e-12)
