"""Regions on the GPU (If, IfElse, While, For, nested), hot updates inside them, and GPU-driven batches,
each checked against the same steps in NumPy on random data."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda as rx

N = 4096
SRC = r"""
// y = y * a + x, in place (a state the block owns). a = 0.5 keeps every product exact, so the device's fused
// multiply-add and NumPy's multiply-then-add round alike.
extern "C" __global__ void acc(const float* x, /*inout*/ float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * a + x[i];
}
// out = x * c + 1
extern "C" __global__ void affine(const float* x, float* out, float c, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * c + 1.0f;
}
// the same signature, another law: out = x * c - 1 (an edit that keeps the layout: a Code-tier swap)
extern "C" __global__ void affine2(const float* x, float* out, float c, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * c - 1.0f;
}
// flag = (v[0] > level) or, with below = 1, (v[0] < level)
extern "C" __global__ void compare(const float* v, unsigned* flag, float level, unsigned below) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *flag = below ? (v[0] < level) : (v[0] > level);
}
"""


@pytest.fixture(scope="module")
def codes():
    return {e: rx.compile_cuda(SRC, entry=e) for e in ("acc", "affine", "affine2", "compare")}


def acc_block(codes, name="acc", a=0.5):
    return rx.Block.from_kernel(codes["acc"], size=N, name=name, a=a)


def affine_block(codes, name="affine", c=2.0):
    return rx.Block.from_kernel(codes["affine"], size=N, name=name, c=c)


def compare_block(codes, name="cmp", level=0.0, below=0):
    b = rx.BlockBuilder(name, size=N)
    k = b.add_kernel(codes["compare"], threads=1)
    b.input("v", k["v"])
    b.output("flag", k["flag"], count=1)
    b.scalar("level", k["level"], default=level)
    b.scalar("below", k["below"], default=below)
    return b.build()


def f32(rng, n=N):
    return rng.standard_normal(n).astype(np.float32)


def test_if_runs_its_body_only_when_the_flag_is_set(engine, codes, rng):
    x = f32(rng)
    cmp, body = compare_block(codes), affine_block(codes)
    engine.add(cmp)
    engine.add(rx.If(cmp["flag"], [body]))
    engine.write(body["x"], x)
    for level in (x[0] - 1.0, x[0] + 1.0):  # above the level, then not
        engine.write(cmp["v"], x)
        cmp.params["level"].value = float(level)
        engine.tick()
        got = engine.read(body["out"])
        want = x * np.float32(2.0) + np.float32(1.0) if x[0] > level else np.zeros(N, np.float32)
        np.testing.assert_array_equal(got, want)
    # a parameter of a block inside the body is a hot update, and it is used
    rebuilds = engine.rebuilds
    cmp.params["level"].value = float(x[0] - 1.0)
    body.params["c"].value = 4.0
    engine.tick()
    assert engine.rebuilds == rebuilds
    np.testing.assert_array_equal(engine.read(body["out"]), x * np.float32(4.0) + np.float32(1.0))


def test_ifelse_runs_exactly_one_body(engine, codes, rng):
    x = f32(rng)
    cmp, a, b = compare_block(codes), affine_block(codes, "a", 2.0), affine_block(codes, "b", -4.0)
    engine.add(cmp)
    engine.add(rx.IfElse(cmp["flag"], [a], [b]))
    for blk in (a, b):
        engine.write(blk["x"], x)
    engine.write(cmp["v"], x)
    for level in (x[0] - 1.0, x[0] + 1.0):
        cmp.params["level"].value = float(level)
        engine.tick()
        then = x[0] > level
        np.testing.assert_array_equal(engine.read(a["out"]), x * np.float32(2.0) + 1 if then else 0 * x)
        np.testing.assert_array_equal(engine.read(b["out"]), 0 * x if then else x * np.float32(-4.0) + 1)


def test_for_runs_n_passes_and_n_is_a_hot_update(engine, codes, rng):
    x = f32(rng)
    body = acc_block(codes)
    loop = rx.For(3, [body])
    engine.add(loop)
    engine.write(body["x"], x)
    y = np.zeros(N, np.float32)
    for n in (3, 7, 0, 1):
        rebuilds = engine.rebuilds
        loop.params["n"].value = n
        engine.tick()
        assert engine.rebuilds == rebuilds or n == 3
        for _ in range(n):
            y = y * np.float32(0.5) + x
        np.testing.assert_array_equal(engine.read(body["y"]), y)


def test_while_loops_on_the_device_until_the_flag_clears(engine, codes, rng):
    x = np.abs(f32(rng)) + np.float32(0.25)
    body, cmp = acc_block(codes), compare_block(codes, below=1)
    loop = rx.While(cmp["flag"], [body, cmp], max_iterations=1000)
    engine.add(loop)
    engine.write(body["x"], x)
    engine.connect(body["y"], cmp["v"])
    level = float(x[0] * 1.9)  # y[0] climbs towards 2 x[0]: a handful of passes
    cmp.params["level"].value = level
    engine.tick()
    y, passes = np.zeros(N, np.float32), 0
    while True:  # a do-while, as the region runs it
        y = y * np.float32(0.5) + x
        passes += 1
        if not (y[0] < np.float32(level)) or passes >= 1000:
            break
    assert 2 < passes < 1000
    np.testing.assert_array_equal(engine.read(body["y"]), y)
    # the bound holds: a level y never reaches, at most max_iterations passes (both hot updates)
    rebuilds = engine.rebuilds
    loop.params["max_iterations"].value = 5
    cmp.params["level"].value = float(x[0] * 3)
    engine.tick()
    assert engine.rebuilds == rebuilds
    for _ in range(5):
        y = y * np.float32(0.5) + x
    np.testing.assert_array_equal(engine.read(body["y"]), y)


def test_a_while_that_reaches_max_iterations_says_so_once_naming_it(engine, codes, rng):
    x = np.abs(f32(rng)) + np.float32(0.25)
    body, cmp = acc_block(codes), compare_block(codes, below=1)
    loop = rx.While(cmp["flag"], [body, cmp], max_iterations=50, name="spin")
    engine.add(loop)
    engine.write(body["x"], x)
    engine.connect(body["y"], cmp["v"])
    seen = []
    engine.diagnostics.subscribe(seen.append)
    cmp.params["level"].value = float(x[0] * 3)  # y[0] climbs towards 2 x[0]: the flag never clears
    y = np.zeros(N, np.float32)

    def run(frames, passes):
        nonlocal y
        out = []
        for _ in range(frames):
            out.append(engine.tick())
            for _ in range(passes):
                y = y * np.float32(0.5) + x
            np.testing.assert_array_equal(engine.read(body["y"]), y)  # the numbers are still the loop's
        return out

    def bound():
        return [d for d in seen if d.severity == "warning" and "max_iterations" in d.message]

    frames = run(4, 50)
    assert [f.loops_at_bound for f in frames] == [("spin",)] * 4
    (w,) = bound()  # once across the frames
    assert w.subject == "spin" and w.block == loop.id and w.frame == frames[0].index
    assert "While 'spin'" in w.message and "50 passes" in w.message and "cmp.flag" in w.message
    assert "raise max_iterations, or fix the condition that never clears: cmp.flag" in w.message
    assert loop.state == "warning"
    # a level the loop reaches: it ends early, says nothing more, and the region recovers
    y = np.zeros(N, np.float32)
    engine.write(body["y"], y)
    level = float(x[0] * 1.5)
    cmp.params["level"].value = level
    engine.tick()
    y, passes = np.zeros(N, np.float32), 0
    while True:
        y = y * np.float32(0.5) + x
        passes += 1
        if not (y[0] < np.float32(level)):
            break
    assert 1 < passes < 50
    np.testing.assert_array_equal(engine.read(body["y"]), y)
    assert engine.tick().loops_at_bound == () and len(bound()) == 1  # (y is past the level: one pass a frame)
    y = y * np.float32(0.5) + x
    assert loop.state == "ok" and any(d.severity == "info" and d.block == loop.id for d in seen)
    # never clearing again: said again, and after a new max_iterations once more
    cmp.params["level"].value = float(x[0] * 3)
    run(2, 50)
    assert len(bound()) == 2
    loop.params["max_iterations"].value = 20
    run(3, 20)
    assert len(bound()) == 3 and "20 passes" in bound()[-1].message


def test_a_while_nested_in_a_for_reaches_its_bound_inside_a_conditional_body(engine, codes, rng):
    """The counter's copy into host-mapped memory runs inside the For's body (a memcpy node in a conditional
    body): the loop at its bound is said once, and the numbers are every pass's."""
    x = np.abs(f32(rng)) + np.float32(0.25)
    body, cmp = acc_block(codes), compare_block(codes, below=1)
    inner = rx.While(cmp["flag"], [body, cmp], max_iterations=9, name="inner")
    engine.add(rx.For(3, [inner], name="outer"))
    engine.write(body["x"], x)
    engine.connect(body["y"], cmp["v"])
    seen = []
    engine.diagnostics.subscribe(seen.append)
    cmp.params["level"].value = float(x[0] * 3)  # never reached
    y = np.zeros(N, np.float32)
    for _ in range(3):
        assert engine.tick().loops_at_bound == ("inner",)
        for _ in range(3 * 9):
            y = y * np.float32(0.5) + x
        np.testing.assert_array_equal(engine.read(body["y"]), y)
    (w,) = [d for d in seen if d.severity == "warning" and "max_iterations" in d.message]
    assert "While 'inner'" in w.message and "all its 9 passes" in w.message


def test_nested_regions_and_eager_equivalence(engine, codes, rng):
    x = f32(rng)
    cmp, body = compare_block(codes), acc_block(codes)
    inner = rx.For(2, [body])
    engine.add(cmp)
    engine.add(rx.If(cmp["flag"], [inner]))
    engine.write(body["x"], x)
    engine.write(cmp["v"], x)
    cmp.params["level"].value = float(x[0] - 1.0)
    engine.tick()
    y = (np.zeros(N, np.float32) * np.float32(0.5) + x) * np.float32(0.5) + x
    np.testing.assert_array_equal(engine.read(body["y"]), y)
    # the eager run decides the regions on the host and must compute the same
    rt = engine._rt
    rt.graph.run_eagerly(rt.stream, check_each=True)
    rt.synchronize()
    y = (y * np.float32(0.5) + x) * np.float32(0.5) + x
    np.testing.assert_array_equal(engine.read(body["y"]), y)


def _particles_like(codes, engine, x):
    body = acc_block(codes)
    engine.add(rx.For(3, [body]))
    engine.write(body["x"], x)
    return body


def test_a_batch_of_k_frames_equals_k_ticks(codes, rng):
    x = f32(rng)
    with rx.Engine() as a, rx.Engine() as b:
        ya, yb = _particles_like(codes, a, x), _particles_like(codes, b, x)
        for _ in range(25):
            a.tick()
        b.tick()  # build
        frame = b.run_batch(24)
        assert frame.frames == 24 and b.frame == a.frame == 25
        np.testing.assert_array_equal(a.read(ya["y"]), b.read(yb["y"]))
        # a parameter change between batches reaches the batch graph
        for blk in (ya, yb):
            blk.params["a"].value = 0.25
        for _ in range(5):
            a.tick()
        b.run_batch(5)
        np.testing.assert_array_equal(a.read(ya["y"]), b.read(yb["y"]))


def test_a_batch_stops_on_a_flag(engine, codes, rng):
    x = np.abs(f32(rng)) + np.float32(0.25)
    body, cmp = acc_block(codes), compare_block(codes)
    engine.add(body)
    engine.add(cmp)
    engine.write(body["x"], x)
    engine.connect(body["y"], cmp["v"])
    cmp.params["level"].value = float(x[0] * 1.9)
    engine.tick()
    frame = engine.run_batch(1000, until=cmp["flag"])
    y, frames = np.zeros(N, np.float32) * np.float32(0.5) + x, 0
    while True:
        y = y * np.float32(0.5) + x
        frames += 1
        if y[0] > np.float32(x[0] * 1.9):
            break
    assert frame.frames == frames < 1000
    np.testing.assert_array_equal(engine.read(body["y"]), y)


def test_a_kernel_edit_inside_a_region_is_swapped_in_place(engine, codes, rng):
    x = f32(rng)
    cmp, body = compare_block(codes), affine_block(codes)
    engine.add(cmp)
    engine.add(rx.If(cmp["flag"], [body]))
    engine.write(body["x"], x)
    engine.write(cmp["v"], x)
    cmp.params["level"].value = float(x[0] - 1.0)
    engine.tick()
    np.testing.assert_array_equal(engine.read(body["out"]), x * np.float32(2.0) + np.float32(1.0))
    rebuilds = engine.rebuilds
    assert body.set_code(None, codes["affine2"]) == "code"
    frame = engine.tick()
    assert "code" in frame.tiers and engine.rebuilds == rebuilds
    np.testing.assert_array_equal(engine.read(body["out"]), x * np.float32(2.0) - np.float32(1.0))
