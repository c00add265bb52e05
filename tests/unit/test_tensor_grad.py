"""Autograd of rxcuda.tensor: every differentiable op against central finite differences in float64.

Each check builds a random seed ``w`` and compares d(sum(f(x) * w))/dx from ``rt.grad`` with central differences
of the same lazy program realized on the CPU backend, so a wrong forward op and a wrong rule both fail here.
"""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda.tensor as rt

EPS = 1e-6


def _numeric(f, arrays, w):
    """Central differences of sum(f(*arrays) * w) with respect to each array."""
    out = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            vals = []
            for step in (EPS, -EPS):
                moved = [b.copy() for b in arrays]
                moved[k][idx] += step
                y = f(*[rt.tensor(b) for b in moved]).numpy()
                vals.append(float(np.sum(y * w)))
            g[idx] = (vals[0] - vals[1]) / (2 * EPS)
        out.append(g)
    return out


def check(f, *arrays, seed=0, rtol=1e-5, atol=1e-6):
    """Assert that rt.grad of f matches finite differences for every argument; returns the analytic gradients."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    xs = [rt.tensor(a, requires_grad=True) for a in arrays]
    y = f(*xs)
    w = np.random.default_rng(seed).standard_normal(y.shape)
    loss = (y * rt.tensor(w)).sum()
    analytic = rt.grad(loss, xs)
    numeric = _numeric(f, arrays, w)
    for k, (ga, gn) in enumerate(zip(analytic, numeric, strict=True)):
        assert ga.shape == arrays[k].shape, f"gradient {k} has shape {ga.shape}, input {arrays[k].shape}"
        np.testing.assert_allclose(ga.numpy(), gn, rtol=rtol, atol=atol, err_msg=f"argument {k}")
    return [g.numpy() for g in analytic]


def rand(*shape, seed=1, low=-2.0, high=2.0):
    return np.random.default_rng(seed + len(shape) * 7 + sum(shape)).uniform(low, high, shape)


def positive(*shape, seed=2):
    return rand(*shape, seed=seed, low=0.5, high=2.5)


# --- elementwise ------------------------------------------------------------------------------------------------

BINARY_SHAPES = [((3,), (3,)), ((2, 3), (3,)), ((2, 1, 4), (3, 1)), ((), (2, 2)), ((4, 1), (1, 5))]


@pytest.mark.parametrize(("sa", "sb"), BINARY_SHAPES)
@pytest.mark.parametrize(
    "op",
    [
        lambda a, b: a + b,
        lambda a, b: a - b,
        lambda a, b: a * b,
        lambda a, b: a / b,
        lambda a, b: rt.maximum(a, b),
        lambda a, b: rt.minimum(a, b),
    ],
    ids=["add", "sub", "mul", "div", "maximum", "minimum"],
)
def test_binary_ops_with_broadcasting(op, sa, sb):
    check(op, rand(*sa, seed=3), positive(*sb, seed=4) if sb else positive(seed=4))


@pytest.mark.parametrize("shape", [(), (5,), (2, 3)])
@pytest.mark.parametrize(
    ("op", "domain"),
    [
        (lambda x: -x, rand),
        (rt.exp, rand),
        (rt.log, positive),
        (rt.sqrt, positive),
        (rt.sin, rand),
        (rt.cos, rand),
        (rt.tanh, rand),
        (rt.abs, rand),
        (lambda x: x.astype(np.float64) * 2.0, rand),
    ],
    ids=["neg", "exp", "log", "sqrt", "sin", "cos", "tanh", "abs", "cast"],
)
def test_unary_ops(op, domain, shape):
    check(op, domain(*shape))


@pytest.mark.parametrize(("sa", "sb"), [((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 3))])
def test_pow_both_arguments(sa, sb):
    check(lambda a, b: a**b, positive(*sa, seed=5), rand(*sb, seed=6))


def test_pow_by_a_constant_and_of_a_constant():
    check(lambda a: a**3.0, rand(2, 3))
    check(lambda b: 2.0**b, rand(4))


def test_pow_gradient_of_the_exponent_is_zero_at_zero_base():
    a = rt.tensor(np.array([0.0, 2.0]))
    b = rt.tensor(np.array([2.0, 3.0]), requires_grad=True)
    (gb,) = rt.grad((a**b).sum(), [b])
    np.testing.assert_allclose(gb.numpy(), [0.0, 8.0 * np.log(2.0)])


@pytest.mark.parametrize(("sc", "sa", "sb"), [((4,), (4,), (4,)), ((2, 3), (3,), ()), ((2, 1), (1, 3), (2, 3))])
def test_where(sc, sa, sb):
    cond = rand(*sc, seed=7) > 0
    check(lambda a, b: rt.where(rt.tensor(cond), a, b), rand(*sa, seed=8), rand(*sb, seed=9) if sb else rand(seed=9))


def test_where_built_from_a_comparison_of_the_input():
    # relu: the comparison carries no gradient, the selected branch does
    g = check(lambda x: rt.where(x > 0.0, x, x * 0.0), np.array([-1.5, 0.5, 2.0, -0.1]))
    np.testing.assert_allclose(g[0] != 0, [False, True, True, False])


def test_maximum_ties_split_the_gradient_equally():
    a = rt.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    b = rt.tensor(np.array([1.0, 5.0, 0.0]), requires_grad=True)
    ga, gb = rt.grad(rt.maximum(a, b).sum(), [a, b])
    np.testing.assert_allclose(ga.numpy(), [0.5, 0.0, 1.0])
    np.testing.assert_allclose(gb.numpy(), [0.5, 1.0, 0.0])


def test_abs_has_zero_gradient_at_zero():
    x = rt.tensor(np.array([-2.0, 0.0, 3.0]), requires_grad=True)
    (g,) = rt.grad(rt.abs(x).sum(), [x])
    np.testing.assert_allclose(g.numpy(), [-1.0, 0.0, 1.0])


def test_copy_to_another_device_sends_the_gradient_back():
    # the CPU backend cannot run a copy to cuda, so this checks the gradient graph, not its numbers
    x = rt.tensor(np.ones(3), requires_grad=True)
    (gx,) = rt.grad((x.to("cuda") * 2.0).sum(), [x])
    assert (gx.device, gx.node.op, gx.node.attrs) == ("cpu", "copy", ("cpu",))
    assert gx.node.inputs[0].device == "cuda"


# --- reductions -------------------------------------------------------------------------------------------------

REDUCE_CASES = [((5,), None, False), ((2, 3), 0, False), ((2, 3), 1, True), ((2, 3, 4), (0, 2), False),
                ((2, 3, 4), -1, True), ((2, 3, 4), None, True)]


@pytest.mark.parametrize(("shape", "axis", "keepdims"), REDUCE_CASES)
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min"])
def test_reductions(name, shape, axis, keepdims):
    # distinct values, so max/min have one winner and finite differences are smooth
    x = np.random.default_rng(11).permutation(np.prod(shape)).reshape(shape) * 0.25 - 1.0
    check(lambda t: getattr(t, name)(axis=axis, keepdims=keepdims), x)


def test_max_ties_split_the_gradient_equally():
    x = rt.tensor(np.array([[3.0, 1.0, 3.0], [0.0, 2.0, 1.0]]), requires_grad=True)
    (g,) = rt.grad(x.max(axis=1).sum(), [x])
    np.testing.assert_allclose(g.numpy(), [[0.5, 0.0, 0.5], [0.0, 1.0, 0.0]])


# --- shapes and indexing ----------------------------------------------------------------------------------------


def test_reshape_transpose_broadcast_to():
    check(lambda x: x.reshape((3, 2)) * 1.5, rand(2, 3))
    check(lambda x: x.transpose((2, 0, 1)), rand(2, 3, 4))
    check(lambda x: x.T, rand(2, 3))
    check(lambda x: x.broadcast_to((4, 2, 3)), rand(2, 1))


@pytest.mark.parametrize(
    "index",
    [1, (slice(None), 2), (slice(1, None), slice(None, None, 2)), (Ellipsis, 0), (None, slice(0, 2)),
     (-1, slice(None, None, -1)), (slice(0, 2), None, slice(3, 0, -2))],
    ids=["int", "col", "slices", "ellipsis", "newaxis", "reverse", "mixed"],
)
def test_getitem_scatters_into_zeros(index):
    check(lambda x: x[index] * 2.0, rand(3, 4))


# --- matmul -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sa", "sb"),
    [((2, 3), (3, 4)), ((3,), (3, 2)), ((2, 3), (3,)), ((3,), (3,)), ((5, 2, 3), (3, 4)), ((2, 1, 2, 3), (4, 3, 2))],
    ids=["mm", "vec-mat", "mat-vec", "dot", "batched", "batch-broadcast"],
)
def test_matmul(sa, sb):
    check(lambda a, b: a @ b, rand(*sa, seed=12), rand(*sb, seed=13))


# --- composite programs -----------------------------------------------------------------------------------------


def _logsumexp(z, axis):
    m = z.max(axis=axis, keepdims=True)
    return rt.log(rt.exp(z - m).sum(axis=axis, keepdims=True)) + m


def test_mlp_layer_with_softmax_cross_entropy():
    labels = np.array([0, 2, 1, 2])
    onehot = np.eye(3)[labels]

    def loss(x, w1, b1, w2):
        h = rt.tanh(x @ w1 + b1)
        z = h @ w2
        logp = z - _logsumexp(z, axis=1)
        return -(logp * rt.tensor(onehot)).sum() / 4.0

    check(loss, rand(4, 5, seed=20), rand(5, 6, seed=21) * 0.5, rand(6, seed=22), rand(6, 3, seed=23))


def test_layernorm():
    def layernorm(x, gamma, beta):
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) * (x - mu)).mean(axis=-1, keepdims=True)
        return (x - mu) / rt.sqrt(var + 1e-5) * gamma + beta

    check(layernorm, rand(3, 5, seed=30), rand(5, seed=31), rand(5, seed=32))


def test_logsumexp():
    check(lambda z: _logsumexp(z, axis=0), rand(4, 3, seed=40))


# --- accumulation and the API -----------------------------------------------------------------------------------


def test_a_node_used_several_times_accumulates_its_gradient():
    def f(x):
        return x * x + rt.sin(x) * x + x

    check(f, rand(5))
    x0 = rand(5)
    x = rt.tensor(x0, requires_grad=True)
    (g,) = rt.grad(f(x).sum(), [x])
    np.testing.assert_allclose(g.numpy(), 2 * x0 + np.cos(x0) * x0 + np.sin(x0) + 1, rtol=1e-12)


def test_backward_stores_and_accumulates_grad():
    x = rt.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    assert x.grad is None
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 7.0, 9.0])
    x.grad = None
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0, 3.0])


def test_backward_with_a_seed_gives_the_vector_jacobian_product():
    x = rt.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    (x * x).backward(np.array([1.0, 0.0, -1.0]))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 0.0, -6.0])


def test_grad_of_an_intermediate_and_of_an_unused_input():
    x = rt.tensor(np.array([1.0, 2.0]), requires_grad=True)
    unused = rt.tensor(np.ones((2, 2)), requires_grad=True)
    h = x * x
    assert h.requires_grad
    gx, gh, gu = rt.grad((h * 3.0).sum(), [x, h, unused])
    np.testing.assert_allclose(gx.numpy(), [6.0, 12.0])
    np.testing.assert_allclose(gh.numpy(), [3.0, 3.0])
    np.testing.assert_array_equal(gu.numpy(), np.zeros((2, 2)))
    assert x.grad is None  # grad() stores nothing


def test_comparisons_and_integer_casts_carry_no_gradient():
    x = rt.tensor(np.array([0.5, 2.5]), requires_grad=True)
    assert not (x > 1.0).requires_grad
    assert not x.astype(np.int64).requires_grad
    y = x * 1.0 + x.astype(np.int64).astype(np.float64)
    (g,) = rt.grad(y.sum(), [x])
    np.testing.assert_allclose(g.numpy(), [1.0, 1.0])


# --- errors -----------------------------------------------------------------------------------------------------


def test_backward_of_a_non_scalar_needs_a_seed():
    x = rt.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(rt.GradientError, match=r"shape \(3,\) needs a seed.*loss.sum\(\)"):
        (x * 2.0).backward()


def test_seed_of_the_wrong_shape():
    x = rt.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(rt.GradientError, match=r"seed gradient has shape \(2,\)"):
        (x * 2.0).backward(np.ones(2))


def test_backward_of_an_integer_tensor():
    x = rt.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(rt.GradientError, match="dtype int64.*floating-point loss"):
        x.astype(np.int64).sum().backward()


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(rt.GradientError, match="only floating-point tensors"):
        rt.tensor(np.arange(3), requires_grad=True)


def test_grad_for_a_tensor_that_does_not_require_grad():
    x = rt.tensor(np.ones(3), requires_grad=True)
    c = rt.tensor(np.ones(3))
    with pytest.raises(rt.GradientError, match=r"inputs\[1\].*does not require grad.*requires_grad=True"):
        rt.grad((x * c).sum(), [x, c])


def test_backward_of_a_loss_that_does_not_depend_on_the_inputs_leaves_grad_alone():
    x = rt.tensor(np.ones(3), requires_grad=True)
    rt.tensor(np.ones(3)).sum().backward()
    assert x.grad is None
    (g,) = rt.grad(rt.tensor(np.ones(3)).sum() + (x * 0.0).sum(), [x])
    np.testing.assert_array_equal(g.numpy(), np.zeros(3))


# --- against PyTorch, where it is installed ---------------------------------------------------------------------


def test_matches_torch_autograd():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed; finite differences cover the rules")
    x0, w0 = rand(4, 5, seed=50), rand(5, 3, seed=51)
    x, w = rt.tensor(x0, requires_grad=True), rt.tensor(w0, requires_grad=True)
    z = x @ w
    loss = (rt.maximum(z, z * 0.1) - _logsumexp(z, axis=1)).mean()
    gx, gw = rt.grad(loss, [x, w])
    tx, tw = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    tz = tx @ tw
    (torch.maximum(tz, tz * 0.1) - torch.logsumexp(tz, dim=1, keepdim=True)).mean().backward()
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-10)


# --- no_grad and detach -----------------------------------------------------------------------------------------


def test_no_grad_results_do_not_require_grad_and_backward_does_not_walk_them():
    x = rt.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    assert rt.is_grad_enabled()
    with rt.no_grad():
        assert not rt.is_grad_enabled()
        y = x * 2.0
    assert rt.is_grad_enabled()
    assert not y.requires_grad
    np.testing.assert_array_equal(y.numpy(), [2.0, 4.0, 6.0])  # the value is computed as usual
    loss = (x * x).sum() + (y * x).sum()  # y counts as a constant
    (gx,) = rt.grad(loss, [x])
    np.testing.assert_allclose(gx.numpy(), 2 * x.numpy() + y.numpy())
    with pytest.raises(rt.GradientError, match="does not require grad"):
        rt.grad(y.sum(), [y])


def test_no_grad_nests_and_decorates():
    x = rt.tensor(np.ones(2), requires_grad=True)

    @rt.no_grad()
    def double(t):
        return t * 2.0

    with rt.no_grad():
        with rt.no_grad():
            a = x + 1.0
        b = x - 1.0
    c = x * 3.0
    assert not a.requires_grad and not b.requires_grad and c.requires_grad
    assert not double(x).requires_grad
    assert rt.is_grad_enabled()


def test_no_grad_sgd_step_does_not_chain_the_steps():
    rng = np.random.default_rng(60)
    a, t = rng.standard_normal((8, 3)), rng.standard_normal(8)
    w = rt.tensor(np.zeros(3), requires_grad=True)
    ref = np.zeros(3)
    for _ in range(3):
        (((rt.tensor(a) @ w) - rt.tensor(t)) ** 2.0).mean().backward()
        with rt.no_grad():
            new = w - 0.1 * w.grad
        assert not new.requires_grad
        ref = ref - 0.1 * (2 * a.T @ (a @ ref - t) / len(t))
        w = new
        w.requires_grad = True  # a fresh leaf: the next step's graph stops here
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-12)


def test_detach_stops_the_gradient_and_keeps_the_value():
    x0 = rand(3, 4, seed=61)
    x = rt.tensor(x0, requires_grad=True)
    d = x.detach()
    assert not d.requires_grad and x.requires_grad
    assert d.shape == x.shape and d.dtype == x.dtype and d.device == x.device
    np.testing.assert_array_equal(d.numpy(), x0)
    # softmax with a detached shift has the same gradient as without one (the shift cancels)
    z = x * 2.0
    shifted = rt.exp(z - z.max(axis=1, keepdims=True).detach())
    p = shifted / shifted.sum(axis=1, keepdims=True)
    w = rand(3, 4, seed=62)
    (g,) = rt.grad((p * rt.tensor(w)).sum(), [x])
    (g_ref,) = rt.grad((rt.softmax(z, axis=1) * rt.tensor(w)).sum(), [x])
    np.testing.assert_allclose(g.numpy(), g_ref.numpy(), rtol=1e-10, atol=1e-12)
    # the detached branch alone contributes nothing
    (g0,) = rt.grad((x * d).sum(), [x])
    np.testing.assert_allclose(g0.numpy(), x0)


def test_detach_of_an_intermediate_and_finite_differences():
    x0 = rand(5, seed=63)
    w = rand(5, seed=64)

    def f(x):
        return rt.tanh(x) * rt.tanh(x).detach()

    x = rt.tensor(x0, requires_grad=True)
    (g,) = rt.grad((f(x) * rt.tensor(w)).sum(), [x])
    # with the detached factor held constant: d/dx tanh(x) * c = (1 - tanh^2) * c
    np.testing.assert_allclose(g.numpy(), (1 - np.tanh(x0) ** 2) * np.tanh(x0) * w, rtol=1e-10)
