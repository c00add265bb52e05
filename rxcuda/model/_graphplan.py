"""The plan of a graph, as pure data: nodes in order, their dependencies, buffers and update slots.

The planner (``rxcuda.plan``) makes it; the CUDA layer (``rxcuda.cuda``) builds a graph from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NamedTuple

import attrs

from . import _dtypes
from ._describe import Launch, PortRef
from ._errors import Problem
from ._events import Tier
from ._provided import provided

# The plan's parts are named tuples: a plan of a large pipeline makes thousands of them on every rebuild,
# and a named tuple is built, hashed and compared in C.

# "mapped": host-mapped memory the host reads straight after a frame (a While's passes left: rxcuda.engine._loops)
BufferKind = Literal["external", "port", "internal", "zeros", "counter", "device_scalar", "delay", "mapped"]


class BufferPlan(NamedTuple):
    """A device buffer the graph uses. ``key`` is stable across rebuilds for the same port."""

    id: int
    key: tuple
    label: str
    dtype: str | None
    count: int  # type: ignore[assignment]  # the field shadows tuple.count, as in any named tuple with it
    kind: BufferKind

    @property
    def nbytes(self) -> int:
        size = _dtypes.itemsize(self.dtype) if self.dtype else 1
        return max(size * self.count, 4)


def sizes_in_bytes(buffers) -> list[int]:
    """Each buffer's ``nbytes``, its dtype's item size looked up once per dtype (the planner and the build size
    hundreds of buffers of a few dtypes at a time)."""
    itemsizes: dict = {}
    out = []
    for b in buffers:
        dtype = b.dtype
        if not dtype:
            out.append(max(b.count, 4))
            continue
        size = itemsizes.get(dtype)
        if size is None:
            size = itemsizes[dtype] = _dtypes.itemsize(dtype)
        n = size * b.count
        out.append(n if n > 4 else 4)
    return out


class BufferArg(NamedTuple):
    """A node argument that is a buffer's device pointer (``buffer``: its id in ``GraphPlan.buffers``)."""

    buffer: int


class ScalarArg(NamedTuple):
    """A node argument passed by value: ``size`` bytes of ``dtype`` holding ``value``, the value the block
    parameter ``name`` had when the plan was made, or a fixed default. A graph built from the plan starts
    with it; later values go into the graph's argument storage (the Parameters tier), never back here."""

    block: int
    name: str | None  # the block parameter feeding it; None: fixed at its default
    dtype: str | None
    size: int
    value: float | int


class HandleArg(NamedTuple):
    """A node argument that passes the conditional handle of the region node ``region`` (a value the driver
    makes when the graph is built: the condition kernels hand it to cudaGraphSetConditional)."""

    region: int
    size: int = 8


Arg = BufferArg | ScalarArg | HandleArg


class KernelNodePlan(NamedTuple):
    """A kernel launch of a block: its code (by content key), launch geometry, arguments, and the buffers it
    reads and writes (from which the planner derives the dependencies)."""

    id: int
    block: int
    kernel: str
    code_key: str
    launch: Launch
    args: tuple[Arg, ...]
    reads: frozenset[int]
    writes: frozenset[int]
    label: str


class CallNodePlan(NamedTuple):
    """A block's library call (or chain of calls), captured from a stream into a child graph."""

    id: int
    block: int
    call: str
    args: tuple[Arg, ...]
    reads: frozenset[int]
    writes: frozenset[int]
    label: str


@attrs.frozen
class MemsetNodePlan:
    """Sets ``count`` elements of a buffer to ``value`` each frame before its readers: an append port's counter
    reset, or the zero-fill of an If body's outputs before the region."""

    id: int
    buffer: int
    value: int
    count: int  # elements of ``element`` bytes
    label: str
    reads: frozenset[int] = frozenset()
    element: int = 4  # 4: 32-bit words; 1: bytes (a buffer whose size is no multiple of 4)

    @property
    def writes(self) -> frozenset[int]:
        return frozenset((self.buffer,))


class CopyNodePlan(NamedTuple):
    """Copies ``nbytes`` from buffer ``src`` to buffer ``dst`` on the device, once a frame: a delayed
    connection's producer buffer into its previous-frame buffer. It runs after every other node that writes
    ``src`` or uses ``dst`` (the planner emits it last), so next frame's readers see this frame's value. Also
    a While's pass counter into host-mapped memory (a ``mapped`` buffer), right after the While's node."""

    id: int
    src: int
    dst: int
    nbytes: int
    label: str
    reads: frozenset[int]
    writes: frozenset[int]


RegionKind = Literal["if", "ifelse", "while", "for"]


class RegionNodePlan(NamedTuple):
    """A region as one conditional graph node: its bodies (one, or two for ``ifelse``) hold the nodes of the
    region's blocks (``GraphPlan.parents`` says which), and run when a condition kernel on the device says
    so. ``reads``/``writes`` are everything the bodies use: outside the region it is one node that uses them."""

    id: int
    region: int  # the region's id in the pipeline description
    kind: RegionKind
    bodies: int
    reads: frozenset[int]
    writes: frozenset[int]
    label: str

    @property
    def loops(self) -> bool:
        """True when the body may run more than once in a frame (``while``, ``for``)."""
        return self.kind in ("while", "for")


class StampNodePlan(NamedTuple):
    """A profiling timestamp (a one-thread kernel reading the GPU's global timer into ``column`` of a ring in
    host memory), run once its dependencies are done; nothing waits for it. See :class:`StampLayout`."""

    id: int
    column: int
    label: str
    reads: frozenset[int] = frozenset()
    writes: frozenset[int] = frozenset()


class StampLayout(NamedTuple):
    """What the timestamps of a profiled plan measure: column 0 is the frame's start; column ``c`` ends unit
    ``names[c]`` (a block, or a kernel as ``block/kernel``; a region or a captured library call is one unit),
    which started when the last of its predecessor columns ``preds[c]`` ended. ``blocks[c]``: the unit's
    block id (None for column 0). ``per``: ``"block"`` or ``"kernel"``."""

    per: str
    names: tuple[str, ...]
    preds: tuple[tuple[int, ...], ...]
    blocks: tuple[int | None, ...]


class PeerCopyNodePlan(NamedTuple):
    """A connection between devices (``rxcuda.plan._placement``): copies ``nbytes`` of buffer ``src`` of device
    ``src_device``'s plan (a pointer of another device) into this plan's buffer ``dst``, once a frame, after
    the event wait that says the source is written. A peer copy where peer access is on; through pinned host
    memory where it is not (the copy's kind, ``cuda.nodes._peer``, picks)."""

    id: int
    src_device: int
    src: int
    dst: int
    nbytes: int
    label: str
    reads: frozenset[int] = frozenset()
    writes: frozenset[int] = frozenset()


class EventRecordNodePlan(NamedTuple):
    """Records event ``event`` (its index in the split's event table) once the nodes it depends on are done:
    another device's graph waits for it (an :class:`EventWaitNodePlan` of the same event)."""

    id: int
    event: int
    label: str
    reads: frozenset[int] = frozenset()
    writes: frozenset[int] = frozenset()


class EventWaitNodePlan(NamedTuple):
    """Waits for event ``event`` (recorded by another device's graph) before the nodes that depend on it."""

    id: int
    event: int
    label: str
    reads: frozenset[int] = frozenset()
    writes: frozenset[int] = frozenset()


NodePlan = (KernelNodePlan | CallNodePlan | MemsetNodePlan | RegionNodePlan | CopyNodePlan | StampNodePlan
            | PeerCopyNodePlan | EventRecordNodePlan | EventWaitNodePlan)


@attrs.frozen
class GraphPlan:
    """What to build: nodes in a valid order, their dependencies, buffers, and update slots."""

    nodes: tuple[NodePlan, ...]
    deps: tuple[tuple[int, ...], ...]
    buffers: tuple[BufferPlan, ...]
    port_buffers: Mapping[PortRef, int]
    counters: Mapping[PortRef, int]
    # (block, parameter) -> ((node id, arg index), ...) for kernel nodes
    slots: Mapping[tuple[int, str], tuple[tuple[int, int], ...]]
    # (block, parameter) -> device-scalar buffer id (library alpha/beta)
    device_scalars: Mapping[tuple[int, str], int]
    # (block, parameter) -> call node ids that must be recaptured when it changes
    recapture: Mapping[tuple[int, str], tuple[int, ...]]
    # (block, kernel) -> node id
    kernel_nodes: Mapping[tuple[int, str], int]
    # what the planner found legal but probably not meant (Problem records of severity "warning")
    warnings: tuple[Problem, ...] = ()
    # node id -> (region node id, body index) for every node inside a region's body; a node not named here is
    # at the top level. A region node comes before the nodes of its bodies in ``nodes``, and ``deps`` of a
    # body node name nodes of the same body only.
    parents: Mapping[int, tuple[int, int]] = attrs.field(factory=dict)
    # delayed connections: the buffer a delayed output writes -> its previous-frame buffer (kind "delay"),
    # which a copy node refreshes at the end of each frame; the delayed inputs read the latter
    delays: Mapping[int, int] = attrs.field(factory=dict)
    # memory reuse (rxcuda.plan._liveness): buffers whose lifetimes never overlap share one allocation.
    # ``shared``: each group of buffers sharing one, in the order they use it; ``storage``: buffer id -> the
    # first buffer of its group, for every member. A buffer in no group has memory of its own.
    shared: tuple[tuple[int, ...], ...] = ()
    storage: Mapping[int, int] = attrs.field(factory=dict)
    # resolved shapes of the ports whose shape differs from the declared one (a resize upstream, a 2-D output
    # into a 1-D input, ...): ``shapes.get(ref, spec.shape)`` is a port's shape (rxcuda.plan._shapes)
    shapes: Mapping[PortRef, tuple[int, ...]] = attrs.field(factory=dict)
    # profiling timestamps (rxcuda.plan._profile): what the StampNodePlan columns measure, or None
    stamps: StampLayout | None = None

    def topology(self) -> tuple:
        """Node kinds and dependencies: equal topologies allow cuGraphExecUpdate instead of instantiating."""
        if self.parents:
            parents = self.parents
            return tuple((type(n).__name__, self.deps[n.id], parents.get(n.id)) for n in self.nodes), len(self.nodes)
        return tuple((type(n).__name__, self.deps[n.id]) for n in self.nodes), len(self.nodes)

    def tier_of(self, block: int, name: str) -> Tier | None:
        """The tier a change of this parameter takes (None: no node uses it)."""
        key = (block, name)
        if key in self.recapture:
            return Tier.RECAPTURE
        if key in self.device_scalars or key in self.slots:
            return Tier.PARAMETERS
        return None

    def route_of(self, block: int, name: str) -> str:
        """How a change of this parameter reaches the GPU, in words (for summaries)."""
        key = (block, name)
        if key in self.device_scalars:
            return "parameters (device scalar copy)"
        if key in self.recapture:
            return "recapture (the library call is captured again)"
        if key in self.slots:
            return "parameters (exec-node update)"
        return "unused"

    def to_dot(self) -> str:
        """DOT text of the plan node by node (kernel, call, memset, copy and region nodes, dependencies):
        :func:`rxcuda.to_dot`, done by ``rxcuda.view`` (rxcuda.model._provided)."""
        return provided("to_dot")(self)
