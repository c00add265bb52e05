"""The planner's shortcuts give what its general paths give: the per-shape emission (rxcuda.plan._emit) the general
emission's plan, field for field and in the same insertion order of every map, on a corpus of pipelines and random
edits (shapes outside its case take the general path); the order of blocks added in the order they run, Kahn's."""

from __future__ import annotations

import random

import attrs
import pytest
from _pipeline import ADD, APPEND, MUL, add, all_inputs, builder, kcode, mul, pipeline, ptr, scalar
from test_replan import Pipeline

from rxcuda import Block
from rxcuda.lowlevel import BlockEntry, PipelineDescription, PortRef
from rxcuda.plan import _emit, _plan
from rxcuda.plan._plan import Replanner


@pytest.fixture
def both():
    """Plan a description with the per-shape emission and with the general path: (fast, general), each the
    plan (None when refused), the problems, and the insertion order of the planner's maps."""

    def run(desc: PipelineDescription):
        out = []
        for enabled in (True, False):
            _emit.ENABLED = enabled
            _emit.clear()
            planner = _plan._Planner(desc, True, resumable=True)
            gp, report = planner._run()
            maps = (list(planner.port_buffers), list(planner.slots), list(planner.by_key), list(planner.buffer_args),
                    list(planner.kernel_nodes))
            out.append((gp if not report.errors else None, [(p.severity, p.subject, p.message, p.block)
                                                             for p in report.problems], maps, planner.marks))
        return out

    yield run
    _emit.ENABLED = True
    _emit.clear()


def two_kernels(size: int = 50, count: int = 50):
    b = builder("scaled_sum", size=size)
    k_add = b.add_kernel(ADD)
    k_mul = b.add_kernel(MUL)
    b.input("a", k_add["a"])
    b.input("b", k_add["b"])
    b.connect(k_add["out"], k_mul["x"], count=count)
    b.output("out", k_mul["out"])
    b.scalar("scale", k_mul["scale"], default=3.0)
    b.scalar("n", [k_add["n"], k_mul["n"]])
    return b.build()


def fixed_default():
    code = kcode("k", ptr("x", "inout"), scalar("fixed", "f32", 1.5), scalar("n", default="size"))
    b = builder("fixed", size=8)
    k = b.add_kernel(code)
    b.input("x", k["x"])
    b.scalar("n", k["n"])
    return b.build()


def valued(desc: PipelineDescription, **values) -> PipelineDescription:
    """``desc`` with its last block's values changed as a block would refuse (the plan must refuse them too)."""
    last = desc.blocks[-1]
    changed = attrs.evolve(last, values={**last.values, **values})
    return attrs.evolve(desc, blocks=(*desc.blocks[:-1], changed))


def corpus():
    """(name, description) of pipelines the fast path covers, and some it hands to the general path."""
    a, m = add(), mul(scale=2.5)
    yield "chain", pipeline(a, m, conns=[(a["out"], m["x"])], fed=all_inputs(a))
    a, m = add(), mul()
    yield "unfed input (zeros)", pipeline(a, m, conns=[(a["out"], m["x"])], fed=[a["a"]])
    a, m = add(), mul()
    yield "bound ports", pipeline(a, m, conns=[(a["out"], m["x"])], fed=[a["b"]],
                                  bindings={a["a"]: ("f32", 64), m["out"]: ("f32", 64)})
    m = mul()
    yield "count above its buffer (clamped)", valued(pipeline(m, fed=[m["x"]]), n=65)
    m = mul()
    yield "negative count (error)", valued(pipeline(m, fed=[m["x"]]), n=-1)
    m = mul()
    yield "a count that is not an int (error)", valued(pipeline(m, fed=[m["x"]]), n=2.5)
    m1, m2 = mul(name="m1"), mul(name="m2", size=32)
    m2.params["n"].value = 16
    yield "count below its buffer", pipeline(m1, m2, conns=[(m1["out"], m2["x"])], fed=[m1["x"]])
    small, big = mul(name="small", size=16), mul(name="big", size=64)
    yield "count above the input it is fed (error)", pipeline(small, big, conns=[(small["out"], big["x"])],
                                                              fed=[small["x"]])
    blk = two_kernels()
    yield "internal connection", pipeline(blk, fed=all_inputs(blk))
    blk = two_kernels(size=50, count=40)
    yield "internal smaller than the count (error)", pipeline(blk, fed=all_inputs(blk))
    blk = fixed_default()
    yield "a parameter fixed at its default", pipeline(blk, fed=[blk["x"]])
    m = mul(name="wide")
    m.set_launch(threads=128)
    yield "a launch set on the block", pipeline(m, fed=[m["x"]])
    blocks = [mul(name=f"c{i}") for i in range(6)]
    yield "long chain", pipeline(*blocks, conns=list(zip([b["out"] for b in blocks], [b["x"] for b in blocks[1:]],
                                                         strict=False)), fed=[blocks[0]["x"]])
    a1, a2 = add(name="a1"), add(name="a2")
    yield "a DAG, one output read twice", pipeline(a1, a2, conns=[(a1["out"], a2["a"]), (a1["out"], a2["b"])],
                                                   fed=all_inputs(a1))
    x, y = mul(name="x"), mul(name="y")
    yield "a cycle (error)", pipeline(x, y, conns=[(x["out"], y["x"]), (y["out"], x["x"])])
    ap = Block.from_kernel(APPEND, size=64, name="append")
    yield "an append port (general path)", pipeline(ap, fed=[ap["values"]])


def test_the_fast_emission_covers_plain_kernel_blocks():
    m = mul()
    d = m.description
    assert _emit.emitter(d.ports, d.scalars, d.kernels, d.internals) is not None
    blk = two_kernels()
    d = blk.description
    assert _emit.emitter(d.ports, d.scalars, d.kernels, d.internals) is not None
    ap = Block.from_kernel(APPEND, size=64, name="append").description  # an append port: counter and reset
    assert _emit.emitter(ap.ports, ap.scalars, ap.kernels, ap.internals) is None


def test_one_function_per_shape_looked_up_by_identity():
    d1, d2 = mul(name="one").description, mul(name="two").description
    f = _emit.emitter(d1.ports, d1.scalars, d1.kernels, d1.internals)
    assert _emit.emitter(d2.ports, d2.scalars, d2.kernels, d2.internals) is f
    assert "def emit(self, b, sources):" in f.source and "for " not in f.source  # unrolled


@pytest.mark.parametrize("name, desc", list(corpus()), ids=[n for n, _ in corpus()])
def test_the_fast_emission_plans_as_the_general_path(both, name, desc):
    fast, general = both(desc)
    assert fast == general


def test_errors_and_warnings_name_the_same_things(both):
    m = mul()
    fast, general = both(valued(pipeline(m, fed=[m["x"]]), n=65))
    assert fast == general
    # n follows the size of x: a value above it is clamped to what x holds, with a warning naming it
    assert [(sev, subject) for sev, subject, _, _ in fast[1]] == [("warning", "mul.n")]
    assert fast[0].nodes[0].args[3].value == 64
    m = mul()
    fast, general = both(valued(pipeline(m, fed=[m["x"]]), n=-1))
    assert fast == general and fast[0] is None
    assert [(sev, subject) for sev, subject, _, _ in fast[1]] == [("error", "mul.n")]


@pytest.mark.parametrize("seed", range(12))
def test_random_edit_sequences_plan_as_the_general_path(both, seed):
    p = Pipeline(random.Random(seed))
    for _ in range(30):
        p.edit()
        fast, general = both(p.desc())
        assert fast == general


@pytest.mark.parametrize("seed", range(6))
def test_the_replanner_with_the_fast_emission_plans_as_a_fresh_general_plan(seed):
    p = Pipeline(random.Random(100 + seed))
    replanner = Replanner()
    try:
        for _ in range(30):
            p.edit()
            desc = p.desc()
            _emit.ENABLED = True
            try:
                got = replanner.plan(desc)
            except Exception as e:  # noqa: BLE001 (refused: the general path refuses it too)
                got = type(e)
                replanner.forget()
            _emit.ENABLED = False
            _emit.clear()
            try:
                want = _plan.plan(desc)
            except Exception as e:  # noqa: BLE001
                want = type(e)
            assert got == want
    finally:
        _emit.ENABLED = True
        _emit.clear()


def test_a_block_fed_through_a_delayed_connection_takes_the_general_path(monkeypatch):
    from rxcuda.lowlevel import Connection

    a, m = mul(name="a"), mul(name="m")
    entries = (BlockEntry(a.id, a.description), BlockEntry(m.id, m.description))
    desc = PipelineDescription(entries, (Connection(PortRef(a.id, "out"), PortRef(m.id, "x")),
                                         Connection(PortRef(m.id, "out"), PortRef(a.id, "x"), delay=1)))
    calls = []
    real = _emit.emitter

    def spy(*parts):
        fn = real(*parts)
        if fn is None:
            return None

        def traced(*args):
            calls.append(args[1].id)
            return fn(*args)

        return traced

    monkeypatch.setattr(_plan, "_emitter", spy)
    gp = _plan.plan(desc)
    assert calls == []  # a delayed connection in the pipeline: every block emitted by the general path
    assert len(gp.nodes) == 3  # two kernels and the delayed output's copy


@pytest.mark.parametrize("seed", range(20))
def test_blocks_added_in_the_order_they_run_are_ordered_as_kahns_order_does(seed):
    """ordered_blocks takes the insertion order at once when every connection runs forward in it: the same
    order as Kahn's with ties in insertion order, on random DAGs with the blocks inserted in a topological
    order or shuffled."""
    from rxcuda.lowlevel import Connection
    from rxcuda.plan import _order

    rng = random.Random(seed)
    blocks = [mul(name=f"k{i}") for i in range(12)]
    conns = []
    for j in range(1, len(blocks)):
        for i in rng.sample(range(j), min(j, rng.randint(0, 2))):
            conns.append(Connection(PortRef(blocks[i].id, "out"), PortRef(blocks[j].id, "x")))
    entries = [BlockEntry(b.id, b.description) for b in blocks]
    if seed % 2:
        rng.shuffle(entries)
    rng.shuffle(conns)
    desc = PipelineDescription(tuple(entries), tuple(conns))
    got = _order.ordered_blocks(desc, _order.Report())
    # Kahn's order, ranked by insertion (the path the shortcut skips)
    index = {e.id: i for i, e in enumerate(entries)}
    succ = {e.id: set() for e in entries}
    for c in conns:
        succ[c.src.block].add(c.dst.block)
    want, stuck = _order.ordered(succ, index)
    assert not stuck and [e.id for e in got] == want
    assert _order._in_order(conns, index) == (want == [e.id for e in entries])


def test_by_identity_of_several_parts_works_each_out_once_and_refuses_no_parts():
    from rxcuda.model._memo import by_identity

    calls = []

    def total(*parts):
        calls.append(parts)
        return sum(map(len, parts))

    memo = by_identity(total, parts=3)
    a, b, c = (1,), (1, 2), (3,)
    assert memo(a, b, c) == memo(a, b, c) == 4 and len(calls) == 1
    assert memo(a, b, tuple([3])) == 4 and len(calls) == 2  # an equal part that is another object: worked out again
    with pytest.raises(ValueError, match="parts >= 1"):
        by_identity(total, parts=0)
