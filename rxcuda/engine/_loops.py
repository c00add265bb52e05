"""A While that reaches its bound: after each frame, the engine reads how many passes each While had left and
says, once, when one ran all its ``max_iterations`` passes.

The planner puts a copy node after each While's conditional node (rxcuda.plan._regions): it copies the loop's
pass counter, which the condition kernels count down from ``max_iterations`` (rxcuda/cuda/_conditions.cu), into
host-mapped memory (a ``mapped`` buffer). Reading that word is a host memory read, no driver call: 0 means the
loop ran every pass (its condition had not cleared before the bound); anything else that it stopped early, and
0xFFFFFFFF that it has not run since the memory was set (the word starts so, also on the null driver, whose
copies move nothing). A frame not waited for (``sync=False``) reads what the last frame the GPU finished wrote.

One warning ``Diagnostic`` per region, naming it, its passes and its condition, and the region's block is in
the "warning" state; it comes again only once the loop ended early (the block then recovers, with an "info"
diagnostic), once its ``max_iterations`` changed, or after a rebuild. Each frame names the Whiles that ran to
their bound in ``Frame.loops_at_bound``. Pipelines without regions never come here (the frame path tests
``graph.regions``).
"""

from __future__ import annotations

from ..model._graphplan import BufferArg, KernelNodePlan, RegionNodePlan
from ..plan._regions import BOUND

UNSET = 0xFFFFFFFF
SOURCE = "max_iterations"  # the block warning's source (Reporter.warn / recover)


class LoopBounds:
    """The Whiles of the running graph and what was said of them (see the module's docstring)."""

    def __init__(self, rt) -> None:
        self.rt = rt
        self.graph = None  # the graph ``words`` were found in
        self.words: tuple = ()  # (region block id, name, condition, ctypes u32 in host-mapped memory) per While
        self.warned: dict[int, int] = {}  # region block id -> its max_iterations when the warning was given

    def check(self, g, frame: int) -> tuple[str, ...]:
        """Read each While's passes left after ``frame``; warn of a loop that ran every pass; returns the
        names of those that did."""
        if g is not self.graph:
            self._find(g)
        if not self.words:
            return ()
        hit: tuple[str, ...] = ()
        for rid, name, condition, word in self.words:
            left = word.value
            if left == 0:
                if self._at_bound(rid, name, condition, frame):
                    hit += (name,)
            elif left != UNSET and rid in self.warned:
                self._ended_early(rid)
        return hit

    def _find(self, g) -> None:
        self.graph, self.warned = g, {}
        plan, pool = g.plan, self.rt.pool
        found = []
        by_key = {b.key: b.id for b in plan.buffers if b.kind == "mapped"}
        for n in plan.nodes:
            if type(n) is not RegionNodePlan or n.kind != "while":
                continue
            bid = by_key.get((BOUND, n.region))
            word = pool.mapped_u32(g.pointers[bid]) if bid is not None and bid in g.pointers else None
            if word is not None:  # (memory of this engine's pool: never an address it did not allocate)
                found.append((n.region, n.label, _condition(plan, n.region), word))
        self.words = tuple(found)

    def _passes(self, rid: int) -> int | None:
        block = self.rt.blocks.get(rid)
        try:
            return int(block.params["max_iterations"].value) if block is not None else None
        except (KeyError, AttributeError, TypeError, ValueError):
            return None

    def _at_bound(self, rid: int, name: str, condition: str, frame: int) -> bool:
        passes = self._passes(rid)
        if passes == 0:
            return False  # no pass to run: the counter starts at 0
        if rid in self.warned and self.warned[rid] == passes:
            return True  # said already
        self.warned[rid] = passes if passes is not None else -1
        shown = f"all its {passes} passes" if passes is not None else "all its passes"
        rt = self.rt
        rt.reporter.warn(name, f"While '{name}' reached its max_iterations: it ran {shown} in frame {frame} and "
                               f"its condition {condition} had not cleared before the bound, so its outputs are "
                               "those of the last pass allowed, not of a loop that ended; raise max_iterations, or "
                               f"fix the condition that never clears: {condition}",
                         rt.blocks.get(rid), source=SOURCE)
        return True

    def _ended_early(self, rid: int) -> None:
        del self.warned[rid]
        block = self.rt.blocks.get(rid)
        if block is not None and SOURCE in getattr(block, "_warnings", {}):
            self.rt.reporter.recover(block, SOURCE, why="its loop ended before max_iterations")


def _condition(plan, rid: int) -> str:
    """The port that makes a While's flag, as its buffer is labelled (``block.port``), from the loop's step."""
    for n in plan.nodes:
        if type(n) is KernelNodePlan and n.block == rid and n.kernel == "step":
            flag = n.args[2] if len(n.args) > 2 else None
            if isinstance(flag, BufferArg):
                return plan.buffers[flag.buffer].label
            break
    return "(no condition: it is never false)"
