"""Frames the GPU drives itself: one launch runs up to K frames of a compiled graph back to back.

The frame graph's nodes are mirrored into the body of a device WHILE node. A loop kernel before it sets a
device frame counter to K; one at the end of each pass counts down and, with a stop port, ends the loop early
when the port's flag is nonzero. Kernel nodes share the frame graph's node parameters (the same argument
memory), so a parameter change made on the frame graph reaches the batch by re-applying the nodes' parameters
to the batch's executable graph (:meth:`BatchGraph.sync`), with no rebuild.
"""

from __future__ import annotations

import numpy as np

from ._driver import check, drv
from ._graph import CompiledGraph
from .nodes import KernelNode, RegionNode, add_conditional


class _Args:
    """Kernel arguments in 8-byte slots with the pointer array the driver reads."""

    def __init__(self, words: int):
        self.words = np.zeros(max(words, 1), dtype=np.uint64)
        self.ptrs = np.arange(max(words, 1), dtype=np.uint64) * np.uint64(8) + np.uint64(self.words.ctypes.data)

    @property
    def ptr(self) -> int:
        return self.ptrs.ctypes.data


def _kernel_params(func, args: _Args) -> object:
    p = drv.CUDA_KERNEL_NODE_PARAMS()
    p.func = func
    p.gridDimX = p.gridDimY = p.gridDimZ = 1
    p.blockDimX = p.blockDimY = p.blockDimZ = 1
    p.sharedMemBytes = 0
    p.kernelParams = args.ptr
    return p


class BatchGraph:
    """The frames of ``frame`` as the body of a device loop: ``launch(k)`` runs up to ``k`` frames.

    ``loop_init`` / ``loop_step``: the loaded condition kernels (``rx_loop_init``, ``rx_loop_step``).
    ``counter``: device address of a u32 the loop counts down in. ``stop``: (device address, bytes) of a flag
    that ends the loop after the frame that set it, or None.
    """

    def __init__(self, frame: CompiledGraph, loop_init, loop_step, counter: int, ctx, stop: tuple[int, int] | None,
                 api=None):
        self.api = api = api if api is not None else frame.api
        self.frame = frame
        self.graph = check(api.cuGraphCreate(0), "cuGraphCreate (batch)")
        self.exec = None
        self.k = -1
        self.mirror: list = []  # batch node handle per frame node
        self._copies: list = []  # (frame node, own _Args, params, {slot: region node id}) for handle-passing kernels
        # what the frame nodes' ``mirror`` reads and fills: this graph's conditional handle per region node, and
        # the region nodes' copies here (whose bodies take the regions' nodes)
        self.handles: dict[int, object] = {}
        self.regions: dict[int, RegionNode] = {}
        try:
            self._build(frame, loop_init, loop_step, counter, ctx, stop)
            self.exec = check(api.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate (batch)")
        except BaseException:
            api.cuGraphDestroy(self.graph)
            self.graph = None
            raise

    def _build(self, frame: CompiledGraph, loop_init, loop_step, counter: int, ctx, stop) -> None:
        api, plan = self.api, frame.plan
        handle = check(api.cuGraphConditionalHandleCreate(self.graph, ctx, 0, 0), "cuGraphConditionalHandleCreate")
        # rx_loop_init(handle, counter, n, flag, size, invert): the frame count is set per launch
        self._init_args = _Args(6)
        self._init_args.words[:2] = (int(handle), counter)
        self._init_args.words[4] = 4
        self._init_params = _kernel_params(loop_init, self._init_args)
        self._init = check(api.cuGraphAddKernelNode(self.graph, [], 0, self._init_params), "cuGraphAddKernelNode")
        loop = RegionNode(_LoopPlan(), handle)  # type: ignore[arg-type]
        add_conditional(api, self.graph, [self._init], ctx, loop)
        body = loop.bodies[0]
        # inner regions get handles of this graph; kernels that pass one get their own argument copy (own_params)
        self.handles = {n.plan.id: check(api.cuGraphConditionalHandleCreate(self.graph, ctx, 0, 0),
                                         "cuGraphConditionalHandleCreate")
                        for n in frame.nodes if n.conditional}
        regions = self.regions
        sinks = set()
        # profiling: as in the frame graph, the frame's start stamp first and the frame's roots after it
        root = next((n for n in frame.nodes if n.starts_frame(n.plan)), None)
        root_h = root.mirror(api, body, [], ctx, self) if root is not None else None
        for node in frame.nodes:
            nid = node.plan.id
            parent = plan.parents.get(nid)
            target = body if parent is None else regions[parent[0]].bodies[parent[1]]
            deps = [self.mirror[d] for d in plan.deps[nid]]
            if root_h is not None and not deps and parent is None and node.after_frame_start:
                deps = [root_h]
            h = root_h if node is root else node.mirror(api, target, deps, ctx, self)
            self.mirror.append(h)
            if parent is None:
                sinks.add(nid)
                sinks.difference_update(plan.deps[nid])
        # rx_loop_step(handle, counter, flag, size, invert): count down; a nonzero stop flag ends the loop
        self._step_args = _Args(5)
        self._step_args.words[:2] = (int(handle), counter)
        if stop is not None:
            self._step_args.words[2:5] = (stop[0], stop[1], 1)
        else:
            self._step_args.words[3] = 4
        self._step_params = _kernel_params(loop_step, self._step_args)
        # without a stop flag the step only counts: it runs beside the frame (the handle is read when the pass
        # ends); with one it reads the flag, so it follows the frame
        last = [self.mirror[s] for s in sorted(sinks)] if stop is not None else []
        check(api.cuGraphAddKernelNode(body, last, len(last), self._step_params), "cuGraphAddKernelNode (batch)")

    def own_params(self, node: KernelNode) -> object:
        """Params of a kernel that passes conditional handles (a region's condition kernel, whose arguments
        are all 8 bytes or less): its own argument copy, holding this graph's handles."""
        handle_slots, handles = node.handle_slots, self.handles
        args = _Args(len(node.slots))
        self._refresh(node, args, handle_slots, handles)
        p = drv.CUDA_KERNEL_NODE_PARAMS()
        src = node.params
        p.func = src.func
        p.gridDimX, p.gridDimY, p.gridDimZ = src.gridDimX, src.gridDimY, src.gridDimZ
        p.blockDimX, p.blockDimY, p.blockDimZ = src.blockDimX, src.blockDimY, src.blockDimZ
        p.sharedMemBytes = src.sharedMemBytes
        p.kernelParams = args.ptr
        self._copies.append((node, args, p, handle_slots, handles))
        return p

    @staticmethod
    def _refresh(node: KernelNode, args: _Args, handle_slots: dict[int, int], handles: dict) -> None:
        """Copy the node's current argument values (8-byte slots) and put this graph's handles in."""
        for i, (view, idx) in enumerate(node.slots):
            raw = view[idx:idx + 1].view(np.uint8)
            word = np.zeros(8, np.uint8)
            word[:raw.size] = raw
            args.words[i] = word.view(np.uint64)[0]
        for i, region in handle_slots.items():
            args.words[i] = int(handles[region])

    def sync(self) -> None:
        """Re-apply the frame graph's current node parameters (values, pointers, functions, geometry) to the
        batch's executable graph: what a parameter change, a rebind or a code swap on the frame graph did."""
        api, exec_ = self.api, self.exec
        copies = {id(c[0]): c for c in self._copies}
        for node, h in zip(self.frame.nodes, self.mirror, strict=True):
            c = copies.get(id(node))
            if c is None:
                node.apply(api, exec_, h, self.frame._ctx)
                continue
            _, args, params, slots, handles = c  # a condition kernel: its own arguments, this graph's handles
            self._refresh(node, args, slots, handles)
            params.func = node.params.func
            check(api.cuGraphExecKernelNodeSetParams(exec_, h, params), "cuGraphExecKernelNodeSetParams (batch)")

    def launch(self, k: int, stream) -> None:
        """Queue up to ``k`` frames (one graph launch)."""
        if k != self.k:
            self._init_args.words[2] = k
            check(self.api.cuGraphExecKernelNodeSetParams(self.exec, self._init, self._init_params),
                  "cuGraphExecKernelNodeSetParams (frames per batch)")
            self.k = k
        check(self.api.cuGraphLaunch(self.exec, stream), "cuGraphLaunch (batch)")

    def close(self) -> None:
        if self.exec is not None:
            self.api.cuGraphExecDestroy(self.exec)
            self.exec = None
        if self.graph is not None:
            self.api.cuGraphDestroy(self.graph)
            self.graph = None


class _LoopPlan:
    """The batch loop as add_conditional sees a region plan: a WHILE with one body."""

    kind = "while"
    bodies = 1
    label = "frames of a batch"
