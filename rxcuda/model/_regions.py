"""Regions as data: a block whose kernels decide on the device whether (and how often) other blocks run.

A region is an ordinary block in the pipeline (its condition is an input port, a ``For``'s count is a
parameter) plus a :class:`RegionSpec` naming the blocks in its bodies. The planner puts the bodies' nodes into
the bodies of one CUDA conditional node; the region block's own kernels (shipped prebuilt, see
``rxcuda/cuda/_conditions.cu``) set the condition before the node and, for loops, at the end of each pass.
"""

from __future__ import annotations

from typing import Literal

import attrs

RegionKind = Literal["if", "ifelse", "while", "for"]
REGION_KINDS: tuple[str, ...] = ("if", "ifelse", "while", "for")
MAX_UNROLL = 16  # copies of a loop's body per relaunch: each adds a nested IF level to the graph
CONDITION_DTYPES: tuple[str, ...] = ("u32", "i32", "u8", "i8", "bool", "u16", "i16", "u64", "i64")


@attrs.frozen
class RegionSpec:
    """Which blocks run inside a region (by block id): one body, or two for ``ifelse`` (then, else).

    ``id`` is the region block's own id (its count, or a ``while``'s bound on passes, is a parameter of that
    block). A region nests by being a member of another region's body.
    """

    id: int
    kind: RegionKind
    bodies: tuple[tuple[int, ...], ...]
    # a loop's body copied this many times per relaunch of its conditional node, each copy after the first
    # under one more nested IF (the loop still stops after any pass); 1: the body once (see rxcuda.blocks.While)
    unroll: int = 1

    def __attrs_post_init__(self):
        if self.kind not in REGION_KINDS:
            raise ValueError(f"a region's kind is one of {', '.join(REGION_KINDS)} (got {self.kind!r})")
        if type(self.unroll) is not int or not 1 <= self.unroll <= MAX_UNROLL:
            raise ValueError(f"'unroll' must be an int from 1 to {MAX_UNROLL} (got {self.unroll!r})")
        if self.unroll > 1 and self.kind not in ("while", "for"):
            raise ValueError(f"only a loop (While, For) unrolls its body; a {self.kind} region has unroll=1 "
                             f"(got {self.unroll})")
        want = 2 if self.kind == "ifelse" else 1
        if len(self.bodies) != want:
            raise ValueError(f"a {self.kind} region has {want} bod{'ies' if want > 1 else 'y'} "
                             f"(got {len(self.bodies)})")

    @property
    def members(self) -> tuple[int, ...]:
        """Every block directly in one of the bodies."""
        return tuple(b for body in self.bodies for b in body)

    @property
    def loops(self) -> bool:
        return self.kind in ("while", "for")
