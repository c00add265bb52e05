"""What a block asks of the engine it is in: the one, narrow interface blocks/ uses (blocks never import the engine,
docs/architecture.md). The engine implements it (rxcuda.engine._blockside.BlockSide) and hands it over as its
``_side``; a block reaches it through :func:`side_of`, the one place that looks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Resizes(Protocol):
    """Where an engine keeps the shapes its inputs were resized to, read by a count parameter's setter at every set
    to tell whether its limit is the declared size (attribute reads, no call: the setter is the hottest call a user
    makes, and nothing but a resize moves the limit)."""

    shapes: Mapping[Any, tuple]  # inputs resized for the next frame (empty: none)
    graph: Any  # the running graph, whose ``plan.shapes`` are the shapes it runs with (empty: declared), or None


class EngineSide(Protocol):
    """The engine's answers to a block, a port or a composite instance of it."""

    resizes: Resizes  # (an attribute, not a method: a count parameter's setter reads it on every set)

    def port_text(self, port: Any) -> str:
        """``str(port)`` for a port of a block in the engine: type, shape, bytes, pool class, whose memory."""
        ...

    def port_count(self, ref: Any, spec: Any) -> int:
        """The element count a port has now (a resize waiting for the next frame included)."""
        ...

    def binding_failed(self, subject: str, err: Exception, keeps: Any, block: Any = None) -> None:
        """A value from a parameter binding was refused: a diagnostic (an error for a count past its buffers, the
        parameter keeping ``keeps``; a warning otherwise)."""
        ...

    def occupancy(self, block_id: int) -> dict[str, float]:
        """Theoretical occupancy of each kernel of the block in the running graph (profiling per kernel)."""
        ...

    def last_profile(self) -> Any:
        """The last profiled frame (its ``blocks``, ``kernels`` and ``frame``), or None."""
        ...

    @property
    def profile(self) -> str:
        """The engine's profiling level."""
        ...


def side_of(engine: Any) -> EngineSide | None:
    """The engine-side interface of ``engine`` (a block's ``_engine``), or None for a block in no engine."""
    return None if engine is None else engine._side


__all__ = ["EngineSide", "Resizes", "side_of"]
