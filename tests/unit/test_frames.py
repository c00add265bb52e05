"""The frame runner and the one way for a value and for code, on the null driver.

- tick, the profiled tick and run_batch go through one FrameRunner that is handed what it needs, not the
  Engine;
- a parameter's value: one patch table, one AppliedUpdate per applied plan, a recapture with the drained
  value, an in-place resize that leaves no stale value behind;
- code: the running plan's code_key says what runs; Block.reload and a saved file take the same path.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import rxcuda
from rxcuda import Block, BlockBuilder, CallSpec, KernelParam
from rxcuda.engine._frames import FrameRunner
from rxcuda.engine._reload import HotReload
from rxcuda.model._events import FileChanged

N = 1024
KERNELS = Path("kernels")


def chain(engine):
    add = engine.add(Block.from_kernel(KERNELS / "vector_add.ptx", size=N))
    mul = engine.add(Block.from_kernel(KERNELS / "scalar_mul.ptx", size=N, scale=3.0))
    engine.connect(add["out"], mul["x"])
    engine.write(add["a"], np.ones(N, np.float32))
    engine.write(add["b"], np.ones(N, np.float32))
    return add, mul


def stored(engine, block, name) -> list[float]:
    """What the running graph's argument storage holds for a block parameter (one entry per node reading it)."""
    g = engine._rt.graph
    out = []
    for nid, i in g.plan.slots[(block.id, name)]:
        view, idx = g.nodes[nid].slots[i]
        out.append(float(view[idx]))
    return out


# -- the runner ---------------------------------------------------------------------------------------------
def test_the_runner_is_handed_what_a_frame_needs_and_never_the_engine(engine):
    runner = engine._runner
    assert isinstance(runner, FrameRunner)
    assert not any(isinstance(v, rxcuda.Engine) for v in vars(runner).values())
    assert runner.stream == engine.stream.handle and runner.profiler is engine._profiler


def test_tick_goes_through_the_runner(engine, api):
    _add, mul = chain(engine)
    seen: list = []
    engine.frames.subscribe(seen.append)
    first = engine._runner.tick(True)  # what engine.tick() calls
    assert first.tiers == ("structure",) and first.launched and first.index == 1
    mark = len(api.calls)
    mul.set(scale=0.5)
    frame = engine.tick()
    assert api.since(mark) == ["cuGraphExecKernelNodeSetParams", "cuGraphLaunch", "cuStreamSynchronize"]
    assert frame.index == 2 and engine.last_frame is frame and seen == [first, frame]
    assert stored(engine, mul, "scale") == [0.5]


def test_changes_applied_between_frames_are_reported_by_the_next_frame(engine, api):
    """A read or array() applies what is pending first (it must see the new graph): the next frame is the first
    to run with those changes, so its tiers name them (a distributed worker's IPC link takes array() before
    the tick: its parameter changes and code swaps were reported by no frame)."""
    _add, mul = chain(engine)
    engine.tick()
    mul.set(scale=0.5)
    engine.array(mul["out"])  # applies the pending value now
    assert stored(engine, mul, "scale") == [0.5]
    frame = engine.tick()
    assert frame.tiers == ("parameters",)
    assert engine.tick().tiers == ()  # reported once
    mul.set(scale=2.0)
    engine.read(mul["out"])
    mul.set(scale=4.0)
    assert engine.tick().tiers == ("parameters",)  # one applied by the read, one by the tick: named once


def test_an_idle_engine_ticks_without_a_launch(engine, api):
    frame = engine.tick()
    assert frame.state == "idle" and not frame.launched and api.count("cuGraphLaunch") == 0


def test_a_profiled_tick_goes_through_the_runner(engine, api):
    chain(engine)
    engine.profile = "summary"
    engine.tick()
    mark = len(api.calls)
    frame = engine.tick()
    calls = api.since(mark)
    assert calls == ["cuEventRecord", "cuGraphLaunch", "cuEventRecord", "cuStreamSynchronize",
                     "cuEventElapsedTime_v2"] or calls[:3] == ["cuEventRecord", "cuGraphLaunch", "cuEventRecord"]
    assert frame.gpu_us is not None and frame.blocks is None
    engine.profile = "per_block"
    engine.tick()  # the rebuild that adds the stamp nodes
    frame = engine.tick()
    assert frame.gpu_us is not None and set(frame.blocks) == {"vector_add", "scalar_mul"}
    engine.profile = "none"
    assert engine.tick().gpu_us is None and engine._runner.plain


def test_debug_turns_the_plain_launch_into_eager_launches(engine, api):
    chain(engine)
    engine.tick()
    engine.debug = True
    mark = len(api.calls)
    engine.tick()
    assert "cuGraphLaunch" not in api.since(mark) and api.since(mark).count("cuLaunchKernel") == 2
    engine.debug = False
    mark = len(api.calls)
    engine.tick()
    assert api.since(mark).count("cuGraphLaunch") == 1


def test_run_batch_goes_through_the_runner(engine, api):
    _add, mul = chain(engine)
    engine.tick()
    mul.set(scale=2.0)
    seen: list = []
    engine.frames.subscribe(seen.append)
    frame = engine.run_batch(5)
    assert frame.tiers == ("parameters",) and frame.frames == 5 and frame.index == 6
    assert engine.frame == 6 and engine.last_frame is frame and seen == [frame]
    assert stored(engine, mul, "scale") == [2.0]


def test_run_batch_builds_first_and_without_a_graph_is_one_tick_that_launches_nothing(engine):
    blk = engine.add(Block.from_kernel(KERNELS / "vector_add.ptx", size=N, name="open"))
    engine.write(blk["a"], np.ones(N, np.float32))  # b is left open: the build fails
    with pytest.warns(RuntimeWarning, match="no graph runs until it is fixed"):
        frame = engine.run_batch(3)
    assert frame.state == "error" and not frame.launched and frame.frames == 1 and frame.index == 1
    engine.write(blk["b"], np.ones(N, np.float32))
    frame = engine.run_batch(3)  # built, then the batch
    assert frame.tiers == ("structure",) and frame.launched and frame.frames == 3 and frame.index == 4


@pytest.mark.parametrize("k", [0, -1, 2**32, 2.0, True, "3"])
def test_run_batch_refuses_a_bad_frame_count(engine, k):
    chain(engine)
    with pytest.raises(ValueError, match=r"run_batch takes a frame count from 1 to 2\*\*32-1"):
        engine.run_batch(k)


def test_frames_from_another_thread_are_refused_while_run_drives(engine):
    chain(engine)
    running = engine.run(200.0)
    try:
        with pytest.raises(RuntimeError, match=r"dispose it before calling tick\(\) yourself"):
            engine.tick()
        with pytest.raises(RuntimeError, match=r"dispose it before calling run_batch\(\) yourself"):
            engine.run_batch(2)
        with pytest.raises(RuntimeError, match="already running; dispose the previous run"):
            engine.run(60.0)
        assert engine.running and engine.loop is engine._runner.loop
        assert engine._gpu(threading.current_thread) is engine.loop.thread  # reads hop to the frame thread
    finally:
        running.dispose()
    assert not engine.running and engine.loop is not None  # the last loop stays readable
    assert engine.tick().launched  # this thread may tick again


def test_a_lost_context_in_a_batch_is_the_engines_one_error(engine, api):
    chain(engine)
    engine.tick()
    api.fail("cuStreamSynchronize", "CUDA_ERROR_ILLEGAL_ADDRESS", times=100)
    with pytest.raises(rxcuda.DeviceLostError, match="restart the process"):
        engine.run_batch(4)
    with pytest.raises(rxcuda.DeviceLostError):
        engine.tick()


# -- one way for a value -----------------------------------------------------------------------------------
def test_one_patch_table_serves_the_hot_and_the_general_path(engine, api):
    add, mul = chain(engine)
    engine.tick()
    g = engine._rt.graph
    assert not hasattr(g, "hot") and not hasattr(g, "scalar_views")
    mul.set(scale=4.0)
    engine.tick()  # one value: the hot path
    assert set(g.patches) == {(mul.id, "scale")}
    mul.set(scale=5.0, n=N)
    add.set(n=N)
    mark = len(api.calls)
    assert engine.tick().tiers == ("parameters",)  # several values: the general path, the same table
    assert api.since(mark).count("cuGraphExecKernelNodeSetParams") == 2  # one per node
    assert set(g.patches) == {(mul.id, "scale"), (mul.id, "n"), (add.id, "n")}
    assert stored(engine, mul, "scale") == [5.0]


def test_one_applied_update_per_applied_plan(engine, api, tmp_path):
    add, mul = chain(engine)
    seen: list = []
    engine.updates.subscribe(seen.append)

    def tick_and_take():
        frame = engine.tick()
        got = list(seen)
        seen.clear()
        return frame, got

    frame, got = tick_and_take()  # the first build
    assert [u.tiers for u in got] == [("structure",)] and got[0].frame == frame.index
    _, got = tick_and_take()  # nothing pending: nothing applied, nothing published
    assert got == []
    mul.set(scale=2.0)  # the hot path
    frame, got = tick_and_take()
    assert [(u.tiers, u.blocks, u.events) for u in got] == [(("parameters",), ("scalar_mul",), 1)]
    assert got[0].frame == frame.index
    mul.set(scale=2.5)
    add.set(n=N)  # two values: the general path
    _, got = tick_and_take()
    assert [(u.tiers, u.blocks, u.events) for u in got] == [(("parameters",), ("scalar_mul", "vector_add"), 2)]
    mul.set(scale=3.0)
    mul.set_launch(threads=N // 2)  # a value and a launch: a drained plan
    _, got = tick_and_take()
    assert [(u.tiers, u.events) for u in got] == [(("parameters",), 2)]
    add.set_code(None, rxcuda.load_kernel_file(KERNELS / "vector_sub.ptx"))
    mul.set(scale=1.5)
    _, got = tick_and_take()
    assert [u.tiers for u in got] == [("code", "parameters")]
    engine.disconnect(add["out"], mul["x"])
    engine.connect(add["out"], mul["x"])
    mul.set(scale=1.25)  # subsumed by the rebuild
    _, got = tick_and_take()
    assert [u.tiers for u in got] == [("structure",)] and stored(engine, mul, "scale") == [1.25]


def _recording_block(seen: list) -> Block:
    """A library call whose record function notes the values it was captured with."""
    params = (KernelParam("x", "pointer", 8, "f32", "in"), KernelParam("y", "pointer", 8, "f32", "out"),
              KernelParam("gain", "scalar", 4, "f32", default=1.0),
              KernelParam("bias", "scalar", 4, "f32", default=0.0))
    spec = CallSpec("probe", params, lambda args: seen.append(dict(args.values)), key=("probe", N))
    b = BlockBuilder("lib", size=N)
    k = b.add_call(spec)
    b.input("x", k["x"])
    b.output("y", k["y"])
    b.scalar("gain", k["gain"], default=1.0)
    b.scalar("bias", k["bias"], default=0.0)
    return b.build()


def test_a_recapture_reads_the_drained_value_not_the_blocks_newer_one(engine, api):
    seen: list = []
    blk = engine.add(_recording_block(seen))
    engine.write(blk["x"], np.ones(N, np.float32))
    engine.tick()
    assert seen[-1] == {"gain": 1.0, "bias": 0.0}
    blk.set(bias=0.5)
    engine.tick()
    blk.set(gain=2.5)
    up = engine._rt.pending.drain()  # the engine thread drains ...
    blk.set(gain=9.0)  # ... another thread sets a newer value before the recapture
    assert engine._updater.apply(up) == ("recapture",)
    assert seen[-1] == {"gain": 2.5, "bias": 0.5}  # the drained value; the others as last captured
    assert engine.tick().tiers == ("recapture",) and seen[-1] == {"gain": 9.0, "bias": 0.5}  # next frame's


def test_a_failed_recapture_is_reported_and_the_last_capture_keeps_running(engine, api):
    seen: list = []
    blk = engine.add(_recording_block(seen))
    engine.write(blk["x"], np.ones(N, np.float32))
    engine.tick()
    api.fail("cuGraphExecChildGraphNodeSetParams", "CUDA_ERROR_INVALID_VALUE")
    blk.set(gain=3.0)
    frame = engine.tick()
    assert frame.tiers == () and blk.state == "error"
    assert "recapture failed" in engine.diagnostic_log[-1].message
    with pytest.raises(rxcuda.CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        api.fail("cuGraphExecChildGraphNodeSetParams", "CUDA_ERROR_INVALID_VALUE")
        blk.set(gain=4.0)
        engine.rebuild()  # raises what tick reported


def test_an_in_place_resize_leaves_no_stale_value_behind(engine, api):
    add, mul = chain(engine)
    engine.tick()
    mul.set(scale=5.0)
    engine.tick()  # the storage holds 5.0; the running plan still says 3.0
    mul.set(scale=3.0)  # back to the value the plan was built with ...
    engine.write(add["a"], np.ones(600, np.float32), resize=True)  # ... with a resize in the same frame
    engine.write(add["b"], np.ones(600, np.float32), resize=True)
    frame = engine.tick()
    assert frame.tiers == ("parameters",) and engine._builder.resized_in_place == 1
    assert stored(engine, mul, "scale") == [3.0]
    assert stored(engine, mul, "n") == [600.0]


def test_an_in_place_resize_updates_no_node_it_need_not(engine, api):
    add, mul = chain(engine)
    other = engine.add(Block.from_kernel(KERNELS / "scalar_mul.ptx", size=N, name="other"))
    engine.write(other["x"], np.ones(N, np.float32))
    engine.tick()
    other.set(scale=7.0)
    engine.tick()  # patched since the build, unchanged by the resize
    engine.write(add["a"], np.ones(600, np.float32), resize=True)
    engine.write(add["b"], np.ones(600, np.float32), resize=True)
    mark = len(api.calls)
    assert engine.tick().tiers == ("parameters",)
    assert api.since(mark).count("cuGraphExecKernelNodeSetParams") == 2  # add and mul; `other` untouched
    assert stored(engine, other, "scale") == [7.0]


def test_an_in_place_resize_leaves_no_stale_launch_behind(engine, api):
    add, _mul = chain(engine)
    other = engine.add(Block.from_kernel(KERNELS / "scalar_mul.ptx", size=N, name="other"))
    engine.write(other["x"], np.ones(N, np.float32))
    engine.tick()
    built = other.launch()
    other.set_launch(threads=N // 2)
    engine.tick()  # the node runs half the grid; the running plan still says the whole
    other.set_launch(grid=built.grid, block=built.block)  # back, in the frame of a resize elsewhere
    engine.write(add["a"], np.ones(600, np.float32), resize=True)
    engine.write(add["b"], np.ones(600, np.float32), resize=True)
    assert engine.tick().tiers == ("parameters",) and engine._builder.resized_in_place == 1
    g = engine._rt.graph
    p = g.nodes[g.plan.kernel_nodes[(other.id, "scalar_mul")]].params
    assert (p.gridDimX, p.blockDimX) == (built.grid[0], built.block[0])


# -- one way for code ------------------------------------------------------------------------------------------
def test_the_running_plan_says_which_code_each_node_runs(engine, api):
    add, _mul = chain(engine)
    engine.tick()
    sub = rxcuda.load_kernel_file(KERNELS / "vector_sub.ptx")
    nid = engine.plan.kernel_nodes[(add.id, "vector_add")]
    assert engine.plan.nodes[nid].code_key != sub.key
    add.set_code(None, sub)
    assert engine.tick().tiers == ("code",)
    assert engine.plan.nodes[nid].code_key == sub.key and engine._rt.graph.nodes[nid].plan.code_key == sub.key
    assert not hasattr(engine._builder, "node_code")
    # a resize after the swap still fits the running graph in place: the plan is not stale
    engine.write(add["a"], np.ones(600, np.float32), resize=True)
    engine.write(add["b"], np.ones(600, np.float32), resize=True)
    assert engine.tick().tiers == ("parameters",) and engine._builder.resized_in_place == 1


def _file_block(tmp_path) -> tuple[Block, Path]:
    src = tmp_path / "k.ptx"
    shutil.copy(KERNELS / "vector_add.ptx", src)
    shutil.copy(KERNELS / "vector_add.json", tmp_path / "k.json")
    return Block.from_kernel(src, size=N), src


def _edit(src: Path) -> None:
    src.write_text((KERNELS / "vector_sub.ptx").read_text().replace("vector_sub", "vector_add"))


def test_block_reload_and_a_saved_file_take_the_same_path(engine, tmp_path, monkeypatch):
    calls: list = []
    real = Block.reload_kernel

    def spy(self, kernel=None):
        calls.append((self.name, kernel))
        return real(self, kernel)

    monkeypatch.setattr(Block, "reload_kernel", spy)
    blk, src = _file_block(tmp_path)
    engine.add(blk)
    engine.write(blk["a"], np.ones(N, np.float32))
    engine.write(blk["b"], np.ones(N, np.float32))
    engine.tick()
    _edit(src)
    assert blk.reload() == ["code"]
    assert calls == [("vector_add", "vector_add")]
    assert engine.tick().tiers == ("code",)
    key = blk.description.kernels[0].code.key
    assert engine.plan.nodes[0].code_key == key
    # a saved file: the watcher's handler, as watch() subscribes it
    reload = HotReload(lambda: engine.blocks, lambda *a: pytest.fail(f"reported {a}"), lambda ev: None)
    src.write_text((KERNELS / "vector_add.ptx").read_text())
    reload._changed(FileChanged(str(src), "digest"))
    assert calls[1:] == [("vector_add", "vector_add")] and reload.reloads == 1
    assert engine.tick().tiers == ("code",)
    assert engine.plan.nodes[0].code_key == blk.description.kernels[0].code.key != key
    reload.close()


def test_a_broken_save_raises_from_block_reload_and_is_reported_by_the_watcher(engine, tmp_path):
    blk, src = _file_block(tmp_path)
    engine.add(blk)
    src.write_text("this is not PTX")
    with pytest.raises(rxcuda.KernelFileError):
        blk.reload()
    reported: list = []
    reload = HotReload(lambda: engine.blocks, lambda err, block, what: reported.append((block, what)),
                       lambda ev: None)
    assert reload.reload(blk, "vector_add") is None
    assert reported == [(blk, "reload")] and reload.failures == 1 and reload.reloads == 0
    reload.close()


def test_reload_kernel_refuses_a_library_call():
    blk = _recording_block([])
    with pytest.raises(TypeError, match="lib.probe is a library call, not a kernel: it has no file to reload"):
        blk.reload_kernel("probe")


def test_an_unchanged_file_reloads_nothing(tmp_path):
    blk, _src = _file_block(tmp_path)
    assert blk.reload_kernel() is None and blk.reload() == []


@pytest.mark.parametrize(("kwargs", "level"), [
    ({}, "none"), ({"profile": "summary"}, "summary"), ({"timing": True}, "summary"),
    ({"profile": "per_block", "timing": True}, "per_block"), ({"profile": "deep", "debug": True}, "deep"),
])
def test_the_profiling_level_given_to_the_engine_is_the_one_it_runs(api, kwargs, level):
    with rxcuda.Engine(driver=api, **kwargs) as engine:
        assert engine.profile == level and engine.timing == (level != "none")
        assert engine.debug == kwargs.get("debug", False) and engine._runner.plain == (engine.profile == "none"
                                                                                   and not engine.debug)
        engine.timing = False
        assert engine.profile == ("none" if level == "summary" else level)


def test_a_bad_profiling_level_is_refused_before_the_device_opens(api):
    with pytest.raises(ValueError, match="the profiling level is one of 'none', 'summary'"):
        rxcuda.Engine(driver=api, profile="fast")
    assert api.calls == []
    with rxcuda.Engine(driver=api) as engine, pytest.raises(ValueError, match="got 'slow'"):
        engine.profile = "slow"
