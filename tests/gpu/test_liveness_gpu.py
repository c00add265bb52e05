"""Memory reuse on a real GPU: every pipeline runs twice on fresh random inputs, once with intermediates
sharing memory (the default) and once with a buffer each (``Engine(reuse_memory=False)``), and the results
must be bit for bit equal, and equal to NumPy. Chains, a diamond, an If region, a For loop with chains around
it, and a delayed connection (feedback across frames)."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda as rx
from rxcuda.lowlevel import PortRef

N = 100_003
SRC = r"""
// y = y * a + x, in place (state the block owns)
extern "C" __global__ void acc(const float* x, /*inout*/ float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * a + x[i];
}
// flag = (v[0] > level)
extern "C" __global__ void compare(const float* v, unsigned* flag, float level) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *flag = v[0] > level;
}
"""


@pytest.fixture(scope="module")
def codes():
    return {e: rx.compile_cuda(SRC, entry=e) for e in ("acc", "compare")}


def f32(rng, n=N):
    return (rng.standard_normal(n) + 0.5).astype(np.float32)


def scales(rng, k):
    return [float(s) for s in rng.uniform(0.5, 1.5, k).astype(np.float32)]


def muls(engine, kernels, names, factors, n=N):
    return [engine.add(rx.Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=s, name=name))
            for name, s in zip(names, factors, strict=True)]


def connect_chain(engine, blocks):
    for a, b in zip(blocks, blocks[1:], strict=False):
        engine.connect(a["out"], b["x"])


def run_both(build, frames):
    """Run ``build(engine) -> (inputs, outputs, before_tick)`` with memory reuse on and off; each frame
    writes its arrays to ``inputs``, calls ``before_tick(i)``, ticks and reads ``outputs``. Returns the results
    of each run (frame by frame) and the stats of the run with reuse."""
    runs = {}
    for reuse in (True, False):
        with rx.Engine(reuse_memory=reuse) as engine:
            inputs, outputs, before_tick = build(engine)
            got = []
            for i, arrays in enumerate(frames):
                for port, arr in zip(inputs, arrays, strict=True):
                    engine.write(port, arr)
                before_tick(i)
                frame = engine.tick()
                assert frame.state == "ok" and frame.launched, frame
                got.append([engine.read(p) for p in outputs])
            runs[reuse] = (got, engine.stats, engine.plan.shared)
    (on, stats, shared), (off, off_stats, off_shared) = runs[True], runs[False]
    assert shared and stats.bytes_saved > 0, "the pipeline shares nothing: the comparison would prove nothing"
    assert off_shared == () and off_stats.bytes_saved == 0
    for frame_on, frame_off in zip(on, off, strict=True):
        for a, b in zip(frame_on, frame_off, strict=True):
            np.testing.assert_array_equal(a, b)
    return on, stats


def nothing(_i):
    return None


def test_a_chain_gives_the_same_results_with_and_without_reuse(rng, kernels):
    k = 24
    factors = scales(rng, k)
    frames = [[f32(rng)] for _ in range(3)]

    def build(engine):
        blocks = muls(engine, kernels, [f"m{i}" for i in range(k)], factors)
        connect_chain(engine, blocks)
        return [blocks[0]["x"]], [blocks[-1]["out"]], nothing

    on, stats = run_both(build, frames)
    assert stats.shared_groups == 2 and stats.allocations == 4  # m0.x, the last output, two for the rest
    for (x,), (got,) in zip(frames, on, strict=True):
        want = x
        for s in factors:
            want = want * np.float32(s)
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_diamond_gives_the_same_results_with_and_without_reuse(rng, kernels):
    factors = scales(rng, 9)
    frames = [[f32(rng)] for _ in range(3)]

    def build(engine):
        src, l1, l2, l3, r1 = muls(engine, kernels, ["src", "l1", "l2", "l3", "r1"], factors[:5])
        join = engine.add(rx.Block.from_kernel(kernels / "vector_add.ptx", size=N, name="join"))
        t = muls(engine, kernels, ["t1", "t2", "t3", "t4"], factors[5:])
        connect_chain(engine, [src, l1, l2, l3])
        engine.connect(src["out"], r1["x"])
        engine.connect(l3["out"], join["a"])
        engine.connect(r1["out"], join["b"])
        engine.connect(join["out"], t[0]["x"])
        connect_chain(engine, t)
        return [src["x"]], [t[-1]["out"]], nothing

    on, _stats = run_both(build, frames)
    f = [np.float32(s) for s in factors]
    for (x,), (got,) in zip(frames, on, strict=True):
        s = x * f[0]
        left = s * f[1] * f[2] * f[3]
        want = (left + s * f[4]) * f[5] * f[6] * f[7] * f[8]
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_an_if_region_between_chains_gives_the_same_results_with_and_without_reuse(rng, kernels, codes):
    factors = scales(rng, 7)
    frames = [[f32(rng)] for _ in range(4)]
    # frames 0 and 2: the body runs (the flag reads pre-chain output [0] > level); 1 and 3: it does not
    levels = []
    for i, (x,) in enumerate(frames):
        head = x[0]
        for s in factors[:3]:
            head = np.float32(head * np.float32(s))
        levels.append(float(head) - 1.0 if i % 2 == 0 else float(head) + 1.0)

    def build(engine):
        pre = muls(engine, kernels, ["p0", "p1", "p2"], factors[:3])
        connect_chain(engine, pre)
        b = rx.BlockBuilder("cmp", size=N)
        kc = b.add_kernel(codes["compare"], threads=1)
        b.input("v", kc["v"])
        b.output("flag", kc["flag"], count=1)
        b.scalar("level", kc["level"], default=0.0)
        cmp = engine.add(b.build())
        body = rx.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, scale=factors[3], name="body")
        engine.add(rx.If(cmp["flag"], [body]))
        post = muls(engine, kernels, ["q0", "q1", "q2"], factors[4:])
        engine.connect(pre[-1]["out"], cmp["v"])
        engine.connect(pre[-1]["out"], body["x"])
        engine.connect(body["out"], post[0]["x"])
        connect_chain(engine, post)

        def before_tick(i):
            cmp.params["level"].value = levels[i]

        return [pre[0]["x"]], [post[-1]["out"]], before_tick

    on, _stats = run_both(build, frames)
    f = [np.float32(s) for s in factors]
    for i, ((x,), (got,)) in enumerate(zip(frames, on, strict=True)):
        if i % 2:
            want = np.zeros(N, np.float32)  # the body's output is zeroed when it does not run
        else:
            want = x * f[0] * f[1] * f[2] * f[3] * f[4] * f[5] * f[6]
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_for_loop_between_chains_gives_the_same_results_with_and_without_reuse(rng, kernels, codes):
    factors = scales(rng, 6)
    frames = [[f32(rng)] for _ in range(3)]
    passes = 3

    def build(engine):
        pre = muls(engine, kernels, ["p0", "p1", "p2"], factors[:3])
        connect_chain(engine, pre)
        body = rx.Block.from_kernel(codes["acc"], size=N, name="acc", a=0.5)
        engine.add(rx.For(passes, [body]))
        post = muls(engine, kernels, ["q0", "q1", "q2"], factors[3:])
        engine.connect(pre[-1]["out"], body["x"])
        engine.connect(body["y"], post[0]["x"])
        connect_chain(engine, post)
        return [pre[0]["x"]], [post[-1]["out"]], nothing

    on, _stats = run_both(build, frames)
    f = [np.float32(s) for s in factors]
    y = np.zeros(N, np.float32)  # the loop's state carries over from frame to frame
    for (x,), (got,) in zip(frames, on, strict=True):
        xin = x * f[0] * f[1] * f[2]
        for _ in range(passes):
            y = y * np.float32(0.5) + xin
        np.testing.assert_allclose(got, y * f[3] * f[4] * f[5], rtol=1e-5)


def test_a_delayed_connection_between_chains_gives_the_same_results_with_and_without_reuse(rng, kernels):
    factors = scales(rng, 6)
    frames = [[f32(rng)] for _ in range(5)]

    def build(engine):
        pre = muls(engine, kernels, ["p0", "p1", "p2"], factors[:3])
        connect_chain(engine, pre)
        acc = engine.add(rx.Block.from_kernel(kernels / "vector_add.ptx", size=N, name="acc"))
        engine.connect(acc["out"], acc["a"], delay=1)  # out = previous out + b
        post = muls(engine, kernels, ["q0", "q1", "q2"], factors[3:])
        engine.connect(pre[-1]["out"], acc["b"])
        engine.connect(acc["out"], post[0]["x"])
        connect_chain(engine, post)
        return [pre[0]["x"]], [post[-1]["out"]], nothing

    on, _stats = run_both(build, frames)
    f = [np.float32(s) for s in factors]
    total = np.zeros(N, np.float32)
    for (x,), (got,) in zip(frames, on, strict=True):
        total = total + x * f[0] * f[1] * f[2]
        np.testing.assert_allclose(got, total * f[3] * f[4] * f[5], rtol=1e-5)


def test_reading_a_shared_intermediate_gives_its_own_value_from_then_on(rng, kernels):
    factors = scales(rng, 8)
    with rx.Engine() as engine:
        blocks = muls(engine, kernels, [f"m{i}" for i in range(8)], factors)
        connect_chain(engine, blocks)
        x = f32(rng)
        engine.write(blocks[0]["x"], x)
        engine.tick()
        gp = engine.plan
        first, last = gp.shared[0][0], gp.shared[0][-1]
        by_buffer = {gp.port_buffers[PortRef(b.id, "out")]: i for i, b in enumerate(blocks)}
        want = [x]
        for s in factors:
            want.append(want[-1] * np.float32(s))
        # the last of a group still holds its value: the rebuild that un-shares it carries it over
        i = by_buffer[last]
        np.testing.assert_allclose(engine.read(blocks[i]["out"]), want[i + 1], rtol=1e-5)
        # the first of a group was overwritten by later members: zeros now, its own value from the next frame
        j = by_buffer[first]
        assert not engine.read(blocks[j]["out"]).any()
        engine.tick()
        np.testing.assert_allclose(engine.read(blocks[j]["out"]), want[j + 1], rtol=1e-5)
        np.testing.assert_allclose(engine.read(blocks[-1]["out"]), want[-1], rtol=1e-5)
