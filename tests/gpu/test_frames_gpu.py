"""The frame runner and the one way for a value and for code, on a real GPU: every launch path computes the
frame NumPy computes, on fresh random data.
"""

import shutil
import time

import numpy as np
import pytest

import rxcuda
from rxcuda import Block, Launch
from rxcuda import libraries as lib


def rand(rng, n):
    return rng.standard_normal(n).astype(np.float32) + 0.5


def f32(rng, lo=-3.0, hi=3.0) -> float:
    """A random float32 value as a Python float (what the kernel reads, exactly)."""
    return float(np.float32(rng.uniform(lo, hi)))


def _chain(engine, rng, kernels, n):
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=f32(rng)))
    engine.connect(add["out"], mul["x"])
    a, b = rand(rng, n), rand(rng, n)
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    return add, mul, a, b


@pytest.mark.parametrize("level", ["none", "summary", "per_block", "per_kernel", "deep", "deep_sync", "debug"])
def test_every_launch_path_computes_the_frame(engine, rng, kernels, level):
    n = 5003
    _add, mul, a, b = _chain(engine, rng, kernels, n)
    if level == "debug":
        engine.debug = True
    else:
        engine.profile = level
    engine.tick()
    for _ in range(3):
        scale = f32(rng)
        mul.set(scale=scale)
        frame = engine.tick()
        assert frame.launched and frame.state == "ok"
        assert (frame.gpu_us is not None and frame.gpu_us >= 0) == (level not in ("none", "debug"))
        np.testing.assert_allclose(engine.read(mul["out"]), (a + b) * np.float32(scale), rtol=1e-6)


def test_an_unsynced_tick_and_a_batch_compute_the_frame(engine, rng, kernels):
    n = 4099
    _add, mul, a, b = _chain(engine, rng, kernels, n)
    engine.tick()
    scale = f32(rng)
    mul.set(scale=scale)
    frame = engine.tick(sync=False)
    engine.synchronize()
    assert frame.tiers == ("parameters",)
    np.testing.assert_allclose(engine.read(mul["out"]), (a + b) * np.float32(scale), rtol=1e-6)
    scale = f32(rng)
    mul.set(scale=scale)
    frame = engine.run_batch(4)
    assert frame.frames == 4 and frame.tiers == ("parameters",) and engine.last_frame is frame
    np.testing.assert_allclose(engine.read(mul["out"]), (a + b) * np.float32(scale), rtol=1e-6)


def test_a_value_set_back_in_the_frame_of_a_resize_reaches_the_gpu(engine, rng, kernels):
    n = 1024
    add, mul, _a, _b = _chain(engine, rng, kernels, n)
    built_with = mul.params["scale"].value
    engine.tick()
    mul.set(scale=f32(rng))
    engine.tick()
    mul.set(scale=built_with)  # back to the value the running plan was built with, in the frame of a resize
    a, b = rand(rng, 600), rand(rng, 600)
    engine.write(add["a"], a, resize=True)
    engine.write(add["b"], b, resize=True)
    frame = engine.tick()
    assert frame.tiers == ("parameters",) and engine.rebuilds == 1  # the resize took the graph in place
    np.testing.assert_allclose(engine.read(mul["out"]), (a + b) * np.float32(built_with), rtol=1e-6)


def test_a_launch_set_back_in_the_frame_of_a_resize_reaches_the_gpu(engine, rng, kernels):
    n = 1024
    add, _mul, _a, _b = _chain(engine, rng, kernels, n)
    other = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, name="other", scale=f32(rng)))
    engine.write(other["x"], rand(rng, n))
    engine.tick()
    built = other.launch()
    other.set_launch(threads=n // 2)  # half the grid: the second half of `out` keeps what it had
    engine.tick()
    other.set_launch(grid=built.grid, block=built.block)  # the whole grid again, in the frame of a resize
    x = rand(rng, n)
    engine.write(other["x"], x)
    engine.write(add["a"], rand(rng, 600), resize=True)
    engine.write(add["b"], rand(rng, 600), resize=True)
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == 1
    np.testing.assert_allclose(engine.read(other["out"]), x * np.float32(other.params["scale"].value), rtol=1e-6)


def test_a_recapture_runs_the_drained_value(engine, rng, kernels):
    n = 4096
    code = rxcuda.load_kernel_file(kernels / "scalar_mul.ptx")
    step = lib.chain(lib.kernel(code, Launch.for_threads(n), counts={"x": n, "out": n}))
    blk = engine.add(Block.from_call(step, scale=f32(rng)))
    x = rand(rng, n)
    engine.write(blk["x"], x)
    engine.tick()
    drained, newer = f32(rng), f32(rng)
    blk.set(scale=drained)
    up = engine._rt.pending.drain()  # the engine thread drains ...
    blk.set(scale=newer)  # ... and a newer value arrives before the recapture: the next frame's
    assert engine._updater.apply(up) == ("recapture",)
    assert engine._rt.graph.launcher(engine._rt.stream_h) == 0  # one frame of the recaptured graph
    engine.synchronize()
    # (the read applies what is pending, the newer value's recapture, before it copies: no frame runs)
    np.testing.assert_allclose(engine.read(blk["out"]), np.float32(drained) * x, rtol=1e-6)
    engine.tick()
    np.testing.assert_allclose(engine.read(blk["out"]), np.float32(newer) * x, rtol=1e-6)


def test_swapped_code_keeps_running_through_an_in_place_resize(engine, rng, kernels):
    n = 2048
    blk = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    a, b = rand(rng, n), rand(rng, n)
    engine.write(blk["a"], a)
    engine.write(blk["b"], b)
    engine.tick()
    sub = rxcuda.load_kernel_file(kernels / "vector_sub.ptx")
    assert blk.set_code(None, sub) == "code"
    assert engine.tick().tiers == ("code",)
    np.testing.assert_allclose(engine.read(blk["out"]), a - b, rtol=1e-6)
    assert engine.plan.nodes[0].code_key == sub.key
    a, b = rand(rng, 1500), rand(rng, 1500)
    engine.write(blk["a"], a, resize=True)
    engine.write(blk["b"], b, resize=True)
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == 1
    np.testing.assert_allclose(engine.read(blk["out"]), a - b, rtol=1e-6)


def test_a_saved_file_and_block_reload_swap_code_the_same_way(engine, rng, kernels, tmp_path):
    n = 3001
    src = tmp_path / "k.ptx"
    shutil.copy(kernels / "vector_add.ptx", src)
    shutil.copy(kernels / "vector_add.json", tmp_path / "k.json")
    blk = engine.add(Block.from_kernel(src, size=n))
    a, b = rand(rng, n), rand(rng, n)
    engine.write(blk["a"], a)
    engine.write(blk["b"], b)
    engine.tick()
    watching = engine.watch(debounce=0.02)
    try:
        src.write_text((kernels / "vector_sub.ptx").read_text().replace("vector_sub", "vector_add"))
        deadline = time.monotonic() + 20
        tiers: tuple = ()
        while "code" not in tiers and time.monotonic() < deadline:
            time.sleep(0.02)
            tiers = engine.tick().tiers
        assert "code" in tiers, "the saved file was not swapped in within 20 s"
    finally:
        watching.dispose()
    np.testing.assert_allclose(engine.read(blk["out"]), a - b, rtol=1e-6)
    assert engine.plan.nodes[0].code_key == blk.description.kernels[0].code.key
    src.write_text((kernels / "vector_add.ptx").read_text())
    assert blk.reload() == ["code"]
    assert engine.tick().tiers == ("code",)
    np.testing.assert_allclose(engine.read(blk["out"]), a + b, rtol=1e-6)
    assert engine.plan.nodes[0].code_key == blk.description.kernels[0].code.key
