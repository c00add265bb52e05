"""Event record and wait nodes: how the graphs of several devices are ordered within a frame, with no host
sync. One device's graph records an event once a buffer is written; the graph of the device reading it waits
for that event before copying it (``rxcuda.plan._placement``)."""

from __future__ import annotations

from ...model._graphplan import EventRecordNodePlan, EventWaitNodePlan
from .._driver import check
from ._base import BuildContext, GraphNode


def _event_of(plan, b: BuildContext):
    if b.crossing is None:
        raise RuntimeError(f"node {plan.label!r} orders the graphs of several devices, but this graph was built "
                           "for one device (no crossing was given)")
    return b.crossing.event(plan.event)


class _EventNode(GraphNode):
    """An event node: what record and wait share (the event, how it is made); each kind names its calls."""

    __slots__ = ("event",)

    eager = True
    verb = ""  # "record" or "wait for", in the node's description

    def __init__(self, plan: EventRecordNodePlan | EventWaitNodePlan, event):
        super().__init__(plan)
        self.event = event

    @classmethod
    def make(cls, plan, b: BuildContext) -> _EventNode:
        return cls(plan, _event_of(plan, b))

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        return plan.label, f"{cls.verb} event {plan.event}"


class EventRecordNode(_EventNode):
    """Records an event once its dependencies are done (another device's graph waits for it)."""

    __slots__ = ()

    kind = "event record"
    verb = "record"

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        return check(api.cuGraphAddEventRecordNode(graph, deps, len(deps), self.event),
                     f"cuGraphAddEventRecordNode ({what})")

    def run(self, api, stream) -> None:
        check(api.cuEventRecord(self.event, stream), f"cuEventRecord ({self.plan.label})")


class EventWaitNode(_EventNode):
    """Waits for an event another device's graph records, before the nodes that depend on it."""

    __slots__ = ()

    kind = "event wait"
    verb = "wait for"

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        return check(api.cuGraphAddEventWaitNode(graph, deps, len(deps), self.event),
                     f"cuGraphAddEventWaitNode ({what})")

    def run(self, api, stream) -> None:
        check(api.cuStreamWaitEvent(stream, self.event, 0), f"cuStreamWaitEvent ({self.plan.label})")
