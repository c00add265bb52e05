"""The engine's decisions on the null driver: tier dispatch, keep-last-good, exec update versus
re-instantiation, code swaps, rebinds, stream ordering of copies, subscribers, closing.

The null driver records driver calls and runs nothing, so these tests assert which operations the engine
chose -- never numbers a kernel would have computed (tests/gpu does that).
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import rxcuda
from rxcuda import Block, BlockBuilder, CallSpec, KernelParam
from rxcuda.cuda import NullDriver

N = 1024
KERNELS = "kernels"


def chain(engine):
    add = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N))
    mul = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, scale=3.0))
    engine.connect(add["out"], mul["x"])
    engine.write(add["a"], np.ones(N, np.float32))
    engine.write(add["b"], np.ones(N, np.float32))
    return add, mul


def test_first_tick_builds_and_instantiates_once(engine, api):
    chain(engine)
    frame = engine.tick()
    assert frame.tiers == ("structure",) and frame.state == "ok" and frame.launched
    assert api.count("cuGraphInstantiate") == 1 and api.count("cuGraphLaunch") == 1
    assert api.count("cuGraphAddKernelNode") == 2
    assert engine.rebuilds == 1


def test_a_parameter_is_one_exec_node_update_and_no_rebuild(engine, api):
    _add, mul = chain(engine)
    engine.tick()
    mark = len(api.calls)
    mul.set(scale=0.5)
    frame = engine.tick()
    assert frame.tiers == ("parameters",)
    assert api.since(mark) == ["cuGraphExecKernelNodeSetParams", "cuGraphLaunch", "cuStreamSynchronize"]


def test_the_hot_path_does_not_depend_on_subscribers(engine, api):
    _add, mul = chain(engine)
    engine.tick()
    seen: list = []
    subs = [engine.changes.subscribe(seen.append), engine.updates.subscribe(seen.append),
            engine.frames.subscribe(seen.append)]
    mark = len(api.calls)
    mul.set(scale=0.25)
    frame = engine.tick()
    assert api.since(mark) == ["cuGraphExecKernelNodeSetParams", "cuGraphLaunch", "cuStreamSynchronize"]
    kinds = [type(x).__name__ for x in seen]
    assert kinds == ["ParameterChanged", "AppliedUpdate", "Frame"]
    assert seen[1].tiers == ("parameters",) and seen[2] == frame
    for s in subs:
        s.dispose()


def test_launch_geometry_is_warm(engine, api):
    _add, mul = chain(engine)
    engine.tick()
    mark = len(api.calls)
    mul.set(n=N // 2)
    mul.set_launch(threads=N // 2)
    assert engine.tick().tiers == ("parameters",)
    assert "cuGraphInstantiate" not in api.since(mark)
    assert api.since(mark).count("cuGraphExecKernelNodeSetParams") == 1  # both changes, one node update


def test_code_with_the_same_layout_is_swapped_in_place(engine, api):
    add, _mul = chain(engine)
    engine.tick()
    mark = len(api.calls)
    assert add.set_code(None, rxcuda.load_kernel_file(f"{KERNELS}/vector_sub.ptx")) == "code"
    assert engine.tick().tiers == ("code",)
    new = api.since(mark)
    assert new[:2] == ["cuModuleLoadData", "cuModuleGetFunction"]
    assert "cuGraphExecKernelNodeSetParams" in new and "cuGraphInstantiate" not in new
    assert "cuModuleUnload" in new  # the old module is no longer used by any node


def test_code_with_another_layout_rebuilds(engine, api):
    add, _mul = chain(engine)
    engine.tick()
    assert add.set_code(None, rxcuda.load_kernel_file(f"{KERNELS}/saxpy.ptx")) == "structure"
    # saxpy's ports differ from vector_add's: the rebuild fails and the old graph keeps running
    frame = engine.tick()
    assert frame.state == "error" and add.state == "error"
    assert api.count("cuGraphLaunch") == 2


def test_same_topology_updates_the_executable_in_place(engine, api):
    add, mul = chain(engine)
    engine.tick()
    mark = len(api.calls)
    engine.disconnect(add["out"], mul["x"])
    engine.connect(add["out"], mul["x"])  # a structure change that leaves the node topology as it was
    assert engine.tick().tiers == ("structure",)
    assert api.since(mark).count("cuGraphExecUpdate") == 1
    assert api.count("cuGraphInstantiate") == 1
    engine.disconnect(add["out"], mul["x"])
    engine.write(mul["x"], np.ones(N, np.float32))  # now host-fed: same nodes, but no dependency
    engine.tick()
    assert api.count("cuGraphInstantiate") == 2  # another topology: instantiated


def test_a_refused_exec_update_falls_back_to_instantiation(engine, api):
    add, mul = chain(engine)
    engine.tick()
    engine.disconnect(add["out"], mul["x"])
    engine.connect(add["out"], mul["x"])  # same topology again
    api.fail("cuGraphExecUpdate", "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE")
    assert engine.tick().tiers == ("structure",)
    assert api.count("cuGraphInstantiate") == 2


def test_a_kernel_that_fails_to_load_keeps_the_last_good_graph(engine, api):
    _add, mul = chain(engine)
    engine.tick()
    launched_exec = [args for name, args in api.calls if name == "cuGraphLaunch"][-1][0]
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    # a kernel no module holds yet, so the build must load it, and the driver refuses
    code = rxcuda.compile_cuda('extern "C" __global__ void scale2(const float* x, float* out, int n)'
                               '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = 2 * x[i]; }')
    extra = engine.add(Block.from_kernel(code, size=N, name="extra"))
    engine.connect(mul["out"], extra["x"])
    api.fail("cuModuleLoadData", "CUDA_ERROR_INVALID_PTX")
    frame = engine.tick()
    assert frame.state == "error" and frame.launched
    assert extra.state == "error" and "INVALID_PTX" in extra.message
    assert [name for name, _ in api.calls].count("cuGraphInstantiate") == 1
    assert [args for name, args in api.calls if name == "cuGraphLaunch"][-1][0] == launched_exec
    assert seen and seen[-1].severity == "error" and seen[-1].subject == "extra"
    assert "the last good graph keeps running" in seen[-1].message
    # parameters still reach the running graph
    mark = len(api.calls)
    mul.set(scale=2.0)
    assert engine.tick().tiers == ("parameters",)
    assert "cuGraphExecKernelNodeSetParams" in api.since(mark)


def test_rebuild_raises_what_tick_reports(engine, api):
    blk = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N, name="open"))
    engine.write(blk["a"], np.ones(N, np.float32))  # b is left open
    with pytest.raises(rxcuda.ValidationError, match="open.b"):
        engine.rebuild()
    assert engine.last_frame is None and engine.plan is None


def test_a_rejected_write_does_not_make_the_input_host_fed(engine, api):
    blk = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N, name="v"))
    engine.write(blk["a"], np.ones(N, np.float32))
    with pytest.raises(rxcuda.ValidationError, match="v.b takes f32, got float64"):
        engine.write(blk["b"], np.ones(N))
    with pytest.raises(rxcuda.ValidationError, match="do not fit"):
        engine.write(blk["b"], np.ones(N + 1, np.float32))
    fed = {r.port for r in engine.describe().fed}
    assert fed == {"a"}
    frame = engine.tick()
    assert frame.state != "ok" and not frame.launched  # the open input is reported, nothing runs
    assert "v.b" in engine.diagnostic_log[-1].message


def test_copies_and_memsets_go_on_the_engines_stream(engine, api):
    above = engine.add(Block.from_kernel(f"{KERNELS}/append_above.ptx", size=N, threshold=0.5))
    engine.write(above["values"], np.ones(N, np.float32))
    engine.tick()
    engine.write(above["values"], np.zeros(N, np.float32))
    engine.read(above["out"])
    stream = engine.stream.handle
    async_calls = [(n, a) for n, a in api.calls if n.startswith(("cuMemcpy", "cuMemset"))]
    assert async_calls, "the build zeroes buffers and the writes copy"
    for name, args in async_calls:
        assert name.endswith("Async"), f"{name} is not stream-ordered"
        assert args[-1] == stream, f"{name} ran on stream {args[-1]:#x}, not the engine's {stream:#x}"


def test_a_failing_frames_subscriber_is_reported_and_frames_go_on(engine, api):
    chain(engine)

    def boom(frame):
        raise RuntimeError("dashboard bug")

    engine.frames.subscribe(boom)
    f1 = engine.tick()
    f2 = engine.tick()
    assert (f1.index, f2.index) == (1, 2)
    warnings = [d for d in engine.diagnostic_log if d.subject == "engine.frames"]
    assert len(warnings) == 2 and "dashboard bug" in warnings[0].message


def test_every_observable_completes_on_close(api):
    engine = rxcuda.Engine(driver=api)
    add, mul = chain(engine)
    done: list[str] = []
    for name in ("frames", "diagnostics", "updates", "changes", "file_changes"):
        getattr(engine, name).subscribe(on_completed=lambda name=name: done.append(name))
    engine.observe(mul["out"]).subscribe(on_completed=lambda: done.append("observe"))
    engine.tick()
    engine.close()
    assert sorted(done) == sorted(["frames", "diagnostics", "updates", "changes", "file_changes", "observe"])


def test_observables_are_read_only(engine):
    for name in ("frames", "diagnostics", "updates", "changes", "file_changes", "parameter_changes"):
        stream = getattr(engine, name)
        assert not any(hasattr(stream, a) for a in ("on_next", "emit")), name


def test_close_releases_every_handle(api):
    engine = rxcuda.Engine(driver=api)
    chain(engine)
    engine.tick()
    engine.observe(engine.blocks[1]["out"]).subscribe(lambda a: None)
    engine.tick()
    engine.close()
    assert api.leaks() == {}


def test_a_lost_context_is_one_clear_error_and_close_does_not_raise(api):
    engine = rxcuda.Engine(driver=api)
    chain(engine)
    engine.tick()
    api.fail("cuStreamSynchronize", "CUDA_ERROR_ILLEGAL_ADDRESS", times=100)
    with pytest.raises(rxcuda.DeviceLostError, match="restart the process") as info:
        engine.tick()
    assert "vector_add" in str(info.value) and "scalar_mul" in str(info.value)
    with pytest.raises(rxcuda.DeviceLostError):
        engine.tick()
    with pytest.raises(rxcuda.DeviceLostError):
        engine.read(engine.blocks[0]["out"])
    engine.close()  # never raises
    assert engine.closed


def _recording_block(seen: list) -> Block:
    """A library call whose record function notes the pointers and values it was captured with (it issues
    nothing: under the null driver a capture records nothing either)."""
    params = (KernelParam("x", "pointer", 8, "f32", "in"), KernelParam("y", "pointer", 8, "f32", "out"),
              KernelParam("gain", "scalar", 4, "f32", default=1.0))
    spec = CallSpec("probe", params, lambda args: seen.append((dict(args.pointers), dict(args.values))),
                    key=("probe", N))
    b = BlockBuilder("lib", size=N)
    k = b.add_call(spec)
    b.input("x", k["x"])
    b.output("y", k["y"])
    b.scalar("gain", k["gain"], default=1.0)
    return b.build()


def test_a_rebound_array_read_by_a_library_call_recaptures_that_call(engine, api, monkeypatch):
    import rxcuda.engine._engine as engine_module

    seen: list = []
    blk = engine.add(_recording_block(seen))

    class FakeArray:  # the null driver has no memory: a resolved array is a pointer and a size
        def __init__(self, ptr):
            self.ptr = ptr

    def resolve(arr, stream=None, api=None):
        from rxcuda.cuda._memory import ExternalArray

        return ExternalArray(arr.ptr, "f32", N, (N,), arr)

    monkeypatch.setattr(engine_module, "resolve_device_array", resolve)
    engine.bind(blk["x"], FakeArray(0xA000))
    engine.tick()
    assert seen[-1][0]["x"] == 0xA000
    rebuilds = engine.rebuilds
    engine.bind(blk["x"], FakeArray(0xB000))
    frame = engine.tick()
    assert frame.tiers == ("recapture",)
    assert engine.rebuilds == rebuilds and engine.recaptures == 1
    assert seen[-1][0]["x"] == 0xB000  # captured again with the new pointer
    assert api.count("cuGraphExecChildGraphNodeSetParams") == 1


def test_a_host_scalar_of_a_library_call_recaptures(engine, api):
    seen: list = []
    blk = engine.add(_recording_block(seen))
    engine.write(blk["x"], np.ones(N, np.float32))
    engine.tick()
    blk.set(gain=2.5)
    assert engine.tick().tiers == ("recapture",)
    assert seen[-1][1]["gain"] == 2.5


def test_structure_subsumes_lower_tiers_and_a_failed_rebuild_keeps_them(engine, api):
    _add, mul = chain(engine)
    engine.tick()
    broken = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N, name="broken"))
    engine.connect(mul["out"], broken["a"])  # broken.b is left open: the rebuild fails
    mark = len(api.calls)
    mul.set(scale=7.0)
    frame = engine.tick()
    assert frame.tiers == ("parameters",) and frame.state == "error"
    assert "cuGraphExecKernelNodeSetParams" in api.since(mark)  # the value reached the last good graph
    assert broken.state == "error"
    engine.write(broken["b"], np.ones(N, np.float32))
    assert engine.tick().tiers == ("structure",)
    assert broken.state == "ok" and engine.tick().state == "ok"


def test_debug_mode_runs_nodes_one_by_one_and_names_the_one_that_faults(api):
    engine = rxcuda.Engine(driver=api, debug=True)
    chain(engine)
    engine.tick()
    launches = [args for name, args in api.calls if name == "cuLaunchKernel"]
    assert len(launches) == 2 and api.count("cuGraphLaunch") == 0
    api.fail("cuStreamSynchronize", "CUDA_ERROR_ILLEGAL_ADDRESS", times=100)  # the first node faults
    with pytest.raises(rxcuda.DeviceLostError, match=r"the fault came from vector_add/vector_add"):
        engine.tick()
    engine.close()


def test_writing_more_bytes_than_an_untyped_port_holds_is_refused_at_once(engine, api, tmp_path):
    # a PTX without a sidecar: its pointers have no element type, so a port of `size` holds `size` bytes
    ptx = tmp_path / "raw.ptx"
    ptx.write_text(pathlib.Path(KERNELS, "scalar_mul.ptx").read_text())
    blk = engine.add(Block.from_kernel(str(ptx), size=N, arg3=N))
    port = blk.inputs[0] if blk.inputs else blk.outputs[0]
    with pytest.raises(rxcuda.ValidationError, match=r"has no element type, so its buffer holds 1024 bytes"):
        engine.write(port, np.ones(N, np.float32))
    engine.write(port, np.ones(N // 4, np.float32))  # what fits is taken
    assert engine.tick().launched


def test_engines_share_the_switch_interval_while_any_runs(api):
    import sys

    before = sys.getswitchinterval()
    a, b = rxcuda.Engine(driver=api), rxcuda.Engine(driver=NullDriver())
    try:
        run_a = a.run(1000.0)
        run_b = b.run(1000.0)
        run_a.dispose()
        assert sys.getswitchinterval() == pytest.approx(0.0002)  # b still runs
        run_b.dispose()
        assert sys.getswitchinterval() == before
        run_a.dispose()  # twice is harmless
        assert sys.getswitchinterval() == before
    finally:
        a.close()
        b.close()


def test_an_array_on_another_gpu_is_refused_and_changes_nothing(engine, api, monkeypatch):
    import rxcuda.engine._engine as engine_module
    from rxcuda.cuda._memory import ExternalArray

    blk = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N))
    monkeypatch.setattr(engine_module, "resolve_device_array",
                        lambda arr, stream=None, api=None: ExternalArray(0xC000, "f32", N, (N,), arr, device=1))
    with pytest.raises(rxcuda.ValidationError, match=r"the array lives on GPU 1, but this engine runs on GPU 0"):
        engine.bind(blk["x"], object())
    assert engine.describe().bindings == {}
