"""The one CUDA layer: every driver and NVRTC call of rxcuda is a named verb here (driver check, device and
context, streams and events, memory pool and copies, module cache, NVRTC), with graph build/update through the
node kinds (``rxcuda.cuda.nodes``), the per-frame fast path and the null driver. Nothing outside this package
calls the driver directly (tests/unit/test_layering.py keeps it so)."""

from ._null import NullDriver

__all__ = ["NullDriver"]
