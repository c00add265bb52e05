"""Copy nodes: a device-to-device copy once a frame (a delayed connection's end-of-frame copy)."""

from __future__ import annotations

from ...model import _dtypes
from ...model._graphplan import CopyNodePlan
from .._driver import check, drv
from ._base import APPLY, BuildContext, GraphNode


class CopyNode(GraphNode):
    """A memcpy node of ``nbytes`` from buffer ``src`` to buffer ``dst``."""

    __slots__ = ("params",)

    kind = "copy"
    eager = True

    def __init__(self, plan: CopyNodePlan, src: int, dst: int):
        super().__init__(plan)
        p = drv.CUDA_MEMCPY3D()
        device = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.srcMemoryType = p.dstMemoryType = device
        p.srcDevice, p.dstDevice = src, dst
        # a 1-D copy as stream capture records cudaMemcpyAsync: one row of one slice, pitches and heights 0
        # (no pitch limit applies, whatever the size)
        p.WidthInBytes = plan.nbytes
        p.Height = p.Depth = 1
        self.params = p

    @classmethod
    def make(cls, plan, b: BuildContext) -> CopyNode:
        return cls(plan, b.pointers[plan.src], b.pointers[plan.dst])

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        return check(api.cuGraphAddMemcpyNode(graph, deps, len(deps), self.params, ctx),
                     f"cuGraphAddMemcpyNode ({what})")

    def buffers(self) -> tuple[int, ...]:
        return (self.plan.src, self.plan.dst)

    def rebind(self, buffer_id: int, ptr: int) -> str:
        p = self.params
        if self.plan.src == buffer_id:
            p.srcDevice = ptr
        if self.plan.dst == buffer_id:
            p.dstDevice = ptr
        return APPLY

    def set_bytes(self, nbytes: int) -> None:
        self.params.WidthInBytes = nbytes

    def apply(self, api, graph_exec, handle, ctx) -> None:
        check(api.cuGraphExecMemcpyNodeSetParams(graph_exec, handle, self.params, ctx),
              "cuGraphExecMemcpyNodeSetParams")

    def run(self, api, stream) -> None:
        p = self.params
        check(api.cuMemcpyDtoDAsync(p.dstDevice, p.srcDevice, p.WidthInBytes, stream),
              f"cuMemcpyDtoDAsync ({self.plan.label})")

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        return plan.label, f"copy {_dtypes.format_bytes(plan.nbytes)}"
