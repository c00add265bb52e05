"""The compiled graph: build a GraphPlan into a CUDA graph, instantiate, launch, update in place.

Each node is built by its kind (``rxcuda.cuda.nodes``: kernel, memset, copy, captured call, region, stamp),
looked up once per node when the graph is built; updates call the nodes' own methods. Kernel nodes keep their
arguments in one persistent native buffer (``nodes.ArgStorage``): a hot update writes the new value into it
through a typed NumPy view made at build time and calls cuGraphExecKernelNodeSetParams once per touched node.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from operator import is_

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
        self.functions = functions  # the loaded functions by code key it was built with (see ``grow``)
        self.held: tuple = ()  # argument storages of nodes taken over from an earlier graph (``grow``)
        # grow: whether the template still matches the exec (False with regions, stamps, another device's
        # crossing, or after a failed grow), and the nodes changed in the exec only since the build
        self.growable = crossing is None and stamps is None
        self.touched: set[int] = set()
        self.plain = 0  # leading nodes known to be kernel nodes passing no conditional handle (grow)
        # the code keys its executable graph names beyond its plan's (nodes ``shrink`` disabled in it): their modules
        # stay loaded while it lives
        self.keeps: frozenset[str] = frozenset()
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
                    continue  # taken out of the template by a grow that failed (see ``grow``)
                for b in node.buffers():
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

    def upload(self, stream) -> None:
        """Upload the executable graph to the device in ``stream`` without running it (``cuGraphUpload``):
        what its first launch would do, paid here (off the frame thread, by a graph prepared there)."""
        check(self.api.cuGraphUpload(self.exec, stream), "cuGraphUpload")

    def _arm(self) -> None:
        """Bind the frame's launch and the patch table's exec-node updates to this executable graph."""
        self.launcher = self.fast.launcher(self._exec_h)
        self.patches = _Table(self)

    @classmethod
    def grow(cls, old: CompiledGraph, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
             present: frozenset | set, capture: Capture | None = None) -> CompiledGraph | None:
        """``plan``'s graph made from ``old``'s template graph in place, or None where that does not apply.

        For the common live edit, nodes added after or removed from the end of a plan that begins with
        ``old``'s nodes (the same node plans: the planner's ``Replanner`` keeps them): the leading nodes stay
        in ``old``'s template graph as they are (a node whose buffers moved, as an output that became an
        intermediate and now shares memory, gets its new pointers there: ``cuGraphKernelNodeSetParams``),
        the new nodes are added after their dependencies, the old trailing nodes are destroyed
        (``cuGraphDestroyNode``), and the template is instantiated anew; ``old``'s executable graph is
        independent of its template once instantiated and keeps running until it is retired. The template,
        and the nodes kept, are the new graph's from then on (``old.close`` leaves them).

        Applies only on the thread that runs ``old`` (its template is touched; a CUgraph is not thread-safe),
        to flat graphs of kernel nodes without regions or stamps whose executable graph still matches the
        template (``growable``, ``touched``), whose functions are the same objects, and where every node
        removed belongs to a block no longer in the pipeline (``present``: the ids of those that are), so
        that nothing will update it in ``old``'s executable graph again. On failure, the nodes added are
        destroyed, the kept nodes' arguments are restored and ``old`` keeps running (it takes no more grows).
        """
        k = cls._kept(old, plan, functions, pointers, present)
        if k is None:
            return None
        drv, graph, ctx = old.api, old.graph, old._ctx
        g = cls.__new__(cls)
        g.plan, g.stamps, g.api, g.fast, g._ctx, g._exec_h = plan, None, drv, old.fast, ctx, 0
        g.pointers = dict(pointers)
        g.built = g.pointers.copy()
        g.exec, g._dirty, g.functions, g.regions = None, set(), functions, False
        g.growable, g.touched, g.plain, g.keeps = True, set(), k, frozenset()  # (instantiated anew: no others)
        g.patches, g._consumers = _Table(g), None
        kept = old.nodes[:k]
        gone = old.nodes[k:]
        tail = plan.nodes[k:]
        kinds = [kind_of(n) for n in tail]
        b = BuildContext(drv, ctx, graph, functions, pointers, capture)
        by_kind: dict[type[GraphNode], list] = {}
        for n, kd in zip(tail, kinds, strict=True):
            by_kind.setdefault(kd, []).append(n)
        for kd, plans in by_kind.items():
            kd.prepare(plans, b)
        g.args = b.args
        held = old.held + ((old.args,) if old.args is not None else ())
        if len(held) > 4:  # keep only the storages some kept node points into
            live = {id(n.storage) for n in kept}
            held = tuple(st for st in held if id(st) in live)
        g.held = held
        # kept nodes whose buffers moved: the new pointers in their arguments and in the template's node
        moved = cls._moved(old, pointers)
        saved: list = []  # (node, [(view, index, old word)]) to restore on failure
        nodes = list(kept)
        added: list = []
        try:
            if moved:
                saved = cls._repoint(kept, moved, pointers)
                for node, _ in saved:
                    node.set_template(drv)
            for n, kd in zip(tail, kinds, strict=True):
                node = kd.make(n, b)
                node.add(drv, graph, [nodes[d].handle for d in plan.deps[n.id]], ctx)
                nodes.append(node)
                added.append(node)
            if isinstance(g.args, ArgStorage):
                g.args.seal()
            for node in gone:
                node.remove(drv)
            g.exec = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except BaseException:
            for node in added:
                drv.cuGraphDestroyNode(node.handle)  # (an undo: its own error would hide the first)
                node.release(drv)
            for node in cls._restore(saved):
                drv.cuGraphKernelNodeSetParams(node.handle, node.params)
            if any(node.handle is None for node in gone):
                old.growable = False  # its template lost nodes its executable graph still runs
                old._consumers = None
            raise
        g.nodes = nodes
        old.graph = None  # the template is the new graph's now
        g.graph = graph
        g._exec_h = int(g.exec)
        g._arm()
        return g

    @classmethod
    def shrink(cls, old: CompiledGraph, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
               present: frozenset | set) -> CompiledGraph | None:
        """``plan``'s graph made from ``old``'s by taking its trailing nodes out, without instantiating anything;
        None where that does not apply.

        For the other half of the common live edit, nodes removed from the end of a plan that is otherwise
        ``old``'s (the same node plans, in the same order, with the same dependencies): the removed nodes are
        disabled in ``old``'s executable graph (``cuGraphNodeSetEnabled``: a disabled node does nothing when the
        graph runs, so the buffers it named may go) and destroyed in its template, a kept node whose buffers moved
        gets its new pointers in both (``cuGraphExecKernelNodeSetParams``, ``cuGraphKernelNodeSetParams``), and
        the new graph takes both over: a removal costs a few driver calls per node instead of an instantiation,
        an upload and the old executable graph's destruction. The executable graph then has nodes its template
        lacks; they are never named again (a later grow instantiates the template anew).

        Applies where ``grow`` does (see there: the thread that runs ``old``, flat graphs of kernel nodes, a
        template that matches the executable graph, nodes removed only of blocks that left), where the removed
        nodes run code that a kept node runs too (``keeps``: their modules stay loaded while the executable graph
        lives, and nothing would unload them now anyway). Where the driver
        refuses a call before the first node is destroyed, ``old`` is left as it was (the nodes disabled so far
        enabled again, the arguments restored) and None is returned (the caller builds otherwise); a failure to
        destroy a node raises, leaving ``old`` as a failed ``grow`` does.
        """
        k = cls._kept(old, plan, functions, pointers, present)
        if k is None or k != len(plan.nodes):
            return None
        drv, exec_h = old.api, old.exec
        kept, gone = old.nodes[:k], old.nodes[k:]
        # a removed node names its function in the executable graph as long as it lives: only where a kept node runs
        # the same code (its module stays loaded anyway), so that removing a block still unloads code nothing runs
        codes = {node.plan.code_key for node in gone}
        if not codes <= {n.code_key for n in plan.nodes}:
            return None
        moved = cls._moved(old, pointers)
        off: list = []
        saved: list = []  # (node, [(view, index, old word)]) to restore on failure
        try:
            for node in gone:
                check(drv.cuGraphNodeSetEnabled(exec_h, node.handle, 0), f"cuGraphNodeSetEnabled ({node.plan.label})")
                off.append(node)
            if moved:
                saved = cls._repoint(kept, moved, pointers)
                for node, _ in saved:
                    node.apply(drv, exec_h, node.handle, old._ctx)
                    node.set_template(drv)
        except BaseException as e:
            for node in off:
                drv.cuGraphNodeSetEnabled(exec_h, node.handle, 1)  # (an undo: its own error would hide the first)
            for node in cls._restore(saved):
                drv.cuGraphExecKernelNodeSetParams(exec_h, node.handle, node.params)
                drv.cuGraphKernelNodeSetParams(node.handle, node.params)
            if isinstance(e, CudaError):
                return None
            raise
        try:
            for node in gone:
                node.remove(drv)
        except BaseException:
            old.growable = False  # its template lost nodes (disabled in its executable graph, which runs on)
            old._consumers = None
            raise
        g = cls.__new__(cls)
        g.plan, g.stamps, g.api, g.fast, g._ctx = plan, None, drv, old.fast, old._ctx
        g.pointers = dict(pointers)
        g.built = g.pointers.copy()
        g._dirty, g.functions, g.regions = set(), functions, False
        g.growable, g.touched, g.plain, g.keeps = True, set(), k, old.keeps | codes
        g.patches, g._consumers = _Table(g), None
        g.args = None  # (no node of its own: the kept nodes' arguments are in the storages it holds)
        g.held = old.held + ((old.args,) if old.args is not None else ())
        g.nodes = list(kept)
        g.graph, g.exec = old.graph, exec_h
        old.graph = old.exec = None  # (both are the new graph's now: closing old frees neither)
        g._exec_h = int(exec_h)
        g._arm()
        return g

    @staticmethod
    def _repoint(nodes, moved: set[int], pointers: Mapping[int, int]) -> list:
        """Write the new address (``pointers``) of each buffer in ``moved`` into the arguments of the ``nodes`` that
        use it; [(node, [(view, index, old word), ...]), ...] for the nodes changed (what ``_restore`` undoes)."""
        saved = []
        for node in nodes:
            if moved.isdisjoint(node.buffer_args):
                continue
            words = []
            for bid in moved.intersection(node.buffer_args):
                for i in node.buffer_args[bid]:
                    view, idx = node.slots[i]
                    words.append((view, idx, int(view[idx])))
                    view[idx] = pointers[bid]
            saved.append((node, words))
        return saved

    @staticmethod
    def _restore(saved: list) -> list:
        """Put back the words ``_repoint`` replaced; the nodes whose arguments it restored."""
        for _, words in saved:
            for view, idx, word in words:
                view[idx] = word
        return [node for node, _ in saved]

    @staticmethod
    def _moved(old: CompiledGraph, pointers: Mapping[int, int]) -> set[int]:
        """The buffers ``old`` was built with that have another address in ``pointers`` (the items' difference
        is taken in C; a buffer ``old`` lacked has not moved)."""
        built = old.built
        return {bid for bid, _ in pointers.items() - built.items() if bid in built}

    @staticmethod
    def _kept(old: CompiledGraph, plan: GraphPlan, functions: Mapping[str, object], pointers: Mapping[int, int],
              present: frozenset | set) -> int | None:
        """How many leading nodes ``grow`` keeps of ``old``'s (None: it does not apply; see there)."""
        if (old.exec is None or old.graph is None or not old.growable or old.regions or plan.parents
                or plan.stamps is not None or old.plan.stamps is not None):
            return None
        was, now = old.plan.nodes, plan.nodes
        limit = min(len(was), len(now))
        k = limit
        if not all(map(is_, now[:limit], was[:limit])):  # (in C: an edit at the end keeps every one)
            k = 0
            while now[k] is was[k]:
                k += 1
        if not k or (k == len(was) and k == len(now)) or plan.deps[:k] != old.plan.deps[:k]:
            return None  # nothing kept, or nothing changed (the exec update's case)
        plain, nodes = old.plain, old.nodes
        while plain < k and type(nodes[plain]) is KernelNode and not nodes[plain].handle_slots:
            plain += 1
        old.plain = plain
        if plain < k or (old.touched and min(old.touched) < k):
            return None
        for node in old.nodes[k:]:
            if type(node) is not KernelNode or node.plan.block in present:
                return None
        for n in now[k:]:
            kd = kind_of(n)
            if kd.conditional or kd.starts_frame(n):
                return None
        for key, f in old.functions.items():
            if functions.get(key, f) is not f:
                return None
        return k

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
            mine.adopt(theirs.handle)
        check(drv.cuGraphDestroy(self.graph), "cuGraphDestroy")
        self.graph, old.graph = old.graph, None
        self.exec, old.exec = old.exec, None
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
