"""Streams on a real GPU: bound parameters, input and output streams, the frame loop, hot reload."""

import shutil
import threading
import time

import cupy as cp
import numpy as np
import pytest
import reactivex
from reactivex.subject import Subject

from rxcuda import Block


def rand(rng, n):
    return rng.standard_normal(n).astype(np.float32) + 0.25


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


def test_parameter_bound_to_observable_changes_results_each_frame(engine, rng, kernels):
    n = 2048
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    scale = Subject()
    sub = mul.params["scale"].bind(scale)
    for _ in range(6):
        s = float(rng.uniform(-3, 3))
        scale.on_next(s)
        engine.tick()
        np.testing.assert_allclose(engine.read(mul["out"]), x * np.float32(s), rtol=1e-6)
    sub.dispose()
    scale.on_next(100.0)  # after dispose: ignored
    engine.tick()
    assert mul.params["scale"].value != 100.0


def test_latest_value_wins_within_a_frame(engine, rng, kernels):
    n = 64
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    engine.tick()
    src = Subject()
    mul.params["scale"].bind(src)
    seen = []
    engine.updates.subscribe(seen.append)
    for v in (1.0, 2.0, 7.0):
        src.on_next(v)
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), x * 7, rtol=1e-6)
    assert seen[-1].tiers == ("parameters",) and seen[-1].events == 3 and seen[-1].blocks == ("scalar_mul",)


def test_bad_bound_value_is_a_warning_and_binding_survives(engine, rng, kernels):
    n = 32
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    diags = []
    engine.diagnostics.subscribe(diags.append)
    src = Subject()
    mul.params["scale"].bind(src)
    src.on_next("not a number")
    src.on_next(3.0)
    engine.tick()
    assert len(diags) == 1 and diags[0].severity == "warning" and "scalar_mul.scale" in diags[0].subject
    np.testing.assert_allclose(engine.read(mul["out"]), x * 3, rtol=1e-6)


@pytest.mark.parametrize("kind", ["numpy", "cupy"])
def test_input_stream_through_kernel_to_output_stream(engine, rng, kernels, kind):
    n = 10_000
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=1.5))
    source = Subject()
    engine.feed(mul["x"], source)
    got = []
    engine.observe(mul["out"], kind=kind).subscribe(lambda a: got.append(cp.asnumpy(a) if kind == "cupy" else a))
    sent = []
    for _ in range(5):
        x = rand(rng, n)
        sent.append(x)
        source.on_next(x if kind == "numpy" else cp.asarray(x))
        engine.tick()
    assert len(got) == 5
    for x, y in zip(sent, got, strict=True):
        np.testing.assert_allclose(y, x * 1.5, rtol=1e-6)
    assert engine.rebuilds == 1  # only the first build; feeding never rebuilds


def test_async_readback_without_per_frame_sync(engine, rng, kernels):
    n = 1 << 16
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    got = []
    engine.observe(mul["out"], every=2).subscribe(got.append)
    scales = [float(i + 1) for i in range(10)]
    for s in scales:
        mul.set(scale=s)
        engine.tick(sync=False)
    engine.tick(sync=True)  # the last, synced frame flushes every readback still in flight
    expected = [s for i, s in enumerate(scales + [scales[-1]], start=1) if i % 2 == 0]
    assert len(got) == len(expected)
    for y, s in zip(got, expected, strict=True):
        np.testing.assert_allclose(y, x * np.float32(s), rtol=1e-6)


def test_append_output_stream_emits_only_appended(engine, kernels):
    n = 256
    ap = engine.add(Block.from_kernel(kernels / "append_above.ptx", size=n, threshold=250.0))
    engine.write(ap["values"], np.arange(n, dtype=np.float32))
    got = []
    engine.observe(ap["out"]).subscribe(got.append)
    engine.tick()
    assert sorted(got[-1].tolist()) == [251, 252, 253, 254, 255]


def test_frames_stream_reports_gpu_time_and_tiers(engine, rng, kernels):
    engine.timing = True  # GPU time per frame is opt-in: two event records a frame
    n = 1 << 20
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n))
    engine.write(mul["x"], rand(rng, n))
    frames = []
    engine.frames.subscribe(frames.append)
    engine.tick()
    mul.set(scale=2.0)
    engine.tick()
    engine.tick()
    assert [f.tiers for f in frames] == [("structure",), ("parameters",), ()]
    assert all(f.gpu_us is not None and f.gpu_us > 0 for f in frames)
    assert [f.index for f in frames] == [1, 2, 3]


def test_run_on_a_clock_with_producers_on_many_threads(engine, rng, kernels):
    n = 4096
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=1.0))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    clock = Subject()
    frames = []
    engine.frames.subscribe(frames.append)
    running = engine.run(clock)
    engine_threads = [t for t in threading.enumerate() if t.name == "rxcuda-engine"]
    assert len(engine_threads) == 1
    with pytest.raises(RuntimeError, match="run"):
        engine.tick()

    def producer(k):
        for i in range(2000):
            mul.params["scale"].value = float(k * 10_000 + i)

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        clock.on_next(0)
    for t in threads:
        t.join()
    last = mul.params["scale"].value

    def another_frame():
        clock.on_next(0)  # ticks that arrive while a frame is produced merge into one frame
        return frames and frames[-1].index >= 2

    assert wait_for(another_frame)
    # every tick sent is counted, as a frame or merged into one (the last ones once the loop has taken them)
    assert wait_for(lambda: engine.loop.stats.frames + engine.loop.stats.merged >= 51)
    # reads from this thread run on the engine thread between frames
    assert wait_for(lambda: np.allclose(engine.read(mul["out"]), x * np.float32(last), rtol=1e-6))
    assert all(f.launched for f in frames)
    running.dispose()
    assert not any(t.name == "rxcuda-engine" and t.is_alive() for t in threading.enumerate())
    engine.tick()  # the caller's thread may tick again once the loop is gone


def test_run_with_interval_clock(engine, rng, kernels):
    n = 512
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0))
    engine.write(mul["x"], rand(rng, n))
    frames = []
    engine.frames.subscribe(frames.append)
    running = engine.run(reactivex.interval(0.002))
    assert wait_for(lambda: len(frames) >= 20)
    running.dispose()
    count = len(frames)
    time.sleep(0.05)
    assert len(frames) == count  # no frames after dispose


def _copy_kernel(kernels, tmp_path, name, as_name):
    shutil.copy(kernels / f"{name}.ptx", tmp_path / f"{as_name}.ptx")
    shutil.copy(kernels / f"{name}.json", tmp_path / f"{as_name}.json")
    return tmp_path / f"{as_name}.ptx"


def test_hot_reload_ptx_while_running(engine, rng, kernels, tmp_path):
    n = 1024
    path = _copy_kernel(kernels, tmp_path, "vector_add", "op")
    blk = engine.add(Block.from_kernel(path, size=n))
    a, b = rand(rng, n), rand(rng, n)
    engine.write(blk["a"], a)
    engine.write(blk["b"], b)
    engine.tick()
    watch = engine.watch(debounce=0.02)
    frames = []
    engine.frames.subscribe(frames.append)
    running = engine.run(reactivex.interval(0.005))
    try:
        text = (kernels / "vector_sub.ptx").read_text().replace("vector_sub", "vector_add")
        tmp = tmp_path / "op.ptx.tmp"
        tmp.write_text(text)
        tmp.replace(path)  # how editors save: write a temp file, rename over
        assert wait_for(lambda: np.allclose(engine.read(blk["out"]), a - b, rtol=1e-6))
        assert engine.rebuilds == 1  # swapped in place
        before = len(frames)
        assert wait_for(lambda: len(frames) > before + 3)  # frames kept coming
    finally:
        running.dispose()
        watch.dispose()


def test_hot_reload_cu_and_broken_save_gives_one_diagnostic(engine, rng, tmp_path):
    n = 4096
    src = tmp_path / "forces.cu"
    body = (
        'extern "C" __global__ void forces(const float* x, float* out, float k, int n)\n'
        "{{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = {expr}; }}\n"
    )
    src.write_text(body.format(expr="k * x[i]"))
    blk = engine.add(Block.from_kernel(src, size=n, k=2.0))
    x = rand(rng, n)
    engine.write(blk["x"], x)
    engine.tick()
    np.testing.assert_allclose(engine.read(blk["out"]), 2 * x, rtol=1e-6)
    diags = []
    engine.diagnostics.subscribe(diags.append)
    watch = engine.watch(debounce=0.02)
    running = engine.run(reactivex.interval(0.005))
    try:
        src.write_text(body.format(expr="k * x[i] * x[i]"))
        assert wait_for(lambda: np.allclose(engine.read(blk["out"]), 2 * x * x, rtol=1e-5), timeout=20)
        src.write_text(body.format(expr="k * x[i] +* oops"))  # a typo
        assert wait_for(lambda: len(diags) >= 1, timeout=20)
        time.sleep(0.3)
        assert len(diags) == 1
        d = diags[0]
        assert d.severity == "error" and "forces.cu" in d.message and d.details
        assert any(getattr(x_, "line", None) == 2 for x_ in d.details)
        np.testing.assert_allclose(engine.read(blk["out"]), 2 * x * x, rtol=1e-5)  # old kernel still runs
        assert blk.state == "warning"
    finally:
        running.dispose()
        watch.dispose()


def test_close_leaves_no_threads(kernels, rng):
    import rxcuda

    before = {t.ident for t in threading.enumerate()}
    e = rxcuda.Engine()
    blk = e.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=64))
    e.write(blk["x"], rand(rng, 64))
    blk.params["scale"].bind(reactivex.interval(0.001).pipe(reactivex.operators.map(float)))
    e.watch()
    e.run(reactivex.interval(0.002))
    time.sleep(0.1)
    e.close()
    assert wait_for(lambda: {t.ident for t in threading.enumerate() if t.is_alive()} <= before, timeout=5)
