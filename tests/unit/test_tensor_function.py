"""rt.function on the CPU backend: tracing, guards, retracing, in-place writes, optimizers, trace-time errors; and
the capture verbs of rxcuda/cuda/_capture.py on the null driver."""

import numpy as np
import pytest

import rxcuda.tensor as rt
from rxcuda.cuda import NullDriver
from rxcuda.cuda._capture import capture

RNG = np.random.default_rng(2024)


def test_traced_once_per_signature_and_replayed():
    calls = []

    @rt.function
    def f(x, y, scale):
        calls.append(1)  # Python runs only while tracing
        return rt.softmax(x * scale, axis=-1) + y.sum()

    a, b = RNG.normal(size=(4, 5)), RNG.normal(size=(3,))
    for _ in range(3):
        a = RNG.normal(size=(4, 5))
        out = f(rt.tensor(a), rt.tensor(b), 0.5)
        e = np.exp(a * 0.5 - (a * 0.5).max(-1, keepdims=True))
        np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True) + b.sum())
    assert len(calls) == 1
    assert (f.stats.calls, f.stats.traces, f.stats.replays) == (3, 1, 2)
    f(rt.tensor(a), rt.tensor(b), 2.0)  # a static argument with a new value: a new trace
    f(rt.tensor(a[:2]), rt.tensor(b), 0.5)  # a new shape (batch size): a new trace
    f(rt.tensor(a.astype(np.float32)), rt.tensor(b), 0.5)  # a new dtype
    f(rt.tensor(a) * 1, rt.tensor(b), 0.5)  # a lazy argument of the same signature: evaluated, then a replay
    assert len(calls) == 4 and f.stats.traces == 4
    assert f.signatures[2] == (((2, 5), np.dtype(np.float64), "cpu"), ((3,), np.dtype(np.float64), "cpu"))
    f.clear()
    f(rt.tensor(a), rt.tensor(b), 0.5)
    assert len(calls) == 5


def test_structures_in_and_out():
    @rt.jit
    def f(pair, named):
        x, y = pair
        return {"sum": x + y, "both": (x * named["k"], None), "n": 3}

    a, b = RNG.normal(size=3), RNG.normal(size=3)
    out = f((rt.tensor(a), rt.tensor(b)), {"k": rt.tensor(b)})
    np.testing.assert_allclose(out["sum"].numpy(), a + b)
    np.testing.assert_allclose(out["both"][0].numpy(), a * b)
    assert out["both"][1] is None and out["n"] == 3
    np.testing.assert_allclose(f((a, b), {"k": b})["sum"].numpy(), a + b)  # NumPy arrays are tensors too


def test_results_are_fresh_and_writable_each_call():
    f = rt.function(lambda x: x * 2)
    r1 = f(rt.tensor(np.ones(3)))
    r2 = f(rt.tensor(np.full(3, 2.0)))
    np.testing.assert_array_equal(r1.numpy(), [2, 2, 2])
    np.testing.assert_array_equal(r2.numpy(), [4, 4, 4])
    r1[0] = 7.0
    assert r1.numpy()[0] == 7.0


def test_outside_tensors_are_read_at_each_call():
    w = rt.tensor(np.array([1.0, 2.0]))
    f = rt.function(lambda x: x * w)
    np.testing.assert_array_equal(f(rt.tensor(np.ones(2))).numpy(), [1, 2])
    w[...] = np.array([3.0, 4.0])
    np.testing.assert_array_equal(f(rt.tensor(np.ones(2))).numpy(), [3, 4])
    assert f.stats.traces == 1


def test_in_place_writes_replay_and_later_reads_see_them():
    @rt.function
    def step(acc, x):
        acc[...] = acc + x
        return acc * 10  # reads the new value

    acc = rt.tensor(np.zeros(3))
    for k in range(1, 4):
        out = step(acc, rt.tensor(np.ones(3)))
        np.testing.assert_array_equal(acc.numpy(), [k, k, k])
        np.testing.assert_array_equal(out.numpy(), [10 * k] * 3)
    assert acc.version == 3
    assert step.stats.traces == 1
    other = rt.tensor(np.full(3, 5.0))
    step(other, rt.tensor(np.ones(3)))  # the same trace writes into the argument it is given
    np.testing.assert_array_equal(other.numpy(), [6, 6, 6])
    np.testing.assert_array_equal(acc.numpy(), [3, 3, 3])


def test_writes_of_arrays_and_numbers():
    @rt.function
    def reset(t, k):
        t[...] = k
        return t + 0

    a = rt.tensor(np.zeros(3))
    np.testing.assert_array_equal(reset(a, 2).numpy(), [2, 2, 2])
    np.testing.assert_array_equal(a.numpy(), [2, 2, 2])

    @rt.function
    def fill(t):
        t[...] = np.array([1.0, 2.0, 3.0])
        return t

    fill(a)
    np.testing.assert_array_equal(a.numpy(), [1, 2, 3])


def test_an_output_that_is_a_cached_value_is_its_own_copy():
    x = rt.tensor(np.ones(3))
    lazy = x * 2
    lazy.numpy()  # cached
    out = rt.function(lambda t: t)(lazy)
    out[0] = 9.0
    np.testing.assert_array_equal(lazy.numpy(), [2, 2, 2])


def test_write_errors():
    @rt.function
    def partial(t):
        t[0] = 1.0
        return t

    with pytest.raises(rt.TraceError, match=r"only whole writes \(t\[...\] = value\) are replayed"):
        partial(rt.tensor(np.zeros(3)))

    @rt.function
    def by_mask(t):
        t[t > 0] = 1.0
        return t

    with pytest.raises(rt.TraceError, match=r"t\[Tensor\(gt, .*\)\] = ... inside .* only whole writes"):
        by_mask(rt.tensor(np.zeros(3)))

    @rt.function
    def into_lazy(t):
        t[...] = 1.0
        return t

    with pytest.raises(rt.TraceError, match="writes into its argument 0, which is a lazy mul tensor"):
        into_lazy(rt.tensor(np.zeros(3)) * 2)
    into_lazy(rt.tensor(np.zeros(3)))
    with pytest.raises(rt.TraceError, match="writes into its argument 0, which is a lazy mul tensor at this call"):
        into_lazy(rt.tensor(np.zeros(3)) * 2)

    w = rt.tensor(np.zeros(2))
    v = w + 1

    @rt.function
    def into_computed(x):
        v[...] = x
        return x

    with pytest.raises(rt.TraceError, match="goes to a lazy add tensor; only a tensor made from data"):
        into_computed(rt.tensor(np.ones(2)))


def test_host_reads_inside_a_trace_are_trace_errors():
    x = rt.tensor(np.ones(3))
    cases = {
        "branch": lambda t: t if t.sum() > 0 else -t,
        "float": lambda t: t * float(t.sum()),
        "item": lambda t: t * t.sum().item(),
        "numpy": lambda t: t.numpy(),
        "tolist": lambda t: t.tolist(),
    }
    for name, body in cases.items():
        f = rt.function(body)
        f.__name__ = name
        with pytest.raises(rt.TraceError, match=r"inside rxcuda.tensor.function .* rt.where\(cond, a, b\)"):
            f(x)
    with pytest.raises(rt.TraceError, match=r"a Python branch on a tensor \(if t:"):
        rt.function(lambda t: 1 if t.sum() else 0)(x)
    with pytest.raises(TypeError, match=r"loss.backward\(\) inside rxcuda.tensor.function .* rt.grad"):
        rt.function(lambda t: t.sum().backward())(rt.tensor(np.ones(2), requires_grad=True))
    printed = []
    rt.function(lambda t: printed.append(str(t)) or t)(x)  # print shows what is traced, reads nothing
    assert printed == ["Tensor(traced const, shape=(3,), dtype=float64, device='cpu')"]
    assert rt.function(lambda t: rt.where(t.sum() > 0, t, -t))(x).numpy().tolist() == [1, 1, 1]


def test_max_traces_and_argument_errors():
    f = rt.function(lambda x: x + 1, max_traces=2)
    f(rt.tensor(np.ones(1)))
    f(rt.tensor(np.ones(2)))
    with pytest.raises(rt.TraceError, match=r"traced 2 times \(max_traces=2\) .* pad the inputs"):
        f(rt.tensor(np.ones(3)))
    with pytest.raises(TypeError, match="got an unhashable set"):
        f({1})
    with pytest.raises(TypeError, match="wraps a callable"):
        rt.function(3)
    with pytest.raises(ValueError, match="'max_traces' must be a positive int or None"):
        rt.function(lambda x: x, max_traces=0)


def test_methods_trace_per_instance():
    class Layer:
        def __init__(self, scale):
            self.w = rt.tensor(np.full(2, scale))

        @rt.function
        def __call__(self, x):
            return x * self.w

    a, b = Layer(2.0), Layer(3.0)
    np.testing.assert_array_equal(a(rt.tensor(np.ones(2))).numpy(), [2, 2])
    np.testing.assert_array_equal(b(rt.tensor(np.ones(2))).numpy(), [3, 3])
    np.testing.assert_array_equal(a(rt.tensor(np.ones(2))).numpy(), [2, 2])
    assert Layer.__call__.stats.traces == 2 and Layer.__call__.stats.replays == 1


def test_nested_functions_inline():
    inner = rt.function(lambda x: x * 3)
    outer = rt.function(lambda x: inner(x) + 1)
    np.testing.assert_array_equal(outer(rt.tensor(np.ones(2))).numpy(), [4, 4])
    assert inner.stats.calls == 0


def _mlp_data(n=16, d=5, h=7, seed=3):
    r = np.random.default_rng(seed)
    return (r.normal(size=(n, d)), r.normal(size=(n, 1)), r.normal(size=(d, h)) * 0.3, r.normal(size=h) * 0.1,
            r.normal(size=(h, 1)) * 0.3)


def _reference_grads(x, y, w1, b1, w2):
    h = x @ w1 + b1
    a = np.maximum(h, 0)
    p = a @ w2
    d = 2 * (p - y) / y.size
    gw2 = a.T @ d
    da = d @ w2.T * (h > 0)
    return ((p - y) ** 2).mean(), [x.T @ da, da.sum(0), gw2]


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
def test_training_step_matches_a_numpy_reference(kind):
    x, y, w1, b1, w2 = _mlp_data()
    params = [rt.tensor(v, requires_grad=True) for v in (w1, b1, w2)]
    opt = {"sgd": lambda: rt.SGD(params, lr=0.05), "momentum": lambda: rt.SGD(params, lr=0.05, momentum=0.9,
                                                                              weight_decay=0.01),
           "adam": lambda: rt.Adam(params, lr=0.01)}[kind]()

    @rt.function
    def step(xb, yb):
        w1_, b1_, w2_ = params
        loss = ((rt.maximum(xb @ w1_ + b1_, 0) @ w2_ - yb) ** 2).mean()
        opt.step(rt.grad(loss, params))
        return loss

    ref = [w1.copy(), b1.copy(), w2.copy()]
    state = [[np.zeros_like(p) for p in ref] for _ in range(2)]
    losses = []
    for t in range(1, 6):
        loss = step(rt.tensor(x), rt.tensor(y))
        want, grads = _reference_grads(x, y, *ref)
        for k, g in enumerate(grads):  # torch.optim's update rules
            if kind == "sgd":
                ref[k] = ref[k] - 0.05 * g
            elif kind == "momentum":
                g = g + 0.01 * ref[k]
                state[0][k] = 0.9 * state[0][k] + g
                ref[k] = ref[k] - 0.05 * state[0][k]
            else:
                state[0][k] = 0.9 * state[0][k] + 0.1 * g
                state[1][k] = 0.999 * state[1][k] + 0.001 * g * g
                mh, vh = state[0][k] / (1 - 0.9 ** t), state[1][k] / (1 - 0.999 ** t)
                ref[k] = ref[k] - 0.01 * mh / (np.sqrt(vh) + 1e-8)
        np.testing.assert_allclose(float(loss), want, rtol=1e-9)
        for p, r in zip(params, ref, strict=True):
            np.testing.assert_allclose(p.numpy(), r, rtol=1e-6, atol=1e-9)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    assert step.stats.traces == 1 and step.stats.replays == 4


def test_optimizer_outside_a_function_and_its_errors():
    w = rt.tensor(np.array([1.0, 2.0]), requires_grad=True)
    opt = rt.SGD([w], lr=0.5)
    (w * w).sum().backward()
    opt.step()  # reads w.grad
    np.testing.assert_allclose(w.numpy(), [0.0, 0.0])
    opt.zero_grad()
    assert w.grad is None
    with pytest.raises(ValueError, match=r"step\(\) without gradients reads p.grad, and a parameter has none"):
        opt.step()
    with pytest.raises(ValueError, match=r"gradient 0 has shape \(3,\); parameter 0 has shape \(2,\)"):
        opt.step([rt.tensor(np.ones(3))])
    with pytest.raises(ValueError, match=r"step\(\) got 2 gradients for 1 parameters"):
        opt.step([w, w])
    with pytest.raises(ValueError, match="'lr' must be a number >= 0.0"):
        rt.SGD([w], lr=-1)
    with pytest.raises(ValueError, match=r"'betas\[1\]' must be a number in \[0.0, 1.0\)"):
        rt.Adam([w], betas=(0.9, 1.0))
    with pytest.raises(TypeError, match="params\\[0\\] has dtype int64"):
        rt.SGD([rt.tensor([1, 2])])
    with pytest.raises(ValueError, match="at least one parameter"):
        rt.Adam([])


def test_learning_rate_is_a_tensor_changed_without_retracing():
    w = rt.tensor(np.array([1.0]), requires_grad=True)
    opt = rt.SGD([w], lr=0.1)
    step = rt.function(lambda: opt.step(rt.grad((w * w).sum(), [w])))
    step()
    np.testing.assert_allclose(w.numpy(), [0.8])
    opt.lr[...] = 0.5
    step()
    np.testing.assert_allclose(w.numpy(), [0.0])
    assert step.stats.traces == 1


def test_capture_verbs_on_the_null_driver():
    api = NullDriver()
    g = capture(5, lambda: None, api=api)
    assert api.names()[-3:] == ["cuStreamBeginCapture", "cuStreamEndCapture", "cuGraphInstantiate"]
    g.launch(5)
    g.launch(5)
    assert g.launches == 2 and api.names().count("cuGraphLaunch") == 2
    g.close()
    g.close()
    assert g.closed and api.leaks() == {}
    with pytest.raises(RuntimeError, match="this captured graph is closed"):
        g.launch(5)

    def fail():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        capture(5, fail, api=api)
    assert api.names()[-1] == "cuGraphDestroy" and api.leaks() == {}


def test_a_cuda_program_that_copies_host_data_is_refused_before_capture():
    from rxcuda.tensor import _ops

    # data said to be on cuda (a host array stands in: tracing and planning read no values; the check is first)
    x = rt.Tensor(_ops.const(np.zeros(3, np.float32), True, "cuda"))
    f = rt.function(lambda t: t + rt.tensor(np.ones(3, np.float32), device="cuda"))
    with pytest.raises(rt.CaptureError, match=r"copies a const \(3,\) from cpu to cuda, which a CUDA graph cannot "
                                              r"replay: make that data a CUDA tensor"):
        f(x)
    g = rt.function(lambda t: t.to("cpu") * 2)
    with pytest.raises(rt.CaptureError, match="from cuda to cpu"):
        g(x)


def test_a_trace_on_one_thread_does_not_stop_evaluations_on_another():
    import threading

    seen = []

    def body(t):
        other = threading.Thread(target=lambda: seen.append(rt.tensor([1.0, 2.0]).sum().item()))
        other.start()
        other.join()
        return t + 1

    np.testing.assert_array_equal(rt.function(body)(rt.tensor(np.ones(2))).numpy(), [2, 2])
    assert seen == [3.0]


def test_the_trace_keeps_no_argument_data_alive():
    import gc
    import weakref

    a = np.ones(1000)
    ref = weakref.ref(a)
    f = rt.function(lambda x: x * 2)
    f(rt.asarray(a))
    del a
    gc.collect()
    assert ref() is None
    np.testing.assert_array_equal(f(rt.tensor(np.full(1000, 3.0))).numpy(), np.full(1000, 6.0))


class _FakeArray:
    """Stands for a CuPy array: an address and a value."""

    _next = [0x1000]

    def __init__(self, value, ptr=None):
        if ptr is None:
            ptr = self._next[0] = self._next[0] + 0x100
        self.data = type("Memory", (), {"ptr": ptr})()
        self.value = value

    def copy(self):
        return _FakeArray(self.value)

    def __setitem__(self, index, v):
        self.value = v.value


class _FakeBackend:
    """The parts of the CUDA backend that rxcuda/tensor/_replay.py uses, without a device."""

    def __init__(self):
        self.capturing = False
        self.allocator = "pool"
        self.cp = self
        self.cuda = self
        self.ndarray = _FakeArray
        self.stream = self
        self.ptr = 77

    def asarray(self, a):
        return a

    def get_allocator(self):
        return self.allocator

    def set_allocator(self, allocator):
        self.allocator = allocator

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _FakeProgram:
    """One output (2 * x) and one write (x + target) per run, recording how each run was made."""

    def __init__(self, backend, fail=False, writes=1):
        self.cuda = backend
        self.runs = []
        self.fail = fail
        self.writes = writes

    def run_arrays(self, arrays, stats, keep=None):
        self.runs.append((self.cuda.capturing, keep is not None, self.cuda.allocator != "pool"))
        if self.fail and keep is not None:
            raise RuntimeError("operation not permitted when stream is capturing")
        x, target = arrays
        values = [_FakeArray(2 * x.value), _FakeArray(x.value + target.value)][:1 + self.writes]
        if keep is not None:
            keep.extend(values)
        return values


def _replays(monkeypatch, fail=False, writes=1):
    from types import SimpleNamespace

    from rxcuda.tensor import _replay

    api = NullDriver()

    def fake_capture(stream, record):
        assert stream == 77
        return capture(stream, record, api=api)

    monkeypatch.setattr(_replay, "capture", fake_capture)
    be = _FakeBackend()
    program = _FakeProgram(be, fail, writes)
    trace = SimpleNamespace(program=program, nouts=1, owner=SimpleNamespace(name="step"))
    return _replay.Replays(trace), program, api


def test_replays_capture_once_per_buffer_set_and_launch_once_a_call(monkeypatch):
    from rxcuda.tensor import _ops
    from rxcuda.tensor._function import FunctionStats

    r, program, api = _replays(monkeypatch)
    x, acc = _FakeArray(3.0), _FakeArray(10.0)
    buf = _ops.const(acc, True, "cuda", (1,), np.float64).attrs[0]
    stats = FunctionStats()
    (out,) = r.run([x, acc], [buf], stats)
    # three warm runs as the capture will run (matmuls through Gemm), then one recorded with a kept allocator
    assert program.runs == [(True, False, False)] * 3 + [(True, True, True)]
    assert r.backend.capturing is False and r.backend.allocator == "pool"
    assert (stats.captures, stats.graph_launches) == (1, 1) and buf.version == 1
    assert out.value == 6.0 and acc.value == 13.0  # the write target got its value during the recorded run
    assert api.names().count("cuGraphLaunch") == 1
    r.run([x, acc], [buf], stats)
    assert len(program.runs) == 4 and (stats.captures, stats.graph_launches) == (1, 2) and buf.version == 2
    assert api.names().count("cuGraphLaunch") == 2
    r.run([_FakeArray(1.0), acc], [buf], stats)  # another input buffer: a graph of its own
    assert (stats.captures, stats.graph_launches, len(r.graphs)) == (2, 3, 2)


def test_replays_copy_a_held_output_before_overwriting_it(monkeypatch):
    from rxcuda.tensor import _ops
    from rxcuda.tensor._function import FunctionStats

    r, _, _ = _replays(monkeypatch, writes=0)
    x, acc = _FakeArray(1.0), _FakeArray(0.0)
    stats = FunctionStats()
    (value,) = r.run([x, acc], [], stats)
    held = rt.Tensor(_ops.const(value, False, "cuda", (1,), np.float64))
    dropped = rt.Tensor(_ops.const(_FakeArray(0.0, value.data.ptr), False, "cuda", (1,), np.float64))
    r.hold([held, dropped])
    del dropped
    r.run([x, acc], [], stats)
    assert held.node.attrs[0].array is not value and held.node.attrs[0].array.value == value.value
    r.hold([])


def test_replays_keep_at_most_a_few_graphs_and_close_them(monkeypatch):
    from rxcuda.tensor import _replay
    from rxcuda.tensor._function import FunctionStats

    r, _, api = _replays(monkeypatch, writes=0)
    stats = FunctionStats()
    for _ in range(_replay.LIMIT + 2):
        r.run([_FakeArray(1.0), _FakeArray(0.0)], [], stats)
    assert len(r.graphs) == _replay.LIMIT and stats.captures == _replay.LIMIT + 2
    assert api.leaks().get("exec", 0) == _replay.LIMIT
    r.close()
    assert api.leaks() == {} and r.graphs == {}


def test_a_failed_capture_says_why_and_restores_the_backend(monkeypatch):
    from rxcuda.tensor._function import FunctionStats

    r, _, api = _replays(monkeypatch, fail=True, writes=0)
    with pytest.raises(rt.CaptureError, match=r"'step' could not be captured into a CUDA graph: RuntimeError: "
                                              r"operation not permitted .* graphs=False"):
        r.run([_FakeArray(1.0), _FakeArray(0.0)], [], FunctionStats())
    assert r.backend.capturing is False and r.backend.allocator == "pool"
    assert r.graphs == {} and api.leaks() == {}


def test_a_dropped_result_is_freed_at_once_so_a_replay_need_not_copy_it():
    """A data tensor's node held itself in its ``leaves`` (a reference cycle), so a function's result lived
    until the cycle collector ran and every replay copied the "still referenced" previous output first (on
    the H200 that copy was ~20 us of a ~30 us repeat call)."""
    import gc
    import weakref

    import numpy as np

    import rxcuda.tensor as rt

    f = rt.function(lambda v: v * 2.0 + 1.0)
    x = rt.tensor(np.arange(4, dtype=np.float32))
    gc.disable()
    try:
        out = f(x)
        np.testing.assert_array_equal(out.numpy(), np.arange(4, dtype=np.float32) * 2 + 1)
        node = weakref.ref(out.node)
        assert node().leaves == (node(),)
        del out
        assert node() is None  # freed by its reference count, no collection needed
    finally:
        gc.enable()
