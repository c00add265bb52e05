"""A structural change in an engine costs what changed: the plan it runs is the one a fresh ``rxcuda.plan`` of
its description gives, and the new graph's kernel nodes hold the arguments a graph built from nothing would,
whatever the rebuild took over from the graph before (rxcuda.plan._plan.Replanner, nodes.ArgStorage)."""

from __future__ import annotations

import numpy as np

import rxcuda
from rxcuda import Block
from rxcuda.cuda._graph import CompiledGraph, KernelNode
from rxcuda.lowlevel import PortRef

N = 256


def _chain(engine, n: int, prefix: str = "m") -> list:
    blocks = [engine.add(Block.from_kernel("scalar_mul", size=N, scale=1.0 + i, name=f"{prefix}{i}"))
              for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        engine.connect(a["out"], b["x"])
    engine.write(blocks[0]["x"], np.ones(N, np.float32))
    return blocks


def _fresh(g: CompiledGraph) -> CompiledGraph:
    """The same plan built with nothing taken over."""
    functions = {n.code_key: node.params.func for n, node in zip(g.plan.nodes, g.nodes, strict=True)
                 if isinstance(node, KernelNode)}
    return CompiledGraph(g.plan, functions, g.built, g._ctx, api=g.api, fast=g.fast)


def _args(g: CompiledGraph) -> list:
    """Every kernel node's arguments as its slots hold them, and its launch and argument pointer offset."""
    out = []
    for node in g.nodes:
        if not isinstance(node, KernelNode):
            continue
        p = node.params
        base = g.args.ptrs_base
        out.append((node.plan.id, [view[idx].item() for view, idx in node.slots],
                    (p.gridDimX, p.blockDimX, p.sharedMemBytes), int(p.kernelParams) - base if node.plan.args else 0))
    return out


def _check(engine) -> None:
    """The running plan is a fresh plan's, and its kernel nodes' arguments a fresh build's."""
    g = engine._rt.graph
    assert g.plan == rxcuda.plan(engine.describe())
    fresh = _fresh(g)
    try:
        assert _args(g) == _args(fresh)
        assert np.array_equal(g.args.words, fresh.args.words)
        if not engine._builder.last_in_place:  # (a resize taken in place changed the words, not the build's)
            assert np.array_equal(g.args.sealed, fresh.args.words)
    finally:
        fresh.close()


def test_adds_removes_middle_connects_and_resizes_plan_and_build_as_from_scratch(engine):
    blocks = _chain(engine, 12)
    engine.tick()
    _check(engine)
    builder = engine._builder
    extra = engine.add(Block.from_kernel("scalar_mul", size=N, scale=3.0, name="extra"))
    engine.connect(blocks[-1]["out"], extra["x"])
    assert engine.tick().tiers == ("structure",)
    assert builder.planner.reused == 12
    assert engine._rt.graph.args.same == 12  # the chain's kernel nodes took their arguments over
    _check(engine)
    engine.remove(extra)
    engine.tick()
    _check(engine)
    # a block put in the middle: the chain re-planned from there, its head taken over
    mid = engine.add(Block.from_kernel("scalar_mul", size=N, scale=0.5, name="mid"))
    engine.disconnect(blocks[5]["out"], blocks[6]["x"])
    engine.connect(blocks[5]["out"], mid["x"])
    engine.connect(mid["out"], blocks[6]["x"])
    engine.tick()
    assert 0 < builder.planner.reused < 13
    _check(engine)
    # a resize: shapes flow down the chain (planned from scratch), and back
    engine.write(blocks[0]["x"], np.ones(2 * N, np.float32), resize=True)
    engine.tick()
    _check(engine)
    engine.write(blocks[0]["x"], np.ones(N, np.float32), resize=True)
    engine.tick()
    _check(engine)
    engine.remove(mid)
    engine.connect(blocks[5]["out"], blocks[6]["x"])
    engine.tick()
    _check(engine)


def test_a_value_changed_in_the_running_graph_reaches_the_rebuilt_graph(engine):
    blocks = _chain(engine, 6)
    engine.tick()
    blocks[2].params["scale"].value = 7.5  # the hot path: the running graph's argument storage, no rebuild
    assert engine.tick().tiers == ("parameters",)
    extra = engine.add(Block.from_kernel("scalar_mul", size=N, name="extra"))
    engine.connect(blocks[-1]["out"], extra["x"])
    engine.tick()
    g = engine._rt.graph
    node = g.nodes[g.plan.kernel_nodes[(blocks[2].id, "scalar_mul")]]
    assert [view[idx].item() for view, idx in node.slots][2] == 7.5
    _check(engine)
    # a value set together with the structural change is planned into the new graph
    blocks[0].params["scale"].value = -2.0
    engine.remove(extra)
    engine.tick()
    g = engine._rt.graph
    node = g.nodes[g.plan.kernel_nodes[(blocks[0].id, "scalar_mul")]]
    assert [view[idx].item() for view, idx in node.slots][2] == -2.0
    _check(engine)


def test_a_node_whose_buffers_moved_is_built_again_not_taken_over(engine):
    blocks = _chain(engine, 8)
    engine.tick()
    g = engine._rt.graph
    nid = g.plan.kernel_nodes[(blocks[2].id, "scalar_mul")]
    out = g.plan.port_buffers[PortRef(blocks[2].id, "out")]
    assert out in g.plan.storage  # m2.out shares memory with the chain's other intermediates
    engine.keep(blocks[2]["out"])  # memory of its own now: the same plan nodes, another address
    engine.tick()
    g2 = engine._rt.graph
    assert g2.plan.nodes[nid] is g.plan.nodes[nid] and g2.args.same == 8
    assert g2.built[out] != g.built[out]
    slots = g2.nodes[nid].slots
    assert slots[1][0][slots[1][1]].item() == g2.built[out]
    _check(engine)


def test_unchanged_blocks_keep_their_snapshot_entries(engine):
    blocks = _chain(engine, 3)
    first = engine.describe()
    second = engine.describe()
    assert all(a is b for a, b in zip(first.blocks, second.blocks, strict=True))
    blocks[1].params["scale"].value = 4.0
    third = engine.describe()
    assert third.blocks[0] is first.blocks[0] and third.blocks[2] is first.blocks[2]
    assert third.blocks[1] is not first.blocks[1] and third.blocks[1].values["scale"] == 4.0
    blocks[2].set_launch(threads=128)
    fourth = engine.describe()
    assert fourth.blocks[2] is not first.blocks[2] and fourth.blocks[2].launches == blocks[2].launches() != {}
