"""The engine's side of the interface blocks use (rxcuda.blocks._engineside.EngineSide): what a block, a port or a
composite instance asks of the engine it is in, answered from the engine's runtime and profiler."""

from __future__ import annotations

import math
from typing import Any

from ._bounds import binding_refused
from ._shapes_io import current_shape
from ._tooltips import port_text


class BlockSide:
    """``engine._side``: :class:`~rxcuda.blocks._engineside.EngineSide` for one engine."""

    __slots__ = ("_engine", "_rt", "resizes")

    def __init__(self, engine: Any):  # (the Engine, which imports this module)
        self._engine = engine
        self._rt = engine._rt
        self.resizes = engine._rt  # (its ``shapes`` and ``graph``: a plain attribute, as the setter reads it)

    def port_text(self, port: Any) -> str:
        return port_text(port)

    def port_count(self, ref: Any, spec: Any) -> int:
        return math.prod(current_shape(self._rt, ref, spec))

    def binding_failed(self, subject: str, err: Exception, keeps: Any, block: Any = None) -> None:
        engine = self._engine
        if not binding_refused(engine, subject, keeps, block.id if block is not None else None, err):
            self._rt.reporter.warn(subject, f"parameter binding: {err}", block)

    def occupancy(self, block_id: int) -> dict[str, float]:
        return {kernel: occ for (bid, kernel), occ in dict(self._rt.occupancy).items() if bid == block_id}

    def last_profile(self) -> Any:
        return self._engine._profiler.last

    @property
    def profile(self) -> str:
        return self._engine.profile


__all__ = ["BlockSide"]
