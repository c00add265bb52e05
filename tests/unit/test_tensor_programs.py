"""rxcuda.tensor's runnable-program cache on the CPU backend: a program traced again over new arrays of the same
layout skips the passes (``stats().plans``) and still gives NumPy's results, and nothing that differs in a way
that matters (which leaves share a buffer, which leaf feeds which operand, a fill's value, an array's strides,
a cached intermediate) is ever served by the wrong program."""

import numpy as np
import pytest

import rxcuda.tensor as rt


@pytest.fixture(autouse=True)
def fresh():
    rt.clear_cache()
    rt.reset_stats()


@pytest.fixture
def rng():
    return np.random.default_rng(1313)


def test_a_repeat_over_new_arrays_reuses_the_program(rng):
    def f(a, b):
        return rt.softmax(rt.asarray(a) * 2 + rt.asarray(b), axis=-1)

    for _ in range(5):
        a, b = rng.standard_normal((4, 7)), rng.standard_normal(7)
        z = a * 2 + b
        e = np.exp(z - z.max(-1, keepdims=True))
        np.testing.assert_allclose(f(a, b).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-12)
    s = rt.stats()
    assert s.plans == 1 and s.evaluations == 5 and s.launches == 5


def test_which_leaf_feeds_which_operand_is_part_of_the_structure(rng):
    a, b = rng.standard_normal(5), rng.standard_normal(5)
    ta, tb = rt.asarray(a), rt.asarray(b)
    first = (ta * tb) + ta   # the same shapes, dtypes and ops: only the last operand's leaf differs
    second = (ta * tb) + tb
    assert first.node.sid != second.node.sid
    np.testing.assert_array_equal(first.numpy(), a * b + a)
    np.testing.assert_array_equal(second.numpy(), a * b + b)


def test_leaves_sharing_a_buffer_get_their_own_program(rng):
    a, b = rng.standard_normal(6), rng.standard_normal(6)
    np.testing.assert_array_equal((rt.asarray(a) - rt.asarray(b)).numpy(), a - b)
    held = rt.asarray(a)
    np.testing.assert_array_equal((held - held).numpy(), np.zeros(6))
    t = rt.tensor(a)
    alias = rt.Tensor(rt.Node("const", (), t.node.attrs, t.shape, t.dtype, "cpu"))  # a second node, one buffer
    np.testing.assert_array_equal((t - alias).numpy(), np.zeros(6))
    np.testing.assert_array_equal((rt.asarray(b) - rt.asarray(a)).numpy(), b - a)


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_fills_differ_by_value_and_sign_of_zero():
    x = rt.tensor(np.array([1.0, -2.0]))
    np.testing.assert_array_equal((1 / (x * 0.0)).numpy(), [np.inf, -np.inf])
    np.testing.assert_array_equal((1 / (x * -0.0)).numpy(), [-np.inf, np.inf])
    np.testing.assert_array_equal((x * 3).numpy(), [3.0, -6.0])
    np.testing.assert_array_equal((x * 4).numpy(), [4.0, -8.0])
    assert (x * 3).node.inputs[1] is (x * 3).node.inputs[1]  # one fill node per value, dtype and device


def test_strides_are_part_of_the_structure(rng):
    a = rng.standard_normal((3, 4))
    np.testing.assert_array_equal((rt.asarray(a) + 1).numpy(), a + 1)
    np.testing.assert_array_equal((rt.asarray(np.ascontiguousarray(a.T).T) + 1).numpy(), a + 1)
    assert rt.asarray(a).node.sid != rt.asarray(np.asfortranarray(a)).node.sid
    assert rt.stats().plans == 2


def test_a_cached_intermediate_is_still_used(rng):
    w = rt.tensor(rng.standard_normal(8))
    wide = rt.exp(w) * 2               # depends on w only: cached once
    x = rng.standard_normal(8)
    (rt.asarray(x) + wide).numpy()     # plans and runs both groups (or one fused)
    wide.numpy()
    before = rt.stats()
    for _ in range(3):
        x = rng.standard_normal(8)
        np.testing.assert_allclose((rt.asarray(x) + wide).numpy(), x + np.exp(w.numpy()) * 2)
    after = rt.stats()
    assert after.launches - before.launches <= 3  # never more than one launch per evaluation


def test_a_write_between_repeats_is_seen(rng):
    t = rt.tensor(rng.standard_normal(5))
    y = rt.sqrt(rt.abs(t)) + 1
    first = y.numpy().copy()
    t[0] = 100.0
    again = rt.sqrt(rt.abs(t)) + 1
    assert again.numpy()[0] == pytest.approx(11.0) and np.array_equal(again.numpy()[1:], first[1:])


def test_passes_are_part_of_the_structure(rng):
    a = rng.standard_normal(16)
    fused = rt.exp(rt.asarray(a)) + 1
    fused.numpy()
    launches = rt.stats().launches
    (rt.exp(rt.asarray(a)) + 1).numpy(passes=rt.Passes.none())
    assert rt.stats().launches - launches == 2 and rt.stats().plans == 2


def test_several_outputs_with_different_leaves(rng):
    a, b, c = rng.standard_normal(4), rng.standard_normal(4), rng.standard_normal(4)
    for _ in range(2):
        ta, tb, tc = rt.asarray(a), rt.asarray(b), rt.asarray(c)
        u, v = rt.realize(ta * tb, tc - tb)
        np.testing.assert_array_equal(u.numpy(), a * b)
        np.testing.assert_array_equal(v.numpy(), c - b)


def test_a_training_step_plans_once(rng):
    """Forward, loss and gradients again over new batches: one plan (a cached constant, such as the gradient's
    seed, or a cached view of a weight does not send the repeat back to the passes)."""
    w = rt.tensor(rng.standard_normal((6, 3)), requires_grad=True)
    b = rt.tensor(np.zeros(3), requires_grad=True)
    plans = []
    for _ in range(4):
        x, y = rng.standard_normal((5, 6)), rng.standard_normal((5, 3))
        loss = ((rt.asarray(x) @ w + b - rt.asarray(y)) ** 2).sum() / 5.0
        gw, gb = rt.grad(loss, [w, b])
        rt.realize(loss, gw, gb)
        r = x @ w.numpy() + b.numpy() - y
        np.testing.assert_allclose(gw.numpy(), 2 * x.T @ r / 5, rtol=1e-12)
        np.testing.assert_allclose(gb.numpy(), 2 * r.sum(0) / 5, rtol=1e-12)
        plans.append(rt.stats().plans)
    assert plans[0] == plans[-1]  # only the first step planned (the step, and the checks' own programs)


def test_a_node_without_inputs_has_a_structure():
    """``to_host`` makes a lone copy node (no inputs) to describe a transfer: it gets an id and no leaves."""
    n = rt.Node("copy", (), ("cpu",), (2, 3), np.dtype(np.float32), "cpu")
    m = rt.Node("copy", (), ("cpu",), (2, 3), np.dtype(np.float32), "cpu")
    assert n.leaves == () and n.sid == m.sid
