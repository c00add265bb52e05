"""Stamp nodes: a profiling timestamp, a one-thread kernel reading the GPU's global timer into its column
of a ring in host memory (``rxcuda.cuda._profile.StampRing``); nothing waits for it."""

from __future__ import annotations

from ...model._graphplan import StampNodePlan
from .._driver import check
from ._base import BuildContext, GraphNode


class StampNode(GraphNode):
    """A profiling timestamp: a one-thread kernel node. Column 0 is the frame's start: added first, and every
    root of the frame waits for it."""

    __slots__ = ("params",)

    kind = "timestamp"
    after_frame_start = False

    def __init__(self, plan: StampNodePlan, params):
        super().__init__(plan)
        self.params = params

    @classmethod
    def starts_frame(cls, plan) -> bool:
        return plan.column == 0

    @classmethod
    def make(cls, plan, b: BuildContext) -> StampNode:
        if b.stamps is None:
            raise RuntimeError("this graph has profiling stamps but no stamp ring was given")
        return cls(plan, b.stamps.params(plan.column))

    def add_copy(self, api, graph, deps: list, ctx, what: str):
        return check(api.cuGraphAddKernelNode(graph, deps, len(deps), self.params), f"cuGraphAddKernelNode ({what})")

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        return plan.label, f"timestamp (column {plan.column})"
