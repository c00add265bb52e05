"""Typed change events. Every change to a running pipeline is one of these, whatever thread made it.

Each event knows its update tier. The tiers, cheapest last:

- ``STRUCTURE``: a block or connection added or removed, a kernel signature changed -> rebuild the graph
- ``CODE``: a kernel's code changed with the same signature -> swap the function in the exec node
- ``RECAPTURE``: a library call's host parameter changed, or an array it reads was rebound -> capture it
  again (the engine decides this when it applies a parameter or a rebind: no event asks for it)
- ``PARAMETERS``: a scalar value, a rebound buffer, a launch geometry -> patch the exec node's arguments
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import attrs

from ._describe import KernelCode, Launch, PortRef


class Tier(enum.StrEnum):
    """Update tiers, highest first: a higher one wins and subsumes the lower ones (``rank``).

    A tier is its name as a string too: ``Frame.tiers == ("parameters",)`` holds, and a tuple of tiers
    prints as ``('structure',)``.
    """

    STRUCTURE = "structure"
    CODE = "code"
    RECAPTURE = "recapture"
    PARAMETERS = "parameters"

    @property
    def rank(self) -> int:
        """3 for STRUCTURE down to 0 for PARAMETERS."""
        return _RANK[self]

    def __repr__(self) -> str:
        return repr(self.value)


_RANK = {Tier.STRUCTURE: 3, Tier.CODE: 2, Tier.RECAPTURE: 1, Tier.PARAMETERS: 0}
TIERS = tuple(Tier)  # highest first: the order an update plan is applied in


def merge_tiers(a: tuple, b: tuple) -> tuple:
    """The tiers in either tuple, once each, highest first."""
    present = set(a) | set(b)
    return tuple(t for t in TIERS if t in present)


class ParameterChanged(NamedTuple):
    """A block's scalar parameter got a new value (a named tuple: the hottest event there is)."""

    block: int
    name: str
    value: Any

    tier = Tier.PARAMETERS


@attrs.frozen(eq=False)
class PortRebound:
    """A port was bound to another user array (same dtype and size: no rebuild)."""

    block: int
    port: str
    array: Any = attrs.field(repr=False)
    tier = Tier.PARAMETERS


@attrs.frozen
class LaunchChanged:
    """A kernel's grid, block or shared memory changed."""

    block: int
    kernel: str
    launch: Launch
    tier = Tier.PARAMETERS


@attrs.frozen
class CodeChanged:
    """A kernel got new code with the same signature."""

    block: int
    kernel: str
    code: KernelCode
    tier = Tier.CODE


@attrs.frozen
class BlockAdded:
    block: int
    name: str
    tier = Tier.STRUCTURE


@attrs.frozen
class BlockRemoved:
    block: int
    name: str
    tier = Tier.STRUCTURE


@attrs.frozen
class BlockChanged:
    """A block's description changed in a way that needs a rebuild (ports, a kernel signature)."""

    block: int
    name: str
    reason: str = ""
    tier = Tier.STRUCTURE


@attrs.frozen
class ProfileChanged:
    """The profiling level changed in a way that adds or removes timestamp nodes in the graph."""

    level: str
    tier = Tier.STRUCTURE


@attrs.frozen
class Connected:
    src: PortRef
    dst: PortRef
    tier = Tier.STRUCTURE


@attrs.frozen
class Disconnected:
    src: PortRef
    dst: PortRef
    tier = Tier.STRUCTURE


@attrs.frozen
class FileChanged:
    """A watched file's content changed (deduplicated by content digest)."""

    path: str
    digest: str


ChangeEvent = (
    ParameterChanged | PortRebound | LaunchChanged | CodeChanged | BlockAdded
    | BlockRemoved | BlockChanged | Connected | Disconnected
)
STRUCTURE_EVENTS = (BlockAdded, BlockRemoved, BlockChanged, Connected, Disconnected, ProfileChanged)
