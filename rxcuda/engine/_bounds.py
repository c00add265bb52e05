"""The engine's side of the count checks (the rules are in ``rxcuda.model._bounds``, the setter's and the
launch's checks in ``rxcuda.blocks._bounds``): a refused value from a binding as an error diagnostic, the limits
of the running plan, and a value that a resize overtook, dropped before it reaches the GPU."""

from __future__ import annotations

from ..model._describe import PortRef
from ..model._errors import BoundsError


def binding_refused(engine, subject: str, keeps, block_id: int | None, err: Exception) -> bool:
    """Report a value from ``bind`` (a parameter's, or a composite instance's) that the count rule refused (a
    BoundsError) as an error diagnostic on ``subject`` saying that it keeps its value ``keeps`` (the block
    stays as it is); False for any other error."""
    if not isinstance(err, BoundsError):
        return False
    from ._records import Diagnostic

    rt = engine._rt
    rt.reporter.publish(Diagnostic("error", subject, f"parameter binding: {err}; the value was refused and "
                                   f"{subject} keeps {keeps!r}", rt.frame, block_id))
    return True


def plan_limits(plan, blocks) -> dict[tuple[int, str], tuple[int, str]]:
    """(block id, parameter) -> (element count of the smallest buffer it counts, that buffer's name) in the
    GraphPlan ``plan``, for the count parameters of ``blocks`` (id -> Block) it holds."""
    internal = {b.key: b.id for b in plan.buffers if b.kind == "internal"}
    out = {}
    for bid, block in blocks.items():
        for s in block.description.scalars:
            caps = []
            for c in s.counts:
                buf = plan.port_buffers.get(PortRef(bid, c))
                if buf is None:
                    buf = internal.get(("internal", bid, c))
                if buf is not None:
                    caps.append((plan.buffers[buf].count, c))
            if caps:
                out[bid, s.name] = min(caps)
    return out


def report_late_refusal(rt, key: tuple[int, str], value, limit: tuple[int, str]) -> None:
    """A count value that passed ``set`` but no longer fits the running graph (a resize came in between):
    it is not applied; an error diagnostic says so."""
    from ._records import Diagnostic

    bid, name = key
    block = rt.blocks.get(bid)
    label = block.name if block is not None else f"#{bid}"
    cap, port = limit
    why = ("is negative" if value < 0 else f"is more than port '{port}' holds ({cap} elements) in the running graph "
           "(it was resized after the value was set)")
    rt.reporter.publish(Diagnostic("error", f"{label}.{name}", f"{label}.{name} = {value} {why}: the value was not "
                                   f"applied. Set 0 <= {name} <= {cap}", rt.frame, bid))
