"""One pipeline over several devices, on a null driver that simulates them: the engine's graphs per device,
copies and events in the driver calls, every tier on its own device's graph, rebuilds of the touched devices
only, pipelined frames, pictures, traces and the live view, faults (the pure split: test_placement.py)."""

from __future__ import annotations

import numpy as np
import pytest
from _pipeline import builder, kcode, mul, ptr, scalar

import rxcuda
from rxcuda import Block, BufferStats, If, ValidationError
from rxcuda.cuda import NullDriver
from rxcuda.cuda._memory import PoolStats
from rxcuda.lowlevel import PortRef

N = 1024
KERNELS = "kernels"


# -- the engine over several devices ---------------------------------------------------------------------------
@pytest.fixture
def api():
    return NullDriver(devices=2)


@pytest.fixture
def engine(api):
    e = rxcuda.Engine(devices=[0, 1], driver=api)
    yield e
    e.close()


def two_stage(engine, device=1):
    first = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N))
    second = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, scale=3.0), device=device)
    engine.connect(first["out"], second["x"])
    engine.write(first["a"], np.ones(N, np.float32))
    engine.write(first["b"], np.ones(N, np.float32))
    return first, second


def graph_adds(api, mark=0):
    return [(n, a) for n, a in api.calls[mark:] if n.startswith("cuGraphAdd")]


def test_devices_are_checked_at_construction(api):
    with pytest.raises(rxcuda.NoDeviceError, match=r"Engine\(devices=\[0, 5\]\): position 1: .*device 5 does not "
                                                   r"exist; this machine has 2"):
        rxcuda.Engine(devices=[0, 5], driver=api)
    assert api.leaks() == {}
    for bad in ([], "01", [0, -1], [0, 1.0]):
        with pytest.raises(ValueError, match="devices takes"):
            rxcuda.Engine(devices=bad, driver=api)
    with pytest.raises(ValueError, match=r"give Engine either device=1 or devices=\[0, 1\], not both"):
        rxcuda.Engine(1, devices=[0, 1], driver=api)


def test_a_block_is_placed_by_position_and_describe_carries_it(engine):
    first, second = two_stage(engine)
    assert engine.describe().placement == {second.id: 1}
    with pytest.raises(ValueError, match=r"device=2 is not one of this engine's devices: it has 2 \(positions 0..1"):
        engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N), device=2)
    assert len(engine.blocks) == 2  # the refused block was not added
    engine.remove(second)
    assert engine.describe().placement == {}


def test_an_engine_on_one_device_refuses_other_positions():
    e = rxcuda.Engine(driver=NullDriver())
    try:
        with pytest.raises(ValueError, match=r"it has 1 \(positions 0..0"):
            e.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N), device=1)
        assert e.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N), device=0) in e.blocks
    finally:
        e.close()


def test_each_device_gets_its_own_graph_and_the_frame_launches_both_without_a_host_sync(engine, api):
    two_stage(engine)
    frame = engine.tick()
    assert frame.tiers == ("structure",) and frame.state == "ok"
    assert api.count("cuGraphInstantiate") == 2 and api.count("cuGraphLaunch") == 2
    adds = graph_adds(api)
    graphs = list(dict.fromkeys(a[0] for _n, a in adds))
    assert len(graphs) == 2
    on = {g: [n for n, a in adds if a[0] == g] for g in graphs}
    assert on[graphs[0]] == ["cuGraphAddEventWaitNode", "cuGraphAddKernelNode", "cuGraphAddEventRecordNode"]
    assert on[graphs[1]] == ["cuGraphAddEventWaitNode", "cuGraphAddMemcpyNode", "cuGraphAddEventRecordNode",
                             "cuGraphAddKernelNode"]
    # one frame: start event, device 0's graph, device 1 waits for the start, its graph, the engine's stream
    # waits for its end, then the one wait the engine asked for (tick(sync=True))
    mark = len(api.calls)
    engine.tick()
    assert api.since(mark) == ["cuEventRecord", "cuGraphLaunch", "cuStreamWaitEvent", "cuGraphLaunch",
                               "cuEventRecord", "cuStreamWaitEvent", "cuStreamSynchronize"]
    assert api.count("cuStreamSynchronize") == api.count("cuStreamSynchronize")  # (no sync inside the frame)
    launches = [a for n, a in api.calls[mark:] if n == "cuGraphLaunch"]
    assert launches[0][1] != launches[1][1]  # each device's graph on its own stream


def test_the_copy_reads_the_producers_memory_and_the_events_pair_up(engine, api):
    first, second = two_stage(engine)
    engine.tick()
    g = engine._rt.graph
    src = g.pointers[g.plan.port_buffers[PortRef(first.id, "out")]]
    (copy,) = [a for n, a in api.calls if n == "cuGraphAddMemcpyNode"]
    assert copy[2] == src and copy[3] != src and copy[4] == N * 4
    records = {a[2] for n, a in api.calls if n == "cuGraphAddEventRecordNode"}
    waits = {a[2] for n, a in api.calls if n == "cuGraphAddEventWaitNode"}
    assert records == waits and len(records) == 2


def test_how_copies_go_is_said_once(engine, api):
    two_stage(engine)
    engine.tick()
    engine.rebuild()
    said = [d for d in engine.diagnostic_log if d.subject == "devices"]
    assert [(d.severity, d.message) for d in said] == [("info", "copies from device 0 to device 1: a peer copy "
                                                                "(peer access on)")]
    assert api.count("cuCtxEnablePeerAccess") >= 1


def test_without_peer_access_the_copy_is_staged_through_pinned_host_memory():
    api = NullDriver(devices=2)
    api.peer_access = False
    e = rxcuda.Engine(devices=[0, 1], driver=api)
    try:
        two_stage(e)
        e.tick()
        copies = [a for n, a in api.calls if n == "cuGraphAddMemcpyNode"]
        assert len(copies) == 2  # device -> host, host -> device
        assert api.count("cuCtxEnablePeerAccess") == 0
        said = [d.message for d in e.diagnostic_log if d.subject == "devices"]
        assert said == ["copies from device 0 to device 1: staged through page-locked host memory (no peer access "
                        "between them)"]
    finally:
        e.close()
    assert api.leaks() == {}


def test_two_positions_on_one_gpu_copy_device_to_device_with_their_own_streams():
    api = NullDriver(devices=1)
    e = rxcuda.Engine(devices=[0, 0], driver=api)
    try:
        two_stage(e)
        assert e.tick().state == "ok"
        assert api.count("cuCtxEnablePeerAccess") == 0 and api.count("cuDeviceCanAccessPeer") == 0
        assert api.count("cuGraphAddMemcpyNode") == 1
        said = [d.message for d in e.diagnostic_log if d.subject == "devices"]
        assert said == ["copies from device 0 to device 1: a device-to-device copy (both are one GPU)"]
    finally:
        e.close()
    assert api.leaks() == {}


def test_a_parameter_of_a_block_on_device_1_updates_device_1s_graph_only(engine, api):
    first, second = two_stage(engine)
    engine.tick()
    g = engine._rt.graph
    exec1 = int(g.graphs[1].exec)
    mark = len(api.calls)
    second.set(scale=0.5)
    assert engine.tick().tiers == ("parameters",)
    updates = [a for n, a in api.calls[mark:] if n == "cuGraphExecKernelNodeSetParams"]
    assert [u[0] for u in updates] == [exec1]
    mark = len(api.calls)
    first.set(n=N // 2)
    engine.tick()
    updates = [a for n, a in api.calls[mark:] if n == "cuGraphExecKernelNodeSetParams"]
    assert [u[0] for u in updates] == [int(g.graphs[0].exec)]


def test_code_swap_on_device_1_loads_the_code_there_and_updates_its_graph(engine, api):
    first = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N), device=1)
    second = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N))
    engine.connect(first["out"], second["x"])
    engine.write(first["a"], np.ones(N, np.float32))
    engine.write(first["b"], np.ones(N, np.float32))
    engine.tick()
    g = engine._rt.graph
    assert g.split.order == (1, 0)
    mark = len(api.calls)
    assert first.set_code(None, rxcuda.load_kernel_file(f"{KERNELS}/vector_sub.ptx")) == "code"
    assert engine.tick().tiers == ("code",)
    new = api.since(mark)
    assert "cuGraphInstantiate" not in new
    assert new.count("cuModuleLoadData") == 2  # on the engine's first device, then on device 1's context
    updates = [a for n, a in api.calls[mark:] if n == "cuGraphExecKernelNodeSetParams"]
    assert [u[0] for u in updates] == [int(g.graphs[1].exec)]
    # the whole plan and device 1's own plan and node record the new code, each with its own ids
    key = first.description.kernels[0].code.key
    nid = next(n.id for n in g.plan.nodes if getattr(n, "block", None) == first.id)
    d, local = g.split.nodes[nid]
    assert d == 1 and g.plan.nodes[nid].code_key == key
    assert g.graphs[1].plan.nodes[local].code_key == key and g.graphs[1].nodes[local].plan.id == local


def test_a_structural_change_rebuilds_only_the_devices_it_touches(engine, api):
    first, second = two_stage(engine)
    engine.tick()
    g = engine._rt.graph
    kept = g.graphs[0]
    extra = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="extra"), device=1)
    engine.connect(second["out"], extra["x"])
    mark = len(api.calls)
    assert engine.tick().tiers == ("structure",)
    assert engine._rt.devices.rebuilt == (1,)
    assert engine._rt.graph.graphs[0] is kept
    assert api.since(mark).count("cuGraphInstantiate") == 1
    second.set(scale=2.0)  # a value, then a structural change on device 1: device 0 still kept
    engine.tick()
    engine.remove(extra)
    engine.tick()
    assert engine._rt.devices.rebuilt == (1,)


def test_reading_an_output_of_device_1_after_the_frame(engine, api):
    _first, second = two_stage(engine)
    engine.tick()
    out = engine.read(second["out"])
    assert out.shape == (N,) and out.dtype == np.float32


def test_a_library_call_on_another_gpu_is_refused_naming_both(engine, api):
    from rxcuda import CallSpec, KernelParam

    params = (KernelParam("x", "pointer", 8, "f32", "in"), KernelParam("y", "pointer", 8, "f32", "out"))
    spec = CallSpec(name="copy", params=params, record=lambda args: None)
    call = rxcuda.BlockBuilder("libcall")
    k = call.add_call(spec)
    call.input("x", k["x"], count=N)
    call.output("y", k["y"], count=N)
    block = engine.add(call.build(), device=1)
    engine.write(block["x"], np.ones(N, np.float32))
    with pytest.raises(ValidationError, match=r"block 'libcall' is a library call placed on device 1 \(GPU 1\), "
                                              r"but its library handle lives on device 0 \(GPU 0\)"):
        engine.rebuild()


def _stamp(graph, d, row):
    """What device ``d``'s stamp kernels would write in the next frame (ns), written ahead into its ring."""
    ring = graph.graphs[d].stamps
    ring.rows[ring.launches % len(ring.rows)] = row


def test_per_kernel_profiling_over_devices_stamps_each_devices_graph_and_tags_each_unit(api):
    e = rxcuda.Engine(devices=[0, 1], profile="per_kernel", driver=api)
    try:
        first, second = two_stage(e)
        e.tick()
        g = e._rt.graph
        layouts = [gg.plan.stamps for gg in g.graphs]
        assert layouts[0].names == ("frame", "vector_add/vector_add")
        # device 1 times the copy from device 0 too: its kernel starts when the copy ends, not at its frame start
        assert layouts[1].names == ("frame", "vector_add.out -> device 1", "scalar_mul/scalar_mul")
        assert layouts[1].preds == ((), (0,), (1,)) and layouts[1].blocks == (None, None, second.id)
        assert g.graphs[0].stamps is not g.graphs[1].stamps  # a ring each, in its own device's context
        _stamp(g, 0, [1_000, 6_000])
        _stamp(g, 1, [50_000, 53_000, 57_000])  # another GPU's timer: times are relative to its own start
        frame = e.tick()
        assert dict(frame.blocks) == {"vector_add": (5.0, 0.0, 5.0), "scalar_mul": (4.0, 3.0, 7.0)}
        assert [frame.blocks.device(n) for n in frame.blocks] == [0, 1]
        assert frame.kernels["vector_add.out -> device 1"] == (3.0, 0.0, 3.0)
        assert frame.kernels.device("vector_add.out -> device 1") == frame.kernels.device("scalar_mul/scalar_mul") == 1
        assert list(frame.blocks.on_device(1)) == ["scalar_mul"]
        assert "last GPU time" in str(second)
        # a parameter change keeps both graphs, rings and counts: the next frame's rows are read alike
        second.set(scale=2.0)
        _stamp(g, 0, [0, 2_000])
        _stamp(g, 1, [0, 1_000, 9_000])
        frame = e.tick()
        assert frame.tiers == ("parameters",) and frame.blocks["scalar_mul"].gpu_us == 8.0
    finally:
        e.close()
    assert api.leaks() == {}


def test_per_block_profiling_over_devices_lists_blocks_only_and_a_rebuild_keeps_the_untouched_ring(engine, api):
    first, second = two_stage(engine)
    engine.tick()
    engine.profile = "per_block"
    frame = engine.tick()
    assert frame.tiers == ("structure",) and frame.state == "ok"
    g = engine._rt.graph
    assert [gg.plan.stamps.names for gg in g.graphs] == [("frame", "vector_add"),
                                                         ("frame", "vector_add.out -> device 1", "scalar_mul")]
    _stamp(g, 0, [0, 4_000])
    _stamp(g, 1, [0, 2_000, 3_500])
    frame = engine.tick()
    assert dict(frame.blocks) == {"vector_add": (4.0, 0.0, 4.0), "scalar_mul": (1.5, 2.0, 3.5)}
    assert frame.kernels is None
    # a block more on device 1: device 0's graph and its ring stay, device 1's are made anew
    ring0 = g.graphs[0].stamps
    third = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="third"), device=1)
    engine.connect(second["out"], third["x"])
    engine.tick()
    g = engine._rt.graph
    assert engine.devices.rebuilt == (1,) and g.graphs[0].stamps is ring0
    _stamp(g, 0, [0, 1_000])
    _stamp(g, 1, [0, 500, 1_500, 2_500])
    frame = engine.tick()
    assert dict(frame.blocks) == {"vector_add": (1.0, 0.0, 1.0), "scalar_mul": (1.0, 0.5, 1.5),
                                  "third": (1.0, 1.5, 2.5)}
    assert [frame.blocks.device(n) for n in frame.blocks] == [0, 1, 1]
    # and run_batch: the last frame's rows, each ring advanced by the batch's frames
    before = (g.graphs[0].stamps.launches, g.graphs[1].stamps.launches)
    assert engine.run_batch(3).blocks is not None
    assert (g.graphs[0].stamps.launches, g.graphs[1].stamps.launches) == (before[0] + 3, before[1] + 3)


def test_run_batch_over_devices_launches_each_devices_graph_k_times_in_frame_order_without_a_sync(engine, api):
    two_stage(engine)
    engine.tick()
    mark = len(api.calls)
    engine.tick()
    one = api.since(mark)[:-1]  # one frame's launches, without the wait tick(sync=True) adds
    assert "cuStreamSynchronize" not in one
    mark = len(api.calls)
    before = engine.frame
    frame = engine.run_batch(5)
    assert frame.frames == 5 and frame.index == before + 5 == engine.frame and frame.launched
    # the frames queued from the host, each as a tick launches it, then the one wait for the batch
    assert api.since(mark) == one * 5 + ["cuStreamSynchronize"]
    launches = [a for n, a in api.calls[mark:] if n == "cuGraphLaunch"]
    g = engine._rt.graph
    assert [a[0] for a in launches] == [int(g.graphs[0].exec), int(g.graphs[1].exec)] * 5  # producers first, each frame


def test_run_batch_over_pipelined_devices_launches_the_readers_first_each_frame(api):
    e = rxcuda.Engine(devices=[0, 1], pipelined=True, driver=api)
    try:
        two_stage(e)
        e.tick()
        mark = len(api.calls)
        assert e.run_batch(3).frames == 3
        g = e._rt.graph
        launches = [a[0] for n, a in api.calls[mark:] if n == "cuGraphLaunch"]
        assert launches == [int(g.graphs[1].exec), int(g.graphs[0].exec)] * 3
        assert api.since(mark).count("cuStreamSynchronize") == 1
    finally:
        e.close()


def test_run_batch_until_over_devices_is_refused_naming_the_fix(engine, api):
    first, second = two_stage(engine)
    engine.tick()
    mark = len(api.calls)
    with pytest.raises(ValueError, match=r"run_batch\(until=...\) needs a GPU-driven loop, which cannot span "
                                         r"devices.*run_batch\(k\) without until"):
        engine.run_batch(4, until=second["out"])
    assert "cuGraphLaunch" not in api.since(mark)


def test_a_fault_on_device_1_names_it_and_the_engine_closes_cleanly(api):
    e = rxcuda.Engine(devices=[0, 1], driver=api)
    _first, second = two_stage(e)
    e.tick()
    api.lost_streams.add(int(e._rt.devices.lanes[1].stream))
    api.fail("cuStreamSynchronize", "CUDA_ERROR_ILLEGAL_ADDRESS", times=100)
    with pytest.raises(rxcuda.DeviceLostError, match=r"the CUDA context of GPU 1 is lost") as info:
        e.tick()
    assert "scalar_mul" in str(info.value) and "vector_add" not in str(info.value)
    e.close()  # never raises; device 0's context is fine, so its lane is released
    assert e.closed


def test_closing_releases_every_devices_handles(api):
    e = rxcuda.Engine(devices=[0, 1], driver=api)
    two_stage(e)
    e.tick()
    e.close()
    assert api.leaks() == {}


def test_a_region_is_placed_with_its_bodies(engine):
    fb = builder("check")
    k = fb.add_kernel(kcode("flag", ptr("x"), ptr("flag", "out", "u32"), scalar("n", default=64)))
    fb.input("x", k["x"])
    fb.output("flag", k["flag"], count=1)
    flag = fb.build()
    inner = mul(name="inner")
    engine.add(flag, device=1)
    gate = engine.add(If(flag["flag"], [inner]), device=1)
    engine.write(flag["x"], np.ones(64, np.float32))
    engine.write(inner["x"], np.ones(64, np.float32))
    assert engine.describe().placement == {flag.id: 1, gate.id: 1, inner.id: 1}
    assert engine.tick().state == "ok"
    assert all(d == 1 for d, _ in engine._rt.graph.split.nodes.values())


def test_pipelined_frames_launch_the_readers_first_and_report_the_latency():
    api = NullDriver(devices=3)
    e = rxcuda.Engine(devices=[0, 1, 2], pipelined=True, driver=api)
    try:
        blocks = [e.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name=f"s{i}"), device=i)
                  for i in range(3)]
        for a, b in zip(blocks, blocks[1:], strict=False):
            e.connect(a["out"], b["x"])
        e.write(blocks[0]["x"], np.ones(N, np.float32))
        e.tick()
        g = e._rt.graph
        assert e.devices.pipelined and e.devices.latency == 2
        mark = len(api.calls)
        e.tick()
        launched = [a[0] for n, a in api.calls[mark:] if n == "cuGraphLaunch"]
        # the last stage first: its event waits find the previous frame's records (frame t-2 on device 2)
        assert launched == [int(g.graphs[2].exec), int(g.graphs[1].exec), int(g.graphs[0].exec)]
        assert api.since(mark).count("cuStreamSynchronize") == 1  # no host sync inside the frame
    finally:
        e.close()


def test_one_frame_at_a_time_is_the_default_and_pipelining_needs_devices(engine, api):
    two_stage(engine)
    engine.tick()
    report = engine.devices
    assert not report.pipelined and report.latency == 0 and report.ordinals == (0, 1)
    assert report.routes == {(0, 1): "peer", (1, 0): "peer"} and report.names == ("Null Device", "Null Device")
    with pytest.raises(ValueError, match=r"pipelined=True pipelines frames over several devices: give them"):
        rxcuda.Engine(pipelined=True, driver=NullDriver())
    solo = rxcuda.Engine(driver=NullDriver())
    assert solo.devices.ordinals == (0,) and solo.devices.latency == 0
    solo.close()


# -- pictures and the live view ---------------------------------------------------------------------------------
def test_the_picture_draws_a_cluster_per_device(engine):
    first, second = two_stage(engine)
    lines = [line.strip() for line in rxcuda.to_dot(engine).splitlines()]
    c0, c1 = lines.index("subgraph cluster_device_0 {"), lines.index("subgraph cluster_device_1 {")
    assert lines[c0 + 1].startswith('label="device 0"') and lines[c0 + 2].startswith(f"b{first.id} [")
    assert lines[c1 + 1].startswith('label="device 1"') and lines[c1 + 2].startswith(f"b{second.id} [")
    solo = rxcuda.Engine(driver=NullDriver())
    try:
        solo.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N))
        assert "cluster_device" not in rxcuda.to_dot(solo)
    finally:
        solo.close()


def test_the_live_view_says_the_device_of_each_block(engine):
    from rxcuda.view._collect import graph_message

    first, second = two_stage(engine)
    engine.tick()
    msg = graph_message(engine)
    blocks = {b["name"]: b for b in msg["blocks"]}
    assert blocks[first.name]["device"] == 0 and blocks[second.name]["device"] == 1
    assert msg["devices"] == 2  # the page labels each box with its device when there are several
    one = rxcuda.Engine(driver=NullDriver())
    try:
        one.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N))
        assert graph_message(one)["devices"] == 1
    finally:
        one.close()


def test_a_composite_is_placed_as_a_whole(engine):
    from rxcuda import Composite

    pair = Composite("pair")
    first = pair.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="first"))
    second = pair.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="second"))
    pair.connect(first["out"], second["x"])
    pair.expose("x", first["x"])
    pair.expose("y", second["out"])
    src = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="src"))
    inst = engine.add(pair, device=1)
    engine.connect(src["out"], inst["x"])
    engine.write(src["x"], np.ones(N, np.float32))
    placement = engine.describe().placement
    assert sorted(placement.values()) == [1, 1] and src.id not in placement
    assert engine.tick().state == "ok"
    assert [str(link) for link in engine._rt.graph.split.links] == ["src.out: device 0 -> 1 (4 KiB)"]


def test_profiled_frames_time_each_devices_part(api):
    e = rxcuda.Engine(devices=[0, 1], timing=True, driver=api)
    try:
        two_stage(e)
        assert e.devices.gpu_us == (None, None)  # nothing profiled yet
        e.tick()
        mark = len(api.calls)
        frame = e.tick()
        assert frame.gpu_us is not None
        # the frame's pair, and each device's pair around its own graph
        assert api.since(mark).count("cuEventRecord") == 2 + 2 * 2 + 2
        assert e.devices.gpu_us == (0.0, 0.0)  # (the null driver's clock)
        e.profile = "none"
        mark = len(api.calls)
        e.tick()
        assert api.since(mark).count("cuEventRecord") == 2  # the frame's start and device 1's end only
    finally:
        e.close()


def test_a_trace_has_a_track_per_device(api, tmp_path):
    e = rxcuda.Engine(devices=[0, 1], timing=True, driver=api)
    try:
        two_stage(e)
        with e.trace(tmp_path / "trace.json") as trace:
            for _ in range(3):
                e.tick()
        events = trace.events()
        tracks = {ev["args"]["name"] for ev in events if ev.get("name") == "thread_name"}
        assert {"device 0", "device 1"} <= tracks
        slices = [ev for ev in events if ev.get("cat") == "device"]
        assert len(slices) == 6 and {ev["name"].split(":")[0] for ev in slices} == {"device 0", "device 1"}
    finally:
        e.close()


def test_a_trace_of_per_block_timings_says_each_blocks_device(api, tmp_path):
    e = rxcuda.Engine(devices=[0, 1], profile="per_block", driver=api)
    try:
        two_stage(e)
        with e.trace(tmp_path / "trace.json") as trace:
            for _ in range(2):
                e.tick()
        blocks = [ev for ev in trace.events() if ev.get("cat") == "block"]
        assert {(ev["name"], ev["args"]["device"]) for ev in blocks} == {("vector_add", 0), ("scalar_mul", 1)}
        assert len([ev for ev in trace.events() if ev.get("cat") == "device"]) == 4  # and the tracks per device
    finally:
        e.close()


def test_memory_per_device_and_the_engines_totals(engine, api):
    assert engine.devices.memory == (PoolStats(), PoolStats()) and engine.stats == BufferStats()
    first, second = two_stage(engine)
    engine.tick()
    kib4 = N * 4
    pools = engine.devices.memory
    assert [p.in_use for p in pools] == [3, 2]  # device 0: a, b, out; device 1: its copy of out, and its out
    assert all(p.allocations >= 1 and p.bytes_reserved > 0 for p in pools)
    # each position's pool is its own: device 1's memory is not in device 0's pool
    assert engine._rt.pool.stats.in_use == 3 and engine.devices.memory[1] is not engine._rt.devices.lanes[1].pool.stats
    total = engine.memory
    assert (total.in_use, total.bytes_reserved, total.allocations) == (
        5, sum(p.bytes_reserved for p in pools), sum(p.allocations for p in pools))
    assert [(b.buffers, b.bytes_allocated) for b in engine.devices.buffers] == [(3, 3 * kib4), (2, 2 * kib4)]
    assert (engine.stats.buffers, engine.stats.bytes_allocated) == (5, 5 * kib4)
    assert "5 buffers in 5 allocations" in str(engine.stats)
    # a block more on device 1 shows there only
    third = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, name="third"), device=1)
    engine.connect(second["out"], third["x"])
    engine.tick()
    assert [p.in_use for p in engine.devices.memory] == [3, 3] and engine.memory.in_use == 6
    assert [b.buffers for b in engine.devices.buffers] == [3, 3]


def test_memory_of_an_engine_on_one_device_is_its_pools():
    e = rxcuda.Engine(driver=NullDriver())
    try:
        m = e.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N))
        e.write(m["x"], np.ones(N, np.float32))
        e.tick()
        assert e.memory is e._rt.pool.stats and e.memory.in_use == 2
        assert e.devices.memory == (e.memory,) and e.devices.buffers == (e.stats,) and e.stats.buffers == 2
    finally:
        e.close()


def test_a_device_with_no_block_launches_nothing(api):
    e = rxcuda.Engine(devices=[0, 1], timing=True, driver=api)
    try:
        m = e.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N))
        e.write(m["x"], np.ones(N, np.float32))
        e.tick()
        mark = len(api.calls)
        e.tick()
        assert api.since(mark).count("cuGraphLaunch") == 1 and "cuStreamWaitEvent" not in api.since(mark)
        assert e.devices.gpu_us == (0.0, None)
    finally:
        e.close()


def test_a_delayed_connection_into_another_device_starts_from_its_initial_value(engine, api):
    mul = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N))
    acc = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N), device=1)
    engine.connect(mul["out"], acc["a"], delay=1, initial=5.0)
    engine.write(mul["x"], np.ones(N, np.float32))
    engine.write(acc["b"], np.ones(N, np.float32))
    mark = len(api.calls)
    engine.tick()
    g = engine._rt.graph
    (link,) = g.split.links
    src, dst = g.graphs[0].pointers[link.src], g.graphs[1].pointers[link.dst]
    copies = [a for n, a in api.calls[mark:] if n == "cuMemcpyDtoDAsync"]
    assert (dst, src, N * 4, int(engine._rt.stream)) in copies  # the replica takes the frame-0 value
    writes = [i for i, (n, a) in enumerate(api.calls[mark:]) if n in ("cuMemcpyHtoDAsync", "cuMemsetD32Async")
              and a[0] == src]
    first_copy = next(i for i, (n, a) in enumerate(api.calls[mark:]) if n == "cuMemcpyDtoDAsync" and a[0] == dst)
    assert writes and max(writes) < first_copy  # after the initial value was written


def test_reset_delays_refreshes_the_other_devices_copy(engine, api):
    mul = engine.add(Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N))
    acc = engine.add(Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N), device=1)
    engine.connect(mul["out"], acc["a"], delay=1)
    engine.write(mul["x"], np.ones(N, np.float32))
    engine.write(acc["b"], np.ones(N, np.float32))
    engine.tick()
    g = engine._rt.graph
    (link,) = g.split.links
    mark = len(api.calls)
    engine.reset_delays()
    copies = [a for n, a in api.calls[mark:] if n == "cuMemcpyDtoDAsync"]
    assert copies == [(g.graphs[1].pointers[link.dst], g.graphs[0].pointers[link.src], N * 4,
                       int(engine._rt.stream))]
