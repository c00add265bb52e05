"""One helper for every driver call: result code -> exception with the error name and explanation."""

from __future__ import annotations

from ..model._errors import CudaError, NoDeviceError

try:  # cuda.bindings imports without a driver; calls fail later, which probe() reports
    from cuda.bindings import driver as drv
except ImportError as e:  # pragma: no cover - dependency missing entirely
    drv = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None


def _describe(err) -> tuple[str, str]:
    try:
        _, name = drv.cuGetErrorName(err)
        _, text = drv.cuGetErrorString(err)
        return name.decode(), text.decode()
    except Exception:  # the driver itself may be unusable
        return str(err), "no explanation available"


def check(result, call: str):
    """Unpack a cuda.bindings result tuple, raising CudaError unless it is CUDA_SUCCESS.

    Returns None, the single value, or a tuple of values.
    """
    err = result[0]
    if err:
        name, text = _describe(err)
        raise CudaError(call, name, text, int(err))
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def require_driver():
    """The driver module, initialised; raises NoDeviceError with the reason otherwise."""
    if drv is None:
        raise NoDeviceError(f"cuda-bindings is not importable ({_IMPORT_ERROR})")
    try:
        check(drv.cuInit(0), "cuInit")
        count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    except CudaError as e:
        raise NoDeviceError(f"the CUDA driver refused to start ({e.name}: {e.explanation})") from e
    except Exception as e:  # cuda.pathfinder's DynamicLibNotFoundError when there is no driver library
        raise NoDeviceError(f"no NVIDIA driver library on this machine ({type(e).__name__}: {e})") from e
    if count == 0:
        raise NoDeviceError("the driver found no CUDA device")
    return drv


def probe() -> tuple[bool, str]:
    """(True, '') when a CUDA device is usable, else (False, reason). Never raises."""
    try:
        require_driver()
    except NoDeviceError as e:
        return False, e.reason
    return True, ""
