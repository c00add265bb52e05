"""A structural change in an engine costs what changed: the plan it runs is the one a fresh ``rxcuda.plan`` of
its description gives, and the new graph's kernel nodes hold the arguments a graph built from nothing would,
whatever the rebuild took over from the graph before (rxcuda.plan._plan.Replanner, nodes.ArgStorage)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

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
        out.append((node.plan.id, [view[idx].item() for view, idx in node.slots],
                    (p.gridDimX, p.blockDimX, p.sharedMemBytes), _reads_slots(node)))
    return out


def _template(g: CompiledGraph) -> dict:
    """The graph's template as the null driver holds it: plan node id -> (the plan ids of the nodes it depends
    on, the parameters struct it was added or last set with)."""
    held = g.api.kernel_edges(g.graph)
    spares = {int(h) for h, _ in g.spares}  # (disabled in the executable graph: see rxcuda.cuda._inplace.extend)
    assert spares <= set(held)
    held = {h: v for h, v in held.items() if h not in spares}
    ids = {node.handle_int: node.plan.id for node in g.nodes}
    assert set(held) == set(ids)  # every node of the plan, and no other (none left over from an earlier graph)
    return {ids[h]: (sorted(ids[d] for d in deps), params) for h, (deps, params) in held.items()}


def _reads_slots(node: KernelNode) -> bool:
    """Whether the node's kernelParams (what the driver reads) point at its slots, argument by argument (a
    graph grown in place keeps its earlier nodes' arguments in an earlier graph's storage)."""
    n = len(node.plan.args)
    if not n:
        return True
    pointers = np.frombuffer(ctypes.string_at(int(node.params.kernelParams), 8 * n), dtype=np.uint64)
    return [int(x) for x in pointers] == [view.ctypes.data + idx * view.itemsize for view, idx in node.slots]


def _check(engine) -> None:
    """The running plan is a fresh plan's, its kernel nodes' arguments a fresh build's, and its template graph
    (nodes, dependencies, parameters) a fresh build's, whether it was built anew or grown in place."""
    g = engine._rt.graph
    assert g.plan == rxcuda.plan(engine.describe())
    for group in () if engine._builder.last_in_place else g.plan.shared:  # one allocation per group, of its
        # largest member's size (a resize taken in place keeps the larger allocations that still fit)
        nbytes = max(g.plan.buffers[m].nbytes for m in group)
        buf = engine._builder.buffers[(("shared", g.plan.buffers[group[0]].key), nbytes)]
        assert all(g.built[m] == buf.ptr for m in group)
    fresh = _fresh(g)
    try:
        assert _args(g) == _args(fresh)
        mine, theirs = _template(g), _template(fresh)
        assert {i: deps for i, (deps, _) in mine.items()} == {i: deps for i, (deps, _) in theirs.items()}
        assert {i: sorted(g.plan.deps[i]) for i in mine} == {i: deps for i, (deps, _) in mine.items()}
        if g.growable:  # (an exec update took the template over: its nodes hold the parameters before)
            assert all(params is g.nodes[i].params for i, (_, params) in mine.items())
        if not g.held:  # (grown in place: the kept nodes' words are in the earlier graphs' storages)
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
    was = engine._rt.graph
    template = int(was.graph)
    extra = engine.add(Block.from_kernel("scalar_mul", size=N, scale=3.0, name="extra"))
    engine.connect(blocks[-1]["out"], extra["x"])
    assert engine.tick().tiers == ("structure",)
    assert builder.planner.reused == 12
    g = engine._rt.graph
    assert builder.grown == 1 and int(g.graph) == template and was.graph is None  # grown by one node, in place
    assert g.nodes[:12] == was.nodes[:12]  # the chain's kernel nodes were kept as they were
    _check(engine)
    engine.remove(extra)
    engine.tick()
    assert builder.grown == 1 and builder.shrunk == 1  # taken off the end in place (test_shrink.py)
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


def test_a_grow_that_fails_to_instantiate_keeps_the_last_good_graph_and_its_template(engine):
    blocks = _chain(engine, 6)
    engine.tick()
    builder, api = engine._builder, engine._rt.api
    good = engine._rt.graph
    before = _template(good)
    extra = engine.add(Block.from_kernel("scalar_mul", size=N, scale=3.0, name="extra"))
    engine.connect(blocks[-1]["out"], extra["x"])
    api.fail("cuGraphInstantiate", "CUDA_ERROR_OUT_OF_MEMORY")
    assert engine.tick().launched  # the last good graph ran
    assert engine._rt.graph is good and builder.grown == 0
    assert api.count("cuGraphDestroyNode") == 1  # grown in place (one node added), undone
    assert good.growable and _template(good) == before  # the node added was taken out again, pointers restored
    assert _args(good) == _args(_fresh(good))
    blocks[1].params["scale"].value = 9.0  # the running graph still takes values
    assert engine.tick().tiers == ("parameters",)
    engine.remove(extra)
    engine.add(extra2 := Block.from_kernel("scalar_mul", size=N, scale=2.0, name="extra2"))
    engine.connect(blocks[-1]["out"], extra2["x"])
    engine.tick()  # re-planned from the changed block: built anew, then checked
    _check(engine)
    # a removal is taken off the running graph's end in place (test_shrink.py); where the driver refuses that, it
    # grows (its node destroyed in the template, the template instantiated anew), and where that instantiation
    # fails too, the last good graph keeps running: its node is gone from the template, so it grows no more
    g = engine._rt.graph
    engine.remove(extra2)
    api.fail("cuGraphNodeSetEnabled")
    api.fail("cuGraphInstantiate", "CUDA_ERROR_OUT_OF_MEMORY")
    assert engine.tick().launched
    assert engine._rt.graph is g and builder.shrunk == 0
    if builder.grown:
        assert not g.growable
    engine.remove(blocks[-1])
    engine.tick()  # the next build succeeds (built anew)
    _check(engine)


def test_grown_graphs_hold_only_the_storages_their_kept_nodes_use(engine):
    blocks = _chain(engine, 5)
    engine.tick()
    builder = engine._builder
    for i in range(12):
        extra = engine.add(Block.from_kernel("scalar_mul", size=N, scale=1.0 + i, name=f"e{i}"))
        engine.connect(blocks[-1]["out"], extra["x"])
        engine.tick()
        _check(engine)
        engine.remove(extra)
        engine.tick()
        _check(engine)
    # each removal taken off the end in place, each addition after the first put into the node it left
    assert builder.grown == 1 and builder.extended == 11 and builder.shrunk == 12
    g = engine._rt.graph
    assert len(g.held) <= 5
    assert {id(n.storage) for n in g.nodes} <= {id(s) for s in (*g.held, g.args)}


def _exec_calls(api, mark: int) -> list:
    return [(name, args) for name, args in api.calls[mark:]
            if name in ("cuGraphInstantiate", "cuGraphExecDestroy", "cuGraphUpload", "cuGraphNodeSetEnabled",
                        "cuGraphDestroyNode", "cuGraphExecKernelNodeSetParams", "cuGraphKernelNodeSetParams")]


@pytest.mark.parametrize("gone", [1, 3])
def test_blocks_removed_from_the_end_are_disabled_in_the_running_executable_graph(engine, gone):
    """A removal at the end instantiates nothing: the removed nodes are disabled in the running executable graph
    and stay in its template as spares, which the new graph takes over with the executable graph itself; the next
    addition after a value changed in the executable graph alone grows the template (destroying the spares there)
    and instantiates it anew, and only then is that executable graph destroyed."""
    api = engine._rt.api
    blocks = _chain(engine, 8)
    engine.tick()
    builder = engine._builder
    tail = blocks[-gone:]
    nodes = {engine._rt.graph.plan.kernel_nodes[(b.id, "scalar_mul")] for b in tail}
    handles = [engine._rt.graph.nodes[i].handle_int for i in sorted(nodes)]
    exec_h = engine._rt.graph._exec_h
    mark = len(api.calls)
    for b in tail:
        engine.remove(b)
    assert engine.tick().tiers == ("structure",)
    g = engine._rt.graph
    assert builder.shrunk == 1 and g._exec_h == exec_h and len(g.nodes) == 8 - gone
    calls = _exec_calls(api, mark)
    assert sorted(a for n, a in calls if n == "cuGraphNodeSetEnabled") == sorted((exec_h, h, 0) for h in handles)
    assert not [n for n, _ in calls if n == "cuGraphDestroyNode"]
    assert [int(h) for h, _ in g.spares] == handles  # in the template still, each after what it depended on
    assert [after for _, after in g.spares] == [frozenset({i - 1}) for i in sorted(nodes)]
    assert not [n for n, _ in calls if n in ("cuGraphInstantiate", "cuGraphExecDestroy", "cuGraphUpload")]
    code = blocks[0].description.kernels[0].code.key
    assert g.keeps == {code} and code in engine._builder.codes  # (the disabled nodes' code stays loaded)
    _check(engine)
    blocks[0].params["scale"].value = 5.0  # the hot path reaches the kept nodes in the same executable graph
    mark = len(api.calls)
    assert engine.tick().tiers == ("parameters",)
    assert ("cuGraphExecKernelNodeSetParams", (exec_h, g.nodes[0].handle_int)) in api.calls[mark:]
    extra = engine.add(Block.from_kernel("scalar_mul", size=N, scale=2.0, name="again"))
    engine.connect(blocks[-gone - 1]["out"], extra["x"])
    mark = len(api.calls)
    engine.tick()
    calls = _exec_calls(api, mark)
    assert [a for n, a in calls if n == "cuGraphExecDestroy"] == [(exec_h,)]  # built anew (block 0 changed)
    assert [n for n, _ in calls].count("cuGraphInstantiate") == 1
    _check(engine)
    engine.close()
    assert not api.leaks().get("exec")


def test_a_removal_in_the_middle_is_not_taken_off_in_place(engine):
    blocks = _chain(engine, 6)
    engine.tick()
    engine.remove(blocks[2])
    engine.connect(blocks[1]["out"], blocks[3]["x"])
    engine.tick()
    assert engine._builder.shrunk == 0
    _check(engine)


def test_a_shrink_the_driver_refuses_part_way_enables_its_nodes_again_and_builds_otherwise(engine):
    api = engine._rt.api
    blocks = _chain(engine, 6)
    engine.tick()
    before = engine._rt.graph._exec_h
    engine.remove(blocks[-1])
    engine.remove(blocks[-2])
    api.fail("cuGraphNodeSetEnabled", times=1)
    mark = len(api.calls)
    assert engine.tick().tiers == ("structure",)
    enabled = [a for n, a in api.calls[mark:] if n == "cuGraphNodeSetEnabled"]
    assert enabled[0][2] == 0 and enabled[-1][2] == 1 or len(enabled) == 1  # a disabled node enabled again
    assert engine._builder.shrunk == 0 and engine._rt.graph._exec_h != before  # built otherwise (instantiated)
    assert all(e.state == "ok" for e in engine.blocks)
    _check(engine)


def test_a_direct_ticks_rebuild_destroys_the_old_executable_graph_after_launching_the_new_one(engine):
    """The old executable graph is idle once the rebuild waited for its frames; its destruction (~0.4 ms at 1000
    nodes on an H200) comes after the new frame's launch, so that it overlaps that frame on the GPU."""
    api = engine._rt.api
    blocks = _chain(engine, 4)
    engine.tick()
    old = engine._rt.graph._exec_h
    mid = engine.add(Block.from_kernel("scalar_mul", size=N, scale=2.0, name="mid"))
    engine.disconnect(blocks[1]["out"], blocks[2]["x"])
    engine.connect(blocks[1]["out"], mid["x"])
    engine.connect(mid["out"], blocks[2]["x"])
    mark = len(api.calls)
    assert engine.tick().tiers == ("structure",)
    new = engine._rt.graph._exec_h
    order = [(n, a[0]) for n, a in api.calls[mark:] if n in ("cuGraphLaunch", "cuGraphExecDestroy")]
    assert order == [("cuGraphLaunch", new), ("cuGraphExecDestroy", old)] and not engine._rt.after_launch
    _check(engine)
    # a rebuild outside a frame (a read needed it): the old graph waits for the next frame, or for close
    engine.remove(mid)
    engine.connect(blocks[1]["out"], blocks[2]["x"])
    engine.read(blocks[-1]["out"])
    assert len(engine._rt.after_launch) == 1 and api.count("cuGraphExecDestroy") == 1
    engine.rebuild()  # (outside a frame too)
    assert len(engine._rt.after_launch) == 2
    engine.tick()
    assert not engine._rt.after_launch  # (a rebuild of the same topology took the running executable graph over)
    engine.rebuild()
    assert engine.tick().tiers == () and not engine._rt.after_launch  # (a frame that reports no tier lets it go too)
    engine.close()
    assert not engine._rt.after_launch and not api.leaks().get("exec")


def test_a_grow_keeps_to_plain_kernel_nodes_the_exec_has_not_changed(engine):
    """Grows one after another look at each graph's leading nodes once (CompiledGraph.plain); a kept node
    changed in the executable graph alone (a value set) stops the next shrink or grow: that graph is built
    anew."""
    blocks = _chain(engine, 6)
    engine.tick()
    builder = engine._builder
    for grown in (1, 2, 3):
        extra = engine.add(Block.from_kernel("scalar_mul", size=N, scale=1.0, name=f"extra{grown}"))
        engine.connect(blocks[-1]["out"], extra["x"])
        engine.tick()
        assert builder.grown == grown and engine._rt.graph.plain >= 6
        blocks.append(extra)
    _check(engine)
    blocks[2].params["scale"].value = 7.5
    engine.tick()
    engine.remove(blocks.pop())
    engine.tick()
    assert builder.grown == 3 and builder.shrunk == 0  # the exec's node 2 is ahead of the template's: built anew
    _check(engine)
    engine.remove(blocks.pop())
    engine.tick()
    assert builder.shrunk == 1 and engine._rt.graph.plain >= 6  # the new graph shrinks, and grows, again
    extra = engine.add(Block.from_kernel("scalar_mul", size=N, scale=1.0, name="extra4"))
    engine.connect(blocks[-1]["out"], extra["x"])
    engine.tick()
    assert builder.extended == 1  # (into the node the removal left: rxcuda.cuda._inplace.extend)
    _check(engine)
    extra = engine.add(Block.from_kernel("scalar_mul", size=N, scale=1.0, name="extra5"))
    engine.connect(blocks[-1]["out"], extra["x"])  # (beside extra4: no spare runs after both blocks' ends)
    engine.tick()
    assert builder.grown == 4
    _check(engine)


def test_a_removed_block_whose_code_nothing_else_runs_is_built_otherwise_and_its_module_unloaded(engine):
    """A shrink would leave the removed node's function named in the running executable graph, so it applies only
    where a kept node runs the same code; otherwise the graph is built anew, and the module that only the removed
    block ran is unloaded once the old graph is destroyed, after the new frame's launch."""
    api = engine._rt.api
    blocks = _chain(engine, 3)
    add = engine.add(Block.from_kernel("vector_add", size=N, name="add"))
    engine.connect(blocks[-1]["out"], add["a"])
    engine.connect(blocks[-1]["out"], add["b"])
    engine.tick()
    key = add.description.kernels[0].code.key
    assert key in engine._rt.modules
    engine.remove(add)
    mark = len(api.calls)
    assert engine.tick().tiers == ("structure",)
    assert engine._builder.shrunk == 0 and key not in engine._rt.modules
    order = [n for n, _ in api.calls[mark:] if n in ("cuGraphLaunch", "cuGraphExecDestroy", "cuModuleUnload")]
    assert order == ["cuGraphLaunch", "cuGraphExecDestroy", "cuModuleUnload"]
    _check(engine)
