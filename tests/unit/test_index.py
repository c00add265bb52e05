"""PipelineIndex: one connection checked at a time, with the planner's own messages, in time that does not grow
with the pipeline."""

from __future__ import annotations

import time

import attrs
import pytest
from _pipeline import IMUL, add, all_inputs, mul, pipeline, ref

from rxcuda import Block, UnknownPortError, ValidationError, plan
from rxcuda.lowlevel import Connection, PortRef
from rxcuda.plan._index import PipelineIndex


def index_of(*blocks: Block, bound=()) -> PipelineIndex:
    index = PipelineIndex()
    for b in blocks:
        index.add_block(b.id, b.description)
    for p in bound:
        index.bind(ref(p))
    return index


def conn(src, dst) -> Connection:
    return Connection(ref(src), ref(dst))


def refusal(fn) -> str:
    with pytest.raises(ValidationError) as e:
        fn()
    return str(e.value)


# -- the same message as the planner's, for every way a connection can be wrong -------------------------------
def cases():
    a1, a2, m, i = add(name="a1"), add(name="a2"), mul(), Block.from_kernel(IMUL, size=64, name="imul")
    small = mul(32, name="small", counts={"x": 32})  # a fixed input
    first, second, third = mul(name="first"), mul(name="second"), mul(name="third")
    loop = mul(name="loop")
    return {
        "input as source": ((a1, m), [], (m["x"], a1["a"]), ()),
        "output as target": ((a1, m), [], (a1["out"], m["out"]), ()),
        "dtypes differ": ((a1, i), [], (a1["out"], i["x"]), ()),
        "sizes differ": ((a1, small), [], (a1["out"], small["x"]), ()),
        "already connected": ((a1, a2, m), [(a1["out"], m["x"])], (a2["out"], m["x"]), ()),
        "bound": ((a1, m), [], (a1["out"], m["x"]), (m["x"],)),
        "cycle": ((first, second, third), [(first["out"], second["x"]), (second["out"], third["x"])],
                  (second["out"], first["x"]), ()),
        "self loop": ((loop,), [], (loop["out"], loop["x"]), ()),
    }


@pytest.mark.parametrize("case", list(cases()))
def test_refusals_read_as_the_planners(case):
    blocks, existing, new, bound = cases()[case]
    # every input fed: the connection is the pipeline's one problem (the planner reports them all at once)
    whole = pipeline(*blocks, conns=[*existing, new], fed=all_inputs(*blocks),
                     bindings={p: ("f32", 64) for p in bound})
    expected = refusal(lambda: plan(whole))
    index = index_of(*blocks, bound=bound)
    for s, d in existing:
        index.add_connection(conn(s, d))
    assert refusal(lambda: index.add_connection(conn(*new))) == expected


def test_cycle_names_only_the_blocks_on_it():
    blocks = [add(name=f"m{i}") for i in range(6)]
    edges = [conn(blocks[s]["out"], blocks[d]["a"]) for s, d in [(0, 1), (1, 2), (2, 3), (3, 4), (1, 5)]]
    closing = conn(blocks[3]["out"], blocks[1]["b"])
    index = index_of(*blocks)
    for c in edges:
        index.add_connection(c)
    with pytest.raises(ValidationError, match=r"cycle through blocks m1, m2, m3; a frame must be a DAG") as e:
        index.add_connection(closing)
    assert e.value.subject == "m1"
    whole = attrs.evolve(pipeline(*blocks, fed=all_inputs(*blocks)), connections=(*edges, closing))
    assert refusal(lambda: plan(whole)) == str(e.value)


def test_unknown_port_and_unknown_block():
    a, m = add(), mul()
    index = index_of(a)
    with pytest.raises(UnknownPortError, match=r"block 'add' has no port 'outt' \(ports: a, b, out\)"):
        index.add_connection(Connection(PortRef(a.id, "outt"), PortRef(a.id, "a")))
    with pytest.raises(ValidationError, match="names a block that is not in the engine; add the block first"):
        index.add_connection(conn(a["out"], m["x"]))


# -- state ---------------------------------------------------------------------------------------------------
def test_a_refused_connection_changes_nothing():
    first, second = mul(name="first"), mul(name="second")
    index = index_of(first, second)
    index.add_connection(conn(first["out"], second["x"]))
    with pytest.raises(ValidationError):
        index.add_connection(conn(second["out"], first["x"]))
    assert index.connections == (conn(first["out"], second["x"]),)
    assert index.source(ref(first["x"])) is None and index.source(ref(second["x"])) == ref(first["out"])


def test_remove_connection_and_connect_again():
    first, second = mul(name="first"), mul(name="second")
    index = index_of(first, second)
    c = conn(first["out"], second["x"])
    index.add_connection(c)
    assert index.remove_connection(c) and c not in index.connections and not index.remove_connection(c)
    index.add_connection(conn(second["out"], first["x"]))  # the reverse no longer makes a cycle


def test_parallel_connections_keep_the_edge_until_the_last_goes():
    src, join = mul(name="src"), add(name="join")
    index = index_of(src, join)
    one, two = conn(src["out"], join["a"]), conn(src["out"], join["b"])
    index.add_connection(one)
    index.add_connection(two)
    index.remove_connection(one)
    with pytest.raises(ValidationError, match="cycle through blocks join, src"):
        index.add_connection(conn(join["out"], src["x"]))
    index.remove_connection(two)
    index.add_connection(conn(join["out"], src["x"]))


def test_remove_block_takes_its_connections_and_bindings():
    a, m, tail = add(), mul(), mul(name="tail")
    index = index_of(a, m, tail, bound=[m["x"]])
    index.unbind(ref(m["x"]))
    index.add_connection(conn(a["out"], m["x"]))
    index.add_connection(conn(m["out"], tail["x"]))
    index.bind(ref(m["x"]))
    assert set(index.remove_block(m.id)) == {conn(a["out"], m["x"]), conn(m["out"], tail["x"])}
    assert index.connections == () and len(index) == 2
    index.add_block(m.id, m.description)  # (its id and name are free again)
    index.add_connection(conn(a["out"], m["x"]))  # (refused were its binding still there)


def test_bound_input_refuses_a_connection_until_unbound():
    a, m = add(), mul()
    index = index_of(a, m, bound=[m["x"]])
    with pytest.raises(ValidationError, match=r"mul\.x is both connected and bound to an array"):
        index.add_connection(conn(a["out"], m["x"]))
    index.unbind(ref(m["x"]))
    index.add_connection(conn(a["out"], m["x"]))


def test_blocks_are_added_once_under_one_name():
    m, other = mul(), mul()
    index = index_of(m)
    with pytest.raises(ValidationError, match=rf"block 'mul' \(id {m.id}\) appears twice"):
        index.add_block(m.id, m.description)
    with pytest.raises(ValidationError, match=rf"two blocks are named 'mul' \(ids {m.id} and {other.id}\)"):
        index.add_block(other.id, other.description)
    assert index.free_name("mul") == "mul_2" and index.free_name("add") == "add"


def test_free_name_skips_names_taken():
    blocks = [mul(name=n) for n in ("m", "m_2", "m_3")]
    index = index_of(*blocks)
    assert index.free_name("m") == "m_4"


# -- cost ----------------------------------------------------------------------------------------------------
def test_a_long_chain_is_declared_in_linear_time():
    # checked whole, each connect of a 1000-block chain took ~14 ms: 5000 blocks would take minutes
    blocks = [mul(16, name=f"m{i}") for i in range(5000)]
    t0 = time.perf_counter()
    index = index_of(*blocks)
    for s, d in zip(blocks, blocks[1:], strict=False):
        index.add_connection(conn(s["out"], d["x"]))
    assert time.perf_counter() - t0 < 5.0
    assert len(index.connections) == 4999
