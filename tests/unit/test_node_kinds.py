"""Node kinds (rxcuda/cuda/nodes/): one class per kind of graph node, looked up in one table.

Every node plan type has exactly one kind; a new kind is one class and one row in ``KINDS``; what a kind
cannot do is refused with an error naming the node; and a graph built through the kinds makes the driver
calls it always made (the null driver records them).
"""

from __future__ import annotations

import typing
from typing import NamedTuple

import pytest

from rxcuda.cuda import NullDriver
from rxcuda.cuda._device import Device
from rxcuda.cuda._graph import CompiledGraph
from rxcuda.cuda.nodes import KINDS, GraphNode, kind_of
from rxcuda.model._describe import CaptureArgs, Launch
from rxcuda.model._graphplan import (
    BufferArg,
    BufferPlan,
    CallNodePlan,
    CopyNodePlan,
    GraphPlan,
    KernelNodePlan,
    MemsetNodePlan,
    NodePlan,
    ScalarArg,
)
from rxcuda.view import to_dot


def test_every_node_plan_type_has_exactly_one_kind():
    plan_types = set(typing.get_args(NodePlan))
    assert set(KINDS) == plan_types
    kinds = list(KINDS.values())
    assert len(set(kinds)) == len(kinds)  # no class serves two plan types
    assert all(issubclass(k, GraphNode) and k is not GraphNode for k in kinds)
    assert len({k.kind for k in kinds}) == len(kinds)  # and each says which kind it is, in messages


def test_a_plan_type_no_kind_builds_is_named_with_the_fix():
    class PeerCopyPlan(NamedTuple):
        id: int

    with pytest.raises(TypeError, match=r"no node kind builds a PeerCopyPlan; add its class under "
                                        r"rxcuda/cuda/nodes/ and a row for it in KINDS"):
        kind_of(PeerCopyPlan(0))


# -- a graph of four kinds on the null driver -----------------------------------------------------------------
def _plan() -> GraphPlan:
    buffers = (BufferPlan(0, ("b", 0), "x", "f32", 16, "internal"), BufferPlan(1, ("b", 1), "y", "f32", 16, "internal"))
    nodes = (
        KernelNodePlan(0, 1, "k", "code", Launch(grid=(4,), block=(128,)),
                       (BufferArg(0), ScalarArg(1, "s", "f32", 4, 2.0)), frozenset(), frozenset({0}), "blk/k"),
        MemsetNodePlan(1, 1, 0, 16, "zero y"),
        CopyNodePlan(2, 0, 1, 64, "x -> y", frozenset({0}), frozenset({1})),
        CallNodePlan(3, 2, "gemm", (BufferArg(1),), frozenset({1}), frozenset({1}), "lib/gemm"),
    )
    return GraphPlan(nodes, ((), (), (0, 1), (2,)), buffers, {}, {}, {(1, "s"): ((0, 1),)}, {}, {(2, "a"): (3,)},
                     {(1, "k"): 0})


@pytest.fixture
def built():
    api = NullDriver()
    dev = Device(0, api=api)
    function = api.cuModuleGetFunction(api.cuModuleLoadData(b"ptx")[1], b"k")[1]
    captures = []

    def capture(plan, pointers):
        captures.append((plan.id, dict(pointers)))
        return api.cuGraphCreate(0)[1], CaptureArgs(0, {}, {}, None)

    mark = len(api.calls)
    g = CompiledGraph(_plan(), {"code": function}, {0: 0x1000, 1: 0x2000}, dev.context, capture=capture, api=api)
    g.instantiate()
    return api, g, mark, captures


def test_a_graph_built_through_the_kinds_makes_the_same_driver_calls(built):
    api, g, mark, captures = built
    assert api.since(mark) == ["cuGraphCreate", "cuGraphAddKernelNode", "cuGraphAddMemsetNode",
                               "cuGraphAddMemcpyNode", "cuGraphCreate", "cuGraphAddChildGraphNode",
                               "cuGraphInstantiate"]
    assert [type(n).kind for n in g.nodes] == ["kernel", "memset", "copy", "library call"]
    assert captures == [(3, {0: 0x1000, 1: 0x2000})]
    assert g.consumers == {0: [0, 2], 1: [1, 2, 3]}


def test_a_rebind_reaches_each_kind_its_own_way(built):
    api, g, _, _ = built
    mark = len(api.calls)
    # y: the memset and the copy are updated at once, the library call must be captured again
    assert g.set_buffer(1, 0x3000) == [3]
    assert api.since(mark) == ["cuGraphExecMemsetNodeSetParams", "cuGraphExecMemcpyNodeSetParams"]
    assert api.calls[-1][1][2:4] == (0x1000, 0x3000)  # the copy's source and new destination
    # x: the kernel is staged (one exec-node update at flush), the copy updated at once
    mark = len(api.calls)
    assert g.set_buffer(0, 0x4000) == []
    g.flush()
    assert api.since(mark) == ["cuGraphExecMemcpyNodeSetParams", "cuGraphExecKernelNodeSetParams"]
    assert int(g.nodes[0].slots[0][0][g.nodes[0].slots[0][1]]) == 0x4000


def test_the_eager_run_and_the_close_go_through_the_kinds(built):
    api, g, _, _ = built
    mark = len(api.calls)
    g.run_eagerly(0)
    assert api.since(mark) == ["cuLaunchKernel", "cuMemsetD32Async", "cuMemcpyDtoDAsync", "cuGraphInstantiate",
                               "cuGraphLaunch"]
    mark = len(api.calls)
    g.close()
    assert api.since(mark) == ["cuGraphExecDestroy", "cuGraphExecDestroy", "cuGraphDestroy", "cuGraphDestroy"]
    assert "graph" not in api.leaks() and "exec" not in api.leaks()


def test_a_kind_refuses_what_it_cannot_do_naming_the_node(built):
    _api, g, _, _ = built
    with pytest.raises(TypeError, match=r"node 'zero y' \(memset\) runs no kernel code, so its code cannot be "
                                        r"swapped; rebuild the graph"):
        g.set_function(1, object())
    with pytest.raises(TypeError, match=r"node 'blk/k' \(kernel\) is no captured library call"):
        g.recapture(0, lambda plan, pointers: None)
    with pytest.raises(TypeError, match=r"node 'x -> y' \(copy\) launches no kernel"):
        g.set_launch(2, Launch(grid=(1,)))
    with pytest.raises(TypeError, match=r"node 'lib/gemm' \(library call\) copies nothing"):
        g.set_copy_bytes(3, 8)


def test_the_kinds_describe_their_nodes_for_the_plan_picture():
    dot = to_dot(_plan())
    for text in ("grid 4 x block 128", "memset y = 0", "copy 64 B", "library call gemm"):
        assert text in dot


# -- a new kind is one class and one row ------------------------------------------------------------------------
class EventRecordPlan(NamedTuple):
    """A made-up kind for the test: records an event (what a multi-device frame will need)."""

    id: int
    event: int
    label: str
    reads: frozenset[int] = frozenset()
    writes: frozenset[int] = frozenset()


class EventRecordNode(GraphNode):
    __slots__ = ()

    kind = "event record"
    added: typing.ClassVar[list] = []

    def add_copy(self, api, graph, deps, ctx, what):
        self.added.append((int(graph), len(deps), what))
        return api.cuGraphCreate(0)[1]  # a handle the null driver made (it has no event nodes to record)

    @classmethod
    def describe(cls, plan, buffers):
        return plan.label, f"record event {plan.event}"


def test_a_new_kind_is_one_class_and_one_row(monkeypatch):
    monkeypatch.setitem(KINDS, EventRecordPlan, EventRecordNode)
    EventRecordNode.added.clear()
    api = NullDriver()
    dev = Device(0, api=api)
    plan = GraphPlan((MemsetNodePlan(0, 0, 0, 4, "zero"), EventRecordPlan(1, 7, "done")), ((), (0,)),
                     (BufferPlan(0, ("b",), "b", "u32", 4, "internal"),), {}, {}, {}, {}, {}, {})
    g = CompiledGraph(plan, {}, {0: 0x1000}, dev.context, api=api)
    g.instantiate()
    assert [type(n) for n in g.nodes][1] is EventRecordNode and g.nodes[1].handle is not None
    assert EventRecordNode.added == [(int(g.graph), 1, "done")]
    assert g.consumers == {0: [0]}  # it uses no buffer: the protocol's default
    assert "record event 7" in to_dot(plan)
    g.run_eagerly(0)  # it issues no eager work (the protocol's default), so nothing fails
    with pytest.raises(TypeError, match=r"node 'done' \(event record\) uses no buffer"):
        g.nodes[1].rebind(0, 0x2000)
    g.close()
