"""The compiled graph: build a GraphPlan into a CUDA graph, instantiate, launch, update in place.

Every kernel node keeps its arguments in one persistent native buffer with a pointer array into it
(what the driver reads at add/update time). A hot update writes the new value into that buffer through a
typed NumPy view made at build time and calls cuGraphExecKernelNodeSetParams once per touched node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..model import _dtypes
from ..model._describe import CaptureArgs, Launch
from ..model._errors import CudaError
from ..model._graphplan import (
    BufferArg,
    CallNodePlan,
    CopyNodePlan,
    GraphPlan,
    HandleArg,
    KernelNodePlan,
    MemsetNodePlan,
    RegionNodePlan,
    StampNodePlan,
)
from ._driver import check, drv
from ._driver import drv as _drv
from ._fast import FastDriver


class ArgStorage:
    """The arguments of every kernel node of one graph in one native buffer of 8-byte slots, and the
    pointer array the driver reads (``kernelParams`` of each node points into it). Made once per build:
    a node's slot is then a (typed view of the whole buffer, index) pair, written in place by updates."""

    def __init__(self, plans: list[KernelNodePlan]):
        starts: dict[int, tuple[int, list[int]]] = {}
        offsets: list[int] = []
        words = 0
        for n in plans:
            first = len(offsets)
            for a in n.args:
                offsets.append(words)
                words += 1 if isinstance(a, BufferArg) else -(-max(a.size, 1) // 8)
            starts[n.id] = (first, offsets[first:])
        self.words = np.zeros(max(words, 1), dtype=np.uint64)
        base = self.words.ctypes.data
        self.ptrs = np.asarray(offsets or [0], dtype=np.uint64) * np.uint64(8) + np.uint64(base)
        self.ptrs_base = self.ptrs.ctypes.data
        self.starts = starts
        self._typed: dict[np.dtype, np.ndarray] = {np.dtype(np.uint64): self.words}

    def typed(self, dt: np.dtype) -> np.ndarray:
        view = self._typed.get(dt)
        if view is None:
            view = self._typed[dt] = self.words.view(dt)
        return view


_BY_SIZE = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


class KernelNode:
    """Driver-side state of one kernel node: node handle, params struct, and its argument slots in the
    graph's ArgStorage (``slots[i]``: the (typed view, index) of argument i)."""

    __slots__ = ("plan", "handle", "params", "slots", "buffer_args", "handle_int", "params_ptr")

    def __init__(self, plan: KernelNodePlan, function, pointers: Mapping[int, int], storage: ArgStorage,
                 handles: Mapping[int, int] | None = None):
        self.plan = plan
        first, offsets = storage.starts[plan.id]
        u64 = storage.words
        slots = []
        self.buffer_args: dict[int, list[int]] = {}
        for i, (a, w) in enumerate(zip(plan.args, offsets, strict=True)):
            if isinstance(a, BufferArg):
                u64[w] = pointers[a.buffer]
                slots.append((u64, w))
                self.buffer_args.setdefault(a.buffer, []).append(i)
            elif isinstance(a, HandleArg):  # a condition kernel's conditional handle
                u64[w] = handles[a.region] if handles else 0
                slots.append((u64, w))
            else:
                size = max(a.size, 1)
                dt = _dtypes.to_numpy(a.dtype) if a.dtype else None
                if dt is None or dt.itemsize != size:
                    dt = _BY_SIZE.get(size, _BY_SIZE[1])
                view = storage.typed(dt)
                idx = w * 8 // dt.itemsize
                view[idx] = a.value
                slots.append((view, idx))
        self.slots = slots
        p = drv.CUDA_KERNEL_NODE_PARAMS()
        p.func = function
        la = plan.launch
        p.gridDimX, p.gridDimY, p.gridDimZ = la.grid
        p.blockDimX, p.blockDimY, p.blockDimZ = la.block
        p.sharedMemBytes = la.shared_mem
        p.kernelParams = storage.ptrs_base + 8 * first if plan.args else 0
        self.params = p
        self.params_ptr = p.getPtr()  # the struct's address, for the GIL-keeping exec-node update
        self.handle = None
        self.handle_int = 0

    def set_launch(self, la: Launch) -> None:
        p = self.params
        p.gridDimX, p.gridDimY, p.gridDimZ = la.grid
        p.blockDimX, p.blockDimY, p.blockDimZ = la.block
        p.sharedMemBytes = la.shared_mem


class CallNode:
    """A captured library call: a child graph node and what is needed to capture it again."""

    __slots__ = ("plan", "handle", "child", "args", "child_exec")

    def __init__(self, plan: CallNodePlan, child, args: CaptureArgs):
        self.plan = plan
        self.child = child
        self.args = args
        self.handle = None
        self.child_exec = None  # the child graph instantiated on its own, for run_eagerly


class MemsetNode:
    __slots__ = ("plan", "handle", "params")

    def __init__(self, plan: MemsetNodePlan, ptr: int):
        self.plan = plan
        p = drv.CUDA_MEMSET_NODE_PARAMS()
        p.dst = ptr
        p.value = plan.value
        p.elementSize = plan.element
        p.width = plan.count
        p.height = 1
        p.pitch = 0
        self.params = p
        self.handle = None


class StampNode:
    """A profiling timestamp: a one-thread kernel node (rxcuda.cuda._profile)."""

    __slots__ = ("plan", "handle", "params")

    def __init__(self, plan: StampNodePlan, params):
        self.plan = plan
        self.params = params
        self.handle = None


class RegionNode:
    """A conditional node: its handle (what the condition kernels set) and its body graphs, which the nodes
    inside the region are added to."""

    __slots__ = ("plan", "handle", "cond", "bodies")

    def __init__(self, plan: RegionNodePlan, cond: int):
        self.plan = plan
        self.cond = cond
        self.handle = None
        self.bodies: list = []


_COND_TYPE = {"if": "CU_GRAPH_COND_TYPE_IF", "ifelse": "CU_GRAPH_COND_TYPE_IF", "while": "CU_GRAPH_COND_TYPE_WHILE",
              "for": "CU_GRAPH_COND_TYPE_WHILE"}


def add_conditional(api, graph, deps: list, ctx, node: RegionNode) -> None:
    """Add ``node`` as a conditional node to ``graph`` (IF with one or two bodies, or WHILE); fills
    ``node.handle`` and ``node.bodies`` (the body graphs the driver made)."""
    params = drv.CUgraphNodeParams()
    params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle = node.cond
    params.conditional.type = getattr(drv.CUgraphConditionalNodeType, _COND_TYPE[node.plan.kind])
    params.conditional.size = node.plan.bodies
    params.conditional.ctx = ctx
    node.handle = check(api.cuGraphAddNode(graph, deps, None, len(deps), params),
                        f"cuGraphAddNode (conditional: {node.plan.label})")
    bodies = getattr(api, "conditional_bodies", None)  # the null driver hands its body graphs out this way
    node.bodies = (list(bodies(node.handle)) if bodies is not None
                   else [params.conditional.phGraph_out[i] for i in range(node.plan.bodies)])


class CopyNode:
    """A device-to-device copy (a delayed connection's end-of-frame copy): a memcpy node of ``nbytes``."""

    __slots__ = ("plan", "handle", "params")

    def __init__(self, plan: CopyNodePlan, src: int, dst: int):
        self.plan = plan
        p = drv.CUDA_MEMCPY3D()
        device = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
        p.srcMemoryType = p.dstMemoryType = device
        p.srcDevice, p.dstDevice = src, dst
        # a 1-D copy as stream capture records cudaMemcpyAsync: one row of one slice, pitches and heights 0
        # (no pitch limit applies, whatever the size)
        p.WidthInBytes = plan.nbytes
        p.Height = p.Depth = 1
        self.params = p
        self.handle = None


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


def _refuse_memory_nodes(drv, graph) -> None:
    nodes, count = check(drv.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")
    if not count:
        return
    nodes, _ = check(drv.cuGraphGetNodes(graph, count), "cuGraphGetNodes")
    t = drv.CUgraphNodeType
    for n in nodes:
        kind = check(drv.cuGraphNodeGetType(n), "cuGraphNodeGetType")
        if kind in (t.CU_GRAPH_NODE_TYPE_MEM_ALLOC, t.CU_GRAPH_NODE_TYPE_MEM_FREE):
            drv.cuGraphDestroy(graph)
            raise CudaError("capture", "MEMORY_NODE_IN_CAPTURE",
                            "the captured library call allocates memory inside the graph, which a child graph "
                            "node cannot hold; give the library a preallocated workspace before capture")


class _Table(dict):
    """A dict that makes a missing entry on first lookup (``table[key]``) with ``make(key)`` and keeps it."""

    def __init__(self, make: Callable):
        super().__init__()
        self._make = make

    def __missing__(self, key):
        value = self[key] = self._make(key)
        return value


class CompiledGraph:
    """An instantiated CUDA graph built from a plan, with in-place update operations.

    Updates are staged (``set_*``) and applied with one exec-node update per touched node (``flush``).
    """

    def __init__(self, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
                 ctx, capture: Capture | None = None, fast: FastDriver | None = None, api=None, stamps=None):
        self.plan = plan
        self.stamps = stamps  # the profiling ring (rxcuda.cuda._profile.StampRing) the stamp nodes write, or None
        self.api = drv = api if api is not None else _drv
        self.fast = fast or FastDriver(api=drv)
        self._ctx = ctx
        self._exec_h = 0
        self.pointers = dict(pointers)
        self.nodes: list = []
        self.args = ArgStorage([n for n in plan.nodes if isinstance(n, KernelNodePlan)])
        self.graph = check(drv.cuGraphCreate(0), "cuGraphCreate")
        self.exec = None
        self._dirty: set[int] = set()
        parents = plan.parents
        self.regions = bool(parents) or any(isinstance(n, RegionNodePlan) for n in plan.nodes)
        try:
            # conditional handles belong to the top-level graph and exist before the kernels that pass them
            handles = {n.id: check(drv.cuGraphConditionalHandleCreate(self.graph, ctx, 0, 0),
                                   f"cuGraphConditionalHandleCreate ({n.label})")
                       for n in plan.nodes if isinstance(n, RegionNodePlan)} if self.regions else {}
            root_stamp = None
            if plan.stamps is not None:  # profiling: the frame's start stamp first; the frame's roots wait for it
                if stamps is None:
                    raise RuntimeError("this graph has profiling stamps but no stamp ring was given")
                first = next(n for n in plan.nodes if isinstance(n, StampNodePlan) and n.column == 0)
                root_stamp = StampNode(first, stamps.params(0))
                root_stamp.handle = check(drv.cuGraphAddKernelNode(self.graph, [], 0, root_stamp.params),
                                          f"cuGraphAddKernelNode ({first.label})")
            for n in plan.nodes:
                deps = [self.nodes[d].handle for d in plan.deps[n.id]]
                if root_stamp is not None and not deps and n.id not in parents and not isinstance(n, StampNodePlan):
                    deps = [root_stamp.handle]
                parent = parents.get(n.id) if self.regions else None
                target = self.graph if parent is None else self.nodes[parent[0]].bodies[parent[1]]
                if isinstance(n, KernelNodePlan):
                    node = KernelNode(n, functions[n.code_key], pointers, self.args, handles)
                    node.handle = check(drv.cuGraphAddKernelNode(target, deps, len(deps), node.params),
                                        f"cuGraphAddKernelNode ({n.label})")
                    node.handle_int = int(node.handle)
                elif isinstance(n, MemsetNodePlan):
                    node = MemsetNode(n, pointers[n.buffer])
                    node.handle = check(drv.cuGraphAddMemsetNode(target, deps, len(deps), node.params, ctx),
                                        f"cuGraphAddMemsetNode ({n.label})")
                elif isinstance(n, CopyNodePlan):
                    node = CopyNode(n, pointers[n.src], pointers[n.dst])
                    node.handle = check(drv.cuGraphAddMemcpyNode(target, deps, len(deps), node.params, ctx),
                                        f"cuGraphAddMemcpyNode ({n.label})")
                elif isinstance(n, RegionNodePlan):
                    node = RegionNode(n, handles[n.id])
                    add_conditional(drv, target, deps, ctx, node)
                elif isinstance(n, StampNodePlan):
                    if n.column == 0:  # the frame's start stamp, added first (see below)
                        node = root_stamp
                    else:
                        node = StampNode(n, stamps.params(n.column))
                        node.handle = check(drv.cuGraphAddKernelNode(target, deps, len(deps), node.params),
                                            f"cuGraphAddKernelNode ({n.label})")
                else:
                    if capture is None:
                        raise RuntimeError("this graph has library calls but no capture function was given")
                    child, args = capture(n, pointers)
                    node = CallNode(n, child, args)
                    node.handle = check(drv.cuGraphAddChildGraphNode(target, deps, len(deps), child),
                                        f"cuGraphAddChildGraphNode ({n.label})")
                self.nodes.append(node)
        except BaseException:
            self._destroy_graphs()
            raise

        # The patch table, the one place a value goes on its way to the GPU, filled on first use (a build of a
        # large pipeline should not pay for tables of parameters nobody changes):
        # (block, parameter) -> ((node id, typed view of the argument storage, index), ...) or None
        self.scalar_views: _Table = _Table(self._views_of)
        # the hot case: keys that only kernel nodes use (no device scalar, no recapture) -> ((typed view, index,
        # bound exec-node update), ...), bound to the executable graph (see _arm)
        self.hot: _Table = _Table(self._hot_of)
        self._consumers: dict[int, list[int]] | None = None

    def _views_of(self, key: tuple[int, str]) -> tuple | None:
        slots = self.plan.slots.get(key)
        return None if slots is None else tuple((nid, *self.nodes[nid].slots[arg]) for nid, arg in slots)

    def _hot_of(self, key: tuple[int, str]) -> tuple | None:
        plan = self.plan
        if key in plan.device_scalars or key in plan.recapture:
            return None
        targets = self.scalar_views[key]
        if targets is None:
            return None
        fast, exec_h, nodes = self.fast, self._exec_h, self.nodes
        return tuple((view, idx, fast.node_updater(exec_h, nodes[nid].handle_int, nodes[nid].params_ptr,
                                                   nodes[nid].params)) for nid, view, idx in targets)

    @property
    def consumers(self) -> dict[int, list[int]]:
        """Buffer id -> the nodes that use it: what a rebound array must reach (made on first use)."""
        if self._consumers is None:
            consumers: dict[int, list[int]] = {}
            for node in self.nodes:
                if isinstance(node, RegionNode | StampNode):
                    continue
                used = (node.plan.buffer,) if isinstance(node, MemsetNode) else (
                    (node.plan.src, node.plan.dst) if isinstance(node, CopyNode) else
                    (a.buffer for a in node.plan.args if isinstance(a, BufferArg)))
                for b in dict.fromkeys(used):
                    consumers.setdefault(b, []).append(node.plan.id)
            self._consumers = consumers
        return self._consumers

    def instantiate(self) -> None:
        drv = self.api
        try:
            self.exec = check(drv.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")
        except BaseException:
            self._destroy_graphs()
            raise
        self._exec_h = int(self.exec)
        self._arm()

    def _arm(self) -> None:
        """Bind the frame's launch and the hot path's exec-node updates to this executable graph."""
        self.launcher = self.fast.launcher(self._exec_h)
        self.hot = _Table(self._hot_of)

    def adopt_exec(self, old: CompiledGraph) -> bool:
        """Take over ``old``'s executable graph through cuGraphExecUpdate when the topology is the same.

        On success this graph uses old's exec and old's node handles (exec-node updates must name nodes of
        the graph the exec was instantiated from) and old must not destroy them. Returns False if the
        driver refuses, leaving both graphs as they were.
        """
        if old.exec is None or self.regions or old.regions or old.plan.topology() != self.plan.topology():
            return False  # (a graph with regions: its condition kernels pass handles of the graph they were made in)
        drv = self.api
        err, _info = drv.cuGraphExecUpdate(old.exec, self.graph)
        if err:
            return False
        for mine, theirs in zip(self.nodes, old.nodes, strict=True):
            mine.handle = theirs.handle
            if isinstance(mine, KernelNode):
                mine.handle_int = int(theirs.handle)
        check(drv.cuGraphDestroy(self.graph), "cuGraphDestroy")
        self.graph, old.graph = old.graph, None
        self.exec, old.exec = old.exec, None
        self._exec_h = int(self.exec)
        self._arm()
        return True

    # -- staged updates --------------------------------------------------------------------------------
    def set_buffer(self, buffer_id: int, ptr: int) -> list[int]:
        """Point every node that uses a buffer at new memory (a warm rebind).

        Kernel nodes are staged (``flush``), memset nodes updated at once; returns the ids of the captured
        call nodes that use the buffer: they must be captured again (``recapture``) to see it.
        """
        self.pointers[buffer_id] = ptr
        calls = []
        for nid in self.consumers.get(buffer_id, ()):
            node = self.nodes[nid]
            if isinstance(node, KernelNode):
                for i in node.buffer_args[buffer_id]:
                    view, idx = node.slots[i]
                    view[idx] = ptr
                self._dirty.add(nid)
            elif isinstance(node, MemsetNode):
                node.params.dst = ptr
                check(self.api.cuGraphExecMemsetNodeSetParams(self.exec, node.handle, node.params, self._ctx),
                      "cuGraphExecMemsetNodeSetParams")
            elif isinstance(node, CopyNode):
                p = node.params
                if node.plan.src == buffer_id:
                    p.srcDevice = ptr
                if node.plan.dst == buffer_id:
                    p.dstDevice = ptr
                check(self.api.cuGraphExecMemcpyNodeSetParams(self.exec, node.handle, p, self._ctx),
                      "cuGraphExecMemcpyNodeSetParams")
            else:
                calls.append(nid)
        return calls

    def set_copy_bytes(self, node_id: int, nbytes: int) -> None:
        """Make copy node ``node_id`` copy ``nbytes`` from now on (applied to the executable graph at once)."""
        node = self.nodes[node_id]
        node.params.WidthInBytes = nbytes
        check(self.api.cuGraphExecMemcpyNodeSetParams(self.exec, node.handle, node.params, self._ctx),
              "cuGraphExecMemcpyNodeSetParams")

    def set_launch(self, node_id: int, launch: Launch) -> None:
        self.nodes[node_id].set_launch(launch)
        self._dirty.add(node_id)

    def set_function(self, node_id: int, function) -> None:
        self.nodes[node_id].params.func = function
        self._dirty.add(node_id)

    def mark(self, node_id: int) -> None:
        """Stage a kernel node whose argument storage was written (applied by ``flush``)."""
        self._dirty.add(node_id)

    def discard(self, node_id: int) -> None:
        """Drop a staged change that could not be completed."""
        self._dirty.discard(node_id)

    def flush(self) -> None:
        """Apply staged kernel-node changes: one cuGraphExecKernelNodeSetParams per touched node."""
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        set_params = self.fast.set_kernel_params_raw
        for nid in dirty:
            node = self.nodes[nid]
            set_params(self._exec_h, node.handle_int, node.params_ptr, node.params)

    def recapture(self, node_id: int, capture: Capture) -> None:
        node: CallNode = self.nodes[node_id]
        drv = self.api
        child, args = capture(node.plan, self.pointers)
        try:
            check(drv.cuGraphExecChildGraphNodeSetParams(self.exec, node.handle, child),
                  f"cuGraphExecChildGraphNodeSetParams ({node.plan.label})")
        except BaseException:
            drv.cuGraphDestroy(child)
            raise
        if node.child_exec is not None:
            drv.cuGraphExecDestroy(node.child_exec)
            node.child_exec = None
        drv.cuGraphDestroy(node.child)
        node.child, node.args = child, args

    # -- the same work, eagerly --------------------------------------------------------------------------
    def run_eagerly(self, stream, *, check_each: bool = False, around=None) -> None:
        """Issue every node's work on ``stream`` one after another, in the plan's order (a valid order of
        the graph): kernels through cuLaunchKernel with the nodes' own arguments, memsets, and each library
        call's captured graph. What the graph computes, without the graph: for debugging (``check_each``
        waits after each node, so a fault names its node: the error carries ``node``) and for comparing a
        graph with its eager run.

        Regions are decided on the host here: the condition is read back (a wait) where the graph's
        condition kernel would read it on the device, and the body's nodes run as often as it says.
        ``around(plan, run)``, if given, is called for each top-level kernel, call and region with the
        function that issues its work (a profiler times it; memsets, copies and stamps run unwrapped).
        """
        if not self.regions and around is None:
            self._eager(range(len(self.nodes)), stream, check_each)
            return
        levels: dict = {}
        for n in self.plan.nodes:
            levels.setdefault(self.plan.parents.get(n.id), []).append(n.id)
        self._eager_level(levels, None, stream, check_each, around)

    def _eager_level(self, levels: dict, level, stream, check_each: bool, around=None) -> None:
        for nid in levels.get(level, ()):
            node = self.nodes[nid]
            if isinstance(node, KernelNode) and any(isinstance(a, HandleArg) for a in node.plan.args):
                continue  # a condition kernel: its region decides on the host (_eager_node)
            if around is not None and isinstance(node, KernelNode | CallNode | RegionNode):
                around(node.plan, lambda nid=nid: self._eager_node(levels, nid, level, stream, check_each))
            else:
                self._eager_node(levels, nid, level, stream, check_each)

    def _eager_node(self, levels: dict, nid: int, level, stream, check_each: bool) -> None:
        node = self.nodes[nid]
        if not isinstance(node, RegionNode):
            self._eager((nid,), stream, check_each)
            return
        setter = next(n for n in self.nodes if isinstance(n, KernelNode)
                      and any(isinstance(a, HandleArg) and a.region == nid for a in n.plan.args)
                      and self.plan.parents.get(n.plan.id) == level)
        if node.plan.kind in ("if", "ifelse"):
            body = 0 if self._flag(setter, 1, 2, stream) else 1
            if body < node.plan.bodies:
                self._eager_level(levels, (nid, body), stream, check_each)
            return
        limit = int(setter.slots[2][0][setter.slots[2][1]])
        step = next(n for n in self.nodes if isinstance(n, KernelNode) and n is not setter
                    and any(isinstance(a, HandleArg) and a.region == nid for a in n.plan.args))
        go = limit > 0 and (not isinstance(setter.plan.args[3], BufferArg) or self._flag(setter, 3, 4, stream))
        passes = 0
        while go:
            self._eager_level(levels, (nid, 0), stream, check_each)
            passes += 1
            go = passes < limit and (not isinstance(step.plan.args[2], BufferArg) or self._flag(step, 2, 3, stream))

    def _flag(self, node: KernelNode, flag_arg: int, size_arg: int, stream) -> bool:
        """The condition a condition kernel would read (argument ``flag_arg``, ``size_arg`` bytes wide), read
        back after the work queued so far."""
        a = node.plan.args[flag_arg]
        if not isinstance(a, BufferArg):
            return True
        size = int(node.slots[size_arg][0][node.slots[size_arg][1]])
        host = np.zeros(1, dtype=np.uint64)
        drv = self.api
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize (reading a region's condition)")
        check(drv.cuMemcpyDtoH(host.ctypes.data, self.pointers[a.buffer], size), "cuMemcpyDtoH (condition)")
        return bool(host[0])

    def _eager(self, ids, stream, check_each: bool) -> None:
        drv = self.api
        for nid in ids:
            node = self.nodes[nid]
            label = node.plan.label
            try:
                if isinstance(node, KernelNode):
                    p = node.params
                    check(drv.cuLaunchKernel(p.func, p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY,
                                             p.blockDimZ, p.sharedMemBytes, stream,
                                             p.kernelParams, 0),
                          f"cuLaunchKernel ({label})")
                elif isinstance(node, MemsetNode):
                    p = node.params
                    if p.elementSize == 1:
                        check(drv.cuMemsetD8Async(p.dst, p.value, p.width, stream), f"cuMemsetD8Async ({label})")
                    else:
                        check(drv.cuMemsetD32Async(p.dst, p.value, p.width, stream), f"cuMemsetD32Async ({label})")
                elif isinstance(node, CopyNode):
                    p = node.params
                    check(drv.cuMemcpyDtoDAsync(p.dstDevice, p.srcDevice, p.WidthInBytes, stream),
                          f"cuMemcpyDtoDAsync ({label})")
                elif isinstance(node, RegionNode | StampNode):
                    continue  # a region is decided by the caller; stamps time graph launches only
                else:
                    if node.child_exec is None:
                        node.child_exec = check(drv.cuGraphInstantiate(node.child, 0), f"cuGraphInstantiate ({label})")
                    check(drv.cuGraphLaunch(node.child_exec, stream), f"cuGraphLaunch ({label})")
                if check_each:
                    check(drv.cuStreamSynchronize(stream), f"cuStreamSynchronize after {label}")
            except CudaError as e:
                e.node = label
                raise

    def debug_dot(self, path, *, verbose: bool = False) -> None:
        """Write the driver's own DOT description of this graph to ``path`` (``cuGraphDebugDotPrint``): the
        topology, node types and ids, kernel names, memcpy directions; ``verbose=True`` adds every node's
        parameters, attributes and handles (CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE). For debugging the build."""
        import os

        if self.graph is None:
            raise RuntimeError("this graph was closed: there is nothing to describe")
        flags = int(self.api.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE) if verbose else 0
        check(self.api.cuGraphDebugDotPrint(self.graph, os.fsencode(path), flags), "cuGraphDebugDotPrint")

    # -- lifetime --------------------------------------------------------------------------------------
    def _destroy_graphs(self) -> None:
        drv = self.api
        for node in self.nodes:
            if isinstance(node, CallNode):
                if node.child_exec is not None:
                    drv.cuGraphExecDestroy(node.child_exec)
                    node.child_exec = None
                if node.child is not None:
                    drv.cuGraphDestroy(node.child)
                    node.child = None
        if self.graph is not None:
            drv.cuGraphDestroy(self.graph)
            self.graph = None

    def close(self) -> None:
        if self.exec is not None:
            self.api.cuGraphExecDestroy(self.exec)
            self.exec = None
        self._destroy_graphs()
        if self.stamps is not None:
            self.stamps.close()
            self.stamps = None
