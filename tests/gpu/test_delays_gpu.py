"""Delayed connections on a real GPU: feedback across frames checked exactly against NumPy float32 arithmetic
done in the same order (an add or a multiply per element per frame: IEEE round-to-nearest on both sides)."""

import cupy as cp
import numpy as np

import rxcuda
from rxcuda import Block


def rand(rng, n):
    return rng.standard_normal(n).astype(np.float32) + 0.5


def accumulator(engine, kernels, n, **connect):
    """acc.out = acc.a + acc.b, with acc.a fed back from acc.out through a delay: out += b every frame."""
    acc = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n, name="acc"))
    engine.connect(acc["out"], acc["a"], delay=1, **connect)
    return acc


def test_feedback_accumulates_exactly_over_100_frames(engine, rng, kernels):
    n = 100_003
    acc = accumulator(engine, kernels, n)
    want = np.zeros(n, np.float32)  # frame 0 reads zeros
    for _ in range(100):
        x = rand(rng, n)  # fresh input every frame
        engine.write(acc["b"], x)
        engine.tick()
        want = want + x  # prev + x, in float32
    got = engine.read(acc["out"])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(engine.read(acc["a"]), want)  # the previous-frame buffer holds it for frame 101
    assert engine.rebuilds == 1 and len(engine.plan.delays) == 1


def test_a_given_initial_value_is_frame_0s_and_reset_delays_brings_it_back(engine, rng, kernels):
    n = 4096
    initial = rand(rng, n)
    acc = accumulator(engine, kernels, n, initial=initial)
    x = rand(rng, n)
    engine.write(acc["b"], x)
    engine.tick()
    np.testing.assert_array_equal(engine.read(acc["out"]), initial + x)
    for _ in range(4):
        engine.tick()
    want = initial + x
    for _ in range(4):
        want = want + x
    np.testing.assert_array_equal(engine.read(acc["out"]), want)
    engine.reset_delays()
    engine.tick()
    np.testing.assert_array_equal(engine.read(acc["out"]), initial + x)


def test_a_scalar_initial_value_fills_every_element(engine, rng, kernels):
    n = 1000
    acc = accumulator(engine, kernels, n, initial=2.5)
    x = rand(rng, n)
    engine.write(acc["b"], x)
    engine.tick()
    np.testing.assert_array_equal(engine.read(acc["out"]), np.float32(2.5) + x)


def test_a_two_block_cycle_through_a_delay(engine, rng, kernels):
    n = 8192
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=0.75))
    engine.connect(add["out"], mul["x"])
    initial = rand(rng, n)
    engine.connect(mul["out"], add["a"], delay=1, initial=initial)  # closes the cycle add -> mul -> add
    b = rand(rng, n)
    engine.write(add["b"], b)
    y = initial
    for _ in range(20):
        engine.tick()
        y = (y + b) * np.float32(0.75)
    np.testing.assert_array_equal(engine.read(mul["out"]), y)
    p = engine.plan
    assert p.deps[p.kernel_nodes[(add.id, "vector_add")]] == ()  # the delayed input orders nothing


def test_state_survives_a_rebuild_elsewhere(engine, rng, kernels):
    n = 2048
    acc = accumulator(engine, kernels, n)
    x = rand(rng, n)
    engine.write(acc["b"], x)
    for _ in range(5):
        engine.tick()
    other = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0))  # a rebuild
    engine.write(other["x"], x)
    rebuilds = engine.rebuilds
    for _ in range(5):
        engine.tick()
    assert engine.rebuilds == rebuilds + 1
    want = np.zeros(n, np.float32)
    for _ in range(10):
        want = want + x
    np.testing.assert_array_equal(engine.read(acc["out"]), want)
    np.testing.assert_array_equal(engine.read(other["out"]), x * np.float32(2.0))


def test_a_rebound_delayed_output_feeds_the_copy_from_the_new_array(engine, rng, kernels):
    n = 3000
    first = cp.full(n, np.nan, dtype=cp.float32)
    second = cp.full(n, np.nan, dtype=cp.float32)
    acc = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n, name="acc"))
    engine.bind(acc["out"], first)
    engine.connect(acc["out"], acc["a"], delay=1)
    x = rand(rng, n)
    engine.write(acc["b"], x)
    for _ in range(3):
        engine.tick()
    rebuilds = engine.rebuilds
    engine.bind(acc["out"], second)  # a warm rebind: the kernel and the copy node now use `second`
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == rebuilds
    engine.tick()
    want3 = x + x + x
    np.testing.assert_array_equal(cp.asnumpy(first), want3)  # left as frame 3 wrote it
    np.testing.assert_array_equal(cp.asnumpy(second), want3 + x + x)  # the feedback went on through it


def test_graph_and_eager_frames_agree_bit_for_bit(rng, kernels):
    n = 5000
    x = [rand(rng, n) for _ in range(10)]
    initial = rand(rng, n)
    results = []
    for debug in (False, True):  # debug: each node issued alone (the copy as cuMemcpyDtoDAsync)
        with rxcuda.Engine(debug=debug) as engine:
            add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
            mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=1.5))
            engine.connect(add["out"], mul["x"])
            engine.connect(mul["out"], add["a"], delay=1, initial=initial)
            for xs in x:
                engine.write(add["b"], xs)
                engine.tick()
            results.append(engine.read(mul["out"]))
    np.testing.assert_array_equal(results[0], results[1])
