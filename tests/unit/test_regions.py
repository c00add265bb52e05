"""Regions (If, IfElse, While, For): planning, validation and the engine's driver calls, on the null driver."""

from __future__ import annotations

import numpy as np
import pytest
from _pipeline import builder, kcode, mul, ptr, scalar

from rxcuda import Engine, For, If, IfElse, ValidationError, While, plan
from rxcuda.cuda import NullDriver
from rxcuda.lowlevel import HandleArg, MemsetNodePlan, RegionNodePlan, ScalarArg

FLAG = kcode("flag", ptr("x"), ptr("flag", "out", "u32"), scalar("n", default=64))
FFLAG = kcode("fflag", ptr("x"), ptr("flag", "out", "f32"), scalar("n", default=64))


def flag_block(name="check", code=FLAG, count=1):
    b = builder(name)
    k = b.add_kernel(code)
    b.input("x", k["x"])
    b.output("flag", k["flag"], count=count)
    return b.build()


@pytest.fixture
def engine():
    e = Engine(driver=NullDriver())
    yield e
    e.close()


def kinds(gp):
    return [type(n).__name__ for n in gp.nodes]


def node(gp, label):
    return next(n for n in gp.nodes if n.label == label)


def test_for_plans_a_while_node_with_init_before_and_a_step_in_the_body(engine):
    src, body, after = mul(name="src"), mul(name="body"), mul(name="after")
    loop = For(3, [body])
    for b in (src, loop, after):
        engine.add(b)
    engine.write(src["x"], np.ones(64, np.float32))
    engine.connect(src["out"], body["x"])
    engine.connect(body["out"], after["x"])
    gp = plan(engine.describe())
    region = next(n for n in gp.nodes if isinstance(n, RegionNodePlan))
    init, step = node(gp, "for/init"), node(gp, "for/step")
    b = node(gp, "body/mul")
    assert region.kind == "for" and region.loops and region.bodies == 1
    assert gp.parents[b.id] == (region.id, 0) and gp.parents[step.id] == (region.id, 0)
    assert init.id not in gp.parents and node(gp, "after/mul").id not in gp.parents
    # the region node waits for its setter and for what the body reads; the step closes the pass
    assert init.id in gp.deps[region.id] and node(gp, "src/mul").id in gp.deps[region.id]
    assert gp.deps[step.id] == ()  # a For's step only counts: it runs beside the body, not after it
    assert region.id in gp.deps[node(gp, "after/mul").id]
    assert init.args[0] == HandleArg(region.id) and step.args[0] == HandleArg(region.id)
    # n is a hot parameter of the init kernel
    assert gp.slots[(loop.id, "n")] == ((init.id, 2),)
    assert gp.tier_of(loop.id, "n") == "parameters"
    assert region.writes >= b.writes and region.reads >= b.reads


def test_if_zeroes_the_body_outputs_before_the_region_and_passes_the_flag_width(engine):
    check, inner = flag_block(), mul(name="inner")
    gate = If(check["flag"], [inner])
    engine.add(check)
    engine.add(gate)
    engine.write(check["x"], np.ones(64, np.float32))
    engine.write(inner["x"], np.ones(64, np.float32))
    gp = plan(engine.describe())
    region = next(n for n in gp.nodes if isinstance(n, RegionNodePlan))
    setter = node(gp, "if/set")
    zero = next(n for n in gp.nodes if isinstance(n, MemsetNodePlan))
    assert zero.buffer == gp.port_buffers[(inner.id, "out")] and zero.id not in gp.parents
    assert zero.id in gp.deps[region.id] and setter.id in gp.deps[region.id]
    assert setter.args[0] == HandleArg(region.id)
    assert setter.args[2] == ScalarArg(gate.id, None, "u32", 4, 4)  # a u32 flag is 4 bytes wide
    assert gp.port_buffers[(gate.id, "condition")] == gp.port_buffers[(check.id, "flag")]
    assert gp.parents[node(gp, "inner/mul").id] == (region.id, 0)


def test_ifelse_has_two_bodies(engine):
    check, a, b = flag_block(), mul(name="a"), mul(name="b")
    branch = IfElse(check["flag"], [a], [b])
    engine.add(check)
    engine.add(branch)
    for blk in (check, a, b):
        engine.write(blk["x"], np.ones(64, np.float32))
    gp = plan(engine.describe())
    region = next(n for n in gp.nodes if isinstance(n, RegionNodePlan))
    assert region.bodies == 2
    assert gp.parents[node(gp, "a/mul").id] == (region.id, 0)
    assert gp.parents[node(gp, "b/mul").id] == (region.id, 1)


def test_while_made_inside_its_body_is_a_do_while(engine):
    step, check = mul(name="step"), flag_block()
    loop = While(check["flag"], [step, check], max_iterations=50)
    engine.add(loop)
    engine.write(step["x"], np.ones(64, np.float32))
    engine.connect(step["out"], check["x"])
    gp = plan(engine.describe())
    init, closing = node(gp, "while/init"), node(gp, "while/step")
    flag_buf = gp.port_buffers[(check.id, "flag")]
    assert init.args[3] == ScalarArg(loop.id, None, "u64", 8, 0)  # no flag before the first pass
    assert flag_buf not in init.reads
    assert closing.args[2].buffer == flag_buf  # the pass's flag decides the next pass
    assert node(gp, "check/flag").id in gp.deps[closing.id]
    assert gp.slots[(loop.id, "max_iterations")] == ((init.id, 2),)
    assert not gp.warnings


def test_while_whose_flag_comes_from_outside_warns(engine):
    check, body = flag_block(), mul(name="body")
    loop = While(check["flag"], [body])
    engine.add(check)
    engine.add(loop)
    for blk in (check, body):
        engine.write(blk["x"], np.ones(64, np.float32))
    gp = plan(engine.describe())
    assert any("computed outside its body" in w.message for w in gp.warnings)
    init = node(gp, "while/init")
    assert init.args[3].buffer == gp.port_buffers[(check.id, "flag")]  # read before the first pass too


def test_regions_nest(engine):
    check, inner = flag_block(), mul(name="inner")
    loop = For(2, [inner])
    gate = If(check["flag"], [loop])
    engine.add(check)
    engine.add(gate)
    for blk in (check, inner):
        engine.write(blk["x"], np.ones(64, np.float32))
    gp = plan(engine.describe())
    outer = next(n for n in gp.nodes if isinstance(n, RegionNodePlan) and n.kind == "if")
    inner_region = next(n for n in gp.nodes if isinstance(n, RegionNodePlan) and n.kind == "for")
    assert gp.parents[inner_region.id] == (outer.id, 0)
    assert gp.parents[node(gp, "for/init").id] == (outer.id, 0)
    assert gp.parents[node(gp, "inner/mul").id] == (inner_region.id, 0)
    assert outer.id < inner_region.id < node(gp, "inner/mul").id  # a region before what it holds
    assert outer.writes >= inner_region.writes


def test_a_float_condition_is_refused_with_the_fix(engine):
    check, inner = flag_block(code=FFLAG), mul(name="inner")
    engine.add(check)
    engine.add(If(check["flag"], [inner]))
    for blk in (check, inner):
        engine.write(blk["x"], np.ones(64, np.float32))
    with pytest.raises(ValidationError, match=r"condition of if comes from check.flag \(f32\[1\]\).*u32 or bool"):
        plan(engine.describe())


def test_a_condition_of_several_elements_is_refused_at_connect(engine):
    check, inner = flag_block(count=64), mul(name="inner")
    engine.add(check)
    with pytest.raises(ValidationError, match="sizes differ"):
        engine.add(If(check["flag"], [inner]))
    assert [b.name for b in engine.blocks] == ["check"]  # the failed add left nothing behind


def test_an_if_cannot_compute_its_own_condition(engine):
    src, check = mul(name="src"), flag_block()
    engine.add(src)
    gate = If(check["flag"], [check])
    engine.add(gate)
    engine.write(src["x"], np.ones(64, np.float32))
    engine.connect(src["out"], check["x"])
    with pytest.raises(ValidationError, match="condition of if is computed inside its own body"):
        plan(engine.describe())


def test_a_block_in_two_regions_is_refused(engine):
    inner = mul(name="inner")
    engine.add(For(2, [inner]))
    with pytest.raises(ValueError, match="inner is already in the body of for"):
        engine.add(For(3, [inner], name="again"))
    assert sorted(b.name for b in engine.blocks) == ["for", "inner"]


def test_ifelse_bodies_may_not_feed_each_other(engine):
    check, a, b = flag_block(), mul(name="a"), mul(name="b")
    engine.add(check)
    engine.add(IfElse(check["flag"], [a], [b]))
    engine.write(check["x"], np.ones(64, np.float32))
    engine.write(a["x"], np.ones(64, np.float32))
    engine.connect(a["out"], b["x"])
    with pytest.raises(ValidationError, match="never both run in a frame"):
        plan(engine.describe())


def test_a_connection_out_of_a_region_and_back_in_is_refused(engine):
    first, outside, second = mul(name="first"), mul(name="outside"), mul(name="second")
    engine.add(For(2, [first, second]))
    engine.add(outside)
    engine.write(first["x"], np.ones(64, np.float32))
    engine.connect(first["out"], outside["x"])
    engine.connect(outside["out"], second["x"])
    with pytest.raises(ValidationError, match="leave a region and come back into it"):
        plan(engine.describe())


def test_body_must_hold_blocks():
    with pytest.raises(TypeError, match="the body of for holds blocks"):
        For(2, ["not a block"])
    with pytest.raises(TypeError, match="the condition of if is a port"):
        If(mul(), [mul(name="b")])


def test_engine_builds_conditional_nodes_and_updates_n_hot(engine):
    api = engine._rt.api
    body = mul(name="body")
    loop = For(3, [body])
    engine.add(loop)
    engine.write(body["x"], np.ones(64, np.float32))
    frame = engine.tick()
    assert frame.state == "ok", engine.diagnostic_log
    assert api.count("cuGraphConditionalHandleCreate") == 1 and api.count("cuGraphAddNode") == 1
    rebuilds, mark = engine.rebuilds, len(api.calls)
    loop.params["n"].value = 9
    body.params["scale"].value = 2.0  # a block inside the body: also an exec-node update
    engine.tick()
    assert engine.rebuilds == rebuilds
    assert api.since(mark).count("cuGraphExecKernelNodeSetParams") == 2
    assert "cuGraphInstantiate" not in api.since(mark)


def test_eager_run_decides_regions_on_the_host(engine):
    api = engine._rt.api
    body = mul(name="body")
    loop = For(3, [body])
    engine.add(loop)
    engine.write(body["x"], np.ones(64, np.float32))
    engine.tick()
    mark = len(api.calls)
    engine._rt.graph.run_eagerly(engine._rt.stream)
    launches = api.since(mark).count("cuLaunchKernel")
    assert launches == 3  # the body three times; the condition kernels are decided on the host
    loop.params["n"].value = 0
    engine.tick(sync=True)
    mark = len(api.calls)
    engine._rt.graph.run_eagerly(engine._rt.stream)
    assert api.since(mark).count("cuLaunchKernel") == 0


def test_removing_a_region_removes_its_body_and_a_member_leaves_the_body(engine):
    a, b = mul(name="a"), mul(name="b")
    loop = For(2, [a, b])
    engine.add(loop)
    engine.remove(b)
    assert loop.members == (a,)
    assert {blk.name for blk in engine.blocks} == {"for", "a"}
    engine.remove(loop)
    assert engine.blocks == ()


def test_str_says_what_a_region_runs():
    a, b = mul(name="a"), mul(name="b")
    check = flag_block()
    assert str(For(4, [a])) == "For 'for': 4 passes of [a]"
    assert str(IfElse(check["flag"], [a], [b])) == "IfElse 'ifelse': [a] if check.flag is nonzero, else [b]"
    assert "at most 7 passes" in str(While(check["flag"], [a], max_iterations=7))


def test_run_batch_builds_one_loop_graph_and_resyncs_after_changes(engine):
    api = engine._rt.api
    a, b = mul(name="a"), mul(name="b")
    engine.add(a)
    engine.add(b)
    engine.write(a["x"], np.ones(64, np.float32))
    engine.connect(a["out"], b["x"])
    engine.tick()
    mark = len(api.calls)
    frame = engine.run_batch(10)
    calls = api.since(mark)
    assert frame.frames == 10 and frame.launched and engine.frame == 11  # the null counter reads 0: all ran
    assert calls.count("cuGraphInstantiate") == 1 and calls.count("cuGraphLaunch") == 1
    assert calls.count("cuGraphConditionalHandleCreate") == 1 and calls.count("cuGraphAddNode") == 1
    mark = len(api.calls)
    engine.run_batch(10)  # nothing changed: the same graph, the same count: one launch
    assert api.since(mark).count("cuGraphLaunch") == 1
    assert "cuGraphExecKernelNodeSetParams" not in api.since(mark)
    mark = len(api.calls)
    engine.run_batch(20)  # a new count: one update of the loop's init kernel
    assert api.since(mark).count("cuGraphExecKernelNodeSetParams") == 1
    mark = len(api.calls)
    a.params["scale"].value = 3.0
    engine.run_batch(20)  # a parameter: applied to the frame graph, then re-applied to the batch's nodes
    calls = api.since(mark)
    assert "cuGraphInstantiate" not in calls
    assert calls.count("cuGraphExecKernelNodeSetParams") == 1 + 2  # the frame graph's node, then both batch nodes
    mark = len(api.calls)
    engine.remove(b)
    engine.run_batch(5)  # a rebuild: a new frame graph and a new batch graph
    assert api.since(mark).count("cuGraphInstantiate") == 2


def test_run_batch_checks_its_arguments(engine):
    a, check = mul(name="a"), flag_block()
    engine.add(a)
    engine.add(check)
    engine.write(a["x"], np.ones(64, np.float32))
    engine.write(check["x"], np.ones(64, np.float32))
    with pytest.raises(ValueError, match="frame count from 1"):
        engine.run_batch(0)
    with pytest.raises(ValidationError, match=r"takes a flag port.*a.out: f32\[64\]"):
        engine.run_batch(4, until=a["out"])
    frame = engine.run_batch(4, until=check["flag"])  # the engine still runs
    assert frame.frames == 4


def test_run_batch_with_regions_gives_inner_regions_their_own_handles(engine):
    api = engine._rt.api
    body = mul(name="body")
    engine.add(For(3, [body]))
    engine.write(body["x"], np.ones(64, np.float32))
    engine.tick()
    mark = len(api.calls)
    engine.run_batch(8)
    calls = api.since(mark)
    assert calls.count("cuGraphConditionalHandleCreate") == 2  # the batch loop's, the For's own
    assert calls.count("cuGraphAddNode") == 2
