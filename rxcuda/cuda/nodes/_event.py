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


class EventRecordNode(GraphNode):
    """Records an event once its dependencies are done (another device's graph waits for it)."""

    __slots__ = ("event",)

    kind = "event record"
    eager = True

    def __init__(self, plan: EventRecordNodePlan, event):
        super().__init__(plan)
        self.event = event

    @classmethod
    def make(cls, plan, b: BuildContext) -> EventRecordNode:
        return cls(plan, _event_of(plan, b))

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        return check(api.cuGraphAddEventRecordNode(graph, deps, len(deps), self.event),
                     f"cuGraphAddEventRecordNode ({what})")

    def run(self, api, stream) -> None:
        check(api.cuEventRecord(self.event, stream), f"cuEventRecord ({self.plan.label})")

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        return plan.label, f"record event {plan.event}"


class EventWaitNode(GraphNode):
    """Waits for an event another device's graph records, before the nodes that depend on it."""

    __slots__ = ("event",)

    kind = "event wait"
    eager = True

    def __init__(self, plan: EventWaitNodePlan, event):
        super().__init__(plan)
        self.event = event

    @classmethod
    def make(cls, plan, b: BuildContext) -> EventWaitNode:
        return cls(plan, _event_of(plan, b))

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        return check(api.cuGraphAddEventWaitNode(graph, deps, len(deps), self.event),
                     f"cuGraphAddEventWaitNode ({what})")

    def run(self, api, stream) -> None:
        check(api.cuStreamWaitEvent(stream, self.event, 0), f"cuStreamWaitEvent ({self.plan.label})")

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        return plan.label, f"wait for event {plan.event}"
