"""The protocol every node kind follows, and what a graph's build hands the kinds.

A node kind is a class: made from its plan (``model._graphplan``, pure data) at build time, it holds the
node's driver-side state (handle, parameter struct) and knows how to add itself to a graph, follow a rebound
buffer, re-apply its parameters to an executable graph, swap its code, be captured again, run eagerly and
describe itself. The defaults here are what a node that does none of that does; a kind overrides what it
supports, and what it refuses raises a TypeError that names the node and its kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ...model._graphplan import KernelNodePlan
from .._driver import check

# what ``rebind`` tells the graph to do after a node took a buffer's new pointer
STAGED = "staged"  # written into the node's parameters: the graph applies them with the next flush
APPLY = "apply"  # the graph applies the node's parameters to the executable graph now (``apply``)
RECAPTURE = "recapture"  # the node bakes the pointer into captured work: it must be captured again


class BuildContext:
    """What the kinds' constructors read while one graph is built: the driver ``api``, the CUDA context
    ``ctx``, the loaded functions by code key, the buffers' device pointers, the capture function for library
    calls, the profiling stamp ring, the other devices' events and buffers (``crossing``, for the peer copy and
    event nodes), and what the kinds' ``prepare`` steps make (the kernel argument storage,
    the regions' conditional handles)."""

    __slots__ = ("api", "ctx", "graph", "functions", "pointers", "capture", "stamps", "args", "handles", "crossing",
                 "previous", "built")

    def __init__(self, api, ctx, graph, functions: Mapping[str, object], pointers: Mapping[int, int],
                 capture: Callable | None = None, stamps=None, crossing=None, previous=None):
        self.api = api
        self.ctx = ctx
        self.graph = graph  # the top-level CUgraph being built
        self.functions = functions
        self.pointers = pointers
        self.capture = capture
        self.stamps = stamps
        self.args: Any = None  # the kernel nodes' ArgStorage (KernelNode.prepare)
        self.handles: dict[int, object] = {}  # region node id -> conditional handle (RegionNode.prepare)
        # several devices: what this device's graph needs of the others (rxcuda.cuda._peer.Crossing), or None
        self.crossing = crossing
        # the graph built before (a CompiledGraph, or None), whose nodes of the same plans may be followed
        # (KernelNode.follow), and the buffers' addresses it was built with
        self.previous = previous
        self.built: Mapping[int, int] = previous.built if previous is not None else {}


class GraphNode:
    """Driver-side state of one node of a compiled graph; one subclass per node kind (see ``KINDS``).

    ``plan``: the node's plan; ``handle``: its CUgraphNode in the graph it was built in (None until added).
    """

    __slots__ = ("plan", "handle")

    kind: ClassVar[str] = "node"  # the kind's name, in messages
    conditional: ClassVar[bool] = False  # needs a conditional handle of the top-level graph (``prepare``)
    timed: ClassVar[bool] = False  # a unit of work the eager profiler times on its own (``run_eagerly``'s around)
    eager: ClassVar[bool] = False  # it issues work of its own when the graph runs eagerly (``run``)
    after_frame_start: ClassVar[bool] = True  # with no other dependency, it waits for the frame's start stamp

    def __init__(self, plan):
        self.plan = plan
        self.handle = None

    # -- building ---------------------------------------------------------------------------------------
    @classmethod
    def prepare(cls, plans: list, b: BuildContext) -> None:
        """Called once per graph with every plan of this kind, in order, before any node is made."""

    @classmethod
    def make(cls, plan, b: BuildContext) -> GraphNode:
        """This kind's node for ``plan`` (not yet in a graph)."""
        return cls(plan)

    def add(self, api, graph, deps: list, ctx) -> None:
        """Add the node to ``graph`` after ``deps``; sets ``handle``."""
        self.handle = self.add_copy(api, graph, deps, ctx, self.plan.label)

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        """Add a node doing this node's work to ``graph`` after ``deps``; returns its handle (``what`` names it
        in an error)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to add itself to a graph")

    def mirror(self, api, graph, deps: list, ctx, batch) -> object:
        """Add this node's work to another graph (a batch's loop body: ``rxcuda.cuda._batch``); returns the
        handle there. Parameters are shared with this node unless the kind needs its own copy."""
        return self.add_copy(api, graph, deps, ctx, "batch")

    @classmethod
    def starts_frame(cls, plan) -> bool:
        """True for the node every root of a frame waits for (the profiling start stamp): added first."""
        return False

    def condition_of(self) -> int | None:
        """For a region's condition kernel (it passes the region's conditional handle), that region node's id;
        None for every other node."""
        return None

    def remove(self, api) -> None:
        """Take the node out of the graph it was added to (``cuGraphDestroyNode``: its edges go with it) and
        free what it owns; ``handle`` is None from then on."""
        check(api.cuGraphDestroyNode(self.handle), f"cuGraphDestroyNode ({self.plan.label})")
        self.handle = None
        self.release(api)

    def adopt(self, handle) -> None:
        """Take the handle of the equal node of the graph whose executable this graph took over."""
        self.handle = handle

    # -- updating ---------------------------------------------------------------------------------------
    def buffers(self) -> tuple[int, ...]:
        """Ids of the buffers the node uses: what a rebound buffer must reach."""
        return ()

    def rebind(self, buffer_id: int, ptr: int) -> str:
        """Take ``ptr`` as buffer ``buffer_id``'s new address; returns STAGED, APPLY or RECAPTURE."""
        raise TypeError(f"{self._name()} uses no buffer, so buffer {buffer_id} cannot be rebound in it")

    def apply(self, api, graph_exec, handle, ctx) -> None:
        """Re-apply the node's current parameters to node ``handle`` of executable graph ``graph_exec``
        (nothing for a kind whose parameters never change after the build)."""

    def set_function(self, function) -> None:
        """The Code tier: run ``function`` from now on (staged; the graph applies it)."""
        raise TypeError(f"{self._name()} runs no kernel code, so its code cannot be swapped; rebuild the graph")

    def set_launch(self, launch) -> None:
        """A new launch geometry (staged; the graph applies it)."""
        raise TypeError(f"{self._name()} launches no kernel, so it has no launch geometry to change")

    def set_bytes(self, nbytes: int) -> None:
        """A new byte count (for a copy); the graph applies it."""
        raise TypeError(f"{self._name()} copies nothing, so it has no byte count to change")

    def recapture(self, api, graph_exec, capture, pointers) -> None:
        """The Recapture tier: capture the work again with the current pointers and values."""
        raise TypeError(f"{self._name()} is no captured library call, so there is nothing to capture again")

    # -- running it without the graph, describing it, releasing it --------------------------------------
    def run(self, api, stream) -> None:
        """Issue the node's work on ``stream`` (the eager run; only called when ``eager`` is True)."""

    def release(self, api) -> None:
        """Free what the node owns beyond its graph (a captured child graph, say)."""

    @classmethod
    def kernel_of(cls, plan) -> KernelNodePlan | None:
        """The kernel launch ``plan`` is (its code is loaded before the build), or None for a node of a kind
        that launches no kernel of a block."""
        return None

    @classmethod
    def describe(cls, plan, buffers: Mapping[int, Any]) -> tuple[str, str]:
        """Two lines for a picture of the plan: the node's name and what it does (``buffers``: id -> BufferPlan)."""
        return getattr(plan, "label", ""), cls.kind

    def _name(self) -> str:
        return f"node {self.plan.label!r} ({self.kind})"
