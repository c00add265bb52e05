"""The planner reports every problem it finds in one pass: errors together in one ValidationError
(``.problems``, ``.subject`` the first error's), warnings on the plan; and the engine marks each block named."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from _pipeline import IMUL, add, all_inputs, builder, kcode, mul, pipeline, ptr, ref, scalar

import rxcuda
from rxcuda import Block, UnknownPortError, ValidationError
from rxcuda.cuda import NullDriver
from rxcuda.lowlevel import (
    BlockDescription,
    Connection,
    KernelSpec,
    Launch,
    Pin,
    PortRef,
    PortSpec,
    Problem,
    check,
    plan,
    validate,
)
from rxcuda.plan._index import PipelineIndex


def problems_of(desc) -> tuple[Problem, ...]:
    with pytest.raises(ValidationError) as e:
        plan(desc)
    assert e.value.problems == check(desc)  # plan raises what check returns
    return e.value.problems


def errors(problems) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def three_mistakes():
    """A dtype mismatch (src -> ints), an open required input (lonely.b), and a cycle (first <-> second)."""
    src, ints = add(name="src"), Block.from_kernel(IMUL, size=64, name="ints")
    lonely = add(name="lonely")
    first, second = mul(name="first"), mul(name="second")
    desc = pipeline(src, ints, lonely, first, second,
                    conns=[(src["out"], ints["x"]), (first["out"], second["x"]), (second["out"], first["x"])],
                    fed=[*all_inputs(src), lonely["a"]])
    return desc, (src, ints, lonely, first, second)


# -- every error at once ------------------------------------------------------------------------------------
def test_three_independent_mistakes_are_reported_at_once():
    desc, (_src, ints, lonely, first, _second) = three_mistakes()
    with pytest.raises(ValidationError) as e:
        plan(desc)
    problems = e.value.problems
    assert [(p.severity, p.subject, p.block) for p in problems] == [
        ("error", "ints.x", ints.id),  # connections are checked first, then cycles, then inputs
        ("error", "first", first.id),
        ("error", "lonely", lonely.id),
    ]
    assert "element types differ" in problems[0].message
    assert "cycle through blocks first, second" in problems[1].message
    assert "required input lonely.b is neither connected nor bound" in problems[2].message
    lines = str(e.value).split("\n")
    assert lines[0] == "3 problems: ints.x, first, lonely"
    assert lines[1:] == [f"- {p.message}" for p in problems]
    assert e.value.subject == "ints.x"  # the first error's: the engine marks that block


def test_validate_raises_what_plan_raises():
    desc, _ = three_mistakes()
    with pytest.raises(ValidationError) as e:
        validate(desc)
    assert e.value.problems == check(desc) and len(e.value.problems) == 3


def test_each_open_required_input_is_its_own_problem():
    a, m = add(name="a"), mul(name="m")
    problems = problems_of(pipeline(a, m))
    assert [p.message.split(";")[0] for p in problems] == [
        "required input a.a is neither connected nor bound",
        "required input a.b is neither connected nor bound",
        "required input m.x is neither connected nor bound",
    ]


def test_each_bad_connection_is_its_own_problem():
    a1, a2, m, small = add(name="a1"), add(name="a2"), mul(), mul(32, name="small", counts={"x": 32})
    desc = pipeline(a1, a2, m, small, conns=[(m["x"], a1["a"]), (a1["out"], small["x"]), (a2["out"], m["out"])],
                    fed=all_inputs(a1, a2, m, small))
    assert [p.message.split(";")[0] for p in problems_of(desc)] == [
        "mul.x is an input port and cannot be a connection's source",
        "cannot connect a1.out (64 elements) to small.x (32 elements): sizes differ",
        "mul.out is an output port and cannot be a connection's target",
    ]


def test_a_connection_wrong_in_two_ways_reports_both():
    a, i = add(), Block.from_kernel(IMUL, size=32, name="imul", counts={"x": 32})
    desc = pipeline(a, i, conns=[(a["out"], i["x"])], fed=all_inputs(a))
    assert [p.message.split(":")[0] for p in problems_of(desc)] == [
        "cannot connect add.out (f32) to imul.x (i32)",
        "cannot connect add.out (64 elements) to imul.x (32 elements)",
    ]


def test_unknown_ports_in_two_connections_are_both_reported():
    a, m = add(), mul()
    desc = attrs.evolve(pipeline(a, m, fed=all_inputs(a, m)),
                        connections=(Connection(ref(a["out"]), PortRef(m.id, "nope")),
                                     Connection(PortRef(a.id, "ot"), ref(m["x"]))))
    with pytest.raises(ValidationError) as e:
        plan(desc)
    assert not isinstance(e.value, UnknownPortError)  # several problems: a plain ValidationError
    messages = [p.message for p in e.value.problems]
    assert "block 'mul' has no port 'nope'" in messages[0] and "did you mean 'out'?" in messages[1]


def test_a_bad_connection_does_not_also_leave_its_input_open():
    a, m = add(), mul()
    desc = pipeline(a, m, conns=[(a["a"], m["x"])], fed=all_inputs(a))
    assert len(problems_of(desc)) == 1  # m.x is connected (wrongly), not open as well


def test_bound_array_of_wrong_dtype_and_size_reports_both():
    m = mul()
    problems = problems_of(pipeline(m, bindings={m["x"]: ("f64", 10)}))
    assert ["has dtype f64" in p.message for p in problems] == [True, False]
    assert "has 10 elements, the port needs 64" in problems[1].message


def test_duplicates_are_reported_with_the_rest():
    one, two = mul(name="dup"), mul(name="dup")
    a = add()
    problems = problems_of(pipeline(one, two, a, a, fed=[one["x"], two["x"]]))
    assert [p.message.split(" (")[0] for p in problems[:2]] == ["two blocks are named 'dup'", "block 'add'"]
    assert "appears twice" in problems[1].message
    assert [p.message.split(";")[0] for p in problems[2:]] == [  # the repeated block is checked once
        "required input add.a is neither connected nor bound",
        "required input add.b is neither connected nor bound",
    ]


def test_each_cycle_is_its_own_problem_and_names_only_its_blocks():
    blocks = [add(name=f"m{i}") for i in range(6)]
    # m0 <-> m1 and m3 <-> m4 are cycles; m2 sits between them (m1 -> m2 -> m3), m5 after them (m4 -> m5)
    edges = [(0, 1, "a"), (1, 0, "a"), (1, 2, "a"), (2, 3, "a"), (3, 4, "a"), (4, 3, "b"), (4, 5, "a")]
    desc = pipeline(*blocks, conns=[(blocks[s]["out"], blocks[d][p]) for s, d, p in edges],
                    fed=[blocks[0]["b"], blocks[1]["b"], blocks[2]["b"], blocks[4]["b"], blocks[5]["b"]])
    problems = problems_of(desc)
    assert [p.message.split(";")[0] for p in problems] == [
        "the connections form a cycle through blocks m0, m1",
        "the connections form a cycle through blocks m3, m4",
    ]
    assert [(p.subject, p.block) for p in problems] == [("m0", blocks[0].id), ("m3", blocks[3].id)]


def test_blocks_after_a_cycle_are_still_checked():
    loop = mul(name="loop")
    code = kcode("k", ptr("x"), scalar("nodefault"))
    raw = Block(BlockDescription("raw", kernels=(KernelSpec("k", code, Launch.for_threads(64)),),
                                 ports=(PortSpec("x", "in", "f32", 64, (Pin("k", 0),)),)))
    desc = pipeline(loop, raw, conns=[(loop["out"], loop["x"]), (loop["out"], raw["x"])])
    assert [p.message.split(";")[0] for p in problems_of(desc)] == [
        "the connections form a cycle through blocks loop",
        "raw: scalar parameter 1 ('nodefault') of 'k' has no value",
    ]


def test_problems_inside_kernels_of_several_blocks_are_all_reported():
    unfed = BlockDescription("unfed", kernels=(KernelSpec("mul", mul().description.kernels[0].code,
                                                          Launch.for_threads(64)),),
                             ports=(PortSpec("x", "in", "f32", 64, (Pin("mul", 0),)),))
    code = kcode("k", ptr("x"), scalar("a"), scalar("b"))
    novalue = BlockDescription("novalue", kernels=(KernelSpec("k", code, Launch.for_threads(8)),),
                               ports=(PortSpec("x", "in", "f32", 8, (Pin("k", 0),)),))
    one, two = Block(unfed), Block(novalue)
    problems = problems_of(pipeline(one, two, fed=all_inputs(one, two)))
    assert [(p.block, p.message.split(" of ")[0]) for p in problems] == [
        (one.id, "unfed: parameter 1 ('out')"),
        (one.id, "unfed: scalar parameter 3 ('n')"),  # a "size" default no block parameter resolves
        (two.id, "novalue: scalar parameter 1 ('a')"),
        (two.id, "novalue: scalar parameter 2 ('b')"),
    ]


# -- one problem: today's message and class --------------------------------------------------------------
def test_a_single_error_keeps_its_message_and_subject():
    a = add()
    with pytest.raises(ValidationError) as e:
        plan(pipeline(a, fed=[a["a"]]))
    assert str(e.value) == e.value.problems[0].message
    assert str(e.value).startswith("required input add.b is neither connected nor bound; connect an output")
    assert e.value.subject == "add" and len(e.value.problems) == 1


def test_a_single_unknown_port_is_still_an_unknown_port_error():
    a, m = add(), mul()
    desc = attrs.evolve(pipeline(a, m, fed=all_inputs(a, m)),
                        connections=(Connection(ref(a["out"]), PortRef(m.id, "nope")),))
    with pytest.raises(UnknownPortError, match=r"^block 'mul' has no port 'nope' \(ports: x, out\)$") as e:
        plan(desc)
    assert isinstance(e.value, KeyError) and e.value.problems[0].block == m.id


def test_the_index_refuses_a_connection_with_the_planners_messages():
    a, i = add(), Block.from_kernel(IMUL, size=32, name="imul", counts={"x": 32})
    index = PipelineIndex()
    index.add_block(a.id, a.description)
    index.add_block(i.id, i.description)
    whole = pipeline(a, i, conns=[(a["out"], i["x"])], fed=all_inputs(a, i))
    with pytest.raises(ValidationError) as planned:
        plan(whole)
    with pytest.raises(ValidationError) as refused:
        index.add_connection(Connection(ref(a["out"]), ref(i["x"])))
    assert str(refused.value) == str(planned.value) and str(refused.value).startswith("2 problems: imul.x\n")
    assert index.connections == ()


# -- warnings ---------------------------------------------------------------------------------------------
def optional_input_block():
    b = builder("opt", size=32)
    k = b.add_kernel(mul().description.kernels[0].code)
    b.input("x", k["x"], required=False)
    b.output("out", k["out"])
    b.scalar("scale", k["scale"])
    b.scalar("n", k["n"])
    return b.build()


def test_an_open_optional_input_is_a_warning_and_the_plan_succeeds():
    blk = optional_input_block()
    desc = pipeline(blk)
    gp = plan(desc)
    assert gp.buffers[gp.port_buffers[ref(blk["x"])]].kind == "zeros"
    (warning,) = gp.warnings
    assert (warning.severity, warning.subject, warning.block) == ("warning", "opt.x", blk.id)
    assert "reads zeros from it every frame" in warning.message
    assert check(desc) == gp.warnings
    assert validate(desc) is None


def test_a_connected_or_written_optional_input_is_no_warning():
    blk = optional_input_block()
    assert plan(pipeline(blk, fed=[blk["x"]])).warnings == ()
    m = mul(32)
    assert plan(pipeline(m, blk, conns=[(m["out"], blk["x"])], fed=[m["x"]])).warnings == ()


def test_warnings_ride_on_the_error_but_not_in_its_message():
    blk, a = optional_input_block(), add()
    with pytest.raises(ValidationError) as e:
        plan(pipeline(blk, a, fed=[a["a"]]))
    assert [p.severity for p in e.value.problems] == ["warning", "error"]
    assert str(e.value) == e.value.problems[1].message and e.value.subject == "add"


def test_a_good_pipeline_has_no_problems():
    a, m = add(), mul()
    desc = pipeline(a, m, conns=[(a["out"], m["x"])], fed=all_inputs(a))
    assert check(desc) == () and plan(desc).warnings == ()


def test_problems_are_frozen_values():
    p = Problem("error", "add", "wrong", 3)
    assert p == Problem("error", "add", "wrong", 3)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        p.message = "other"  # type: ignore[misc]


def test_from_problems_needs_an_error():
    with pytest.raises(ValueError, match="at least one problem of severity 'error'"):
        ValidationError.from_problems([Problem("warning", "opt.x", "zeros")])


# -- the engine: a failed tick marks every block named, rebuild raises them all ---------------------------
N = 1024


@pytest.fixture
def engine():
    e = rxcuda.Engine(driver=NullDriver())
    yield e
    e.close()


def two_open_blocks(engine):
    left = engine.add(Block.from_kernel("kernels/vector_add.ptx", size=N, name="left"))
    right = engine.add(Block.from_kernel("kernels/vector_add.ptx", size=N, name="right"))
    engine.write(left["a"], np.ones(N, np.float32))  # left.b and right.b are left open
    engine.write(right["a"], np.ones(N, np.float32))
    return left, right


def test_a_failed_tick_reports_every_problem_and_marks_every_block(engine):
    left, right = two_open_blocks(engine)
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    engine.tick()
    (diagnostic,) = seen
    assert diagnostic.severity == "error" and diagnostic.subject == "left"
    assert [(p.subject, p.block) for p in diagnostic.details] == [("left", left.id), ("right", right.id)]
    assert "2 problems: left, right" in diagnostic.message
    assert left.state == "error" and right.state == "error"
    assert right.message.startswith("required input right.b is neither connected nor bound")


def test_rebuild_raises_every_problem(engine):
    left, right = two_open_blocks(engine)
    with pytest.raises(ValidationError, match=r"^2 problems: left, right\n- required input left\.b") as e:
        engine.rebuild()
    assert [p.block for p in e.value.problems] == [left.id, right.id]
    assert left.state == "error" and right.state == "error"
    engine.write(left["b"], np.ones(N, np.float32))
    engine.write(right["b"], np.ones(N, np.float32))
    engine.rebuild()
    assert left.state == "ok" and right.state == "ok"
