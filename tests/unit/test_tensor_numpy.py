"""The operations NumPy users reach for (rxcuda/tensor/_numpy.py), each against NumPy on the CPU backend."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import rxcuda.tensor as rt

RNG = np.random.default_rng(24)

ints = hnp.arrays(np.int64, hnp.array_shapes(max_dims=3, max_side=5), elements=st.integers(-50, 50))


@settings(max_examples=40, deadline=None)
@given(ints, st.integers(1, 9), st.sampled_from(["floordiv", "mod", "and", "or", "xor"]))
def test_integer_operators_match_numpy(a, b, which):
    t = rt.tensor(a)
    got = {"floordiv": lambda: t // b, "mod": lambda: t % b, "and": lambda: t & b, "or": lambda: t | b,
           "xor": lambda: t ^ b}[which]().numpy()
    want = {"floordiv": a // b, "mod": a % b, "and": a & b, "or": a | b, "xor": a ^ b}[which]
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype


def test_reflected_and_float_floordiv_mod_and_invert():
    a = RNG.normal(size=(4, 5)) * 10
    b = RNG.uniform(0.5, 3.0, size=(5,))
    np.testing.assert_allclose((rt.tensor(a) // b).numpy(), a // b)
    np.testing.assert_allclose((rt.tensor(a) % b).numpy(), a % b)
    np.testing.assert_allclose((7.5 // rt.tensor(b)).numpy(), 7.5 // b)
    np.testing.assert_allclose((7.5 % rt.tensor(b)).numpy(), 7.5 % b)
    m = RNG.normal(size=6) > 0
    k = RNG.integers(-9, 9, size=6)
    np.testing.assert_array_equal((~rt.tensor(m)).numpy(), ~m)
    np.testing.assert_array_equal((~rt.tensor(k)).numpy(), ~k)
    np.testing.assert_array_equal((rt.tensor(m) & (rt.tensor(k) > 0)).numpy(), m & (k > 0))
    np.testing.assert_array_equal((3 | rt.tensor(k)).numpy(), 3 | k)
    with pytest.raises(TypeError, match="bitand is not defined for float64"):
        rt.tensor(a) & 1


def test_host_reads():
    t = rt.tensor(np.array([[2.5]], dtype=np.float32))
    assert float(t) == 2.5 and t.item() == 2.5 and int(t) == 2
    assert rt.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert int(rt.tensor(7)) == 7 and isinstance(rt.tensor(7).item(), int)
    with pytest.raises(TypeError, match=r"float\(t\) needs a tensor of one element \(this one has shape \(2,\)\)"):
        float(rt.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match=r"item\(\) needs a tensor of one element"):
        rt.tensor([1, 2]).item()


def test_str_shows_values_and_repr_stays_lazy():
    t = rt.tensor(np.array([1.0, 2.5], dtype=np.float32))
    assert str(t) == "Tensor([1. , 2.5], dtype=float32, device='cpu')"
    assert repr(t * 2).startswith("Tensor(mul, shape=(2,)")


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(max_dims=3, max_side=5), elements=st.floats(-100, 100)),
       st.data())
def test_reductions_match_numpy(a, data):
    axis = data.draw(st.sampled_from([None, *range(a.ndim)]))
    keep = data.draw(st.booleans())
    t = rt.tensor(a)
    np.testing.assert_allclose(rt.prod(t, axis, keep).numpy(), np.prod(a, axis=axis, keepdims=keep), rtol=1e-9)
    np.testing.assert_allclose(rt.var(t, axis, keepdims=keep).numpy(), np.var(a, axis=axis, keepdims=keep),
                               rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(t.std(axis, ddof=0, keepdims=keep).numpy(), np.std(a, axis=axis, keepdims=keep),
                               rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(rt.cumsum(t, axis).numpy(), np.cumsum(a, axis=axis), rtol=1e-9, atol=1e-9)
    if a.size:
        np.testing.assert_array_equal(rt.argmax(t, axis, keep).numpy(), np.argmax(a, axis=axis, keepdims=keep))
        np.testing.assert_array_equal(t.argmin(axis, keepdims=keep).numpy(), np.argmin(a, axis=axis, keepdims=keep))


def test_var_std_ddof_and_int_inputs():
    a = RNG.integers(0, 10, size=(3, 4))
    np.testing.assert_allclose(rt.var(rt.tensor(a), axis=1, ddof=1).numpy(), np.var(a, axis=1, ddof=1))
    np.testing.assert_allclose(rt.std(rt.tensor(a), ddof=1).numpy(), np.std(a, ddof=1))
    assert rt.prod(rt.tensor(np.array([True, True]))).numpy().dtype == np.prod(np.array([True, True])).dtype


def test_concatenate_stack_clip_squeeze_expand_dims():
    a, b = RNG.normal(size=(2, 3)), RNG.normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_array_equal(rt.concatenate([rt.tensor(a), rt.tensor(b)]).numpy(), np.concatenate([a, b]))
    np.testing.assert_array_equal(rt.concatenate([rt.tensor(a), a], axis=1).numpy(), np.concatenate([a, a], 1))
    np.testing.assert_array_equal(rt.stack([rt.tensor(a), rt.tensor(a)], axis=-1).numpy(), np.stack([a, a], -1))
    np.testing.assert_array_equal(rt.clip(rt.tensor(a), -0.5, 0.5).numpy(), np.clip(a, -0.5, 0.5))
    np.testing.assert_array_equal(rt.tensor(a).clip(a_max=0.1).numpy(), np.clip(a, None, 0.1))
    c = RNG.normal(size=(1, 3, 1))
    np.testing.assert_array_equal(rt.squeeze(rt.tensor(c)).numpy(), np.squeeze(c))
    np.testing.assert_array_equal(rt.tensor(c).squeeze(axis=0).numpy(), np.squeeze(c, axis=0))
    np.testing.assert_array_equal(rt.expand_dims(rt.tensor(a), (0, 3)).numpy(), np.expand_dims(a, (0, 3)))
    np.testing.assert_array_equal(rt.tensor(c).flatten().numpy(), c.flatten())


def test_shape_errors_name_the_fix():
    a = rt.tensor(np.ones((2, 3)))
    with pytest.raises(rt.ShapeError, match=r"concatenate along axis 0: shapes \(2, 3\) and \(2, 4\) differ"):
        rt.concatenate([a, rt.tensor(np.ones((2, 4)))])
    with pytest.raises(rt.ShapeError, match="same number of axes"):
        rt.concatenate([a, rt.tensor(np.ones(3))])
    with pytest.raises(rt.ShapeError, match="zero-dimensional tensors cannot be joined; use rt.stack"):
        rt.concatenate([rt.tensor(1.0), rt.tensor(2.0)])
    with pytest.raises(rt.ShapeError, match="stack: all tensors need one shape"):
        rt.stack([a, rt.tensor(np.ones((3, 2)))])
    with pytest.raises(ValueError, match="squeeze: axis 1 has length 3"):
        a.squeeze(axis=1)
    with pytest.raises(ValueError, match="clip needs a_min, a_max or both"):
        rt.clip(a)
    with pytest.raises(ValueError, match="argmax of an empty tensor"):
        rt.argmax(rt.tensor(np.ones((0,))))
    with pytest.raises(ValueError, match="needs at least one tensor"):
        rt.concatenate([])


def test_integer_array_indexing_and_take():
    a = RNG.normal(size=(5, 3))
    idx = np.array([4, 0, -1, 2])
    t = rt.tensor(a)
    np.testing.assert_array_equal(t[idx].numpy(), a[idx])
    np.testing.assert_array_equal(t[[1, 1]].numpy(), a[[1, 1]])
    np.testing.assert_array_equal(t[rt.tensor(idx), ...].numpy(), a[idx, ...])
    np.testing.assert_array_equal(rt.take(t, [2, 0], axis=1).numpy(), np.take(a, [2, 0], axis=1))
    with pytest.raises(IndexError, match="boolean-mask indexing .* rt.where"):
        t[a[:, 0] > 0]
    with pytest.raises(IndexError, match="boolean-mask indexing"):
        t[t[:, 0] > 0]
    with pytest.raises(IndexError, match=r"supported on the first axis .* rt.take\(t, idx, axis=k\)"):
        t[:, [0, 1]]
    with pytest.raises(IndexError, match="take: indices must be integers"):
        rt.take(t, np.array([0.5]))


def test_gradients_of_new_ops_match_finite_differences():
    a = RNG.uniform(0.5, 2.0, size=(3, 4))
    x = rt.tensor(a, requires_grad=True)
    w = RNG.normal(size=(3, 4))
    for f, ref in [(lambda t: rt.prod(t, axis=1), lambda v: np.prod(v, axis=1)),
                   (lambda t: rt.cumsum(t, axis=1), lambda v: np.cumsum(v, axis=1)),
                   (lambda t: rt.concatenate([t, t * 2], axis=0)[1:4], lambda v: np.concatenate([v, v * 2])[1:4]),
                   (lambda t: rt.std(t, axis=0), lambda v: np.std(v, axis=0))]:
        out = f(x)
        seed = RNG.normal(size=out.shape)
        (g,) = rt.grad(out, [x], gradient=seed)
        eps = 1e-6
        num = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            d = np.zeros_like(a)
            d[i] = eps
            num[i] = ((ref(a + d) - ref(a - d)) * seed).sum() / (2 * eps)
        np.testing.assert_allclose(g.numpy(), num, rtol=1e-5, atol=1e-6)
    assert w.shape == a.shape
    with pytest.raises(rt.GradientError, match="no gradient flows through take"):
        rt.grad(x[[0, 1]].sum(), [x])


def test_numpy_functions_on_tensors():
    a = RNG.normal(size=(3, 4))
    t = rt.tensor(a)
    for f in (np.exp, np.tanh, np.abs, np.negative):
        out = f(t)
        assert isinstance(out, rt.Tensor)
        np.testing.assert_allclose(out.numpy(), f(a))
    out = np.maximum(t, 0.0) + np.ones(4)  # ndarray + Tensor stays a Tensor
    assert isinstance(out, rt.Tensor)
    np.testing.assert_allclose(out.numpy(), np.maximum(a, 0) + 1)
    for f, kw in [(np.sum, {"axis": 0}), (np.mean, {}), (np.max, {"axis": 1}), (np.std, {"axis": 1}),
                  (np.var, {"ddof": 1}), (np.argmax, {"axis": 0}), (np.cumsum, {"axis": 1}), (np.prod, {})]:
        out = f(t, **kw)
        assert isinstance(out, rt.Tensor), f
        np.testing.assert_allclose(out.numpy(), f(a, **kw))
    np.testing.assert_allclose(np.concatenate([t, t]).numpy(), np.concatenate([a, a]))
    np.testing.assert_allclose(np.where(t > 0, t, 0.0).numpy(), np.where(a > 0, a, 0))
    assert np.allclose(t, a)  # a NumPy function without a tensor op runs on the host value
    with pytest.raises(TypeError, match=r"numpy.add.reduce has no tensor op"):
        np.add.reduce(t)
    with pytest.raises(TypeError, match=r"numpy.exp with out has no tensor op"):
        np.exp(t, out=np.empty_like(a))


def test_dtype_names_and_refused_kinds():
    assert rt.tensor([1, 2], dtype="f32").dtype == np.float32
    assert rt.tensor([1, 2], dtype="i64").dtype == np.int64
    assert rt.tensor([1, 2], dtype="<f8").dtype == np.float64
    assert rt.tensor([1, 2]).astype("f16").dtype == np.float16
    assert rt.full((2,), 1, dtype="u8").dtype == np.uint8
    with pytest.raises(TypeError, match="a tensor holds numbers and bools, not <U1 data"):
        rt.tensor(["a", "b"])
    with pytest.raises(TypeError, match="not object data"):
        rt.tensor(np.array([{}, 1], dtype=object))
    with pytest.raises(TypeError, match="rxcuda.tensor.asarray: a tensor holds numbers"):
        rt.asarray(np.array(["x"]))
