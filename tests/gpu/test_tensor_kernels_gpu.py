"""The generated kernels of rxcuda.tensor (rxcuda/tensor/_codegen.py) on a GPU, against NumPy on fresh random data.

Two ways in: each fused group's C++ kernel compiled with NVRTC and launched directly with ``launch_shape`` (so
the register-resident row kernels, the short-row warp kernels, the strided-loop fallback and the elementwise
kernels run whatever else the backend prefers), with inputs that may be strided or misaligned CuPy views; and
the same programs end to end through ``rxcuda.tensor`` on ``device="cuda"``. Row lengths cover every kernel
shape: 1..33 (a few lanes a row), 257..16384 (a block a row, vector loads where aligned) and 20000 (loops)."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import rxcuda.tensor as rt  # noqa: E402
from rxcuda.sources._nvrtc import compile_cuda  # noqa: E402
from rxcuda.tensor import _codegen as cg  # noqa: E402
from rxcuda.tensor import _ir  # noqa: E402
from rxcuda.tensor._passes import plan  # noqa: E402

COLS = [1, 3, 10, 31, 32, 33, 257, 1000, 4096, 5000, 20000]
ROWS = 37  # odd: the last block of short rows is part empty
DTYPES = [np.float32, np.float64]


@pytest.fixture(autouse=True)
def fresh():
    rt.clear_cache()
    rt.reset_stats()


def tol(dtype, ref):
    """(rtol, atol) for a result of ``dtype`` against the float64 reference ``ref``: a few hundred ulps."""
    eps = float(np.finfo(dtype).eps)
    scale = float(np.max(np.abs(ref))) if np.size(ref) else 1.0
    return 200 * eps, 200 * eps * max(1.0, scale)


def check(out, ref, dtype):
    out = cp.asnumpy(out) if isinstance(out, cp.ndarray) else np.asarray(out)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert out.dtype == np.dtype(dtype), out.dtype
    rtol, atol = tol(dtype, ref)
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=rtol, atol=atol)


def run_generated(program, arrays, views=None):
    """Plan ``program`` over CPU tensors of ``arrays``, then launch the C++ kernel of its one fused group on the
    GPU, the group's inputs being CuPy copies of ``arrays`` (or ``views[k]``, a CuPy array of the same shape and
    any strides, for input ``k``); returns (the kernel's outputs, its launch mode)."""
    tensors = [rt.tensor(a) for a in arrays]
    out = program(*tensors)
    outs = out if isinstance(out, tuple) else (out,)
    p = plan([t.node for t in outs])
    groups = [g for g in p.groups if g.kind in ("elementwise", "reduce")]
    assert len(groups) == 1, [g.kind for g in p.groups]
    g = groups[0]
    views = views or {}
    device = {id(t.node): views[k] if k in views else cp.asarray(a)
              for k, (t, a) in enumerate(zip(tensors, arrays, strict=True))}
    args, values = [], []
    for n in g.inputs:
        if n.op == "full":
            value = n.attrs[0]
            values.append(value)
            args.append(np.uint8(bool(value)) if n.dtype == np.bool_ else n.dtype.type(value))
        else:
            assert id(n) in device, f"group input {n.op} is not one of the program's arrays"
            values.append(device[id(n)])
            args.append(device[id(n)])
    ir = _ir.group_ir(g, p, values)
    assert ir is not None
    code = compile_cuda(cg.generate(ir), entry=cg.ENTRY, name="rx_group.cu")
    module = cp.cuda.function.Module()
    module.load(code.image)
    results = [cp.empty(n.shape, n.dtype) for n in g.outputs]
    blocks, threads = cg.launch_shape(ir)
    if blocks:
        module.get_function(code.entry)((blocks,), (threads,), (*args, *results))
    cp.cuda.runtime.deviceSynchronize()
    by_node = dict(zip(g.outputs, results, strict=True))
    answers = []
    for t in outs:  # the program's outputs: the group's, or a reshape of one (logsumexp drops the kept axis)
        node = t.node
        while node not in by_node:
            assert node.op == "reshape", f"output {node.op} is not the fused group's"
            node = p.inputs_of(node)[0]
        answers.append(by_node[node].reshape(t.shape))
    return answers, cg._planned(ir)[1].mode


# -- NumPy references (float64) -----------------------------------------------------------------------------------
def np_softmax(a, axis=-1):
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def np_logsumexp(a, axis=-1):
    m = a.max(axis, keepdims=True)
    return (np.log(np.exp(a - m).sum(axis, keepdims=True)) + m).squeeze(axis)


def np_layernorm(a):
    d = a - a.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)


def layernorm(x):
    mu = x.mean(-1, keepdims=True)
    d = x - mu
    return d / rt.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)


ROW_PROGRAMS = {
    "softmax": (lambda x: rt.softmax(x, axis=-1), np_softmax),
    "log_softmax": (lambda x: x - x.max(-1, keepdims=True) - rt.log(rt.exp(x - x.max(-1, keepdims=True))
                                                                     .sum(-1, keepdims=True)),
                    lambda a: a - a.max(-1, keepdims=True) - np.log(np.exp(a - a.max(-1, keepdims=True))
                                                                    .sum(-1, keepdims=True))),
    "logsumexp": (lambda x: rt.logsumexp(x, axis=-1), np_logsumexp),
    "layernorm": (layernorm, np_layernorm),
    "sum": (lambda x: x.sum(axis=-1), lambda a: a.sum(-1)),
    "max": (lambda x: x.max(axis=-1, keepdims=True), lambda a: a.max(-1, keepdims=True)),
    "min": (lambda x: x.min(axis=-1) * 2 + 1, lambda a: a.min(-1) * 2 + 1),
    "mean": (lambda x: x.mean(axis=-1), lambda a: a.mean(-1)),
}


@pytest.mark.parametrize("name", list(ROW_PROGRAMS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", COLS)
def test_row_kernels_launched_directly(rng, cols, dtype, name):
    program, reference = ROW_PROGRAMS[name]
    a = rng.standard_normal((ROWS, cols)).astype(dtype)
    (out,), mode = run_generated(program, [a])
    held = cols <= (16384 if dtype == np.float32 else 8192)
    assert mode == ("rows" if held else "loop")
    check(out, reference(a.astype(np.float64)), dtype)


@pytest.mark.parametrize("name", list(ROW_PROGRAMS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", COLS)
def test_row_programs_end_to_end(rng, cols, dtype, name):
    program, reference = ROW_PROGRAMS[name]
    a = rng.standard_normal((ROWS, cols)).astype(dtype)
    out = program(rt.tensor(cp.asarray(a))).cupy()
    check(out, reference(a.astype(np.float64)), dtype)


@pytest.mark.parametrize("cols", [1, 10, 33, 1000, 4096, 16384, 20000])
def test_every_element_is_counted_exactly_once(rng, cols):
    """Small integers in float32 sum exactly: any element read twice or skipped shows."""
    a = rng.integers(-8, 9, (ROWS, cols)).astype(np.float32)
    (out,), _ = run_generated(lambda x: x.sum(axis=-1), [a])
    np.testing.assert_array_equal(cp.asnumpy(out), a.astype(np.int64).sum(-1).astype(np.float32))
    (out,), _ = run_generated(lambda x: (x * x).sum(axis=0), [a])
    np.testing.assert_array_equal(cp.asnumpy(out), (a.astype(np.int64) ** 2).sum(0).astype(np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cols", [3, 32, 1000, 4096])
def test_rows_of_strided_and_misaligned_views(rng, cols, dtype):
    """Rows that are not 16-byte aligned (a column slice) and rows with a stride (a transpose): the kernel reads
    them element by element (the run-time alignment check, or no vector loads at all) with the same results."""
    big = cp.asarray(rng.standard_normal((ROWS, cols + 1)).astype(dtype))
    view = big[:, 1:]
    (out,), _ = run_generated(lambda x: rt.softmax(x, axis=-1), [cp.asnumpy(view)], {0: view})
    check(out, np_softmax(cp.asnumpy(view).astype(np.float64)), dtype)
    offset = cp.asarray(rng.standard_normal(ROWS * cols + 1).astype(dtype))[1:].reshape(ROWS, cols)
    (out,), _ = run_generated(layernorm, [cp.asnumpy(offset)], {0: offset})  # the base pointer 4 or 8 bytes off
    check(out, np_layernorm(cp.asnumpy(offset).astype(np.float64)), dtype)
    t = cp.asarray(rng.standard_normal((cols, ROWS)).astype(dtype)).T
    (out,), _ = run_generated(lambda x: rt.logsumexp(x, axis=-1), [cp.asnumpy(t)], {0: t})
    check(out, np_logsumexp(cp.asnumpy(t).astype(np.float64)), dtype)


@pytest.mark.parametrize("axis,keepdims", [(0, False), (1, True), ((0, 2), False), ((0, 2), True), ((1, 2), False),
                                           (None, False)])
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_over_other_and_several_axes(rng, op, axis, keepdims, dtype):
    a = rng.standard_normal((7, 300, 5)).astype(dtype)
    (out,), _ = run_generated(lambda x: getattr(x * 2 - 1, op)(axis=axis, keepdims=keepdims) + 1, [a])
    check(out, getattr(a.astype(np.float64) * 2 - 1, op)(axis=axis, keepdims=keepdims) + 1, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [10, 1000, 5000])
def test_softmax_over_the_first_axis(rng, rows, dtype):
    a = rng.standard_normal((rows, 33)).astype(dtype)
    (out,), _ = run_generated(lambda x: rt.softmax(x, axis=0), [a])
    check(out, np_softmax(a.astype(np.float64), axis=0), dtype)


def test_min_and_max_propagate_nan(rng):
    for cols in (10, 1000, 20000):
        a = rng.standard_normal((ROWS, cols)).astype(np.float32)
        a[3, cols // 2] = np.nan
        for op in ("max", "min"):
            (out,), _ = run_generated(lambda x, op=op: getattr(x, op)(axis=-1), [a])
            out = cp.asnumpy(out)
            assert np.isnan(out[3]) and not np.isnan(np.delete(out, 3)).any()
            np.testing.assert_array_equal(np.delete(out, 3), getattr(np.delete(a, 3, 0), op)(-1))


@pytest.mark.parametrize("cols", [10, 33, 4096, 20000])
def test_integer_and_bool_reductions(rng, cols):
    a = rng.integers(-1000, 1000, (ROWS, cols)).astype(np.int32)
    for program, reference in [
        (lambda x: x.sum(axis=-1), lambda a: a.sum(-1)),
        (lambda x: x.max(axis=-1), lambda a: a.max(-1)),
        (lambda x: (x * 3 - 1).min(axis=-1, keepdims=True), lambda a: (a * 3 - 1).min(-1, keepdims=True)),
        (lambda x: (x > 0).sum(axis=-1), lambda a: (a > 0).sum(-1)),
        (lambda x: (x > 990).max(axis=-1), lambda a: (a > 990).max(-1)),
        (lambda x: x.astype("int64").sum(axis=0), lambda a: a.astype(np.int64).sum(0)),
    ]:
        (out,), _ = run_generated(program, [a])
        expected = reference(a)
        assert cp.asnumpy(out).dtype == expected.dtype
        np.testing.assert_array_equal(cp.asnumpy(out), expected)


def test_per_row_and_per_element_outputs_of_one_kernel(rng):
    for cols in (10, 4096):
        a = rng.standard_normal((ROWS, cols)).astype(np.float32)
        (m, sm), mode = run_generated(lambda x: (x.max(axis=-1, keepdims=True), rt.softmax(x, axis=-1)), [a])
        assert mode == "rows"
        check(m, a.astype(np.float64).max(-1, keepdims=True), np.float32)
        check(sm, np_softmax(a.astype(np.float64)), np.float32)


def test_a_per_row_input_and_a_broadcast_weight_in_a_row_kernel(rng):
    a = rng.standard_normal((ROWS, 1000)).astype(np.float32)
    w = rng.standard_normal(1000).astype(np.float32)
    c = rng.standard_normal((ROWS, 1)).astype(np.float32)
    (out,), mode = run_generated(lambda x, w, c: rt.softmax(x * w + c, axis=-1) * w, [a, w, c])
    assert mode == "rows"
    check(out, np_softmax(a.astype(np.float64) * w + c) * w, np.float32)


# -- elementwise --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 1000, 1024, 4097, 1 << 20, (1 << 20) + 3])
def test_elementwise_contiguous(rng, n, dtype):
    a, b = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    (out,), mode = run_generated(lambda x, y: rt.tanh(x * 2 + y) - rt.exp(y) / (rt.abs(x) + 1), [a, b])
    assert mode == "elementwise"
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    check(out, np.tanh(a64 * 2 + b64) - np.exp(b64) / (np.abs(a64) + 1), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_broadcast_and_strided(rng, dtype):
    a = rng.standard_normal((300, 33)).astype(dtype)
    row = rng.standard_normal(33).astype(dtype)
    col = rng.standard_normal((300, 1)).astype(dtype)
    (out,), _ = run_generated(lambda x, r, c: rt.where(x > r, rt.maximum(x, c), rt.sqrt(rt.abs(x * r))) + c,
                              [a, row, col])
    check(out, np.where(a > row, np.maximum(a, col), np.sqrt(np.abs(a * row))) + col, dtype)
    t = cp.asarray(rng.standard_normal((33, 300)).astype(dtype)).T  # a transposed operand
    s = cp.asarray(rng.standard_normal((600, 66)).astype(dtype))[::2, 1::2]  # a stepped slice, offset start
    (out,), _ = run_generated(lambda x, y: rt.sin(x) * y + x, [cp.asnumpy(t), cp.asnumpy(s)], {0: t, 1: s})
    tt, ss = cp.asnumpy(t).astype(np.float64), cp.asnumpy(s).astype(np.float64)
    check(out, np.sin(tt) * ss + tt, dtype)


def test_elementwise_integers_and_bools(rng):
    a = rng.integers(-50, 50, (170, 90)).astype(np.int32)
    b = rng.integers(-50, 50, 90).astype(np.int32)
    for program, reference in [
        (lambda x, y: x * x - 3 * x + y, lambda a, b: a * a - 3 * a + b),
        (lambda x, y: (x > 0) == (x < y), lambda a, b: (a > 0) == (a < b)),
        (lambda x, y: rt.minimum(x, y) ** 2, lambda a, b: np.minimum(a, b) ** 2),
    ]:
        (out,), _ = run_generated(program, [a, b])
        expected = reference(a, b)
        assert cp.asnumpy(out).dtype == expected.dtype
        np.testing.assert_array_equal(cp.asnumpy(out), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_end_to_end_on_views(rng, dtype):
    a = rng.standard_normal((257, 130)).astype(dtype)
    x = rt.asarray(cp.asarray(a))
    check((x.T[::2, 1:] * 2 + 1).cupy(), a.T[::2, 1:].astype(np.float64) * 2 + 1, dtype)
    check((rt.exp(x[:, :1]) * x).cupy(), np.exp(a[:, :1].astype(np.float64)) * a, dtype)


# -- the vector path of elementwise kernels, and the tunings ------------------------------------------------------
EW_TUNINGS = {
    "default": cg.Tuning(),
    "unroll1-128": cg.Tuning(ew_unroll=1, ew_threads=128),
    "unroll8-3blocks-hints": cg.Tuning(ew_unroll=8, ew_max_blocks=3, loads="ldcs", stores="stcs"),
    "ldg-512": cg.Tuning(ew_threads=512, ew_unroll=2, loads="ldg"),
    "scalar": cg.Tuning(ew_vector=False),
}


@pytest.fixture
def tuning(request):
    """The tuning named by the test's parameter, for its kernels only."""
    previous = cg.set_tuning(request.param)
    yield request.param
    cg.set_tuning(previous)


def offset_view(a: np.ndarray, by: int = 1):
    """A CuPy copy of ``a`` whose data starts ``by`` elements past a 16-byte boundary (a misaligned view)."""
    flat = cp.zeros(a.size + by, a.dtype)
    flat[by:] = cp.asarray(a.ravel())
    return flat[by:].reshape(a.shape)


@pytest.mark.parametrize("tuning", list(EW_TUNINGS.values()), ids=list(EW_TUNINGS), indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("n", [2, 5, 8, 1023, 4096 + 3, 3 * 4096 * 4 + 2, (1 << 20) + 1])
def test_vector_elementwise_aligned_misaligned_and_tails(rng, tuning, dtype, n):
    """Whole vectors, the partial last tile and the scalar tail (sizes not a multiple of the vector), with every
    pointer 16-byte aligned (the vector path) or an input one element off (the scalar path), under each tuning."""
    if np.dtype(dtype).kind == "f":
        a, b = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    else:
        a, b = rng.integers(-1000, 1000, n).astype(dtype), rng.integers(-1000, 1000, n).astype(dtype)

    def program(x, y):
        return x * 3 - y + 1

    expected = a.astype(np.float64) * 3 - b + 1
    for views in ({}, {0: offset_view(a)}, {1: offset_view(b, 3)}, {0: offset_view(a, 2), 1: offset_view(b, 2)}):
        (out,), mode = run_generated(program, [a, b], views)
        assert mode == "elementwise"
        if np.dtype(dtype).kind == "f":
            check(out, expected, dtype)
        else:
            np.testing.assert_array_equal(cp.asnumpy(out), expected.astype(dtype))


@pytest.mark.parametrize("tuning", list(EW_TUNINGS.values()), ids=list(EW_TUNINGS), indirect=True)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(37, 33), (300, 4), (5, 4099), (1, 7)])
def test_vector_elementwise_with_broadcast_operands(rng, tuning, dtype, shape):
    """A dense operand read as vectors beside broadcast ones read at each element's coordinates (vectors that
    straddle rows where the row length is not a multiple of the vector)."""
    a = rng.standard_normal(shape).astype(dtype)
    row = rng.standard_normal(shape[1]).astype(dtype)
    col = rng.standard_normal((shape[0], 1)).astype(dtype)
    (out,), _ = run_generated(lambda x, r, c: rt.exp(x * r) - c / (rt.abs(x) + 1) + r, [a, row, col])
    a64, r64, c64 = a.astype(np.float64), row.astype(np.float64), col.astype(np.float64)
    check(out, np.exp(a64 * r64) - c64 / (np.abs(a64) + 1) + r64, dtype)
    t = cp.asarray(rng.standard_normal(shape[::-1]).astype(dtype)).T  # a transposed operand beside a dense one
    (out,), _ = run_generated(lambda x, y: x * y + 2, [a, cp.asnumpy(t)], {1: t})
    check(out, a64 * cp.asnumpy(t).astype(np.float64) + 2, dtype)


ROW_TUNINGS = {
    "elems4": cg.Tuning(row_elems=4),
    "elems8-late-occupancy": cg.Tuning(row_elems=8, late_loads=True, row_occupancy=1536),
    "elems32": cg.Tuning(row_elems=32),
    "block-rows-512-hints": cg.Tuning(row_block_threads=512, loads="ldcs", stores="stcs"),
    "min128-ldg": cg.Tuning(row_min_threads=128, loads="ldg"),
}


@pytest.mark.parametrize("tuning", list(ROW_TUNINGS.values()), ids=list(ROW_TUNINGS), indirect=True)
@pytest.mark.parametrize("cols", [1, 33, 257, 1000, 1024, 4096, 5000, 16384])
def test_row_kernels_under_other_tunings(rng, tuning, cols):
    """Softmax and layernorm with a weight and a bias (loaded late under ``late_loads``), aligned and not; rows of
    up to 1024 come 2113 at a time, enough for several block-wide rows to share a block (the last one part
    empty) where the tuning asks for that."""
    a = rng.standard_normal((2113 if cols <= 1024 else ROWS, cols)).astype(np.float32)
    g, b = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    a64 = a.astype(np.float64)
    (out,), mode = run_generated(lambda x: rt.softmax(x, axis=-1), [a])
    assert mode == "rows"
    check(out, np_softmax(a64), np.float32)
    (out,), _ = run_generated(lambda x: rt.softmax(x, axis=-1), [a], {0: offset_view(a)})
    check(out, np_softmax(a64), np.float32)
    (out,), _ = run_generated(lambda x, g, b: layernorm(x) * g + b, [a, g, b])
    check(out, np_layernorm(a64) * g + b, np.float32)
    (out,), _ = run_generated(lambda x: x.sum(axis=-1), [a])
    check(out, a64.sum(-1), np.float32)
