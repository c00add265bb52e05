"""Loops whose body is unrolled (``For``/``While`` ``unroll=k``) on the GPU: the same passes as one copy per
relaunch, stopping after any copy, with hot updates reaching every copy; checked against NumPy on random data."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda as rx

N = 4096
SRC = r"""
// y = y * a + x, in place (a state the block owns). a = 0.5 or 0.25 keeps every product exact, so the device's
// fused multiply-add and NumPy's multiply-then-add round alike.
extern "C" __global__ void acc(const float* x, /*inout*/ float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * a + x[i];
}
// flag = (v[0] < level)
extern "C" __global__ void below(const float* v, unsigned* flag, float level) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *flag = v[0] < level;
}
"""


@pytest.fixture(scope="module")
def codes():
    return {e: rx.compile_cuda(SRC, entry=e) for e in ("acc", "below")}


def below_block(codes, level: float):
    b = rx.BlockBuilder("below", size=N)
    k = b.add_kernel(codes["below"], threads=1)
    b.input("v", k["v"])
    b.output("flag", k["flag"], count=1)
    b.scalar("level", k["level"], default=level)
    return b.build()


@pytest.mark.parametrize("unroll", [2, 4])
def test_an_unrolled_for_runs_exactly_n_passes(engine, codes, rng, unroll):
    x = rng.standard_normal(N).astype(np.float32)
    body = rx.Block.from_kernel(codes["acc"], size=N, name="acc", a=0.5)
    loop = rx.For(3, [body], unroll=unroll)
    engine.add(loop)
    engine.write(body["x"], x)
    y = np.zeros(N, np.float32)
    a = np.float32(0.5)
    for i, n in enumerate((3, 1, unroll - 1, unroll, unroll + 1, 2 * unroll + 1, 0, 13)):
        rebuilds = engine.rebuilds
        loop.params["n"].value = n
        if i == 4:  # a parameter of the body: one hot update that every copy must see
            a = np.float32(0.25)
            body.params["a"].value = 0.25
        frame = engine.tick()
        assert frame.state == "ok" and (engine.rebuilds == rebuilds or i == 0)
        for _ in range(n):
            y = y * a + x
        np.testing.assert_array_equal(engine.read(body["y"]), y)


def test_an_unrolled_while_stops_after_the_pass_that_clears_its_flag(engine, codes, rng):
    x = np.abs(rng.standard_normal(N).astype(np.float32)) + np.float32(0.25)
    body = rx.Block.from_kernel(codes["acc"], size=N, name="acc", a=0.5)
    level = float(x[0] * 1.9)  # y[0] climbs towards 2 x[0]: a handful of passes
    check = below_block(codes, level)
    loop = rx.While(check["flag"], [body, check], max_iterations=1000, unroll=3)
    engine.add(loop)
    engine.write(body["x"], x)
    engine.connect(body["y"], check["v"])
    engine.tick()
    y, passes = np.zeros(N, np.float32), 0
    while True:  # a do-while, as the region runs it
        y = y * np.float32(0.5) + x
        passes += 1
        if not (y[0] < np.float32(level)) or passes >= 1000:
            break
    assert 2 < passes < 1000
    np.testing.assert_array_equal(engine.read(body["y"]), y)
    # the bound holds mid-round: a level y never reaches, at most max_iterations = 5 passes (not a multiple of 3)
    rebuilds = engine.rebuilds
    loop.params["max_iterations"].value = 5
    check.params["level"].value = float(x[0] * 3)
    engine.tick()
    assert engine.rebuilds == rebuilds
    for _ in range(5):
        y = y * np.float32(0.5) + x
    np.testing.assert_array_equal(engine.read(body["y"]), y)


def test_the_eager_run_of_an_unrolled_loop_computes_what_the_graph_does(engine, codes, rng):
    x = rng.standard_normal(N).astype(np.float32)
    body = rx.Block.from_kernel(codes["acc"], size=N, name="acc", a=0.5)
    engine.add(rx.For(5, [body], unroll=2))
    engine.write(body["x"], x)
    engine.tick()
    y = np.zeros(N, np.float32)
    for _ in range(5):
        y = y * np.float32(0.5) + x
    np.testing.assert_array_equal(engine.read(body["y"]), y)
    rt = engine._rt  # the eager run decides the passes on the host: 5 more
    rt.graph.run_eagerly(rt.stream, check_each=True)
    rt.synchronize()
    for _ in range(5):
        y = y * np.float32(0.5) + x
    np.testing.assert_array_equal(engine.read(body["y"]), y)


def test_a_batch_of_frames_with_an_unrolled_loop_equals_its_ticks(codes, rng):
    x = rng.standard_normal(N).astype(np.float32)
    with rx.Engine() as a, rx.Engine() as b:
        blocks = []
        for engine in (a, b):
            body = rx.Block.from_kernel(codes["acc"], size=N, name="acc", a=0.5)
            engine.add(rx.For(3, [body], unroll=2))
            engine.write(body["x"], x)
            blocks.append(body)
        ya, yb = blocks
        for _ in range(4):
            a.tick()
        b.tick()  # build
        assert b.run_batch(3).frames == 3
        y = np.zeros(N, np.float32)
        for _ in range(12):
            y = y * np.float32(0.5) + x
        np.testing.assert_array_equal(a.read(ya["y"]), y)
        np.testing.assert_array_equal(b.read(yb["y"]), y)
        # a parameter of the body between batches reaches every copy in the batch graph
        for blk in (ya, yb):
            blk.params["a"].value = 0.25
        for _ in range(2):
            a.tick()
        b.run_batch(2)
        for _ in range(6):
            y = y * np.float32(0.25) + x
        np.testing.assert_array_equal(a.read(ya["y"]), y)
        np.testing.assert_array_equal(b.read(yb["y"]), y)
