"""A While that runs all its ``max_iterations`` passes says so (rxcuda.engine._loops): on the CPU device, with
real numbers checked against NumPy; the plan's copy node; the null driver; the isolated engine."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda as rx
from rxcuda.cuda import NullDriver
from rxcuda.cuda._memory import BufferPool
from rxcuda.engine._loops import UNSET, LoopBounds
from rxcuda.lowlevel import CopyNodePlan, RegionNodePlan

N = 256
SRC = r"""
extern "C" __global__ void acc(const float* x, /*inout*/ float* y, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * a + x[i];
}
extern "C" __global__ void compare(const float* v, unsigned* flag, float level, unsigned below) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *flag = below ? (v[0] < level) : (v[0] > level);
}
"""


@pytest.fixture(scope="module")
def codes():
    return {e: rx.compile_cuda(SRC, entry=e, target="ptx") for e in ("acc", "compare")}


@pytest.fixture
def engine():
    with rx.Engine(device="cpu") as e:
        yield e


def loop_of(codes, max_iterations=50, unroll=1, name="spin"):
    """y = y * 0.5 + x again while y[0] < level (y[0] climbs towards 2 x[0]); the flag made in the body."""
    body = rx.Block.from_kernel(codes["acc"], size=N, name="acc", a=0.5)
    b = rx.BlockBuilder("cmp", size=N)
    k = b.add_kernel(codes["compare"], threads=1)
    b.input("v", k["v"])
    b.output("flag", k["flag"], count=1)
    b.scalar("level", k["level"], default=0.0)
    b.scalar("below", k["below"], default=1)
    cmp = b.build()
    loop = rx.While(cmp["flag"], [body, cmp], max_iterations=max_iterations, name=name, unroll=unroll)
    return loop, body, cmp


def add(engine, loop, body, cmp, x):
    engine.add(loop)
    engine.write(body["x"], x)
    engine.connect(body["y"], cmp["v"])


def warnings_of(seen):
    return [d for d in seen if d.severity == "warning" and "max_iterations" in d.message]


def passes_to(y, x, level, cap):
    """The do-while on the host: (y after it, passes run)."""
    n = 0
    while True:
        y = y * np.float32(0.5) + x
        n += 1
        if not (y[0] < np.float32(level)) or n >= cap:
            return y, n


@pytest.fixture
def x():
    return np.abs(np.random.default_rng().standard_normal(N).astype(np.float32)) + np.float32(0.25)


def test_a_loop_whose_condition_never_clears_warns_once_naming_the_region(engine, codes, x):
    loop, body, cmp = loop_of(codes)
    add(engine, loop, body, cmp, x)
    seen = []
    engine.diagnostics.subscribe(seen.append)
    cmp.params["level"].value = float(x[0] * 3)  # never reached
    y = np.zeros(N, np.float32)
    frames = []
    for _ in range(5):
        frames.append(engine.tick())
        y, n = passes_to(y, x, float(x[0] * 3), 50)
        assert n == 50
        np.testing.assert_array_equal(engine.read(body["y"]), y)  # every pass ran, exactly
    (w,) = warnings_of(seen)
    assert (w.subject, w.block, w.frame) == ("spin", loop.id, frames[0].index)
    assert w.message.startswith("While 'spin' reached its max_iterations: it ran all its 50 passes in frame 1")
    assert w.message.endswith("raise max_iterations, or fix the condition that never clears: cmp.flag")
    assert [f.loops_at_bound for f in frames] == [("spin",)] * 5
    assert engine.tick(sync=False).loops_at_bound == ("spin",)  # (the CPU device has finished it already)
    assert len(warnings_of(seen)) == 1
    assert loop.state == "warning" and "max_iterations" in loop.message
    assert frames[-1].state == "ok"  # a warning, not an error: the frames go on


def test_a_loop_that_ends_before_its_bound_says_nothing(engine, codes, x):
    loop, body, cmp = loop_of(codes)
    add(engine, loop, body, cmp, x)
    seen = []
    engine.diagnostics.subscribe(seen.append)
    level = float(x[0] * 1.9)
    cmp.params["level"].value = level
    frame = engine.tick()
    y, n = passes_to(np.zeros(N, np.float32), x, level, 50)
    assert 2 < n < 50
    np.testing.assert_array_equal(engine.read(body["y"]), y)
    for _ in range(3):
        frame = engine.tick()
        assert frame.loops_at_bound == ()
    assert not warnings_of(seen) and loop.state == "ok"


def test_after_the_loop_ends_early_or_its_bound_changes_the_warning_comes_again(engine, codes, x):
    loop, body, cmp = loop_of(codes)
    add(engine, loop, body, cmp, x)
    seen = []
    engine.diagnostics.subscribe(seen.append)
    cmp.params["level"].value = float(x[0] * 3)
    engine.tick()
    engine.tick()
    assert len(warnings_of(seen)) == 1
    loop.params["max_iterations"].value = 60  # a hot update, still too few: said again, with the new bound
    engine.tick()
    engine.tick()
    assert len(warnings_of(seen)) == 2 and "all its 60 passes" in warnings_of(seen)[-1].message
    # the condition clears: no warning, the region recovers
    engine.write(body["y"], np.zeros(N, np.float32))
    level = float(x[0] * 1.5)
    cmp.params["level"].value = level
    assert engine.tick().loops_at_bound == ()
    y, _ = passes_to(np.zeros(N, np.float32), x, level, 60)
    np.testing.assert_array_equal(engine.read(body["y"]), y)
    assert loop.state == "ok"
    assert [d for d in seen if d.severity == "info" and d.block == loop.id and "ended before" in d.message]
    # and never clearing again later: said again
    cmp.params["level"].value = float(x[0] * 3)
    engine.tick()
    engine.tick()
    assert len(warnings_of(seen)) == 3


def test_an_unrolled_loop_and_one_in_a_batch_say_so_too(engine, codes, x):
    loop, body, cmp = loop_of(codes, max_iterations=7, unroll=3)
    add(engine, loop, body, cmp, x)
    seen = []
    engine.diagnostics.subscribe(seen.append)
    cmp.params["level"].value = float(x[0] * 3)
    assert engine.tick().loops_at_bound == ("spin",)
    y, n = passes_to(np.zeros(N, np.float32), x, float(x[0] * 3), 7)
    assert n == 7  # the bound holds mid-round (7 passes: rounds of 3, 3 and 1)
    np.testing.assert_array_equal(engine.read(body["y"]), y)
    assert len(warnings_of(seen)) == 1
    frame = engine.run_batch(3)
    assert frame.frames == 3 and frame.loops_at_bound == ("spin",) and len(warnings_of(seen)) == 1
    for _ in range(3):
        y, _ = passes_to(y, x, float(x[0] * 3), 7)
    np.testing.assert_array_equal(engine.read(body["y"]), y)


def test_no_passes_to_run_is_no_bound_reached(engine, codes, x):
    loop, body, cmp = loop_of(codes, max_iterations=0)
    add(engine, loop, body, cmp, x)
    seen = []
    engine.diagnostics.subscribe(seen.append)
    cmp.params["level"].value = float(x[0] * 3)
    assert engine.tick().loops_at_bound == ()  # the counter starts at 0: the loop did not run
    np.testing.assert_array_equal(engine.read(body["y"]), np.zeros(N, np.float32))
    assert not warnings_of(seen)


def test_the_plan_copies_the_counter_after_the_loop_into_host_mapped_memory(engine, codes, x):
    loop, body, cmp = loop_of(codes)
    outer = rx.For(2, [loop], name="outer")  # a nested While: its copy sits in the For's body, after it
    engine.add(outer)
    engine.write(body["x"], x)
    engine.connect(body["y"], cmp["v"])
    gp = rx.plan(engine.describe())
    region = next(n for n in gp.nodes if isinstance(n, RegionNodePlan) and n.kind == "while")
    (copy,) = [n for n in gp.nodes if isinstance(n, CopyNodePlan)]
    src, dst = gp.buffers[copy.src], gp.buffers[copy.dst]
    assert src.key == ("internal", loop.id, "counter") and dst.kind == "mapped" and copy.nbytes == 4
    assert gp.parents[copy.id] == gp.parents[region.id]  # at the loop's level
    assert region.id in gp.deps[copy.id]
    assert not any(copy.dst in g for g in gp.shared)
    cmp.params["level"].value = float(x[0] * 3)
    assert engine.tick().loops_at_bound == ("spin",)
    y = np.zeros(N, np.float32)
    for _ in range(2):
        y, _ = passes_to(y, x, float(x[0] * 3), 50)
    np.testing.assert_array_equal(engine.read(body["y"]), y)


def test_pipelines_without_a_while_never_read_and_the_null_driver_reads_nothing(codes, x, monkeypatch):
    def fail(*_):
        raise AssertionError("read without a While")

    with rx.Engine(device="cpu") as e:  # no region: the frame path never calls the check
        m = e.add(rx.Block.from_kernel("scalar_mul", size=N))
        e.write(m["x"], x)
        monkeypatch.setattr(LoopBounds, "check", fail)
        assert e.tick().loops_at_bound == () and e.tick().state == "ok"
        monkeypatch.undo()
    with rx.Engine(driver=NullDriver()) as e:  # no real GPU: the word keeps its start value, nothing is said
        loop, body, cmp = loop_of(codes)
        add(e, loop, body, cmp, x)
        seen = []
        e.diagnostics.subscribe(seen.append)
        assert e.tick().loops_at_bound == () and e.tick().loops_at_bound == ()
        assert not warnings_of(seen)
        ((_, name, condition, word),) = e._runner.loops.words
        assert (name, condition, word.value) == ("spin", "cmp.flag", UNSET)


def test_the_pool_keeps_mapped_words_apart_and_reuses_them():
    api = NullDriver()
    pool = BufferPool(api)
    a = pool.acquire(4, mapped=True)
    word = pool.mapped_u32(a.ptr)
    assert word is not None and word.value == UNSET
    assert pool.mapped_u32(pool.acquire(4).ptr) is None  # device memory is not host-mapped
    word.value = 0
    mark = len(api.calls)
    pool.zero([a], stream=0)  # passed over: set from the host when acquired
    assert api.since(mark) == [] and word.value == 0
    pool.release(a)
    with pytest.raises(ValueError, match="twice"):
        pool.release(a)
    b = pool.acquire(4, mapped=True)
    assert b.ptr == a.ptr and pool.mapped_u32(b.ptr).value == UNSET  # reused, and set again
    pool.close()
    assert pool.mapped_u32(b.ptr) is None


def test_the_isolated_engine_forwards_the_warning():
    from rxcuda.distributed import IsolatedEngine

    x = np.abs(np.random.default_rng().standard_normal(N).astype(np.float32)) + np.float32(0.25)
    codes = {e: rx.compile_cuda(SRC, entry=e, target="ptx") for e in ("acc", "compare")}
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        loop, body, cmp = loop_of(codes)
        add(iso, loop, body, cmp, x)
        seen = []
        iso.diagnostics.subscribe(seen.append)
        cmp.params["level"].value = float(x[0] * 3)
        for _ in range(3):
            assert iso.tick().state == "ok"
        y = np.zeros(N, np.float32)
        for _ in range(3):
            y, _ = passes_to(y, x, float(x[0] * 3), 50)
        np.testing.assert_array_equal(iso.read(body["y"]), y)
        (w,) = warnings_of(seen)
        assert w.subject == "spin" and "While 'spin'" in w.message and "cmp.flag" in w.message
        assert "all its 50 passes" in w.message
