"""Captured library calls: a block's library call (or chain of calls) captured from a stream into a child
graph, captured again when its parameters change (the Recapture tier)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ...model._describe import CaptureArgs
from ...model._errors import CudaError
from ...model._graphplan import BufferArg, CallNodePlan
from .._driver import check, drv
from ._base import RECAPTURE, BuildContext, GraphNode

Capture = Callable[[CallNodePlan, Mapping[int, int]], tuple[object, CaptureArgs]]


def capture_graph(stream, record: Callable[[CaptureArgs], None], args: CaptureArgs, api=None):
    """Capture what ``record`` issues on ``stream`` into a new CUDA graph (thread-local capture mode)."""
    drv_ = api if api is not None else drv
    mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    check(drv_.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")
    try:
        record(args)
    except BaseException:
        err, g = drv_.cuStreamEndCapture(stream)
        if not err and g is not None:
            drv_.cuGraphDestroy(g)
        raise
    graph = check(drv_.cuStreamEndCapture(stream), "cuStreamEndCapture")
    _refuse_memory_nodes(drv_, graph)
    return graph


def _refuse_memory_nodes(api, graph) -> None:
    nodes, count = check(api.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")
    if not count:
        return
    nodes, _ = check(api.cuGraphGetNodes(graph, count), "cuGraphGetNodes")
    t = drv.CUgraphNodeType
    for n in nodes:
        kind = check(api.cuGraphNodeGetType(n), "cuGraphNodeGetType")
        if kind in (t.CU_GRAPH_NODE_TYPE_MEM_ALLOC, t.CU_GRAPH_NODE_TYPE_MEM_FREE):
            api.cuGraphDestroy(graph)
            raise CudaError("capture", "MEMORY_NODE_IN_CAPTURE",
                            "the captured library call allocates memory inside the graph, which a child graph "
                            "node cannot hold; give the library a preallocated workspace before capture")


class CallNode(GraphNode):
    """A captured library call: a child graph node and what is needed to capture it again."""

    __slots__ = ("child", "args", "child_exec")

    kind = "library call"
    eager = True
    timed = True

    def __init__(self, plan: CallNodePlan, child, args: CaptureArgs):
        super().__init__(plan)
        self.child = child
        self.args = args
        self.child_exec = None  # the child graph instantiated on its own, for run_eagerly

    @classmethod
    def make(cls, plan, b: BuildContext) -> CallNode:
        if b.capture is None:
            raise RuntimeError("this graph has library calls but no capture function was given")
        child, args = b.capture(plan, b.pointers)
        return cls(plan, child, args)

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        return check(api.cuGraphAddChildGraphNode(graph, deps, len(deps), self.child),
                     f"cuGraphAddChildGraphNode ({what})")

    def buffers(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(a.buffer for a in self.plan.args if isinstance(a, BufferArg)))

    def rebind(self, buffer_id: int, ptr: int) -> str:
        return RECAPTURE  # the pointer is baked into the captured work

    def recapture(self, api, graph_exec, capture: Capture, pointers) -> None:
        child, args = capture(self.plan, pointers)
        try:
            check(api.cuGraphExecChildGraphNodeSetParams(graph_exec, self.handle, child),
                  f"cuGraphExecChildGraphNodeSetParams ({self.plan.label})")
        except BaseException:
            api.cuGraphDestroy(child)
            raise
        if self.child_exec is not None:
            api.cuGraphExecDestroy(self.child_exec)
            self.child_exec = None
        api.cuGraphDestroy(self.child)
        self.child, self.args = child, args

    def run(self, api, stream) -> None:
        label = self.plan.label
        if self.child_exec is None:
            self.child_exec = check(api.cuGraphInstantiate(self.child, 0), f"cuGraphInstantiate ({label})")
        check(api.cuGraphLaunch(self.child_exec, stream), f"cuGraphLaunch ({label})")

    def release(self, api) -> None:
        if self.child_exec is not None:
            api.cuGraphExecDestroy(self.child_exec)
            self.child_exec = None
        if self.child is not None:
            api.cuGraphDestroy(self.child)
            self.child = None

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        return plan.label, f"library call {plan.call}"
