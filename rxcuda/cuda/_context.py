"""The context the calling thread runs in: which device it is on, and that device's architecture.

Library calls set up their handles in whatever context is current (the engine makes its device's primary
context current before it sets up or captures anything); they never create or switch contexts themselves.
"""

from __future__ import annotations

from ..model._errors import CudaError
from . import _host
from ._driver import check, require_driver


def current_device() -> int | None:
    """Ordinal of the device whose context is current on this thread, or None when no context is."""
    if _host.current() is not None:
        return 0  # the CPU device (one device, ordinal 0)
    drv = require_driver()
    ctx = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        return None
    return int(check(drv.cuCtxGetDevice(), "cuCtxGetDevice"))


def require_current(ordinal: int, what: str) -> None:
    """Raise CudaError unless a context on device ``ordinal`` is current; ``what`` names the caller."""
    current = current_device()
    if current == ordinal:
        return
    if current is None:
        fix = (f"no CUDA context is current on this thread; add the call to an rxcuda.Engine (which makes its "
               f"device's primary context current), or make device {ordinal}'s context current first")
    else:
        fix = (f"the current context is on device {current}, but the call is set up for device {ordinal}; "
               f"make device {ordinal}'s context current first")
    raise CudaError(what, "CUDA_ERROR_INVALID_CONTEXT", fix)


def device_arch(ordinal: int) -> str:
    """``'sm_90'``-style architecture name of device ``ordinal``, for compilers (the CPU device's where its context
    is current: it runs the PTX)."""
    drv = _host.current() or require_driver()
    dev = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
    a = drv.CUdevice_attribute
    major = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
    minor = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
    return f"sm_{major}{minor}"
