"""Memset nodes: a buffer set to a value each frame before its readers (an append port's counter reset, the
zero-fill of an If body's outputs)."""

from __future__ import annotations

from ...model._graphplan import MemsetNodePlan
from .._driver import check, drv
from ._base import APPLY, BuildContext, GraphNode


class MemsetNode(GraphNode):
    """A memset node: ``count`` elements of ``element`` bytes (4 or 1) of one buffer set to ``value``."""

    __slots__ = ("params",)

    kind = "memset"
    eager = True

    def __init__(self, plan: MemsetNodePlan, ptr: int):
        super().__init__(plan)
        p = drv.CUDA_MEMSET_NODE_PARAMS()
        p.dst = ptr
        p.value = plan.value
        p.elementSize = plan.element
        p.width = plan.count
        p.height = 1
        p.pitch = 0
        self.params = p

    @classmethod
    def make(cls, plan, b: BuildContext) -> MemsetNode:
        return cls(plan, b.pointers[plan.buffer])

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        return check(api.cuGraphAddMemsetNode(graph, deps, len(deps), self.params, ctx),
                     f"cuGraphAddMemsetNode ({what})")

    def buffers(self) -> tuple[int, ...]:
        return (self.plan.buffer,)

    def rebind(self, buffer_id: int, ptr: int) -> str:
        self.params.dst = ptr
        return APPLY

    def apply(self, api, graph_exec, handle, ctx) -> None:
        check(api.cuGraphExecMemsetNodeSetParams(graph_exec, handle, self.params, ctx),
              "cuGraphExecMemsetNodeSetParams")

    def run(self, api, stream) -> None:
        p, label = self.params, self.plan.label
        if p.elementSize == 1:
            check(api.cuMemsetD8Async(p.dst, p.value, p.width, stream), f"cuMemsetD8Async ({label})")
        else:
            check(api.cuMemsetD32Async(p.dst, p.value, p.width, stream), f"cuMemsetD32Async ({label})")

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        buf = buffers.get(plan.buffer)
        return plan.label, f"memset {buf.label if buf else plan.buffer} = {plan.value}"
