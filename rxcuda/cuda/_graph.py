"""The compiled graph: build a GraphPlan into a CUDA graph, instantiate, launch, update in place.

Each node is built by its kind (``rxcuda.cuda.nodes``: kernel, memset, copy, captured call, region, stamp),
looked up once per node when the graph is built; updates call the nodes' own methods. Kernel nodes keep their
arguments in one persistent native buffer (``nodes.ArgStorage``): a hot update writes the new value into it
through a typed NumPy view made at build time and calls cuGraphExecKernelNodeSetParams once per touched node.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping

import numpy as np

from ..model._describe import Launch
from ..model._errors import CudaError
from ..model._graphplan import BufferArg, GraphPlan
from ._driver import check
from ._driver import drv as _drv
from ._fast import FastDriver
from .nodes import (
    APPLY,
    RECAPTURE,
    STAGED,
    ArgStorage,
    BuildContext,
    CallNode,
    Capture,
    CopyNode,
    GraphNode,
    KernelNode,
    MemsetNode,
    RegionNode,
    StampNode,
    add_conditional,
    capture_graph,
    kind_of,
)

# the node kinds, for the modules that name them through the graph
__all__ = ["ArgStorage", "CallNode", "Capture", "CompiledGraph", "CopyNode", "KernelNode", "MemsetNode",
           "RegionNode", "StampNode", "add_conditional", "capture_graph"]


class _Table(dict):
    """A dict that makes a missing entry on first lookup (``table[key]``) with ``owner._patch_of(key)`` and
    keeps it. It holds its graph weakly: a bound method would make a reference cycle, and a retired graph (a
    thousand kernel nodes, their parameter structs and argument storage) would then live on until the cyclic
    garbage collector's next pass over it, which grows with every rebuild (measured on the null driver: seven
    retired 1000-node graphs alive after seven rebuilds, a 45-95 ms collection)."""

    def __init__(self, owner: CompiledGraph):
        super().__init__()
        self._owner = weakref.ref(owner)

    def __missing__(self, key):
        owner = self._owner()
        if owner is None:
            raise KeyError(key)
        value = self[key] = owner._patch_of(key)
        return value


class CompiledGraph:
    """An instantiated CUDA graph built from a plan, with in-place update operations.

    Updates are staged (``set_*``) and applied with one exec-node update per touched node (``flush``).
    ``previous``: the graph built before (running, or retired and not yet closed): the kernel nodes of the
    plans the two share, leading the plan, take over its argument layout and the words it was built with
    instead of writing them again (``nodes.ArgStorage``, ``KernelNode.follow``); nothing of it is changed.
    """

    def __init__(self, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
                 ctx, capture: Capture | None = None, fast: FastDriver | None = None, api=None, stamps=None,
                 crossing=None, previous: CompiledGraph | None = None):
        self.plan = plan
        self.stamps = stamps  # the profiling ring (rxcuda.cuda._profile.StampRing) the stamp nodes write, or None
        self.api = drv = api if api is not None else _drv
        self.fast = fast or FastDriver(api=drv)
        self._ctx = ctx
        self._exec_h = 0
        self.pointers = dict(pointers)
        self.built: Mapping[int, int] = self.pointers.copy()  # the buffers' addresses as built (see ``previous``)
        self.nodes: list = []
        self.graph = check(drv.cuGraphCreate(0), "cuGraphCreate")
        self.exec = None
        self._dirty: set[int] = set()
        self.functions = functions  # the loaded functions by code key it was built with (see rxcuda.cuda._inplace)
        self.held: tuple = ()  # argument storages of nodes taken over from an earlier graph (rxcuda.cuda._inplace)
        # in-place edits (rxcuda.cuda._inplace): whether the template still matches the exec (False with regions,
        # stamps, another device's crossing, or after a failed grow), and the nodes changed in the exec only since
        # the build
        self.growable = crossing is None and stamps is None
        self.touched: set[int] = set()
        self.plain = 0  # leading nodes known to be kernel nodes passing no conditional handle (_inplace)
        # the code keys its executable graph names beyond its plan's (nodes ``_inplace.shrink`` disabled in it, spares):
        # their modules stay loaded while it lives
        self.keeps: frozenset[str] = frozenset()
        # disabled nodes of the executable graph that its template still holds, in the order they follow each other,
        # each ``(handle, after)``: what ``_inplace.extend`` gives blocks added at the end (see ``_make_spares``)
        self.spares: list[tuple[object, frozenset[int] | None]] = []
        parents = plan.parents
        kinds = [kind_of(n) for n in plan.nodes]  # the one lookup per node: from here on, the nodes' methods
        self.regions = bool(parents) or any(k.conditional for k in kinds)
        if previous is not None and (previous.graph is None or previous.api is not drv):
            previous = None
        b = BuildContext(drv, ctx, self.graph, functions, pointers, capture, stamps, crossing, previous)
        try:
            by_kind: dict[type[GraphNode], list] = {}
            for n, k in zip(plan.nodes, kinds, strict=True):
                by_kind.setdefault(k, []).append(n)
            for k, plans in by_kind.items():  # argument storage, conditional handles: before any node
                k.prepare(plans, b)
            self.args = b.args
            root = None
            if plan.stamps is not None:  # profiling: the frame's start stamp first; the frame's roots wait for it
                if stamps is None:
                    raise RuntimeError("this graph has profiling stamps but no stamp ring was given")
                first, kind = next((n, k) for n, k in zip(plan.nodes, kinds, strict=True) if k.starts_frame(n))
                root = kind.make(first, b)
                root.add(drv, self.graph, [], ctx)
            if root is None and not self.regions and self.fast.batches and all(k is KernelNode for k in kinds):
                # a flat graph of kernel nodes: made first, then added in one compiled call (~1 µs a node)
                self.nodes = KernelNode.make_all(list(plan.nodes), b)
                handles = self.fast.add_kernel_nodes(self.graph, self.nodes, plan.deps)
                for node, h in zip(self.nodes, handles, strict=True):
                    node.added_as(h)
            else:
                for n, kind in zip(plan.nodes, kinds, strict=True):
                    if root is not None and n is root.plan:
                        self.nodes.append(root)
                        continue
                    deps = [self.nodes[d].handle for d in plan.deps[n.id]]
                    if root is not None and not deps and n.id not in parents and kind.after_frame_start:
                        deps = [root.handle]
                    parent = parents.get(n.id) if self.regions else None
                    target = self.graph if parent is None else self.nodes[parent[0]].bodies[parent[1]]
                    node = kind.make(n, b)
                    node.add(drv, target, deps, ctx)
                    self.nodes.append(node)
            if isinstance(self.args, ArgStorage):
                self.args.seal()
        except BaseException:
            self._destroy_graphs()
            raise

        # The patch table, the one way a parameter's value reaches the graph, filled on first use (a build of a
        # large pipeline should not pay for tables of parameters nobody changes): (block, parameter) ->
        # (((node id, typed view of the argument storage, index, bound exec-node update), ...), plain), where
        # ``plain`` says that kernel nodes alone read it (no device scalar, no recapture: the hot path's case).
        # Its updates are bound to the executable graph (see _arm); its keys are the values written since the
        # build, whose copy in the plan (ScalarArg.value) is then stale.
        self.patches: _Table = _Table(self)
        self._consumers: dict[int, list[int]] | None = None

    def _patch_of(self, key: tuple[int, str]) -> tuple:
        plan, fast, exec_h, nodes = self.plan, self.fast, self._exec_h, self.nodes
        targets = []
        for nid, arg in plan.slots.get(key, ()):
            node = nodes[nid]
            view, idx = node.slots[arg]
            targets.append((nid, view, idx, fast.node_updater(exec_h, node.handle_int, node.params_ptr,
                                                               node.params)))
        return tuple(targets), key not in plan.device_scalars and key not in plan.recapture

    @property
    def consumers(self) -> dict[int, list[int]]:
        """Buffer id -> the nodes that use it: what a rebound array must reach (made on first use)."""
        if self._consumers is None:
            consumers: dict[int, list[int]] = {}
            for node in self.nodes:
                if node.handle is None:
                    continue  # taken out of the template by a grow that failed (see rxcuda.cuda._inplace)
                for b in node.buffers():
                    consumers.setdefault(b, []).append(node.plan.id)
            self._consumers = consumers
        return self._consumers

    def instantiate(self, spares: bool = False) -> None:
        """Instantiate the template. ``spares``: first add ``SPARES`` spare nodes after its end where the graph
        can take blocks added at the end in place (``_make_spares``), disabled in the executable graph."""
        drv = self.api
        try:
            if spares and self.growable and not self.regions:
                self.spares, code = self._make_spares(drv, self.graph, self.plan, self.nodes)
                if code is not None:
                    self.keeps = self.keeps | {code}
            self.exec = check(drv.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")
            self._disable_spares()
        except BaseException:
            if self.exec is not None:
                drv.cuGraphExecDestroy(self.exec)
                self.exec = None
            self._destroy_graphs()
            raise
        self._exec_h = int(self.exec)
        self._arm()

    # spare nodes: after every node of a flat graph of kernel nodes, disabled in its executable graph, in graphs of
    # SPARES_MIN nodes or more: a disabled node still costs a launch ~0.4-0.9 µs (H200: 1 kernel 7.9 -> 8.8 µs a
    # frame, 10 kernels 17.9 -> 18.2; 100 and 1000 kernels the same within noise), and a small graph is instantiated
    # anew in microseconds anyway
    SPARES = 2
    SPARES_MIN = 64

    @classmethod
    def _make_spares(cls, drv, graph, plan: GraphPlan, nodes: list) -> tuple[list, str | None]:
        """Add ``SPARES`` kernel nodes to ``graph`` (the template, before it is instantiated; a graph of ``SPARES_MIN``
        nodes or more), the first after every node that nothing depends on, each next one after the one before,
        doing the last node's work; returns ``([(handle, None), ...], the code key they name)`` (``([], None)`` where
        the graph does not qualify: fewer nodes, regions, stamps, another device's crossing, a last node that is no
        plain kernel node).

        Disabled in the executable graph (``_disable_spares``), they do no work when it runs, and each runs after
        every node before it: a block added at the end, whatever it depends on, can take one over
        (``_inplace.extend``: its parameters in both graphs, ``cuGraphNodeSetEnabled``) instead of a new
        instantiation of the template. The
        executable graph then orders that block after all others (it may run later than it could, never
        earlier), until the next instantiation."""
        if not cls.SPARES or len(nodes) < cls.SPARES_MIN or plan.parents or plan.stamps is not None:
            return [], None
        last = nodes[-1]
        if type(last) is not KernelNode or last.handle_slots:
            return [], None
        depended: set[int] = set()
        depended.update(*plan.deps)
        deps = [n.handle for n in nodes if n.plan.id not in depended]
        spares: list = []
        for _ in range(cls.SPARES):
            h = check(drv.cuGraphAddKernelNode(graph, deps, len(deps), last.params), "cuGraphAddKernelNode (spare)")
            spares.append((h, None))
            deps = [h]
        return spares, last.plan.code_key

    def _disable_spares(self) -> None:
        for h, _ in self.spares:
            check(self.api.cuGraphNodeSetEnabled(self.exec, h, 0), "cuGraphNodeSetEnabled (spare)")

    def upload(self, stream) -> None:
        """Upload the executable graph to the device in ``stream`` without running it (``cuGraphUpload``):
        what its first launch would do, paid here (off the frame thread, by a graph prepared there)."""
        check(self.api.cuGraphUpload(self.exec, stream), "cuGraphUpload")

    def _arm(self) -> None:
        """Bind the frame's launch and the patch table's exec-node updates to this executable graph."""
        self.launcher = self.fast.launcher(self._exec_h)
        self.patches = _Table(self)

    def adopt_exec(self, old: CompiledGraph) -> bool:
        """Take over ``old``'s executable graph through cuGraphExecUpdate when the topology is the same.

        On success this graph uses old's exec and old's node handles (exec-node updates must name nodes of
        the graph the exec was instantiated from) and old must not destroy them. Returns False if the
        driver refuses, leaving both graphs as they were.
        """
        if (old.exec is None or self.regions or old.regions or old.plan.topology() != self.plan.topology()
                or any(after is not None for _, after in old.spares)):
            return False  # (a graph with regions: its condition kernels pass handles of the graph they were made in)
        drv = self.api
        mine_spares: list = []
        if old.spares:  # the same spares after the end, or the topologies differ
            mine_spares, _ = self._make_spares(drv, self.graph, self.plan, self.nodes)
            if len(mine_spares) != len(old.spares):
                for h, _ in mine_spares:
                    drv.cuGraphDestroyNode(h)
                return False
        err, _info = drv.cuGraphExecUpdate(old.exec, self.graph)
        if err:
            for h, _ in mine_spares:
                drv.cuGraphDestroyNode(h)
            return False
        for mine, theirs in zip(self.nodes, old.nodes, strict=True):
            mine.adopt(theirs.handle)
        self.spares, old.spares = old.spares, []
        self.keeps = self.keeps | old.keeps  # (the code its spares name)
        check(drv.cuGraphDestroy(self.graph), "cuGraphDestroy")
        self.graph, old.graph = old.graph, None
        self.exec, old.exec = old.exec, None
        self._disable_spares()  # (in the executable graph, whatever the update made of them)
        self.growable = False  # the template's nodes hold old's parameters, the executable graph this one's
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
            self.touched.add(nid)
            node = self.nodes[nid]
            how = node.rebind(buffer_id, ptr)
            if how is STAGED:
                self._dirty.add(nid)
            elif how is APPLY:
                node.apply(self.api, self.exec, node.handle, self._ctx)
            elif how is RECAPTURE:
                calls.append(nid)
        return calls

    def set_copy_bytes(self, node_id: int, nbytes: int) -> None:
        """Make copy node ``node_id`` copy ``nbytes`` from now on (applied to the executable graph at once)."""
        node = self.nodes[node_id]
        self.touched.add(node_id)
        node.set_bytes(nbytes)
        node.apply(self.api, self.exec, node.handle, self._ctx)

    def set_launch(self, node_id: int, launch: Launch) -> None:
        self.touched.add(node_id)
        self.nodes[node_id].set_launch(launch)
        self._dirty.add(node_id)

    def set_function(self, node_id: int, function) -> None:
        self.touched.add(node_id)
        self.nodes[node_id].set_function(function)
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
        """The Recapture tier: capture a library call node again and swap it into the executable graph."""
        self.touched.add(node_id)
        self.nodes[node_id].recapture(self.api, self.exec, capture, self.pointers)

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

    def _eager_level(self, levels: dict, level, stream, check_each: bool, around=None, skip=()) -> None:
        for nid in levels.get(level, ()):
            node = self.nodes[nid]
            if node.condition_of() is not None or nid in skip:
                continue  # a condition kernel (or an unrolled loop's IF): its region decides on the host
            if around is not None and node.timed:
                around(node.plan, lambda nid=nid: self._eager_node(levels, nid, level, stream, check_each))
            else:
                self._eager_node(levels, nid, level, stream, check_each)

    def _eager_node(self, levels: dict, nid: int, level, stream, check_each: bool) -> None:
        node = self.nodes[nid]
        if not node.conditional:
            self._eager((nid,), stream, check_each)
            return
        setter = next(n for n in self.nodes if n.condition_of() == nid and self.plan.parents.get(n.plan.id) == level)
        if node.plan.kind in ("if", "ifelse"):
            body = 0 if self._flag(setter, 1, 2, stream) else 1
            if body < node.plan.bodies:
                self._eager_level(levels, (nid, body), stream, check_each)
            return
        limit = int(setter.slots[2][0][setter.slots[2][1]])
        go = limit > 0 and (not isinstance(setter.plan.args[3], BufferArg) or self._flag(setter, 3, 4, stream))
        # the levels the passes run at: the loop's body, then the nested IF of each further copy of an unrolled
        # body (rxcuda.plan._regions), each closed by a step kernel; a copy's IF is decided here, not by its flag
        inner = {n.plan.id for n in self.nodes
                 if n.conditional and n.plan.id != nid and getattr(n.plan, "region", None) == node.plan.region}
        copies = [(nid, 0)]
        while (nxt := next((i for i in levels.get(copies[-1], ()) if i in inner), None)) is not None:
            copies.append((nxt, 0))
        closing = inner | {nid}
        steps = [next(self.nodes[i] for i in levels.get(lvl, ()) if self.nodes[i].condition_of() in closing
                      and getattr(self.nodes[i].plan, "kernel", "") != "clear") for lvl in copies]
        passes = 0
        while go:
            for lvl, step in zip(copies, steps, strict=True):
                self._eager_level(levels, lvl, stream, check_each, skip=inner)
                passes += 1
                go = passes < limit and (not isinstance(step.plan.args[2], BufferArg) or self._flag(step, 2, 3, stream))
                if not go:
                    break

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
            if not node.eager:
                continue  # a region is decided by the caller; stamps time graph launches only
            try:
                node.run(drv, stream)
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
            node.release(drv)
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
