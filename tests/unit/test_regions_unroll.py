"""A loop's body unrolled k times (``While``/``For`` ``unroll=k``) on the null driver: the plan's shape (nested IFs,
a step per copy, the clear kernel), hot parameters reaching every copy, code and launch changes rebuilding, the
checks of the option, and an eager run deciding it on the host."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from _pipeline import MUL, builder, kcode, mul, ptr, scalar

from rxcuda import Engine, For, If, While, plan
from rxcuda.cuda import NullDriver
from rxcuda.lowlevel import HandleArg, RegionNodePlan
from rxcuda.model._regions import RegionSpec

FLAG = kcode("flag", ptr("x"), ptr("flag", "out", "u32"), scalar("n", default=64))


def flag_block(name="check"):
    b = builder(name)
    k = b.add_kernel(FLAG)
    b.input("x", k["x"])
    b.output("flag", k["flag"], count=1)
    return b.build()


@pytest.fixture
def engine():
    e = Engine(driver=NullDriver())
    yield e
    e.close()


def by_label(gp, label):
    return [n for n in gp.nodes if n.label == label]


def test_for_unrolled_4_times_nests_an_if_per_extra_copy(engine):
    body = mul(name="body")
    loop = For(10, [body], unroll=4)
    engine.add(loop)
    engine.write(body["x"], np.ones(64, np.float32))
    gp = plan(engine.describe())
    regions = [n for n in gp.nodes if isinstance(n, RegionNodePlan)]
    assert [r.kind for r in regions] == ["for", "if", "if", "if"]
    outer, ifs = regions[0], regions[1:]
    # each IF sits in the body of the one before; each copy of the body sits at its own level
    levels = [(outer.id, 0)] + [(r.id, 0) for r in ifs]
    assert [gp.parents[r.id] for r in ifs] == levels[:-1]
    copies = by_label(gp, "body/mul")
    assert [gp.parents[c.id] for c in copies] == levels
    steps = by_label(gp, "for/step")
    assert [gp.parents[s.id] for s in steps] == levels
    # a copy's step sets the next IF; the last one the loop; each IF follows its step
    assert [s.args[0] for s in steps] == [HandleArg(r.id) for r in ifs] + [HandleArg(outer.id)]
    assert all(s.id in gp.deps[r.id] for s, r in zip(steps, ifs, strict=False))
    (clear,) = by_label(gp, "for/clear")
    assert gp.parents[clear.id] == (outer.id, 0) and clear.args[0] == HandleArg(outer.id)
    counter = gp.nodes[steps[0].id].writes
    assert clear.reads & counter and clear.id in gp.deps[steps[0].id]  # it runs before the first step
    # every copy's scale is one patch target; the body's kernels have no single node
    assert sorted(nid for nid, _ in gp.slots[(body.id, "scale")]) == [c.id for c in copies]
    assert (body.id, "mul") not in gp.kernel_nodes
    assert outer.reads >= ifs[0].reads >= copies[-1].reads


def test_an_unrolled_while_reads_the_flag_of_each_copy(engine):
    step, check = mul(name="step"), flag_block()
    loop = While(check["flag"], [step, check], max_iterations=50, unroll=2)
    engine.add(loop)
    engine.write(step["x"], np.ones(64, np.float32))
    engine.connect(step["out"], check["x"])
    gp = plan(engine.describe())
    flag_buf = gp.port_buffers[(check.id, "flag")]
    steps = by_label(gp, "while/step")
    flags = by_label(gp, "check/flag")
    assert len(steps) == 2 == len(flags)
    for s, f in zip(steps, flags, strict=True):
        assert s.args[2].buffer == flag_buf and f.id in gp.deps[s.id]
    assert not gp.warnings


def test_parameters_of_an_unrolled_body_are_hot_and_reach_every_copy(engine):
    api = engine._rt.api
    body = mul(name="body")
    loop = For(7, [body], unroll=3)
    engine.add(loop)
    engine.write(body["x"], np.ones(64, np.float32))
    frame = engine.tick()
    assert frame.state == "ok", engine.diagnostic_log
    assert api.count("cuGraphAddNode") == 3 and api.count("cuGraphConditionalHandleCreate") == 3
    rebuilds, mark = engine.rebuilds, len(api.calls)
    body.params["scale"].value = 2.0
    assert engine.tick().tiers == ("parameters",)
    assert api.since(mark).count("cuGraphExecKernelNodeSetParams") == 3 and engine.rebuilds == rebuilds
    loop.params["n"].value = 8  # the loop's count: its init kernel, once
    mark = len(api.calls)
    engine.tick()
    assert api.since(mark).count("cuGraphExecKernelNodeSetParams") == 1


def test_a_launch_or_code_change_in_an_unrolled_body_rebuilds(engine):
    body = mul(name="body")
    engine.add(For(5, [body], unroll=2))
    engine.write(body["x"], np.ones(64, np.float32))
    engine.tick()
    rebuilds = engine.rebuilds
    launch = body.set_launch("mul", grid=1, block=64)
    assert engine.tick().tiers == ("structure",) and engine.rebuilds == rebuilds + 1
    gp = engine._rt.graph.plan
    assert [n.launch for n in by_label(gp, "body/mul")] == [launch, launch]
    # new code of the same layout: swapped in place elsewhere, here one rebuild puts it into both copies
    new = kcode("mul", *MUL.signature.params, image=b"// mul, edited")
    body.set_code("mul", new)
    assert engine.tick().tiers == ("structure",) and engine.rebuilds == rebuilds + 2
    assert {n.code_key for n in by_label(engine._rt.graph.plan, "body/mul")} == {new.key}


@pytest.mark.parametrize("n", [0, 1, 2, 4, 5, 7])
def test_an_eager_run_decides_an_unrolled_loop_pass_by_pass(engine, n):
    api = engine._rt.api
    body = mul(name="body")
    loop = For(3, [body], unroll=3, name="loop")
    engine.add(loop)
    engine.write(body["x"], np.ones(64, np.float32))
    loop.params["n"].value = n
    engine.tick()
    mark = len(api.calls)
    engine._rt.graph.run_eagerly(engine._rt.stream)
    assert api.since(mark).count("cuLaunchKernel") == n  # the body n times, the condition kernels on the host


def test_an_eager_run_of_an_unrolled_while_reads_each_pass_flag(engine, monkeypatch):
    api = engine._rt.api
    step, check = mul(name="step"), flag_block()
    loop = While(check["flag"], [step, check], max_iterations=4, unroll=3)
    engine.add(loop)
    engine.write(step["x"], np.ones(64, np.float32))
    engine.connect(step["out"], check["x"])
    engine.tick()
    mark = len(api.calls)
    engine._rt.graph.run_eagerly(engine._rt.stream)  # the null driver reads the flag back as 0: one pass
    assert api.since(mark).count("cuLaunchKernel") == 2  # step and check, once
    read = api.cuMemcpyDtoH

    def flag_set(dst, src, nbytes):  # the flag read back as 1: the loop runs to its bound (4 passes, 2 rounds)
        out = read(dst, src, nbytes)
        ctypes.memset(int(dst), 1, 1)
        return out

    monkeypatch.setattr(api, "cuMemcpyDtoH", flag_set)
    mark = len(api.calls)
    engine._rt.graph.run_eagerly(engine._rt.stream)
    assert api.since(mark).count("cuLaunchKernel") == 8


def test_unroll_is_checked():
    body = mul(name="body")
    with pytest.raises(ValueError, match=r"for: 'unroll' must be an int from 1 to 16 \(got 0\)"):
        For(3, [body], unroll=0)
    with pytest.raises(ValueError, match=r"'unroll' must be an int from 1 to 16 \(got 2.0\)"):
        While(body["out"], [body], unroll=2.0)
    with pytest.raises(ValueError, match=r"only a loop \(While, For\) unrolls its body"):
        RegionSpec(1, "if", ((2,),), unroll=2)
    assert If(body["out"], [mul(name="other")]).spec().unroll == 1
    loop = For(3, [mul(name="third")], unroll=16)
    assert loop.spec().unroll == 16 and str(loop) == "For 'for': 3 passes of [third], 16 copies per relaunch"
    assert str(For(2, [mul(name="fourth")])) == "For 'for': 2 passes of [fourth]"
