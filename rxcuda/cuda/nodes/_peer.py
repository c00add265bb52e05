"""Peer copy nodes: a connection between devices, once a frame, in the graph of the device that reads it.

The route (``rxcuda.cuda._peer``) decides the work: one device-to-device copy where both "devices" are one
GPU or peer access is on (unified addressing: the source pointer is the other device's); two copies staged
through page-locked host memory where it is not (the first runs in the source device's context).
"""

from __future__ import annotations

from ...model import _dtypes
from ...model._graphplan import PeerCopyNodePlan
from .._driver import check, drv
from .._peer import HOST
from ._base import APPLY, BuildContext, GraphNode

_PORTABLE = 1  # CU_MEMHOSTALLOC_PORTABLE: page-locked for every context, so both devices' copies may use it


def _memcpy(nbytes: int, src: int, dst: int, src_host: bool = False, dst_host: bool = False):
    p = drv.CUDA_MEMCPY3D()
    device, host = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE, drv.CUmemorytype.CU_MEMORYTYPE_HOST
    p.srcMemoryType = host if src_host else device
    p.dstMemoryType = host if dst_host else device
    if src_host:
        p.srcHost = src
    else:
        p.srcDevice = src
    if dst_host:
        p.dstHost = dst
    else:
        p.dstDevice = dst
    p.WidthInBytes = nbytes  # one row of one slice (as CopyNode)
    p.Height = p.Depth = 1
    return p


class PeerCopyNode(GraphNode):
    """Copies another device's buffer into this device's replica of it (``route``: local, peer or host)."""

    __slots__ = ("params", "route", "src_ctx", "stage", "staged", "stage_handle")

    kind = "peer copy"
    eager = True

    def __init__(self, plan: PeerCopyNodePlan, src: int, dst: int, route: str, src_ctx=None, api=None):
        super().__init__(plan)
        self.route = route
        self.src_ctx = src_ctx
        self.stage = None  # the page-locked staging buffer (host route)
        self.stage_handle = None
        if route == HOST:
            self.stage = int(check(api.cuMemHostAlloc(max(plan.nbytes, 1), _PORTABLE), "cuMemHostAlloc (staging)"))
            self.staged = _memcpy(plan.nbytes, src, self.stage, dst_host=True)
            self.params = _memcpy(plan.nbytes, self.stage, dst, src_host=True)
        else:
            self.staged = None
            self.params = _memcpy(plan.nbytes, src, dst)

    @classmethod
    def make(cls, plan, b: BuildContext) -> PeerCopyNode:
        c = b.crossing
        if c is None:
            raise RuntimeError(f"node {plan.label!r} copies from device {plan.src_device}, but this graph was built "
                               "for one device (no crossing was given)")
        route = c.route(plan.src_device)
        src_ctx = c.contexts[plan.src_device] if route == HOST and c.contexts else b.ctx
        return cls(plan, c.pointer(plan.src_device, plan.src), b.pointers[plan.dst], route, src_ctx, b.api)

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        if self.staged is not None:  # device -> host in the source's context, then host -> this device
            self.stage_handle = check(api.cuGraphAddMemcpyNode(graph, deps, len(deps), self.staged, self.src_ctx),
                                      f"cuGraphAddMemcpyNode ({what}, to host)")
            deps = [self.stage_handle]
        return check(api.cuGraphAddMemcpyNode(graph, deps, len(deps), self.params, ctx),
                     f"cuGraphAddMemcpyNode ({what})")

    def buffers(self) -> tuple[int, ...]:
        return (self.plan.dst,)  # the source is another device's: a rebuild of that device rebuilds this one

    def rebind(self, buffer_id: int, ptr: int) -> str:
        if self.plan.dst == buffer_id:
            self.params.dstDevice = ptr
        return APPLY

    def set_source(self, api, graph_exec, ptr: int, ctx) -> None:
        """The other device's buffer moved (a rebound array): copy from ``ptr`` from now on (applied at once)."""
        if self.staged is not None:
            self.staged.srcDevice = ptr
            check(api.cuGraphExecMemcpyNodeSetParams(graph_exec, self.stage_handle, self.staged, self.src_ctx),
                  "cuGraphExecMemcpyNodeSetParams (peer copy, to host)")
        else:
            self.params.srcDevice = ptr
            self.apply(api, graph_exec, self.handle, ctx)

    def apply(self, api, graph_exec, handle, ctx) -> None:
        check(api.cuGraphExecMemcpyNodeSetParams(graph_exec, handle, self.params, ctx),
              "cuGraphExecMemcpyNodeSetParams (peer copy)")

    def run(self, api, stream) -> None:
        p, n, label = self.params, self.plan.nbytes, self.plan.label
        if self.staged is not None:
            check(api.cuMemcpyDtoHAsync(self.stage, self.staged.srcDevice, n, stream), f"cuMemcpyDtoHAsync ({label})")
            check(api.cuMemcpyHtoDAsync(p.dstDevice, self.stage, n, stream), f"cuMemcpyHtoDAsync ({label})")
            return
        check(api.cuMemcpyDtoDAsync(p.dstDevice, p.srcDevice, n, stream), f"cuMemcpyDtoDAsync ({label})")

    def release(self, api) -> None:
        if self.stage is not None:
            api.cuMemFreeHost(self.stage)
            self.stage = None

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        return plan.label, f"copy {_dtypes.format_bytes(plan.nbytes)} from device {plan.src_device}"
