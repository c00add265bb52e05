"""Memory reuse by liveness, again after a re-plan: the previous plan's work for the nodes it kept is reused.

``rxcuda.plan._liveness`` decides which buffers share an allocation in one pass over a plan. The planner's
``Replanner`` re-plans a changed pipeline from the first block that changed, keeping the leading nodes; this
module gives the same groups as that pass (``share``; the tests compare them on random edits) while looking
at the kept nodes' part of the work again only where the change reaches it:

- the ancestor bits of the kept nodes are the previous plan's (a node's come from the nodes before it);
- each buffer's uses and first definite write are the previous plan's, but for the buffers the dropped nodes
  used (their uses cut back to the kept nodes) and those the new nodes use (their uses added);
- the buffers ready to share are the previous ones, but for those buffers and those whose pinning changed
  (an output that a new block now consumes, say);
- the greedy assignment, in the order of first use, is the previous one up to the first buffer whose entry
  changed: its state there is restored from the nearest checkpoint (every ``_EVERY`` buffers) and the
  previous choices after it, and only the rest is assigned again.

Flat plans only (no region bodies) whose nodes come in a topological order, as the planner emits them; any
other plan takes the whole pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model._describe import PipelineDescription
from ..model._graphplan import GraphPlan, sizes_in_bytes
from ._liveness import _SHAREABLE, MAX_NODES, assign, note_uses, pinned_buffers, share_memory, with_groups

_EVERY = 32  # ready buffers between two checkpoints of the greedy assignment


class Sharing:
    """What one pass worked out, for the next: the nodes it saw, per position the ancestor bits, per buffer
    the positions using it and the first definite write, the pinned buffers, the ready buffers in the order
    assigned with the slot each took, the slots' members, and checkpoints (ready index, members per slot,
    size per slot)."""

    __slots__ = ("nodes", "anc", "uses", "clean", "pinned", "ready", "choices", "members", "marks")

    def __init__(self, nodes, anc, uses, clean, pinned, ready, choices, members, marks):
        self.nodes = nodes
        self.anc = anc
        self.uses = uses
        self.clean = clean
        self.pinned = pinned
        self.ready = ready
        self.choices = choices
        self.members = members
        self.marks = marks


def share(gp: GraphPlan, desc: PipelineDescription, prev: Sharing | None, kept: int
          ) -> tuple[GraphPlan, Sharing | None]:
    """``share_memory(gp, desc)`` and the state a later call continues from; ``prev``: the previous call's
    state and ``kept``: how many leading nodes of ``gp`` are the previous plan's (the same objects with the
    same dependencies), 0 for a pass over everything."""
    nodes = gp.nodes
    if gp.parents or desc.regions or len(nodes) > MAX_NODES or (nodes and nodes[-1].id != len(nodes) - 1):
        return share_memory(gp, desc), None
    # (a flat plan's dependencies come from buffer hazards in node order: each names earlier nodes, so the
    # positions of the whole pass are the node ids)
    if prev is None or not 0 < kept <= len(prev.nodes) or prev.nodes[kept - 1] is not nodes[kept - 1]:
        kept = 0
    groups, state = _groups(gp, desc, prev if kept else None, kept)
    return (with_groups(gp, groups) if groups else gp), state


def _groups(gp: GraphPlan, desc: PipelineDescription, prev: Sharing | None, kept: int
            ) -> tuple[tuple[tuple[int, ...], ...], Sharing]:
    nodes, deps, buffers = gp.nodes, gp.deps, gp.buffers
    pinned = pinned_buffers(gp, desc)
    changed: set[int] = set()  # buffers whose entry (uses, first write, pinning) may differ from prev's
    if prev is not None:
        anc = prev.anc[:kept]
        uses, clean = prev.uses, prev.clean  # (prev is not used again: its maps are taken over and changed)
        for n in prev.nodes[kept:]:  # what the dropped nodes used: cut back to the kept nodes
            changed.update(n.reads)
            changed.update(n.writes)
        for b in changed:
            used = uses.get(b)
            if used is not None:
                used = [v for v in used if v < kept]
                if used:
                    uses[b] = used
                else:
                    del uses[b]
            c = clean.get(b)
            if c is not None and c >= kept:
                del clean[b]
        changed.update(pinned ^ prev.pinned)
    else:
        anc, uses, clean = [], {}, {}
    track = prev is not None  # (a whole pass looks at every buffer: no need to note which ones it touched)
    for nid in range(kept, len(nodes)):
        a = 0
        for d in deps[nid]:
            a |= anc[d] | (1 << d)
        anc.append(a)
        n = nodes[nid]
        if track:
            changed.update(n.reads)
            changed.update(n.writes)
        note_uses(uses, clean, n, nid, buffers, True)  # (a flat plan: every write is definite)

    def is_ready(b: int) -> int | None:
        if b >= len(buffers) or buffers[b].kind not in _SHAREABLE or b in pinned:
            return None
        return _first(b)

    def _first(b: int) -> int | None:
        used = uses.get(b)
        if not used:
            return None
        first = min(used)
        if clean.get(b) != first:
            return None
        for v in used:
            if v != first and not (anc[v] >> first) & 1:
                return None
        return first

    if prev is None:
        ready = [(f, b) for b, bp in enumerate(buffers)
                 if bp.kind in _SHAREABLE and b not in pinned and (f := _first(b)) is not None]
    else:
        ready = [e for e in prev.ready if e[1] not in changed]
        ready.extend((f, b) for b in changed if (f := is_ready(b)) is not None)
    ready.sort()

    # the greedy assignment: restored up to the first entry that changed, then continued
    was = prev.ready if prev is not None else ()
    j = 0
    limit = min(len(was), len(ready))
    while j < limit and ready[j] == was[j] and ready[j][1] not in changed:
        j += 1
    slot_members: list[list[int]] = []
    slot_size: list[int] = []
    choices: list[int] = []
    marks: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
    start = 0
    if prev is not None and j:
        mark = next(m for m in reversed(prev.marks) if m[0] <= j)
        start, counts, sizes = mark
        slot_members = [prev.members[s][:c] for s, c in enumerate(counts)]
        slot_size = list(sizes)
        choices = prev.choices[:start]
        marks = prev.marks[:prev.marks.index(mark) + 1]
        for i in range(start, j):  # the previous choices, replayed
            _, b = ready[i]
            s = prev.choices[i]
            need = buffers[b].nbytes
            if s == len(slot_members):
                slot_members.append([b])
                slot_size.append(need)
            else:
                slot_members[s].append(b)
                if need > slot_size[s]:
                    slot_size[s] = need
            choices.append(s)
        start = j
    slot_last = [uses[m[-1]] for m in slot_members]
    needs = sizes_in_bytes(buffers[b] for _, b in ready[start:])
    i = start
    while i < len(ready):  # (_liveness.assign, a checkpoint every _EVERY entries)
        if i % _EVERY == 0 and (not marks or marks[-1][0] != i):
            marks.append((i, tuple(len(m) for m in slot_members), tuple(slot_size)))
        end = min(len(ready), (i // _EVERY + 1) * _EVERY)
        choices.extend(assign(ready[i:end], anc, uses, needs[i - start:end - start], slot_last, slot_size,
                              slot_members))
        i = end
    if not marks:
        marks.append((0, (), ()))
    state = Sharing(nodes, anc, uses, clean, pinned, ready, choices, slot_members, marks)
    return _final(slot_members), state


def _final(members: Sequence[list[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(m) for m in members if len(m) > 1)
