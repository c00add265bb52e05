"""Blocks added at the end take a spare node over (rxcuda.cuda._inplace.extend): a graph is instantiated
with ``SPARES`` disabled kernel nodes after its end, a removal at the end leaves its nodes there disabled too, and a
block added after the end again gets its parameters into one of them and enables it: nothing is instantiated,
uploaded or destroyed. On the null driver: the driver calls made, the template's nodes and dependencies, and the
new nodes' arguments against a graph built from nothing (test_replan_engine.py's ``_check``)."""

from __future__ import annotations

import pytest
from test_replan_engine import N, _args, _chain, _check, _exec_calls, _fresh

from rxcuda import Block
from rxcuda.cuda._graph import CompiledGraph

pytestmark = pytest.mark.spares

HEAVY = ("cuGraphInstantiate", "cuGraphExecDestroy", "cuGraphUpload", "cuGraphExecUpdate")


def _add(engine, after, name: str, scale: float = 2.0):
    extra = engine.add(Block.from_kernel("scalar_mul", size=N, scale=scale, name=name))
    engine.connect(after["out"], extra["x"])
    return extra


def _ancestors(held: dict, h: int) -> set[int]:
    """The nodes ``h`` runs after in a template as the null driver holds it (node -> (deps, params))."""
    seen: set[int] = set()
    todo = [int(d) for d in held[h][0]]
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(int(x) for x in held[d][0])
    return seen


def test_a_graph_is_instantiated_with_disabled_spares_after_its_end(engine, api):
    blocks = _chain(engine, 6)
    mark = len(api.calls)
    engine.tick()
    g = engine._rt.graph
    assert len(g.spares) == CompiledGraph.SPARES == 2 and all(after is None for _, after in g.spares)
    held = api.kernel_edges(g.graph)
    (s0, _), (s1, _) = g.spares
    assert [int(d) for d in held[int(s0)][0]] == [g.nodes[-1].handle_int]  # after the chain's end
    assert [int(d) for d in held[int(s1)][0]] == [int(s0)]  # after the spare before
    calls = _exec_calls(api, mark)
    assert [a for n, a in calls if n == "cuGraphNodeSetEnabled"] == [(g._exec_h, int(s0), 0), (g._exec_h, int(s1), 0)]
    assert g.keeps == {blocks[-1].description.kernels[0].code.key}  # (the code the spares name stays loaded)
    _check(engine)


def test_a_block_added_at_the_end_takes_a_spare_over_without_instantiating(engine, api):
    blocks = _chain(engine, 8)
    engine.tick()
    builder = engine._builder
    g0 = engine._rt.graph
    exec_h, (s0, _), (s1, _) = g0._exec_h, *g0.spares
    mark = len(api.calls)
    extra = _add(engine, blocks[-1], "extra", scale=3.0)
    assert engine.tick().tiers == ("structure",)
    g = engine._rt.graph
    assert builder.extended == 1 and builder.grown == 0 and g._exec_h == exec_h and g0.exec is None
    calls = _exec_calls(api, mark)
    assert not [n for n, _ in calls if n in HEAVY] and "cuGraphAddKernelNode" not in api.since(mark)
    h = int(s0)
    assert g.nodes[-1].handle_int == h and g.spares == [(s1, None)]
    assert [(n, a) for n, a in calls if a[-2:] == (h, 1) or a == (h,) or a == (exec_h, h)] == [
        ("cuGraphKernelNodeSetParams", (h,)), ("cuGraphExecKernelNodeSetParams", (exec_h, h)),
        ("cuGraphNodeSetEnabled", (exec_h, h, 1))]
    _check(engine)  # the new node's arguments, the template's nodes and dependencies: a fresh build's
    extra.params["scale"].value = 0.25  # the hot path reaches the node that was a spare
    mark = len(api.calls)
    assert engine.tick().tiers == ("parameters",)
    assert ("cuGraphExecKernelNodeSetParams", (exec_h, h)) in api.calls[mark:]
    engine.close()
    assert not api.leaks().get("exec") and not api.leaks().get("graph")


def test_blocks_added_and_removed_at_the_end_repeatedly_instantiate_once(engine, api):
    blocks = _chain(engine, 10)
    engine.tick()
    builder = engine._builder
    mark = len(api.calls)
    for i in range(20):
        extra = _add(engine, blocks[-1], f"e{i}", scale=1.0 + i)
        engine.tick()
        _check(engine)
        engine.remove(extra)
        engine.tick()
        _check(engine)
    assert builder.extended == 20 and builder.shrunk == 20 and builder.grown == 0
    assert not [n for n in api.since(mark) if n in HEAVY]
    g = engine._rt.graph
    # the first spare, after the chain's end since its last removal, and the second, after every node
    assert [after for _, after in g.spares] == [frozenset({9}), None] and len(g.held) <= 5


def test_two_blocks_added_at_once_take_two_spares_and_three_grow_the_template(engine, api):
    blocks = _chain(engine, 5)
    engine.tick()
    builder = engine._builder
    a = _add(engine, blocks[-1], "a")
    b = _add(engine, a, "b")
    engine.tick()
    assert builder.extended == 1 and not engine._rt.graph.spares
    _check(engine)
    engine.remove(b)
    engine.remove(a)
    engine.tick()
    assert builder.shrunk == 1 and len(engine._rt.graph.spares) == 2
    g0 = engine._rt.graph
    spares = [int(h) for h, _ in g0.spares]
    mark = len(api.calls)
    c = _add(engine, blocks[-1], "c")
    d = _add(engine, c, "d")
    _add(engine, d, "e")  # one more than there are spares: the template grows, and is instantiated anew
    engine.tick()
    assert builder.grown == 1 and builder.extended == 1
    g = engine._rt.graph
    destroyed = [a[0] for n, a in api.calls[mark:] if n == "cuGraphDestroyNode"]
    assert sorted(destroyed) == sorted(spares)  # the old spares: they would run in the new executable graph
    assert len(g.spares) == 2 and all(after is None for _, after in g.spares)
    assert [a for n, a in api.calls[mark:] if n == "cuGraphNodeSetEnabled"] == [(g._exec_h, int(h), 0)
                                                                               for h, _ in g.spares]
    _check(engine)


def test_a_block_added_beside_the_end_runs_after_every_end_until_the_next_instantiation(engine, api):
    """Two chains, a block added after one of them: the spare it takes over runs after both ends (it may start
    later than it could, never earlier), and its arguments are a fresh build's."""
    a = _chain(engine, 3, prefix="a")
    _chain(engine, 3, prefix="b")
    engine.tick()
    g0 = engine._rt.graph
    ends = {g0.nodes[-1].handle_int, g0.nodes[2].handle_int}
    _add(engine, a[-1], "c")
    engine.tick()
    g = engine._rt.graph
    assert engine._builder.extended == 1
    held = api.kernel_edges(g.graph)
    node = g.nodes[-1]
    assert {int(d) for d in held[node.handle_int][0]} == ends  # every end of the graph before
    plan_deps = {g.nodes[d].handle_int for d in g.plan.deps[node.plan.id]}
    assert plan_deps and plan_deps <= _ancestors(held, node.handle_int)
    fresh = _fresh(g)
    try:
        assert _args(g) == _args(fresh)
    finally:
        fresh.close()


def test_a_spare_left_by_a_removal_takes_only_a_block_after_what_it_followed(engine):
    blocks = _chain(engine, 4)
    engine.tick()
    builder = engine._builder
    engine.remove(blocks[-1])
    engine.tick()
    assert builder.shrunk == 1 and engine._rt.graph.spares[0][1] == frozenset({2})
    _add(engine, blocks[1], "beside")  # after block 1: the spare left runs after block 2 only
    engine.tick()
    assert builder.extended == 0 and builder.grown == 1
    _check(engine)


def test_a_spare_the_driver_refuses_to_enable_is_left_and_the_template_grows(engine, api):
    blocks = _chain(engine, 4)
    engine.tick()
    builder = engine._builder
    api.fail("cuGraphNodeSetEnabled", times=1)
    _add(engine, blocks[-1], "extra")
    frame = engine.tick()
    assert frame.state == "ok" and frame.launched
    assert builder.extended == 0 and builder.grown == 1
    _check(engine)


def test_a_rebuild_of_the_same_topology_updates_the_executable_graph_with_its_spares(engine, api):
    _chain(engine, 5)
    engine.tick()
    g0 = engine._rt.graph
    exec_h, spares = g0._exec_h, list(g0.spares)
    mark = len(api.calls)
    engine.rebuild()
    g = engine._rt.graph
    names = api.since(mark)
    assert "cuGraphExecUpdate" in names and "cuGraphInstantiate" not in names
    assert g._exec_h == exec_h and g.spares == spares
    assert [a for n, a in api.calls[mark:] if n == "cuGraphNodeSetEnabled"] == [(exec_h, int(h), 0)
                                                                               for h, _ in spares]
    engine.tick()
    engine.close()
    assert not api.leaks().get("exec")


@pytest.mark.spares(default_min=True)
def test_a_graph_smaller_than_spares_min_gets_none_and_a_large_one_gets_them(engine):
    """A disabled node still costs a launch a little (~0.4-0.9 µs on an H200), which a small graph would feel and a
    small graph's instantiation does not: spares only from ``SPARES_MIN`` nodes up."""
    blocks = _chain(engine, CompiledGraph.SPARES_MIN - 1)
    engine.tick()
    assert engine._rt.graph.spares == []
    _add(engine, blocks[-1], "one_more")
    engine.tick()
    assert engine._builder.grown == 1 and len(engine._rt.graph.spares) == CompiledGraph.SPARES
