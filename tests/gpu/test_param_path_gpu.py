"""The parameter hot path on a real GPU (rxcuda/engine/_update.py's hot table): every frame's value and count
reach the kernel, with a live view's subscribers attached and after a rebuild; checked against NumPy on fresh
random data."""

import numpy as np

from rxcuda import Block

N = 4096


def test_every_frame_runs_with_the_value_and_count_set_before_it(engine, rng, kernels):
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=1.0))
    x = rng.standard_normal(N).astype(np.float32)
    engine.write(mul["x"], x)
    engine.tick()
    out = x.copy()
    seen: list = []
    subs = [engine.changes.subscribe(lambda e: None), engine.updates.subscribe(seen.append),
            engine.frames.subscribe(lambda f: None)]
    for i in range(40):
        scale = float(rng.uniform(-4.0, 4.0))
        n = int(rng.integers(1, N + 1)) if i % 3 == 0 else N  # a count every third frame
        mul.params["scale"].value = scale
        mul.params["n"].value = n
        frame = engine.tick()
        assert frame.tiers == ("parameters",) and frame.state == "ok"
        out[:n] = x[:n] * np.float32(scale)  # the elements past n keep what the last frame wrote
        np.testing.assert_allclose(engine.read(mul["out"]), out, rtol=1e-6)
    assert len(seen) == 40 and all(u.tiers == ("parameters",) and u.blocks == ("scalar_mul",) for u in seen)
    for s in subs:
        s.dispose()


def test_after_a_rebuild_values_reach_the_new_graph(engine, rng, kernels):
    first = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=2.0, name="first"))
    x = rng.standard_normal(N).astype(np.float32)
    engine.write(first["x"], x)
    engine.tick()
    first.set(scale=3.0)
    engine.tick()  # the first graph's hot table holds scale
    second = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=0.5, name="second"))
    engine.connect(first["out"], second["x"])
    assert "structure" in engine.tick().tiers
    for _ in range(10):
        a, b = float(rng.uniform(0.5, 2.0)), float(rng.uniform(-2.0, 2.0))
        first.set(scale=a)
        second.set(scale=b)
        engine.tick()
        np.testing.assert_allclose(engine.read(second["out"]), x * np.float32(a) * np.float32(b), rtol=1e-6)
        first.set(scale=b)  # one value alone: the hot path
        assert engine.tick().tiers == ("parameters",)
        np.testing.assert_allclose(engine.read(second["out"]), x * np.float32(b) * np.float32(b), rtol=1e-6)


def test_one_value_a_frame_from_another_thread_in_every_form_reaches_the_kernel(engine, rng, kernels):
    """The hot path's one pending value (popped from the pending plan) and the setter's fast test: a Python
    float takes the fast test, a NumPy float32 and a Python int the full check; all set on another thread."""
    import threading

    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=1.0))
    x = rng.standard_normal(N).astype(np.float32)
    engine.write(mul["x"], x)
    engine.tick()
    values = [float(rng.uniform(-4.0, 4.0)) for _ in range(30)]
    values = [v if i % 3 == 0 else np.float32(v) if i % 3 == 1 else int(round(v * 10)) for i, v in enumerate(values)]
    for v in values:
        t = threading.Thread(target=lambda v=v: setattr(mul.params["scale"], "value", v))
        t.start()
        t.join()
        assert engine.tick().tiers == ("parameters",)
        np.testing.assert_allclose(engine.read(mul["out"]), x * np.float32(v), rtol=1e-6)


# one kernel with a parameter of each width the compiled path writes: f64, f32, i64, u32, i16 and a u8 flag
MIXED = r'''
extern "C" __global__ void mixed(const double* x, double* out, double a, float b, long long c, unsigned int d,
                                 short e, unsigned char f, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * a + (double)b + (double)c + (double)d + (double)e + (f ? 0.5 : 0.0);
}
'''


def _mixed_expected(x, a, b, c, d, e, f):
    return x * a + float(np.float32(b)) + float(c) + float(d) + float(e) + (0.5 if f else 0.0)


def test_the_compiled_path_runs_here_and_every_value_of_every_width_reaches_the_kernel(engine, rng):
    """On the GPU machine the compiled parameter path (rxcuda.cuda._native) builds and is the one in use; each
    frame changes one parameter (the drain's single value, applied in C) or several (the general path), of
    every width, and the kernel's result matches NumPy every frame -- then the same on the Python path."""
    from rxcuda.cuda import _native

    assert engine._updater.native is not None, f"the compiled parameter path did not build: {_native.why_not}"
    n = 2048
    blk = engine.add(Block.from_cuda(MIXED, size=n, a=1.0, b=0.0, c=0, d=0, e=0, f=0))
    x = rng.standard_normal(n)
    engine.write(blk["x"], x)
    engine.tick()
    vals = {"a": 1.0, "b": 0.0, "c": 0, "d": 0, "e": 0, "f": 0}
    draws = {"a": lambda: float(rng.uniform(-3, 3)), "b": lambda: float(rng.uniform(-100, 100)),
             "c": lambda: int(rng.integers(-2**40, 2**40)), "d": lambda: int(rng.integers(0, 2**32)),
             "e": lambda: int(rng.integers(-2**15, 2**15)), "f": lambda: int(rng.integers(0, 2))}
    for native in (True, False):
        assert engine._updater.use_native(native) is native
        for i in range(60):
            names = [list(draws)[i % 6]] if i % 4 else list(rng.choice(list(draws), 3, replace=False))
            for name in names:
                vals[name] = draws[name]()
                blk.params[name].value = vals[name]
            frame = engine.tick()
            assert frame.tiers == ("parameters",) and frame.state == "ok"
            np.testing.assert_allclose(engine.read(blk["out"]), _mixed_expected(x, **vals), rtol=1e-12, atol=1e-9)
