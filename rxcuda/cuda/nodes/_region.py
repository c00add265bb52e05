"""Region nodes: a region as one conditional graph node (IF with one or two bodies, or WHILE), run when a
condition kernel on the device says so; the nodes of the region's blocks go into its body graphs."""

from __future__ import annotations

from ...model._graphplan import RegionNodePlan
from .._driver import check, drv
from ._base import BuildContext, GraphNode

_COND_TYPE = {"if": "CU_GRAPH_COND_TYPE_IF", "ifelse": "CU_GRAPH_COND_TYPE_IF", "while": "CU_GRAPH_COND_TYPE_WHILE",
              "for": "CU_GRAPH_COND_TYPE_WHILE"}
REGION_NAMES = {"if": "If", "ifelse": "IfElse", "while": "While", "for": "For"}  # the kinds as users write them


def add_conditional(api, graph, deps: list, ctx, node) -> None:
    """Add ``node`` (a RegionNode) as a conditional node to ``graph``; fills ``node.handle`` and
    ``node.bodies`` (the body graphs the driver made)."""
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


class RegionNode(GraphNode):
    """A conditional node: its handle (what the condition kernels set) and its body graphs, which the nodes
    inside the region are added to. ``plan`` needs ``kind``, ``bodies`` and ``label`` (a RegionNodePlan, or
    the loop of a batch of frames)."""

    __slots__ = ("cond", "bodies")

    kind = "region"
    conditional = True
    timed = True

    def __init__(self, plan: RegionNodePlan, cond):
        super().__init__(plan)
        self.cond = cond
        self.bodies: list = []

    @classmethod
    def prepare(cls, plans: list, b: BuildContext) -> None:
        # conditional handles belong to the top-level graph and exist before the kernels that pass them
        b.handles = {n.id: check(b.api.cuGraphConditionalHandleCreate(b.graph, b.ctx, 0, 0),
                                 f"cuGraphConditionalHandleCreate ({n.label})") for n in plans}

    @classmethod
    def make(cls, plan, b: BuildContext) -> RegionNode:
        return cls(plan, b.handles[plan.id])

    def add(self, api, graph, deps: list, ctx) -> None:
        add_conditional(api, graph, deps, ctx, self)

    def mirror(self, api, graph, deps: list, ctx, batch) -> object:
        copy = RegionNode(self.plan, batch.handles[self.plan.id])
        add_conditional(api, graph, deps, ctx, copy)
        batch.regions[self.plan.id] = copy  # the region's nodes go into the copy's bodies
        return copy.handle

    @classmethod
    def describe(cls, plan, buffers) -> tuple[str, str]:
        return REGION_NAMES.get(plan.kind, plan.kind), plan.label
