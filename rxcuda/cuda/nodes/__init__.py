"""Node kinds: one class per kind of graph node, one protocol (:class:`GraphNode`), one table.

``KINDS`` maps each node plan type (``rxcuda.model._graphplan``, pure data) to the class that builds it into
a CUDA graph and keeps its driver-side state. The graph (``rxcuda.cuda._graph``) looks a plan's kind up once,
when it builds; after that it calls the node's methods. A new kind of node (a peer copy, an event record or
wait) is one module here with its class, and one row below.

>>> from rxcuda.cuda.nodes import KINDS, kind_of
>>> from rxcuda.model._graphplan import CopyNodePlan
>>> kind_of(CopyNodePlan(0, 1, 2, 64, "delay", frozenset({1}), frozenset({2}))).kind
'copy'
>>> sorted(k.kind for k in KINDS.values())
['copy', 'event record', 'event wait', 'kernel', 'library call', 'memset', 'peer copy', 'region', 'timestamp']
"""

from __future__ import annotations

from ...model._graphplan import (
    CallNodePlan,
    CopyNodePlan,
    EventRecordNodePlan,
    EventWaitNodePlan,
    KernelNodePlan,
    MemsetNodePlan,
    PeerCopyNodePlan,
    RegionNodePlan,
    StampNodePlan,
)
from ._base import APPLY, RECAPTURE, STAGED, BuildContext, GraphNode
from ._call import CallNode, Capture, capture_graph
from ._copy import CopyNode
from ._event import EventRecordNode, EventWaitNode
from ._kernel import ArgStorage, KernelNode
from ._memset import MemsetNode
from ._peer import PeerCopyNode
from ._region import REGION_NAMES, RegionNode, add_conditional
from ._stamp import StampNode

KINDS: dict[type, type[GraphNode]] = {
    KernelNodePlan: KernelNode,
    CallNodePlan: CallNode,
    MemsetNodePlan: MemsetNode,
    CopyNodePlan: CopyNode,
    RegionNodePlan: RegionNode,
    StampNodePlan: StampNode,
    PeerCopyNodePlan: PeerCopyNode,
    EventRecordNodePlan: EventRecordNode,
    EventWaitNodePlan: EventWaitNode,
}


def kind_of(plan) -> type[GraphNode]:
    """The node kind that builds ``plan``; a TypeError names a plan type no kind builds."""
    kind = KINDS.get(type(plan))
    if kind is None:
        raise TypeError(f"no node kind builds a {type(plan).__name__}; add its class under rxcuda/cuda/nodes/ "
                        "and a row for it in KINDS (rxcuda/cuda/nodes/__init__.py)")
    return kind


__all__ = ["APPLY", "KINDS", "RECAPTURE", "REGION_NAMES", "STAGED", "ArgStorage", "BuildContext", "CallNode",
           "Capture", "CopyNode", "EventRecordNode", "EventWaitNode", "GraphNode", "KernelNode", "MemsetNode",
           "PeerCopyNode", "RegionNode", "StampNode", "add_conditional", "capture_graph", "kind_of"]
