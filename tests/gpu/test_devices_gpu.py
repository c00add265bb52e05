"""One pipeline over several devices on real GPUs, results against NumPy on fresh random data, every tier.

``Engine(devices=[0, 0])`` runs everywhere there is one GPU: two "devices" that are the same GPU, with real
contexts, streams, pools and graphs of their own; the copy between them degenerates to a device-to-device
copy. With two or more GPUs the same tests run on distinct devices (peer copies, or copies staged through
host memory); they are skipped, with the reason, where there is one. ``Engine(devices=["cpu", "cpu"])`` runs them
on two positions of the CPU device, on any machine.
"""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda import Block
from rxcuda.cuda._device import device_info


def _gpus() -> int:
    return len(device_info().get("devices", ()))


ONE_GPU = pytest.param([0, 0], id="one-gpu-twice")
TWO_GPUS = pytest.param([0, 1], id="two-gpus", marks=pytest.mark.skipif(
    _gpus() < 2, reason=f"needs two GPUs for distinct devices; this machine has {_gpus()}"))
# two positions of the CPU device (docs/devices.md#on-the-cpu-device): run everywhere, so CI checks these numbers too
# (conftest.py runs them on a machine without a GPU, and last on one with a GPU, as the engine tests' CPU runs)
CPU_TWICE = pytest.param(["cpu", "cpu"], id="cpu-device-twice")


def rand(rng, n):
    return rng.standard_normal(n).astype(np.float32) + 0.5


@pytest.fixture(params=[ONE_GPU, TWO_GPUS, CPU_TWICE])
def devices(request):
    return request.param


def two_stage(engine, kernels, rng, n, *, first_on=0, second_on=1, scale=3.0):
    first = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n), device=first_on)
    second = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=scale), device=second_on)
    engine.connect(first["out"], second["x"])
    a, b = rand(rng, n), rand(rng, n)
    engine.write(first["a"], a)
    engine.write(first["b"], b)
    return first, second, a, b


def test_a_chain_across_devices_matches_numpy(devices, rng, kernels):
    n = 100_003
    with rxcuda.Engine(devices=devices) as engine:
        _first, second, a, b = two_stage(engine, kernels, rng, n)
        frame = engine.tick()
        assert frame.state == "ok" and "structure" in frame.tiers
        np.testing.assert_allclose(engine.read(second["out"]), (a + b) * 3.0, rtol=1e-6)
        routes = engine.devices.routes
        assert routes[(0, 1)] == ("local" if devices[0] == devices[1] else routes[(0, 1)])
        said = [d.message for d in engine.diagnostic_log if d.subject == "devices"]
        assert len(said) == 1 and said[0].startswith("copies from device 0 to device 1: ")


def test_data_flowing_back_to_the_first_device(devices, rng, kernels):
    n = 4099
    with rxcuda.Engine(devices=devices) as engine:
        _first, second, a, b = two_stage(engine, kernels, rng, n, first_on=1, second_on=0, scale=-2.0)
        engine.tick()
        assert engine._rt.graph.split.order == (1, 0)
        np.testing.assert_allclose(engine.read(second["out"]), (a + b) * -2.0, rtol=1e-6)


def test_every_tier_on_the_second_device(devices, rng, kernels):
    n = 8192
    with rxcuda.Engine(devices=devices) as engine:
        first, second, a, b = two_stage(engine, kernels, rng, n, first_on=1, second_on=0)
        engine.tick()
        # Parameters: a value of a block on device 0 and of one on device 1, each checked
        for _ in range(3):
            s = float(rng.uniform(-4, 4))
            second.set(scale=s)
            assert engine.tick().tiers == ("parameters",)
            np.testing.assert_allclose(engine.read(second["out"]), (a + b) * s, rtol=1e-5)
        # Code: vector_add -> vector_sub on device 1, swapped in place in device 1's graph
        assert first.set_code(None, rxcuda.load_kernel_file(kernels / "vector_sub.ptx")) == "code"
        assert engine.tick().tiers == ("code",)
        np.testing.assert_allclose(engine.read(second["out"]), (a - b) * s, rtol=1e-5)
        # new data into device 1's block, read from device 0's
        a2 = rand(rng, n)
        engine.write(first["a"], a2)
        engine.tick()
        np.testing.assert_allclose(engine.read(second["out"]), (a2 - b) * s, rtol=1e-5)
        # Structure: a block more on device 0 rebuilds device 0's graph only
        third = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=0.25, name="third"), device=0)
        engine.connect(second["out"], third["x"])
        assert engine.tick().tiers == ("structure",)
        assert engine.devices.rebuilt == (0,)
        np.testing.assert_allclose(engine.read(third["out"]), (a2 - b) * s * 0.25, rtol=1e-5)


def test_a_delayed_connection_across_devices(devices, rng, kernels):
    n = 1000
    with rxcuda.Engine(devices=devices) as engine:
        mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=3.0))
        acc = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n), device=1)
        engine.connect(mul["out"], acc["a"], delay=1, initial=0.5)
        x, b = rand(rng, n), rand(rng, n)
        engine.write(mul["x"], x)
        engine.write(acc["b"], b)
        engine.tick()
        np.testing.assert_allclose(engine.read(acc["out"]), b + np.float32(0.5), rtol=1e-6)  # frame 0: initial
        engine.tick()
        np.testing.assert_allclose(engine.read(acc["out"]), 3.0 * x + b, rtol=1e-6)
        x2 = rand(rng, n)
        engine.write(mul["x"], x2)
        engine.tick()  # reads the previous frame's 3x
        np.testing.assert_allclose(engine.read(acc["out"]), 3.0 * x + b, rtol=1e-6)
        engine.tick()
        np.testing.assert_allclose(engine.read(acc["out"]), 3.0 * x2 + b, rtol=1e-6)


def test_pipelined_frames_lag_one_frame_per_hop(devices, rng, kernels):
    n = 50_000
    with rxcuda.Engine(devices=devices, pipelined=True) as engine:
        s1 = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0, name="s1"))
        s2 = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=-3.0, name="s2"), device=1)
        engine.connect(s1["out"], s2["x"])
        xs = [rand(rng, n) for _ in range(5)]
        outs = []
        for x in xs:
            engine.write(s1["x"], x)
            engine.tick()
            outs.append(engine.read(s2["out"]).copy())
        assert engine.devices.latency == 1
        np.testing.assert_allclose(outs[0], np.zeros(n, np.float32))  # the pipeline fills
        for t in range(1, len(xs)):
            np.testing.assert_allclose(outs[t], xs[t - 1] * 2.0 * -3.0, rtol=1e-6)


def test_observe_and_feed_across_devices(devices, rng, kernels):
    from reactivex.subject import Subject

    n = 2048
    with rxcuda.Engine(devices=devices) as engine:
        mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=1.5))
        add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n), device=1)
        engine.connect(mul["out"], add["a"])
        b = rand(rng, n)
        engine.write(add["b"], b)
        source: Subject = Subject()
        engine.feed(mul["x"], source)
        seen: list = []
        engine.observe(add["out"]).subscribe(seen.append)
        for _ in range(3):
            x = rand(rng, n)
            source.on_next(x)
            engine.tick()
            np.testing.assert_allclose(seen[-1], 1.5 * x + b, rtol=1e-6)


def test_a_debug_frame_runs_every_devices_nodes_eagerly(devices, rng, kernels):
    n = 3000
    with rxcuda.Engine(devices=devices, debug=True) as engine:
        _first, second, a, b = two_stage(engine, kernels, rng, n)
        engine.tick()
        np.testing.assert_allclose(engine.read(second["out"]), (a + b) * 3.0, rtol=1e-6)


def test_summary_timing_covers_every_device(devices, rng, kernels):
    n = 1 << 20
    with rxcuda.Engine(devices=devices, timing=True) as engine:
        _first, second, a, b = two_stage(engine, kernels, rng, n)
        engine.tick()
        frame = engine.tick()
        assert frame.gpu_us is not None and frame.gpu_us > 0
        per_device = engine.devices.gpu_us
        assert len(per_device) == 2 and all(t is not None and t > 0 for t in per_device)
        np.testing.assert_allclose(engine.read(second["out"]), (a + b) * 3.0, rtol=1e-6)


def test_the_two_gpus_example_runs(tmp_path):
    import subprocess
    import sys

    from conftest import gpu_subprocess_env

    proc = subprocess.run([sys.executable, "-m", "rxcuda.examples.two_gpus", "4"], capture_output=True, text=True,
                          cwd=tmp_path, env=gpu_subprocess_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("max error vs NumPy") == 4 + 3  # 4 frames, then 3 pipelined frames after the fill
    if _gpus() < 2:
        assert proc.stdout.startswith("one GPU here (")
    assert list(tmp_path.iterdir()) == []


def _accumulating(engine, kernels, rng, n):
    """Device 0 scales x; device 1 adds it to its own previous output (a delayed self-connection): after k
    frames its output is k * 2.5 * x, so the frame count shows in the numbers."""
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.5, name="mul"))
    acc = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n, name="acc"), device=1)
    engine.connect(mul["out"], acc["b"])
    engine.connect(acc["out"], acc["a"], delay=1)
    x = rand(rng, n)
    engine.write(mul["x"], x)
    return acc, x


@pytest.mark.parametrize("pipelined", [False, True], ids=["one-frame-at-a-time", "pipelined"])
def test_run_batch_across_devices_is_k_ticks(devices, rng, kernels, pipelined):
    n, k = 10_007, 7
    with rxcuda.Engine(devices=devices, pipelined=pipelined) as batched, \
            rxcuda.Engine(devices=devices, pipelined=pipelined) as ticked:
        acc_b, x = _accumulating(batched, kernels, rng, n)
        acc_t, _ = _accumulating(ticked, kernels, rng, n)
        ticked.write(ticked.blocks[0]["x"], x)  # the same input in both
        frame = batched.run_batch(k)
        assert frame.frames == k and batched.frame == k
        for _ in range(k):
            ticked.tick()
        got, want = batched.read(acc_b["out"]), ticked.read(acc_t["out"])
        np.testing.assert_array_equal(got, want)  # bit for bit what k ticks give
        lag = 1 if pipelined else 0  # pipelined, device 1's first frame reads the pipeline's zeros
        expect = np.zeros(n, np.float32)
        for _ in range(k - lag):
            expect = expect + np.float32(2.5) * x
        np.testing.assert_allclose(got, expect, rtol=1e-5)
        # a second batch goes on from there, after a parameter change on device 0
        batched.blocks[0].set(scale=-1.0)
        batched.run_batch(3)
        after = expect.copy()
        for t in range(3):
            after = after + (np.float32(-1.0) if t >= lag else np.float32(2.5)) * x
        np.testing.assert_allclose(batched.read(acc_b["out"]), after, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("level", ["per_block", "per_kernel"])
def test_per_block_and_per_kernel_profiling_across_devices(devices, rng, kernels, level):
    n = 1 << 20
    with rxcuda.Engine(devices=devices, profile=level) as engine:
        first, second, a, b = two_stage(engine, kernels, rng, n)
        engine.tick()
        frame = engine.tick()
        np.testing.assert_allclose(engine.read(second["out"]), (a + b) * 3.0, rtol=1e-6)
        assert frame.blocks is not None and list(frame.blocks) == [first.name, second.name]
        assert [frame.blocks.device(x) for x in frame.blocks] == [0, 1]
        for x in frame.blocks:  # each timed on its own device's timer, from that device's start of the frame
            t = frame.blocks[x]
            assert t.gpu_us > 0 and 0 <= t.start_us <= t.end_us
        copy = f"{first.name}.out -> device 1"
        if level == "per_kernel":
            assert frame.kernels is not None and frame.kernels.device(copy) == 1
            # device 1's kernel is timed from the end of the copy it waits for
            assert frame.kernels[f"{second.name}/scalar_mul"].start_us >= frame.kernels[copy].end_us
        else:
            assert copy not in frame.blocks and frame.kernels is None
        # a batch over the devices, profiled: the last frame's timings, the numbers still right
        batch = engine.run_batch(4)
        assert batch.frames == 4 and batch.blocks is not None and set(batch.blocks) == {first.name, second.name}
        np.testing.assert_allclose(engine.read(second["out"]), (a + b) * 3.0, rtol=1e-6)


def test_memory_per_device(devices, rng, kernels):
    n = 1 << 18
    with rxcuda.Engine(devices=devices) as engine:
        _first, second, a, b = two_stage(engine, kernels, rng, n)
        engine.tick()
        np.testing.assert_allclose(engine.read(second["out"]), (a + b) * 3.0, rtol=1e-6)
        pools, bufs = engine.devices.memory, engine.devices.buffers
        assert [p.in_use for p in pools] == [3, 2]  # a, b, out on device 0; its copy of out and out on device 1
        assert all(p.bytes_reserved >= 2 * n * 4 for p in pools)
        assert engine.memory.bytes_reserved == sum(p.bytes_reserved for p in pools)
        assert [x.bytes_allocated for x in bufs] == [3 * n * 4, 2 * n * 4]
        assert engine.stats.bytes_allocated == 5 * n * 4
