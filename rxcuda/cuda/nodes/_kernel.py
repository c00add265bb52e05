"""Kernel nodes: a block's kernel launch (or a region's condition kernel), its arguments in persistent memory.

Every kernel node of a graph keeps its arguments in one native buffer of 8-byte slots with a pointer array
into it (:class:`ArgStorage`: what the driver reads at add/update time). A hot update writes the new value
into that buffer through a typed NumPy view made at build time, and the graph applies the node's parameters
with one cuGraphExecKernelNodeSetParams (``CompiledGraph.flush`` and its ``hot`` table, bound at build time).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from ...model import _dtypes
from ...model._describe import Launch
from ...model._graphplan import BufferArg, HandleArg, KernelNodePlan, ScalarArg
from .._driver import check, drv
from ._base import STAGED, BuildContext, GraphNode


class ArgStorage:
    """The arguments of every kernel node of one graph in one native buffer of 8-byte slots, and the
    pointer array the driver reads (``kernelParams`` of each node points into it). Made once per build:
    a node's slot is then a (typed view of the whole buffer, index) pair, written in place by updates.

    ``previous``: the storage of the graph built before from a plan that began with the same kernel node
    plans (the same objects, as the planner's ``Replanner`` reuses them): the layout of those leading nodes
    is the same, so it is copied, with the words they were built with (``sealed``), and a node whose buffers
    kept their addresses is then made without writing its arguments again (``KernelNode.follow``)."""

    def __init__(self, plans: list[KernelNodePlan], previous: ArgStorage | None = None):
        starts: dict[int, tuple[int, list[int]]] = {}
        offsets: list[int] = []
        marks: list[tuple[int, int]] = []  # after each plan: (offsets, words) so far
        words = 0
        same = 0
        if previous is not None and previous.sealed is not None:
            was = previous.plans
            limit = min(len(plans), len(was))
            while same < limit and plans[same] is was[same]:
                same += 1
            if same:
                marks = previous.marks[:same]
                n_offsets, words = marks[-1]
                offsets = previous.offsets[:n_offsets]
                starts = {n.id: previous.starts[n.id] for n in plans[:same]}
        # what ``fill`` writes for the plans after ``same``, gathered here: the buffer arguments' words and buffer ids,
        # each kind of scalar's words and values, and each conditional handle (node id -> [(argument, word, region)]:
        # written by the node, once the regions made their handles)
        buffer_words: list[int] = []
        buffer_ids: list[int] = []
        scalars: dict[tuple, tuple[list[int], list]] = {}
        self.handle_args: dict[int, list[tuple[int, int, int]]] = {}
        # (the loop runs once per argument of every node: 4000 for 1000 nodes of four arguments; its lists' appends
        # are bound once, and a group of scalars is found by its (dtype, size) fields read by index)
        put, put_word, put_id = offsets.append, buffer_words.append, buffer_ids.append
        for n in plans[same:]:
            first = len(offsets)
            for a in n.args:
                put(words)
                t = type(a)
                if t is BufferArg:
                    put_word(words)
                    put_id(a[0])
                    words += 1
                    continue
                if t is ScalarArg:
                    size = a[3]
                    group = scalars.get((a[2], size))
                    if group is None:
                        group = scalars[a[2], size] = ([], [])
                    group[0].append(words)
                    group[1].append(a[4])
                    words += 1 if 0 <= size <= 8 else -(-max(size, 1) // 8)
                    continue
                if t is HandleArg:
                    self.handle_args.setdefault(n.id, []).append((len(offsets) - 1 - first, words, a.region))
                else:  # (any other argument: a word per 8 bytes of its size, as a scalar's)
                    group = scalars.get((a.dtype, a.size))
                    if group is None:
                        group = scalars[a.dtype, a.size] = ([], [])
                    group[0].append(words)
                    group[1].append(a.value)
                words += -(-max(a.size, 1) // 8)
            starts[n.id] = (first, offsets[first:])
            marks.append((len(offsets), words))
        self._pending = (buffer_words, buffer_ids, scalars)
        self.words = np.zeros(max(words, 1), dtype=np.uint64)
        if same:
            self.words[:marks[same - 1][1]] = previous.sealed[:marks[same - 1][1]]  # type: ignore[union-attr]
        base = self.words.ctypes.data
        self.ptrs = np.asarray(offsets or [0], dtype=np.uint64) * np.uint64(8) + np.uint64(base)
        self.ptrs_base = self.ptrs.ctypes.data
        self.starts = starts
        self.plans = plans
        self.offsets = offsets
        self.marks = marks
        self.same = same  # leading plans whose layout and built words came from ``previous``
        self.sealed: np.ndarray | None = None  # the words as built (``seal``): what a later storage copies
        self._typed: dict[np.dtype, np.ndarray] = {np.dtype(np.uint64): self.words}
        self.scalar_views: dict[tuple, tuple[np.ndarray, int]] = {}  # (dtype, size) -> see scalar_view
        # each node's CUDA_KERNEL_NODE_PARAMS, in the plans' order (``row``): what the driver reads when the node is
        # added or updated (``KernelNode.params_ptr``), written for all of them at once (``fill``)
        self.structs = np.zeros(max(len(plans), 1) * STRIDE, dtype=np.uint8)
        self.structs_base = self.structs.ctypes.data
        self.row = {n.id: i for i, n in enumerate(plans)}
        self.filled = False  # the structs, by ``fill``
        self.written = False  # the arguments of the plans after ``same``, by ``fill``

    def fill(self, functions: Mapping[str, object], pointers: Mapping[int, int]) -> None:
        """Write the arguments of the plans after ``same`` (their buffers' addresses from ``pointers``, their scalars'
        values: conditional handles are the nodes' to write), a kind of argument at a time, and every plan's
        CUDA_KERNEL_NODE_PARAMS (its function from ``functions`` by code key, its launch, the address of its
        arguments' pointers) column by column: element by element, and a struct made through cuda.bindings, cost
        ~4 µs a node; a build of 1000 kernel nodes writes all of it in ~1 ms."""
        buffer_words, buffer_ids, scalars = self._pending
        self._pending = ((), (), {})
        if buffer_words:
            self.words[np.array(buffer_words)] = np.fromiter(map(pointers.__getitem__, buffer_ids), dtype=np.uint64,
                                                             count=len(buffer_ids))
        for (dtype, size), (at, values) in scalars.items():
            view, itemsize = self.scalar_view(dtype, size)
            idx = np.array(at) * 8 // itemsize
            try:
                view[idx] = values
            except (TypeError, ValueError, OverflowError):  # (as the element-by-element write would convert them)
                for i, v in zip(idx.tolist(), values, strict=True):
                    view[i] = v
        self.written = True
        plans, layout = self.plans, _layout()
        if layout is None or not plans:
            return
        rows = self.structs[:len(plans) * STRIDE].view(layout)
        n = len(plans)
        keys = [p.code_key for p in plans]
        ints = {key: int(functions[key]) for key in set(keys)}  # type: ignore[call-overload]
        rows["func"] = np.fromiter(map(ints.__getitem__, keys), dtype=np.uint64, count=n)
        # the launches: the few distinct ones in a table (the blocks of one kernel share its Launch object),
        # picked per node by index, instead of a NumPy array made from a thousand tuples
        distinct: list = []
        at: dict[int, int] = {}
        pick = []
        for p in plans:
            la = p.launch
            k = at.get(id(la))
            if k is None:
                k = at[id(la)] = len(distinct)
                distinct.append(la)  # (held: its id is not reused while the table stands)
            pick.append(k)
        table = np.array([(*la.grid, *la.block, la.shared_mem) for la in distinct], dtype=np.uint32)
        picked = table[np.array(pick, dtype=np.intp)]
        for i, axis in enumerate("xyz"):
            rows["grid" + axis] = picked[:, i]
            rows["block" + axis] = picked[:, 3 + i]
        rows["shared"] = picked[:, 6]
        # each node's first pointer, from the marks (offsets so far after each node); none for a node of no arguments
        after = np.array([m[0] for m in self.marks], dtype=np.uint64)
        first = np.concatenate((np.zeros(1, dtype=np.uint64), after[:-1]))
        rows["args"] = np.where(after > first, first * np.uint64(8) + np.uint64(self.ptrs_base), np.uint64(0))
        self.filled = True

    def typed(self, dt: np.dtype) -> np.ndarray:
        view = self._typed.get(dt)
        if view is None:
            view = self._typed[dt] = self.words.view(dt)
        return view

    def scalar_view(self, dtype: str | None, size: int) -> tuple[np.ndarray, int]:
        """(the typed view a scalar argument of ``dtype`` and ``size`` bytes is written through, its item
        size): its dtype, or an unsigned integer of its size when the two disagree. Worked out once per
        storage and kind of scalar (``scalar_views``): a build writes thousands of scalars of a few kinds."""
        found = self.scalar_views.get((dtype, size))
        if found is None:
            n = max(size, 1)
            dt = _dtypes.to_numpy(dtype) if dtype else None
            if dt is None or dt.itemsize != n:
                dt = _BY_SIZE.get(n, _BY_SIZE[1])
            found = self.scalar_views[dtype, size] = (self.typed(dt), dt.itemsize)
        return found

    def slots_of(self, plan: KernelNodePlan) -> list[tuple[np.ndarray, int]]:
        """(typed view, index) of each argument of ``plan``: where a value of its type is written."""
        u64, views = self.words, self.scalar_views
        slots = []
        for a, w in zip(plan.args, self.starts[plan.id][1], strict=True):
            if type(a) is ScalarArg:
                view, itemsize = views.get((a.dtype, a.size)) or self.scalar_view(a.dtype, a.size)
                slots.append((view, w * 8 // itemsize))
            else:
                slots.append((u64, w))
        return slots

    def seal(self) -> None:
        """The build wrote every argument: keep a copy of the words as built (updates change ``words``)."""
        self.sealed = self.words.copy()


_BY_SIZE = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}

STRIDE = 80  # bytes per CUDA_KERNEL_NODE_PARAMS in ArgStorage.structs (the driver's v2 struct takes 72)


@functools.cache
def _layout() -> np.dtype | None:
    """CUDA_KERNEL_NODE_PARAMS as the driver reads it, as a NumPy record of ``STRIDE`` bytes: each field's offset
    found by writing a distinct value through cuda.bindings' own struct over zeroed memory and looking for its
    bytes (None where a field is not found: nodes then write their structs through cuda.bindings)."""
    mem = np.zeros(2 * STRIDE, dtype=np.uint8)
    p = drv.CUDA_KERNEL_NODE_PARAMS(_ptr=mem.ctypes.data)
    probes = {"func": 0x0102030405060708, "args": 0x1112131415161718}
    small = {f"{kind}{axis}": 0x21 + 3 * j + i for j, kind in enumerate(("grid", "block")) for i, axis in
             enumerate("xyz")}
    small["shared"] = 0x2A
    try:
        p.func = drv.CUfunction(probes["func"])
        p.kernelParams = probes["args"]
        p.gridDimX, p.gridDimY, p.gridDimZ = small["gridx"], small["gridy"], small["gridz"]
        p.blockDimX, p.blockDimY, p.blockDimZ = small["blockx"], small["blocky"], small["blockz"]
        p.sharedMemBytes = small["shared"]
    except Exception:
        return None
    raw = mem.tobytes()
    offsets: dict[str, int] = {}
    for name, v in probes.items():
        offsets[name] = raw.find(v.to_bytes(8, "little"))
    for name, v in small.items():
        offsets[name] = raw.find(v.to_bytes(4, "little"))
    if min(offsets.values()) < 0 or max(offsets.values()) + 8 > STRIDE:
        return None
    names = list(offsets)
    return np.dtype({"names": names, "offsets": [offsets[k] for k in names], "itemsize": STRIDE,
                     "formats": [np.uint64 if k in probes else np.uint32 for k in names]})


class KernelNode(GraphNode):
    """Driver-side state of one kernel node: node handle, params struct, and its argument slots in the
    graph's ArgStorage (``slots[i]``: the (typed view, index) of argument i). ``handle_slots``: argument
    index -> region node id, for each argument that passes a region's conditional handle."""

    __slots__ = ("_params", "_slots", "_buffer_args", "_handle", "handle_int", "params_ptr", "handle_slots",
                 "starts_at", "storage")

    kind = "kernel"
    eager = True
    timed = True

    def __init__(self, plan: KernelNodePlan, function, pointers: Mapping[int, int], storage: ArgStorage,
                 handles: Mapping[int, object] | None = None):
        super().__init__(plan)
        self.storage = storage  # the ArgStorage its kernelParams point into (kept alive with the node)
        self._slots = self._buffer_args = None
        self.handle_slots: dict[int, int] = {}
        if storage.written and storage.row[plan.id] >= storage.same:  # its arguments are in the storage already
            u64 = storage.words
            for i, w, region in storage.handle_args.get(plan.id, ()):  # a condition kernel's conditional handles
                u64[w] = handles[region] if handles else 0
                self.handle_slots[i] = region
        else:
            self._write(pointers, handles)
        self._bind(function, storage)

    def _write(self, pointers: Mapping[int, int], handles: Mapping[int, object] | None) -> None:
        """Write the node's arguments into its storage, one by one."""
        for i, (a, (view, idx)) in enumerate(zip(self.plan.args, self.slots, strict=True)):
            if isinstance(a, BufferArg):
                view[idx] = pointers[a.buffer]
            elif isinstance(a, HandleArg):
                view[idx] = handles[a.region] if handles else 0
                self.handle_slots[i] = a.region
            else:
                view[idx] = a.value

    @property
    def slots(self) -> list[tuple[np.ndarray, int]]:
        """Argument i's (typed view of the storage, index) (made on first use: ``ArgStorage.slots_of``)."""
        slots = self._slots
        if slots is None:
            slots = self._slots = self.storage.slots_of(self.plan)
        return slots

    @property
    def buffer_args(self) -> dict[int, list[int]]:
        """Buffer id -> the indices of the arguments that pass it (made on first use)."""
        found = self._buffer_args
        if found is None:
            found = self._buffer_args = {}
            for i, a in enumerate(self.plan.args):
                if type(a) is BufferArg:
                    found.setdefault(a.buffer, []).append(i)
        return found

    @property  # type: ignore[override]
    def handle(self):
        """The node's CUgraphNode (made on first use from ``handle_int`` where the graph was added in one call)."""
        h = self._handle
        if h is None and self.handle_int:
            h = self._handle = drv.CUgraphNode(self.handle_int)
        return h

    @handle.setter
    def handle(self, h) -> None:
        self._handle = h

    @classmethod
    def follow(cls, old: KernelNode, function, storage: ArgStorage) -> KernelNode:
        """The node of ``old``'s plan in a graph whose argument storage copied ``old``'s words as built (its
        buffers kept their addresses, and it passes no conditional handle): the slots are the same places
        in the new storage, and nothing is written there."""
        node = cls.__new__(cls)
        node.plan = old.plan
        node.handle = None
        node._slots = None  # (the same places in the new storage: ArgStorage.slots_of)
        node._buffer_args = old._buffer_args  # (never changed after a build: shared)
        node.handle_slots = {}
        node.storage = storage
        node._bind(function, storage)
        return node

    def _bind(self, function, storage: ArgStorage) -> None:
        """The node's CUDA_KERNEL_NODE_PARAMS: its row of ``storage.structs`` (``params_ptr``, the struct's address,
        is what the driver reads), written there already by ``ArgStorage.fill``, else here through ``params``:
        its function, its plan's launch, its arguments' address."""
        self.params_ptr = storage.structs_base + STRIDE * storage.row[self.plan.id]
        self._params = None
        self.handle_int = 0
        if not storage.filled:
            p = self.params
            p.func = function
            la = self.plan.launch
            p.gridDimX, p.gridDimY, p.gridDimZ = la.grid
            p.blockDimX, p.blockDimY, p.blockDimZ = la.block
            p.sharedMemBytes = la.shared_mem
            p.kernelParams = storage.ptrs_base + 8 * storage.starts[self.plan.id][0] if self.plan.args else 0

    @property
    def params(self):
        """The node's CUDA_KERNEL_NODE_PARAMS as a cuda.bindings struct over its row of the storage (made on first
        use: what driver calls through cuda.bindings take; writing its fields writes the row)."""
        p = self._params
        if p is None:
            p = self._params = drv.CUDA_KERNEL_NODE_PARAMS(_ptr=self.params_ptr)
        return p

    @classmethod
    def prepare(cls, plans: list, b: BuildContext) -> None:
        was = b.previous
        b.args = ArgStorage(plans, was.args if was is not None and isinstance(was.args, ArgStorage) else None)
        b.args.fill(b.functions, b.pointers)

    @classmethod
    def make_all(cls, plans: list[KernelNodePlan], b: BuildContext) -> list[KernelNode]:
        """``[make(p, b) for p in plans]``: where no node can follow an earlier graph's and ``fill`` wrote every
        argument and struct with no conditional handle among them (a cold build), each node is only its fields,
        set in one loop (1000 nodes: ~0.4 ms against ~1.2 through ``make``)."""
        storage = b.args
        if (b.previous is not None and storage.same) or not (storage.written and storage.filled) \
                or storage.handle_args:
            return [cls.make(p, b) for p in plans]
        new, base, row, starts = cls.__new__, storage.structs_base, storage.row, storage.starts
        nodes = []
        for p in plans:
            node = new(cls)
            node.plan = p
            node._handle = node._params = node._slots = node._buffer_args = None
            node.handle_int = 0
            node.handle_slots = {}
            node.storage = storage
            node.params_ptr = base + STRIDE * row[p.id]
            node.starts_at = starts[p.id]
            nodes.append(node)
        return nodes

    @classmethod
    def make(cls, plan, b: BuildContext) -> KernelNode:
        was = b.previous
        if was is not None and b.args.same and plan.id < len(was.nodes):
            old = was.nodes[plan.id]
            if old.plan is plan and not old.handle_slots and b.args.starts[plan.id] is old.starts_at:
                built, pointers = b.built, b.pointers
                if all(pointers[a] == built[a] for a in old.buffer_args):
                    node = cls.follow(old, b.functions[plan.code_key], b.args)
                    node.starts_at = old.starts_at
                    return node
        node = cls(plan, b.functions[plan.code_key], b.pointers, b.args, b.handles)
        node.starts_at = b.args.starts[plan.id]
        return node

    def add(self, api, graph, deps: list, ctx) -> None:
        super().add(api, graph, deps, ctx)
        self.handle_int = int(self.handle)  # type: ignore[call-overload]

    def remove(self, api) -> None:
        super().remove(api)
        self.handle_int = 0

    def set_template(self, api) -> None:
        """Give the node in its (not executable) graph the current parameters (``cuGraphKernelNodeSetParams``):
        what a graph instantiated from it later starts with."""
        check(api.cuGraphKernelNodeSetParams(self.handle, self.params),
              f"cuGraphKernelNodeSetParams ({self.plan.label})")

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        result = api.cuGraphAddKernelNode(graph, deps, len(deps), self.params)
        if result[0]:  # the message is formatted only for an error (a build adds a node per kernel)
            check(result, f"cuGraphAddKernelNode ({what})")
        return result[1]

    def mirror(self, api, graph, deps: list, ctx, batch) -> object:
        # a condition kernel passes its region's handle, which belongs to the graph: the copy gets its own
        # argument memory holding the other graph's handles
        params = batch.own_params(self) if self.handle_slots else self.params
        return check(api.cuGraphAddKernelNode(graph, deps, len(deps), params), "cuGraphAddKernelNode (batch)")

    def adopt(self, handle) -> None:
        self.handle = handle
        self.handle_int = int(handle)

    def added_as(self, handle: int) -> None:
        """The node was added to its graph as ``handle`` (an int: its CUgraphNode is made on first use)."""
        self._handle = None
        self.handle_int = handle

    def condition_of(self) -> int | None:
        return next(iter(self.handle_slots.values()), None)

    def buffers(self) -> tuple[int, ...]:
        return tuple(self.buffer_args)

    def rebind(self, buffer_id: int, ptr: int) -> str:
        for i in self.buffer_args[buffer_id]:
            view, idx = self.slots[i]
            view[idx] = ptr
        return STAGED

    def apply(self, api, graph_exec, handle, ctx) -> None:
        check(api.cuGraphExecKernelNodeSetParams(graph_exec, handle, self.params), "cuGraphExecKernelNodeSetParams")

    def set_function(self, function) -> None:
        self.params.func = function

    def set_launch(self, launch: Launch) -> None:
        p = self.params
        p.gridDimX, p.gridDimY, p.gridDimZ = launch.grid
        p.blockDimX, p.blockDimY, p.blockDimZ = launch.block
        p.sharedMemBytes = launch.shared_mem

    def run(self, api, stream) -> None:
        p = self.params
        check(api.cuLaunchKernel(p.func, p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY,
                                 p.blockDimZ, p.sharedMemBytes, stream, p.kernelParams, 0),
              f"cuLaunchKernel ({self.plan.label})")

    @classmethod
    def kernel_of(cls, plan) -> KernelNodePlan | None:
        return plan

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        la = plan.launch
        extra = f", {la.shared_mem} B shared" if la.shared_mem else ""
        return plan.label, f"grid {_dims(la.grid)} x block {_dims(la.block)}{extra}"


def _dims(d: tuple[int, ...]) -> str:
    d = tuple(d)
    while len(d) > 1 and d[-1] == 1:
        d = d[:-1]
    return "x".join(str(v) for v in d)
