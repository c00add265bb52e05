"""rxcuda.tensor on the CPU backend: every op against NumPy (broadcasting, promotion, reductions, views,
matmul), the passes checked structurally and for unchanged results, the result cache, explain() and errors."""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest

import rxcuda.tensor as rt
from rxcuda.tensor import Passes
from rxcuda.tensor._passes import plan

RNG = np.random.default_rng(7)
DTYPES = ["bool", "int32", "int64", "float32", "float64"]
SHAPE_PAIRS = [((), ()), ((3,), (3,)), ((2, 3), (3,)), ((4, 1), (1, 5)), ((2, 1, 3), (4, 1)), ((5,), ())]
ALL_OFF = [Passes(dead=False), Passes(cse=False), Passes(vertical=False), Passes(horizontal=False), Passes.none()]


def data(shape, dtype, positive=False):
    if dtype == "bool":
        return RNG.random(shape) > 0.5
    if dtype.startswith("int"):
        return RNG.integers(1 if positive else -5, 6, size=shape).astype(dtype)
    x = RNG.standard_normal(shape).astype(dtype)
    return np.abs(x) + 0.1 if positive else x


def same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-6 if want.dtype != np.float32 else 1e-5, equal_nan=True)


@pytest.fixture(autouse=True)
def fresh():
    rt.clear_cache()
    rt.reset_stats()


# -- every op against NumPy ---------------------------------------------------------------------------------
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "maximum": np.maximum,
          "minimum": np.minimum, "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
          "gt": np.greater, "ge": np.greater_equal, "pow": np.power}
TENSOR_BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
                 "div": lambda a, b: a / b, "maximum": rt.maximum, "minimum": rt.minimum,
                 "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
                 "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
                 "pow": lambda a, b: a ** b}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("da,db", [("float32", "float32"), ("int32", "float32"), ("float32", "float64"),
                                   ("int64", "int32"), ("bool", "bool"), ("bool", "float64")])
@pytest.mark.parametrize("sa,sb", SHAPE_PAIRS)
def test_binary_ops_broadcast_and_promote_like_numpy(op, da, db, sa, sb):
    a, b = data(sa, da, positive=op == "pow"), data(sb, db, positive=True)
    with np.errstate(all="ignore"):
        try:
            want = BINARY[op](a, b)
        except TypeError:  # NumPy refuses (bool - bool): so must we, with the op named
            with pytest.raises(TypeError, match=op):
                TENSOR_BINARY[op](rt.tensor(a), rt.tensor(b))
            return
        got = TENSOR_BINARY[op](rt.tensor(a), rt.tensor(b)).numpy()
    same(got, want)


@pytest.mark.parametrize("scalar", [2, 1.5, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_python_scalars_are_weak_like_numpy_2(scalar, dtype):
    a = data((3, 2), dtype, positive=True)
    same((rt.tensor(a) + scalar).numpy(), a + scalar)
    same((scalar * rt.tensor(a)).numpy(), scalar * a)
    same((rt.tensor(a) < scalar).numpy(), a < scalar)
    same(rt.maximum(rt.tensor(a), scalar).numpy(), np.maximum(a, scalar))
    same((a + rt.tensor(a)).numpy(), a + a)  # an ndarray on the left gives way to the tensor


UNARY = {"neg": (lambda x: -x, np.negative), "exp": (rt.exp, np.exp), "log": (rt.log, np.log),
         "sqrt": (rt.sqrt, np.sqrt), "sin": (rt.sin, np.sin), "cos": (rt.cos, np.cos), "tanh": (rt.tanh, np.tanh),
         "abs": (rt.abs, np.abs)}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 2)])
def test_unary_ops_like_numpy(op, dtype, shape):
    ours, numpys = UNARY[op]
    a = data(shape, dtype, positive=True)
    with np.errstate(divide="ignore"):  # log(False)
        try:
            want = numpys(a)
        except TypeError:
            with pytest.raises(TypeError, match=op):
                ours(rt.tensor(a))
            return
        same(ours(rt.tensor(a)).numpy(), want)


@pytest.mark.parametrize("dc,dx,dy", [("bool", "float32", "float32"), ("int32", "int32", "float64"),
                                      ("bool", "bool", "int64")])
def test_where_broadcasts_and_promotes(dc, dx, dy):
    c, x, y = data((4, 1), dc), data((3,), dx), data((4, 3), dy)
    same(rt.where(rt.tensor(c), rt.tensor(x), rt.tensor(y)).numpy(), np.where(c, x, y))
    same(rt.where(rt.tensor(c), rt.tensor(x), 0).numpy(), np.where(c, x, 0))


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2), (1,)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_like_numpy(op, dtype, axis, keepdims):
    a = data((3, 4, 5), dtype)
    want = getattr(np, op)(a, axis=axis, keepdims=keepdims)
    same(getattr(rt.tensor(a), op)(axis, keepdims).numpy(), want)
    same(getattr(rt, op)(rt.tensor(a), axis=axis, keepdims=keepdims).numpy(), want)


def test_views_like_numpy():
    a = data((4, 5, 6), "float32")
    t = rt.tensor(a)
    same(t.T.numpy(), a.T)
    same(t.transpose(1, 0, 2).numpy(), a.transpose(1, 0, 2))
    same(t.reshape(20, -1).numpy(), a.reshape(20, -1))
    same(t[1:, None, ::2, -1].numpy(), a[1:, None, ::2, -1])
    same(t[..., 3].numpy(), a[..., 3])
    same(t[::-1, 2].numpy(), a[::-1, 2])
    same(t[5:].numpy(), a[5:])  # empty
    same(t[0].broadcast_to((3, 5, 6)).numpy(), np.broadcast_to(a[0], (3, 5, 6)))
    same((t[1:3].T + 1).sum(axis=0).numpy(), (a[1:3].T + 1).sum(axis=0))


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,)),
                                   ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2))])
@pytest.mark.parametrize("da,db", [("float32", "float32"), ("int32", "float64")])
def test_matmul_like_numpy(sa, sb, da, db):
    a, b = data(sa, da), data(sb, db)
    same((rt.tensor(a) @ rt.tensor(b)).numpy(), a @ b)
    same(rt.matmul(a, rt.tensor(b)).numpy(), a @ b)


def np_softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def np_logsumexp(x, axis, keepdims=False):  # by hand, in float64, with the maximum taken out
    x64 = x.astype(np.float64)
    m = x64.max(axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    return np.log(np.exp(x64 - m).sum(axis, keepdims=keepdims)) + (m if keepdims else np.squeeze(m, axis))


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_and_logsumexp_are_stable(axis, dtype):
    a = (data((6, 9), dtype) * 400).astype(dtype)  # exp would overflow without the shift
    s = rt.softmax(rt.tensor(a), axis=axis).numpy()
    assert np.isfinite(s).all()
    np.testing.assert_allclose(s, np_softmax(a.astype(np.float64), axis), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(s.sum(axis), 1.0, rtol=1e-5)
    for keepdims in (False, True):
        got = rt.logsumexp(rt.tensor(a), axis=axis, keepdims=keepdims).numpy()
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got, np_logsumexp(a, axis, keepdims), rtol=1e-5)
    rows = np.array([[-np.inf, -np.inf], [0.0, -np.inf]])
    with np.errstate(divide="ignore"):  # log(0) is -inf, as it should be
        np.testing.assert_array_equal(rt.logsumexp(rt.tensor(rows), axis=1).numpy(), [-np.inf, 0.0])


def test_creation():
    same(rt.zeros((2, 3)).numpy(), np.zeros((2, 3)))
    same(rt.ones(4, dtype="int32").numpy(), np.ones(4, np.int32))
    same(rt.full((2,), 2.5, dtype="float32").numpy(), np.full(2, 2.5, np.float32))
    same(rt.arange(2, 11, 3).numpy(), np.arange(2, 11, 3))
    a = np.arange(4.0)
    owned = rt.tensor(a)
    a[0] = 99  # tensor() copied
    assert owned.numpy()[0] == 0
    assert rt.asarray(a).numpy() is a  # asarray holds by reference
    same((rt.tensor(1.0) + 1).numpy(), np.asarray(2.0))


# -- the passes ------------------------------------------------------------------------------------------------
def test_dead_nodes_are_removed_and_cached_results_cut_the_graph():
    x = rt.tensor(np.ones(4))
    kept, dropped = rt.exp(x), rt.sin(x) * 2
    p = plan([kept.node], roots=[kept.node, dropped.node])
    assert {n.op for n in p.removed} == {"sin", "mul", "full"}
    assert dropped.node in p.removed and kept.node in p.nodes
    p = plan([kept.node], roots=[kept.node, dropped.node], passes=Passes(dead=False))
    assert p.removed == [] and dropped.node in p.nodes
    p = plan([(kept + 1).node], cached=lambda n: n is kept.node)  # exp is cached: x is not needed
    assert p.known == {kept.node} and x.node in p.removed
    assert "dead nodes: removed 3 (%" in rt.explain(kept, dropped, outputs=[kept])


def test_common_subexpressions_merge():
    x = rt.tensor(np.arange(5.0))
    y = rt.exp(x + 1) * rt.exp(x + 1)
    p = plan([y.node])
    # the two 1s are one fill node already (tracing shares a Python scalar's fill), so CSE merges the rest
    assert [(a.op, b.op) for a, b in p.merged.items()] == [("add", "add"), ("exp", "exp")]
    assert len([n for n in p.nodes if n.op == "exp"]) == 1
    p = plan([y.node], passes=Passes(cse=False))
    assert p.merged == {} and len([n for n in p.nodes if n.op == "exp"]) == 2
    # the same data at another version, or another buffer, is not the same subexpression
    assert plan([(rt.tensor(np.ones(2)) + rt.tensor(np.ones(2))).node]).merged == {}


def test_vertical_fusion_chains_and_reductions():
    x = rt.tensor(data((4, 8), "float32"))
    chain = rt.tanh(rt.exp(x) * 2 + 1)
    p = plan([chain.node])
    assert [(g.kind, [n.op for n in g.nodes]) for g in p.groups] == [("elementwise", ["exp", "mul", "add", "tanh"])]
    assert len(plan([chain.node], passes=Passes(vertical=False)).groups) == 4
    pro_epi = (rt.abs(x) * 3).sum(axis=1) / 8 + 1
    (g,) = plan([pro_epi.node]).groups
    assert (g.kind, g.axes, [n.op for n in g.nodes]) == ("reduce", (1,), ["abs", "mul", "sum", "div", "add"])
    (g,) = plan([rt.softmax(x).node]).groups
    assert g.pattern == "row-wise softmax" and [n.op for n in g.nodes] == ["max", "sub", "exp", "sum", "div"]
    gamma, beta = rt.tensor(np.ones(8, np.float32)), rt.tensor(np.zeros(8, np.float32))
    mu = x.mean(-1, keepdims=True)
    d = x - mu
    ln = d / rt.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    (g,) = plan([ln.node]).groups
    assert g.pattern == "row-wise layernorm" and g.inputs == [x.node, rt_full(g), gamma.node, beta.node]
    # a node two groups need is written once and read by both: here exp feeds a reduction over another axis
    e = rt.exp(x)
    p = plan([(e.sum(0)).node, (e.sum(1)).node])
    assert len(p.groups) == 3 and p.group_of()[e.node].outputs == [e.node]


def rt_full(g):
    (f,) = [i for i in g.inputs if i.op == "full"]
    return f


def test_horizontal_fusion_merges_independent_elementwise_groups_only():
    x, y = rt.tensor(np.ones((3, 3))), rt.tensor(np.ones((3, 3)))
    a, b = rt.sin(x) + 1, rt.cos(y) * 2
    c = rt.exp(x[0])  # another shape: not merged
    p = plan([a.node, b.node, c.node])
    wide = [g for g in p.groups if g.chains > 1]
    assert len(wide) == 1 and {n.op for n in wide[0].nodes} == {"sin", "add", "cos", "mul"}
    assert wide[0].outputs == [a.node, b.node]
    assert len(plan([a.node, b.node, c.node], passes=Passes(horizontal=False)).groups) == 4
    dependent = rt.exp(rt.sum(a)) + a  # needs a through a reduction: cannot share a launch with it
    assert all(g.chains == 1 for g in plan([a.node, dependent.node]).groups)


def test_results_are_the_same_with_each_pass_off():
    x = rt.tensor(data((5, 7), "float32"))
    outs = [rt.softmax(x), rt.logsumexp(x, axis=0), rt.exp(x + 1) * rt.exp(x + 1), rt.sin(x) + rt.cos(x.T).T,
            (x @ x.T).max(axis=1, keepdims=True) - x.mean()]
    want = [o.numpy() for o in outs]
    for passes in ALL_OFF:
        rt.clear_cache()
        got = rt.realize(*outs, passes=passes)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.numpy(passes=passes), w)


# -- the result cache -------------------------------------------------------------------------------------------
def test_a_repeat_runs_nothing():
    x = rt.tensor(data((4, 4), "float64"))
    y = rt.softmax(x) @ x
    first = y.numpy()
    before = rt.stats()
    assert before.launches == 2 and before.nodes == 6
    again = y.numpy()
    after = rt.stats()
    assert (after.launches, after.nodes, after.hits) == (2, 6, 1)
    assert again is first
    z = rt.softmax(x) @ x  # rebuilt from scratch: the same structure and inputs hit the cache too
    z.numpy()
    assert rt.stats().launches == 2


def test_a_write_reruns_exactly_what_depends_on_it():
    a, b = rt.tensor(np.ones(3)), rt.tensor(np.full(3, 2.0))
    da, db = rt.exp(a) + 1, rt.sin(b) * 2
    out = da * db
    rt.realize(out, da, db, passes=Passes(horizontal=False))
    assert rt.stats().nodes == 5
    rt.reset_stats()
    version = a.version
    a[1] = 5.0
    assert a.version == version + 1
    got = rt.realize(out, da, db, passes=Passes(horizontal=False))
    # one launch of exp, add and mul (da joined its user's group, and is written as an output of it); not sin*2
    assert (rt.stats().launches, rt.stats().nodes, rt.stats().hits) == (1, 3, 1)
    np.testing.assert_allclose(got[0].numpy(), (np.exp([1, 5, 1]) + 1) * np.sin(2.0) * 2)


def test_outside_arrays_count_as_changed_unless_marked():
    raw = np.ones(3)
    t = rt.asarray(raw)
    y = t * 2
    y.numpy()
    raw[0] = 10  # rxcuda cannot see this write
    assert y.numpy()[0] == 20 and rt.stats().launches == 2
    t.mark_unchanged()  # from now on: the result of the last evaluation stands
    y.numpy()
    y.numpy()
    assert rt.stats().launches == 2 and rt.stats().hits == 2
    t.mark_unchanged(False)
    raw[1] = 7
    assert y.numpy()[1] == 14 and rt.stats().launches == 3
    with pytest.raises(TypeError, match="outside array"):
        rt.tensor(raw).mark_unchanged()


def test_results_are_read_only_and_the_cache_can_be_skipped():
    y = rt.tensor(np.ones(2)) + 1
    with pytest.raises(ValueError):
        y.numpy()[0] = 5
    rt.clear_cache()
    rt.reset_stats()
    rt.realize(y, cache=False)
    rt.realize(y, cache=False)
    assert rt.stats().launches == 2 and len(rt.cache()) == 0


# -- explain ---------------------------------------------------------------------------------------------------------
def test_explain_names_passes_nodes_devices_launches_and_copies():
    x = rt.tensor(np.ones((2, 3), np.float32))
    text = rt.explain(rt.softmax(x), rt.tensor([1.0]).to("cuda"))
    assert text.splitlines()[0].startswith("program: 2 output(s), ")
    for line in ("passes:", "  dead nodes: removed 0", "  common subexpressions: merged 0", "nodes:", "launches:",
                 "copies:", "  vertical fusion: 1 group(s) of several ops"):
        assert line in text.splitlines(), line
    assert "reduce on cpu (2, 3) over axes (1,): max sub exp sum div -> %5 [row-wise softmax]" in text
    assert "cpu -> cuda (1,) float64 (asked: .to('cuda'))" in text
    assert "copy         (1,)           float64  cuda" in text
    off = rt.explain(rt.softmax(x), passes=Passes.none())
    assert "vertical fusion (off): 0 group(s)" in off and off.count(" on cpu ") == 5


def test_cuda_without_a_device_is_a_clear_error():
    from rxcuda.cuda._driver import probe

    if probe()[0]:
        pytest.skip("a CUDA device is here: tests/gpu/test_tensor_gpu.py runs the CUDA backend")
    t = rt.zeros(3, device="cuda")
    assert t.device == "cuda" and "cuda" in rt.explain(t + 1)
    for f in (t.numpy, t.cupy, (t + 1).realize, rt.tensor(np.ones(2)).to("cuda").numpy):
        with pytest.raises(rt.CudaUnavailableError, match=r"on 'cuda', but the CUDA backend cannot run here: .*"
                                                          r"\.to\('cpu'\)"):
            f()
    assert issubclass(rt.CudaUnavailableError, RuntimeError)


class FakeCudaArray:  # what CuPy and PyTorch CUDA tensors expose
    __cuda_array_interface__ = {"shape": (2, 3), "typestr": "<f4", "data": (0, False), "version": 3}


def test_cuda_arrays_from_outside_are_held_on_cuda():
    t = rt.asarray(FakeCudaArray())
    assert (t.shape, t.dtype, t.device) == ((2, 3), np.float32, "cuda")
    assert (t * 2).device == "cuda" and (t * 2).dtype == np.float32


# -- errors ---------------------------------------------------------------------------------------------------
def test_clear_errors():
    a, b = rt.tensor(np.ones((2, 3))), rt.tensor(np.ones((4, 3)))
    with pytest.raises(rt.ShapeError, match=r"add: shapes \(2, 3\) and \(4, 3\) do not broadcast: axis -2"):
        a + b
    with pytest.raises(rt.ShapeError, match=r"matmul: shapes \(2, 3\) and \(2, 3\) do not fit"):
        a @ a
    with pytest.raises(np.exceptions.AxisError, match="sum: axis 2 is out of range .* use an axis from -2 to 1"):
        a.sum(axis=2)
    with pytest.raises(ValueError, match="unknown device 'gpu': use 'cpu' or 'cuda'"):
        a.to("gpu")
    with pytest.raises(rt.DeviceError, match=r"operands on different devices .* move one with .to"):
        a + rt.zeros((2, 3), device="cuda")
    with pytest.raises(rt.ShapeError, match=r"reshape: shape \(2, 3\) has 6 elements, \(4,\) has 4"):
        a.reshape(4)
    with pytest.raises(TypeError, match="basic slicing"):
        a[1.5]  # an index list is a gather now (rt.take), see test_tensor_numpy.py
    with pytest.raises(IndexError, match="out of bounds for axis 0 with length 2"):
        a[2]
    with pytest.raises(TypeError, match="only a tensor made from data can be written"):
        (a + 1)[0] = 1
    with pytest.raises(TypeError, match="truth value of a lazy tensor"):
        bool(a > 0)
    with pytest.raises(ValueError, match="max over an empty axis"):
        rt.tensor(np.ones((0, 2))).max(axis=0)


def test_importing_rxcuda_does_not_import_the_tensor_package():
    import subprocess

    code = "import sys, rxcuda; assert 'rxcuda.tensor' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_every_op_name_has_an_evaluation():
    from rxcuda.tensor._graph import OPS

    assert len(OPS) == len(set(OPS)) and set(itertools.chain(BINARY, UNARY)) < OPS
