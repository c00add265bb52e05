"""The one CUDA layer: driver check, device/context/stream, memory pool, module cache, graph build/update/capture
and the per-frame fast path."""

from ._null import NullDriver

__all__ = ["NullDriver"]
