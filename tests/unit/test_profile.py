"""Profiling levels on the null driver: which nodes each level adds, which change rebuilds, that no level but
deep_sync waits, the timing arithmetic on known stamps, occupancy warnings, and block states that recover."""

from __future__ import annotations

import numpy as np
import pytest
from _pipeline import add, mul
from cuda.bindings.driver import CUresult

import rxcuda as rx
from rxcuda.cuda import NullDriver
from rxcuda.engine._profile import FrameTimes, Timings, timings_from_row
from rxcuda.lowlevel import StampLayout, StampNodePlan
from rxcuda.plan._profile import add_stamps


@pytest.fixture
def engine():
    e = rx.Engine(driver=NullDriver())
    yield e
    e.close()


def chain(engine, n=3):
    blocks = [engine.add(mul(name=f"m{i}")) for i in range(n)]
    engine.write(blocks[0]["x"], np.ones(64, np.float32))
    for a, b in zip(blocks, blocks[1:], strict=False):
        engine.connect(a["out"], b["x"])
    return blocks


def test_per_block_stamps_each_block_beside_the_chain(engine):
    chain(engine)
    gp = rx.plan(engine.describe())
    stamped = add_stamps(gp, engine.describe(), "block")
    stamps = [n for n in stamped.nodes if isinstance(n, StampNodePlan)]
    assert [s.column for s in stamps] == [0, 1, 2, 3]
    assert stamped.stamps.names == ("frame", "m0", "m1", "m2")
    assert stamped.stamps.preds == ((), (0,), (1,), (2,))
    # nothing waits for a stamp: the frame's own dependencies are unchanged
    ids = {s.id for s in stamps}
    assert all(not (set(d) & ids) for d in stamped.deps[:len(gp.nodes)])
    assert stamped.deps[:len(gp.nodes)] == gp.deps
    assert stamped.deps[stamps[2].id] == (gp.kernel_nodes[(engine.blocks[1].id, "mul")],)


def test_a_diamond_times_the_join_from_its_later_input(engine):
    a, b, c = mul(name="a"), mul(name="b"), mul(name="c")
    d = add(name="d")
    for blk in (a, b, c, d):
        engine.add(blk)
    engine.write(a["x"], np.ones(64, np.float32))
    engine.connect(a["out"], b["x"])
    engine.connect(a["out"], c["x"])
    engine.connect(b["out"], d["a"])
    engine.connect(c["out"], d["b"])
    layout = add_stamps(rx.plan(engine.describe()), engine.describe(), "block").stamps
    assert layout.preds[layout.names.index("d")] == (layout.names.index("b"), layout.names.index("c"))
    # stamps in ns: a ends at 10 us, b at 30, c at 50 (b and c ran side by side), d at 55
    row = np.array([0, 10_000, 30_000, 50_000, 55_000])
    blocks, kernels = timings_from_row(layout, row, {})
    assert kernels is None
    assert blocks["a"].gpu_us == 10 and blocks["b"].gpu_us == 20 and blocks["c"].gpu_us == 40
    assert blocks["d"] == (5.0, 50.0, 55.0)  # from the later of its inputs


def test_per_kernel_gives_kernels_and_their_blocks():
    layout = StampLayout("kernel", ("frame", "x/k1", "x/k2", "y/k"), ((), (0,), (1,), (2,)), (None, 7, 7, 8))
    blocks, kernels = timings_from_row(layout, np.array([0, 2000, 5000, 9000]), {7: "x", 8: "y"})
    assert dict((n, t.gpu_us) for n, t in kernels.items()) == {"x/k1": 2.0, "x/k2": 3.0, "y/k": 4.0}
    assert blocks["x"].gpu_us == 5.0 and blocks["y"].gpu_us == 4.0
    with pytest.raises(KeyError, match="no timing for 'z'"):
        blocks["z"]


def test_levels_change_the_graph_only_when_stamps_change(engine):
    chain(engine)
    engine.tick()
    rebuilds = engine.rebuilds
    for level, rebuilt in (("summary", False), ("per_block", True), ("per_kernel", True), ("deep", False),
                           ("deep_sync", True), ("none", False), ("per_block", True), ("none", True)):
        engine.profile = level
        frame = engine.tick()
        assert (engine.rebuilds > rebuilds) is rebuilt, level
        assert ("structure" in frame.tiers) is rebuilt, level
        rebuilds = engine.rebuilds
        nodes = engine.plan.nodes
        assert any(isinstance(n, StampNodePlan) for n in nodes) is (level in ("per_block", "per_kernel", "deep"))
    with pytest.raises(ValueError, match="profiling level is one of 'none', 'summary'"):
        engine.profile = "everything"
    assert engine.profile == "none"


def test_frames_carry_what_their_level_measures(engine):
    chain(engine)
    engine.profile = "per_block"
    f = engine.tick()
    assert f.gpu_us is not None and set(f.blocks) == {"m0", "m1", "m2"} and f.kernels is None and f.phases is None
    engine.profile = "per_kernel"
    f = engine.tick()
    assert set(f.kernels) == {"m0/mul", "m1/mul", "m2/mul"} and set(f.blocks) == {"m0", "m1", "m2"}
    engine.profile = "deep"
    f = engine.tick()
    assert set(f.phases) == {"apply", "launch", "sync"} and all(v >= 0 for v in f.phases.values())
    engine.profile = "deep_sync"
    f = engine.tick()
    assert set(f.kernels) == {"m0/mul", "m1/mul", "m2/mul"}
    engine.profile = "summary"
    f = engine.tick()
    assert f.gpu_us is not None and f.blocks is None
    engine.profile = "none"
    assert engine.tick().gpu_us is None


def test_no_level_but_deep_sync_waits(engine):
    api = engine._rt.api
    chain(engine)
    got: list[FrameTimes] = []
    engine.timings.subscribe(got.append)
    for level in ("summary", "per_block", "per_kernel", "deep"):
        engine.profile = level
        engine.tick()  # (a rebuild waits for the old graph; the frames below must not)
        mark = len(api.calls)
        frame = engine.tick(sync=False)
        assert "cuStreamSynchronize" not in api.since(mark), level
        engine.tick()  # a waited-for frame collects what is done, the unsynced frame's timings with it
        assert frame.index in {t.frame for t in got}, level
    engine.profile = "deep_sync"
    mark = len(api.calls)
    engine.tick(sync=False)
    assert api.since(mark).count("cuStreamSynchronize") >= 3  # after each node
    assert [t.frame for t in got] == sorted(t.frame for t in got)


def test_the_event_ring_drops_the_oldest_rather_than_wait(engine, monkeypatch):
    chain(engine)
    engine.profile = "summary"
    engine.tick()
    fast = engine._rt.fast
    monkeypatch.setattr(fast, "done", lambda event: False)  # nothing ever finishes
    api = engine._rt.api
    mark = len(api.calls)
    for _ in range(10):
        engine.tick(sync=False)
    assert "cuStreamSynchronize" not in api.since(mark)
    assert len(engine._profiler._pending) == 4  # the ring holds four frames in flight


def test_run_batch_counts_its_frames_in_the_stamp_ring(engine):
    chain(engine)
    engine.profile = "per_block"
    engine.tick()
    ring = engine._rt.graph.stamps
    before = ring.launches
    frame = engine.run_batch(7)
    assert ring.launches == before + 7
    assert frame.gpu_us is not None and set(frame.blocks) == {"m0", "m1", "m2"}


def test_low_occupancy_warns_once_per_rebuild_and_the_block_recovers(engine, monkeypatch):
    api = engine._rt.api
    blocks = chain(engine, 2)
    engine.profile = "per_kernel"
    monkeypatch.setattr(api, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                        lambda f, threads, smem: (CUresult.CUDA_SUCCESS, 1))  # one block of 256 per SM
    engine.tick()
    occ = engine._rt.occupancy[(blocks[0].id, "mul")]
    assert occ == 256 / 2048
    assert blocks[0].occupancy == {"mul": 256 / 2048}  # the same number as data, not only in str(block)
    warnings = [d for d in engine.diagnostic_log if "theoretical occupancy 12%" in d.message]
    assert len(warnings) == 2 and blocks[0].state == "warning"
    assert "use more threads per block" in warnings[0].message
    monkeypatch.undo()
    engine.rebuild()
    engine.tick()
    assert blocks[0].state == "ok"
    recovered = [d for d in engine.diagnostic_log if d.severity == "info" and "recovered" in d.message]
    assert {d.subject for d in recovered} == {"m0", "m1"}


def test_str_of_a_block_shows_its_last_gpu_time(engine):
    blocks = chain(engine)
    engine.profile = "per_block"
    engine.tick()
    assert "last GPU time" in str(blocks[1])


def test_timings_mapping():
    t = Timings(("a", "b"), np.array([0.0, 1.5]), np.array([1.5, 4.0]))
    assert len(t) == 2 and t["b"].gpu_us == 2.5 and "b=2.50us" in repr(t)


def test_profiling_regions_and_batches_leave_nothing_behind():
    api = NullDriver()
    e = rx.Engine(driver=api, profile="per_kernel")
    a = e.add(mul(name="a"))
    e.add(rx.For(3, [mul(name="b")]))
    e.write(a["x"], np.ones(64, np.float32))
    e.tick()
    e.run_batch(5)
    e.profile = "summary"
    e.tick(sync=False)
    e.run_batch(3)
    e.profile = "deep_sync"
    e.tick()
    e.close()
    assert api.leaks() == {}
