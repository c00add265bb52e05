"""Composite blocks and engine.replace on the null driver: flattening, instances, hot parameter updates,
descriptions as data, removal, the hot-swap, and every refusal with its message.

The null driver records driver calls and computes nothing: these tests check names, wiring and which
driver operations the engine chose (tests/gpu/test_composite_gpu.py checks the numbers).
"""

from __future__ import annotations

import numpy as np
import pytest
from reactivex.subject import Subject

import rxcuda
from rxcuda import Block, Composite, CompositeInstance
from rxcuda.cuda import NullDriver
from rxcuda.lowlevel import CompositeDescription, ExposedParameter, MemberDescription, MemberPort

N = 1024
K = "kernels"
# the driver calls that build a graph: none of them may run when nothing is rebuilt
BUILDING = ("cuGraphCreate", "cuGraphAddKernelNode", "cuGraphAddMemsetNode", "cuGraphAddChildGraphNode",
            "cuGraphInstantiate", "cuGraphExecUpdate", "cuModuleLoadData", "cuMemAlloc")


def mul(name: str | None = None, **kw) -> Block:
    return Block.from_kernel(f"{K}/scalar_mul.ptx", size=N, name=name, **kw)


def add_(name: str | None = None) -> Block:
    return Block.from_kernel(f"{K}/vector_add.ptx", size=N, name=name)


def pair(name: str = "pair", value=None) -> Composite:
    """x -> first.scale -> second.scale -> y, with 'gain' setting both scales."""
    c = Composite(name)
    first = c.add(mul("first", scale=2.0))
    second = c.add(mul("second", scale=3.0))
    c.connect(first["out"], second["x"])
    c.expose("x", first["x"])
    c.expose("y", second["out"])
    c.expose_parameter("gain", first.params["scale"], second.params["scale"], value=value)
    return c


def nested() -> Composite:
    """outer: x -> inner (a pair) -> post -> y; 'gain' reaches the pair's two scales, 'post' the third."""
    outer = Composite("outer")
    inner = outer.add(pair("inner"))
    post = outer.add(mul("post"))
    outer.connect(inner["y"], post["x"])
    outer.expose("x", inner["x"])
    outer.expose("y", post["out"])
    outer.expose_parameter("gain", inner.params["gain"])
    outer.expose_parameter("post", post.params["scale"])
    return outer


def building_calls(api, mark: int) -> list[str]:
    return [n for n in api.since(mark) if n in BUILDING]


# -- definitions ----------------------------------------------------------------------------------------------
def test_str_lists_members_connections_ports_and_parameters_nested_indented():
    text = str(nested())
    assert text.split("\n") == [
        "composite outer: 2 members, 1 connection",
        "  inner: composite inner: 2 members, 1 connection",
        "    block first: kernel scalar_mul",
        "    block second: kernel scalar_mul",
        "    first.out -> second.x",
        "    input x: first.x (f32[1024])",
        "    output y: second.out (f32[1024])",
        "    parameter gain: first.scale, second.scale (f32)",
        "  block post: kernel scalar_mul",
        "  inner.y -> post.x",
        "  input x: inner.x (f32[1024])",
        "  output y: post.out (f32[1024])",
        "  parameter gain: inner.gain (f32)",
        "  parameter post: post.scale (f32)",
    ]


def test_describe_is_data_and_the_same_data_rebuilds_an_equal_composite():
    outer = nested()
    outer.members["post"].params["scale"].value = 0.25
    outer.members["post"].set_launch(threads=N // 2)
    d = outer.describe()
    assert isinstance(d, CompositeDescription)
    post = d.member("post")
    assert post.values["scale"] == 0.25 and post.launches["scalar_mul"].threads == N // 2
    assert d.member("inner").is_composite and d.resolve_port("x") == (("inner", "first"), "x")
    assert d.resolve_parameter("gain") == ((("inner", "first"), "scale"), (("inner", "second"), "scale"))
    again = Composite.from_description(d)
    assert again is not outer and again.describe() == d
    assert str(again) == str(outer)
    assert again.members["post"].params["scale"].value == 0.25


def test_from_description_checks_the_data_as_it_rebuilds():
    d = pair().describe()
    wrong = CompositeDescription(d.name, d.members, d.connections,
                                 d.ports + (d.ports[0].__class__("z", "in", MemberPort("first", "nope")),))
    with pytest.raises(rxcuda.UnknownPortError, match="has no port 'nope'"):
        Composite.from_description(wrong)
    twisted = CompositeDescription(d.name, d.members, d.connections, d.ports[:1] + (
        d.ports[1].__class__("y", "in", d.ports[1].inner),))
    with pytest.raises(rxcuda.ValidationError, match="exposed port 'y' says 'in' but second.out is an output"):
        Composite.from_description(twisted)
    with pytest.raises(TypeError, match="takes a CompositeDescription"):
        Composite.from_description(d.members[0])


def test_members_are_templates_read_when_an_instance_is_added(engine):
    c = Composite("c")
    blk = c.add(mul("m", scale=2.0))
    c.expose("x", blk["x"])
    first = engine.add(c)
    blk.params["scale"].value = 7.0  # the template changes; the instance made before does not
    second = engine.add(c)
    assert first.members["m"].params["scale"].value == 2.0
    assert second.members["m"].params["scale"].value == 7.0
    assert blk.state == "not built" and blk not in engine.blocks


def test_a_default_member_name_that_is_taken_is_numbered_and_members_are_listed():
    c = Composite("c")
    one, two = c.add(mul()), c.add(mul())
    named = c.add(mul(), name="third")
    assert dict(c.members) == {"scalar_mul": one, "scalar_mul_2": two, "third": named}
    assert repr(c) == "<Composite c: 3 members>"


# -- instances ------------------------------------------------------------------------------------------------
def test_the_same_composite_twice_gives_independent_instances(engine, api):
    c = pair()
    a, b = engine.add(c), engine.add(c)
    assert isinstance(a, CompositeInstance) and a.name == "pair" and b.name == "pair_2"
    assert [blk.name for blk in engine.blocks] == ["pair/first", "pair/second", "pair_2/first", "pair_2/second"]
    assert not set(a.blocks) & set(b.blocks)
    assert engine.composites == (a, b)
    engine.connect(a["y"], b["x"])
    engine.write(a["x"], np.ones(N, np.float32))
    assert engine.tick().tiers == ("structure",)
    assert api.count("cuGraphAddKernelNode") == 4
    plan = engine.plan
    assert [n.label for n in plan.nodes] == ["pair/first/scalar_mul", "pair/second/scalar_mul",
                                            "pair_2/first/scalar_mul", "pair_2/second/scalar_mul"]
    assert plan.deps == ((), (0,), (1,), (2,))
    # the instance's ports are the inner blocks' handles: everything that takes a port takes them
    assert a["x"] == a.members["first"]["x"] and a.ports == {"x": a["x"], "y": a["y"]}
    assert engine.read(b["y"]).shape == (N,)


def test_an_instance_name_avoids_blocks_and_instances_already_there(engine):
    engine.add(mul("pair"))
    engine.add(mul("pair_2/first"))
    inst = engine.add(pair())
    assert inst.name == "pair_3"  # "pair" is a block, "pair_2" would clash with the block pair_2/first


def test_nested_instances_resolve_ports_and_parameters_through_every_level(engine):
    inst = engine.add(nested())
    inner = inst.members["inner"]
    assert isinstance(inner, CompositeInstance) and inner.name == "outer/inner" and inner.root is inst
    assert [b.name for b in inst.blocks] == ["outer/inner/first", "outer/inner/second", "outer/post"]
    assert inst["x"] == inner.members["first"]["x"]
    assert [(s.block.name, s.name, d.block.name, d.name) for s, d in engine.connections] == [
        ("outer/inner/first", "out", "outer/inner/second", "x"), ("outer/inner/second", "out", "outer/post", "x")]
    assert inst.params["gain"].targets == (inner.members["first"].params["scale"],
                                           inner.members["second"].params["scale"])


def test_a_composite_parameter_is_a_hot_update_of_every_inner_parameter(engine, api):
    inst = engine.add(nested())
    engine.write(inst["x"], np.ones(N, np.float32))
    engine.tick()
    rebuilds, mark = engine.rebuilds, len(api.calls)
    inst.params["gain"].value = 0.5
    frame = engine.tick()
    assert frame.tiers == ("parameters",) and engine.rebuilds == rebuilds
    assert api.since(mark) == ["cuGraphExecKernelNodeSetParams"] * 2 + ["cuGraphLaunch", "cuStreamSynchronize"]
    inner = inst.members["inner"]
    assert [inner.members[m].params["scale"].value for m in ("first", "second")] == [0.5, 0.5]
    assert inst.members["post"].params["scale"].value == 1.0
    inst.set(post=4.0, gain=1)
    assert inst.params["post"].value == 4.0 and inst.params["gain"].value == 1.0
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == rebuilds
    assert repr(inst.params["gain"]) == "<parameter outer.gain: f32 = 1.0>"


def test_a_bad_composite_value_changes_no_inner_parameter(engine):
    inst = engine.add(pair())
    with pytest.raises(TypeError, match=r"pair/first.scale \(f32\) takes a number"):
        inst.params["gain"].value = "loud"
    assert [b.params["scale"].value for b in inst.blocks] == [2.0, 3.0]
    with pytest.raises(KeyError, match="composite instance 'pair' has no parameter 'gian'"):
        inst.params["gian"]
    with pytest.raises(rxcuda.UnknownPortError, match="exposes no port 'z'"):
        inst["z"]


def test_starting_values_of_exposed_parameters_outer_ones_win(engine):
    assert [b.params["scale"].value for b in engine.add(pair("p", value=5.0)).blocks] == [5.0, 5.0]
    outer = Composite("outer")
    inner = outer.add(pair("inner", value=5.0))
    outer.expose("x", inner["x"])
    outer.expose_parameter("gain", inner.params["gain"], value=0.5)
    assert outer.params["gain"].value == 0.5 and inner.params["gain"].value == 5.0
    inst = engine.add(outer)
    assert [b.params["scale"].value for b in inst.blocks] == [0.5, 0.5]
    outer.params["gain"].value = 9  # the value instances made from now on start with
    assert [b.params["scale"].value for b in engine.add(outer).blocks] == [9.0, 9.0]
    with pytest.raises(ValueError, match="finite number"):
        outer.params["gain"].value = float("inf")


def test_binding_a_composite_parameter_sets_every_inner_one_until_the_instance_goes(engine):
    inst = engine.add(pair())
    knob = Subject()
    inst.params["gain"].bind(knob)
    knob.on_next(0.125)
    assert [b.params["scale"].value for b in inst.blocks] == [0.125, 0.125]
    knob.on_next("bad")  # reported, the binding stays
    assert "parameter binding" in engine.diagnostic_log[-1].message
    knob.on_next(2)
    assert [b.params["scale"].value for b in inst.blocks] == [2.0, 2.0]
    engine.remove(inst)
    knob.on_next(8.0)
    assert [b.params["scale"].value for b in inst.blocks] == [2.0, 2.0]


def test_removing_an_instance_removes_every_block_inside(engine, api):
    keep = engine.add(mul("keep"))
    inst = engine.add(nested())
    engine.connect(inst["y"], keep["x"])
    engine.write(inst["x"], np.ones(N, np.float32))
    engine.tick()
    engine.remove(inst)
    assert engine.blocks == (keep,) and engine.composites == () and engine.connections == ()
    assert inst.state == "removed" and all(b.state == "removed" for b in inst.blocks)
    with pytest.raises(ValueError, match="composite instance outer is not in this engine"):
        engine.remove(inst)


def test_a_block_or_nested_instance_inside_is_removed_only_with_its_instance(engine):
    inst = engine.add(nested())
    with pytest.raises(rxcuda.ValidationError, match="outer/post is part of composite instance 'outer'; remove "
                                                     "the whole instance"):
        engine.remove(inst.members["post"])
    with pytest.raises(rxcuda.ValidationError, match="outer/inner is part of composite instance 'outer'"):
        engine.remove(inst.members["inner"])
    assert len(engine.blocks) == 3


def test_instance_state_and_text(engine):
    inst = engine.add(pair())
    assert inst.state == "not built"
    engine.write(inst["x"], np.ones(N, np.float32))
    engine.tick()
    assert inst.state == "ok"
    assert str(inst).split("\n") == [
        "composite pair: ok",
        "  block pair/first: ok",
        "  block pair/second: ok",
        "  first.out -> second.x",
        "  input x: <port pair/first.x>",
        "  output y: <port pair/second.out>",
        "  parameter gain: f32 = 2.0",
    ]
    assert repr(inst) == "<CompositeInstance pair (2 blocks) ok>"


def test_a_delayed_inner_connection_is_feedback_across_frames(engine):
    c = Composite("acc")
    acc = c.add(add_("acc"))
    c.connect(acc["out"], acc["b"], delay=1)  # out = x + out of the previous frame
    c.expose("x", acc["a"])
    c.expose("y", acc["out"])
    assert "acc.out -> acc.b (delay 1)" in str(c)
    inst = engine.add(c)
    engine.write(inst["x"], np.ones(N, np.float32))
    engine.tick()
    (conn,) = engine.describe().connections
    assert conn.delay == 1 and conn.src.port == "out" and conn.dst.port == "b"
    d = Composite("d")
    one, two = d.add(mul("one")), d.add(mul("two"))
    with pytest.raises(rxcuda.ValidationError, match="composite 'd': one.out -> two.x: 'delay' must be 0"):
        d.connect(one["out"], two["x"], delay=2)


# -- refusals ---------------------------------------------------------------------------------------------
def test_exposing_a_port_that_is_not_there_names_the_ports():
    c = Composite("c")
    blk = c.add(mul("m"))
    with pytest.raises(rxcuda.UnknownPortError, match=r"block 'm' has no port 'ot' \(ports: x, out\); did you mean"):
        c.expose("y", blk["ot"])
    inner = pair()
    c.add(inner)
    with pytest.raises(rxcuda.UnknownPortError, match=r"composite 'pair' exposes no port 'z' \(ports: x, y\)"):
        c.expose("z", inner["z"])
    with pytest.raises(rxcuda.ForeignBlockError, match="stray is not a member of composite 'c'; add it first"):
        c.expose("y", mul("stray")["out"])
    with pytest.raises(rxcuda.NotAPortError, match=r"name one of its ports, e.g. member\['out'\]"):
        c.expose("y", blk)


def test_two_exposures_with_one_name_are_refused():
    c = pair()
    first = c.members["first"]
    with pytest.raises(rxcuda.ValidationError, match=r"already exposes a port named 'x' \(first.x\); choose another"):
        c.expose("x", first["out"])
    with pytest.raises(rxcuda.ValidationError, match="already exposes a parameter named 'gain'"):
        c.expose_parameter("gain", first.params["n"])


def test_an_input_is_exposed_once_and_never_when_it_is_connected_inside():
    c = pair()
    first, second = c.members["first"], c.members["second"]
    with pytest.raises(rxcuda.ValidationError, match="second.x is connected inside composite 'pair'"):
        c.expose("z", second["x"])
    with pytest.raises(rxcuda.ValidationError, match="first.x is already exposed as input 'x'"):
        c.expose("z", first["x"])
    c.expose("y2", second["out"])  # an output may have two names
    extra = c.add(mul("extra"))
    with pytest.raises(rxcuda.ValidationError, match="first.x is exposed as input 'x' of composite 'pair'"):
        c.connect(extra["out"], first["x"])


def test_a_cycle_among_inner_connections_gets_the_planners_message():
    c = Composite("loop")
    a, b = c.add(mul("a")), c.add(mul("b"))
    c.connect(a["out"], b["x"])
    with pytest.raises(rxcuda.ValidationError, match="composite 'loop': the connections form a cycle through blocks "
                                                     "a, b; a frame must be a DAG"):
        c.connect(b["out"], a["x"])
    outer = Composite("outer")  # a cycle through a nested composite, resolved to the blocks inside
    inner = outer.add(pair("inner"))
    post = outer.add(mul("post"))
    outer.connect(inner["y"], post["x"])
    with pytest.raises(rxcuda.ValidationError, match="cycle through blocks inner/first, inner/second, post"):
        outer.connect(post["out"], inner["x"])
    assert len(outer.describe().connections) == 1


def test_inner_connections_that_do_not_fit_get_the_planners_message():
    c = Composite("c")
    a = c.add(mul("a"))
    small = c.add(Block.from_kernel(f"{K}/scalar_mul.ptx", size=16, name="small", counts={"x": 16}))  # fixed
    with pytest.raises(rxcuda.ValidationError, match=r"composite 'c': cannot connect a.out \(1024 elements\) to "
                                                     r"small.x \(16 elements\): sizes differ"):
        c.connect(a["out"], small["x"])
    with pytest.raises(rxcuda.ValidationError, match="is an input port and cannot be a connection's source"):
        c.connect(a["x"], small["x"])


def test_a_member_block_already_in_an_engine_is_refused(engine):
    blk = engine.add(mul("live"))
    with pytest.raises(rxcuda.ValidationError, match="live is in an engine, so it cannot be a member of composite "
                                                     "'c': members are templates"):
        Composite("c").add(blk)


def test_members_twice_taken_names_and_a_composite_inside_itself_are_refused():
    c = Composite("c")
    blk = c.add(mul("m"))
    with pytest.raises(rxcuda.ValidationError, match=r"m is already a member of composite 'c' \(as 'm'\)"):
        c.add(blk)
    with pytest.raises(rxcuda.ValidationError, match="already has a member named 'm'"):
        c.add(mul(), name="m")
    with pytest.raises(rxcuda.ValidationError, match="cannot contain itself"):
        c.add(c)
    outer = Composite("outer")
    outer.add(c)
    with pytest.raises(rxcuda.ValidationError, match=r"composite 'c' cannot contain itself \(through 'outer'\)"):
        c.add(outer)
    with pytest.raises(TypeError, match="takes a Block or a Composite"):
        c.add("scalar_mul")
    for bad in ("", "a/b", 3):
        with pytest.raises(ValueError, match="non-empty str without '/'"):
            Composite(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a member's name must be"):
        c.add(mul(), name="x/y")


def test_exposed_parameters_are_checked():
    c = Composite("c")
    m = c.add(mul("m"))
    add = c.add(add_("add"))
    with pytest.raises(rxcuda.ValidationError, match=r"would set m.scale \(f32\), add.n \(i32\); a composite "
                                                     "parameter has one type"):
        c.expose_parameter("mixed", m.params["scale"], add.params["n"])
    with pytest.raises(rxcuda.ValidationError, match="names m.scale twice"):
        c.expose_parameter("twice", m.params["scale"], m.params["scale"])
    with pytest.raises(TypeError, match="at least one parameter"):
        c.expose_parameter("none")
    with pytest.raises(TypeError, match="parameters of members"):
        c.expose_parameter("num", 1.0)  # type: ignore[arg-type]
    with pytest.raises(rxcuda.ForeignBlockError, match="stray is not a member"):
        c.expose_parameter("stray", mul("stray").params["scale"])
    with pytest.raises(TypeError, match="takes a number"):
        c.expose_parameter("gain", m.params["scale"], value="2")
    assert "gain" not in c.params  # a refusal leaves nothing behind
    c.expose_parameter("gain", m.params["scale"])
    with pytest.raises(rxcuda.ValidationError, match="m.scale is already exposed as parameter 'gain'"):
        c.expose_parameter("again", m.params["scale"])
    outer = Composite("outer")
    inner = outer.add(c)
    outer.expose_parameter("g", inner.params["gain"])
    with pytest.raises(rxcuda.ValidationError, match="c/m.scale is already exposed as parameter 'g'"):
        outer.expose_parameter("g2", inner.params["gain"])
    with pytest.raises(KeyError, match="composite 'c' has no parameter 'nope'"):
        inner.params["nope"]


def test_a_region_cannot_be_a_member():
    class FakeRegion(Block):  # anything with bodies is a region to the composite
        bodies = ((),)

    region = FakeRegion(mul("r").description)
    with pytest.raises(rxcuda.ValidationError, match="is a region"):
        Composite("c").add(region)


def test_exposed_descriptions_compare_by_value():
    a, b = pair().describe(), pair().describe()
    assert a == b and a.parameters == (ExposedParameter("gain", "f32", a.parameters[0].targets),)
    assert isinstance(a.members[0], MemberDescription)
    with pytest.raises(KeyError, match="has no member 'nope'"):
        a.member("nope")


# -- engine.replace -------------------------------------------------------------------------------------
def chain(engine):
    src = engine.add(add_("src"))
    mid = engine.add(mul("mid", scale=3.0))
    dst = engine.add(mul("dst"))
    engine.connect(src["out"], mid["x"])
    engine.connect(mid["out"], dst["x"])
    engine.write(src["a"], np.ones(N, np.float32))
    engine.write(src["b"], np.ones(N, np.float32))
    engine.tick()
    return src, mid, dst


def test_an_equal_replacement_is_no_rebuild(engine, api):
    src, mid, dst = chain(engine)
    rebuilds, mark = engine.rebuilds, len(api.calls)
    new = mul()  # scale left at its default: mid's 3.0 carries over
    assert engine.replace(mid, new) is new
    frame = engine.tick()
    assert frame.tiers == () and engine.rebuilds == rebuilds
    assert api.since(mark) == ["cuGraphLaunch", "cuStreamSynchronize"] and building_calls(api, mark) == []
    assert new.name == "mid" and new.params["scale"].value == 3.0 and new.state == "ok"
    assert mid.state == "removed" and mid not in engine.blocks and new.id != mid.id
    assert [(s.block, d.block) for s, d in engine.connections] == [(src, new), (new, dst)]
    assert engine.blocks == (src, new, dst)  # the same place in the order
    with pytest.raises(rxcuda.ValidationError, match="mid is not in this engine"):
        engine.read(mid["out"])


def test_values_set_on_the_new_block_win_and_are_hot_updates(engine, api):
    _src, mid, _dst = chain(engine)
    mid.set_launch(threads=N // 2)
    engine.tick()
    rebuilds, mark = engine.rebuilds, len(api.calls)
    new = mul()
    new.params["scale"].value = 0.5  # set on new: it stays (mid's 3.0 does not carry over)
    engine.replace(mid, new)
    assert new.params["scale"].value == 0.5 and new.launch().threads == N // 2  # the launch carried over
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == rebuilds
    assert api.since(mark) == ["cuGraphExecKernelNodeSetParams", "cuGraphLaunch", "cuStreamSynchronize"]


def test_a_replacement_with_another_description_rebuilds_and_keeps_connections(engine, api):
    src, mid, dst = chain(engine)
    rebuilds = engine.rebuilds
    sub = Block.from_kernel(f"{K}/vector_sub.ptx", size=N)
    engine.replace(src, sub)
    assert sub.name == "src"
    assert engine.tick().tiers == ("structure",) and engine.rebuilds == rebuilds + 1
    assert [(s.block, d.block) for s, d in engine.connections] == [(sub, mid), (mid, dst)]
    desc = engine.describe()
    assert {r.port for r in desc.fed if r.block == sub.id} == {"a", "b"}  # still written from the host
    assert [n.label for n in engine.plan.nodes][0] == "src/vector_sub"


def test_a_new_block_without_a_port_in_use_is_refused_and_the_engine_is_unchanged(engine, api):
    src, mid, dst = chain(engine)
    before = (engine.blocks, engine.connections, engine.rebuilds)
    with pytest.raises(rxcuda.ValidationError, match=r"cannot replace mid with vector_add: vector_add has no port "
                                                     r"'x', which is connected from src.out \(its ports: a, b, out\)"):
        engine.replace(mid, add_())
    assert (engine.blocks, engine.connections, engine.rebuilds) == before and mid.state == "ok"
    with pytest.raises(rxcuda.ValidationError, match="no port 'a', which is written from the host"):
        engine.replace(src, mul())
    small = Block.from_kernel(f"{K}/scalar_mul.ptx", size=16, counts={"x": 16})  # a fixed input
    with pytest.raises(rxcuda.ValidationError, match=r"cannot replace mid with scalar_mul: cannot connect src.out "
                                                     r"\(1024 elements\) to mid.x \(16 elements\)"):
        engine.replace(mid, small)
    assert engine.tick().tiers == () and engine.blocks == before[0]


def test_replace_refuses_blocks_of_other_engines_and_blocks_not_here(engine, api):
    _src, mid, dst = chain(engine)
    with rxcuda.Engine(driver=NullDriver()) as other:
        theirs = other.add(mul())
        with pytest.raises(rxcuda.ValidationError, match="scalar_mul is already in another engine"):
            engine.replace(mid, theirs)
        with pytest.raises(rxcuda.ForeignBlockError, match="scalar_mul is not in this engine"):
            engine.replace(theirs, mul())
    with pytest.raises(rxcuda.ValidationError, match="dst is already in this engine"):
        engine.replace(mid, dst)
    with pytest.raises(TypeError, match="takes two blocks; 'new' is a str"):
        engine.replace(mid, "scalar_mul")  # type: ignore[arg-type]
    assert engine.replace(mid, mid) is mid and mid.state == "ok"


def test_replace_keeps_streams_in_and_out_when_the_port_fits(engine, api):
    src, mid, dst = chain(engine)
    seen: list = []
    sub = engine.observe(dst["out"]).subscribe(seen.append)
    engine.tick()
    new = mul()
    engine.replace(dst, new)
    engine.tick()
    assert len(seen) == 2 and seen[-1].shape == (N,)  # the tap goes on with the new block's port
    assert [ref.block for ref, _tap, _obs in engine._io.taps] == [new.id]
    engine.disconnect(mid["out"], new["x"])
    engine.write(new["x"], np.ones(N, np.float32))
    small = Block.from_kernel(f"{K}/scalar_mul.ptx", size=16, counts={"x": 16})  # a fixed input
    with pytest.raises(rxcuda.ValidationError, match=r"'out' is observed, which expects f32\[1024\]"):
        engine.replace(new, small)
    sub.dispose()


def test_a_fed_input_stays_fed(engine):
    blk = engine.add(mul("m"))
    frames = Subject()
    engine.feed(blk["x"], frames)
    engine.tick()
    new = mul()
    engine.replace(blk, new)
    frames.on_next(np.ones(N, np.float32))
    engine.tick()
    assert engine._io.feeds and next(iter(engine._io.feeds)).block == new.id
    with pytest.raises(rxcuda.ValidationError, match=r"'x' is fed by a stream, which expects f32\[1024\]"):
        engine.replace(new, Block.from_kernel(f"{K}/scalar_mul.ptx", size=16))


def test_replace_keeps_a_bound_array_and_checks_it_fits(engine, monkeypatch):
    import rxcuda.engine._engine as engine_module
    from rxcuda.cuda._memory import ExternalArray

    class FakeArray:  # the null driver has no memory: a resolved array is a pointer and a size
        ptr = 0xA000

    monkeypatch.setattr(engine_module, "resolve_device_array",
                        lambda arr, stream=None, api=None: ExternalArray(arr.ptr, "f32", N, (N,), arr))
    blk = engine.add(mul("m"))
    engine.bind(blk["x"], FakeArray())
    engine.tick()
    new = mul()
    engine.replace(blk, new)
    assert engine.tick().tiers == ()
    assert engine.describe().bindings.keys() == {rxcuda.lowlevel.PortRef(new.id, "x")}
    big = Block.from_kernel(f"{K}/scalar_mul.ptx", size=2 * N)
    with pytest.raises(rxcuda.ValidationError, match=r"the f32 array of 1024 elements bound to 'x' does not fit"):
        engine.replace(new, big)


def scaler(scale_dtype: str) -> Block:
    """A block with scalar_mul's ports and scalars 'scale' of ``scale_dtype``, 'n' (i32) and 'bias' (f32)."""
    sig = rxcuda.KernelSignature("scaler", (
        rxcuda.KernelParam("x", "pointer", 8, "f32", "in"), rxcuda.KernelParam("out", "pointer", 8, "f32", "out"),
        rxcuda.KernelParam("scale", "scalar", 8 if scale_dtype == "f64" else 4, scale_dtype, default=1.0),
        rxcuda.KernelParam("n", "scalar", 4, "i32", default="size"),
        rxcuda.KernelParam("bias", "scalar", 4, "f32", default=0.0)))
    return Block.from_kernel(rxcuda.KernelCode("scaler", b"(a PTX image)", "ptx", sig), size=N)


def test_a_parameter_carries_over_only_where_name_and_type_match(engine):
    blk = engine.add(mul("m", scale=3.0))
    blk.set(n=100)
    engine.write(blk["x"], np.ones(N, np.float32))
    engine.tick()
    new = scaler("f64")
    engine.replace(blk, new)
    assert new.values() == {"scale": 1.0, "n": 100, "bias": 0.0}  # scale is f64 here: not mid's f32 value
    assert engine.tick().tiers == ("structure",)
    same_type = scaler("f32")
    engine.replace(new, same_type)
    assert same_type.values() == {"scale": 1.0, "n": 100, "bias": 0.0}  # 1.0 is what new ran with


def test_a_block_inside_an_instance_is_replaced_through_it(engine, api):
    inst = engine.add(pair())
    engine.write(inst["x"], np.ones(N, np.float32))
    engine.tick()
    rebuilds = engine.rebuilds
    old = inst.members["second"]
    new = mul()
    engine.replace(old, new)
    assert inst.members["second"] is new and new.name == "pair/second" and inst["y"].block is new
    assert new.params["scale"].value == 3.0  # carried over
    inst.params["gain"].value = 0.75  # the composite parameter now sets the new block
    assert new.params["scale"].value == 0.75 and old.params["scale"].value == 3.0
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == rebuilds
    with pytest.raises(rxcuda.ValidationError, match="part of composite instance 'pair'"):
        engine.remove(new)
    engine.remove(inst)
    assert engine.blocks == ()


def test_the_old_blocks_parameter_bindings_end(engine):
    blk = engine.add(mul("m"))
    engine.write(blk["x"], np.ones(N, np.float32))
    knob = Subject()
    blk.params["scale"].bind(knob)
    engine.tick()
    new = mul()
    engine.replace(blk, new)
    knob.on_next(6.0)
    assert blk.params["scale"].value == 1.0 and new.params["scale"].value == 1.0
