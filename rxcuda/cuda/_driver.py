"""One helper for every driver call: result code -> exception with the error name and explanation.

The layer calls the driver through an ``api`` object: ``cuda.bindings.driver`` itself (``drv``), or a
:class:`~rxcuda.cuda._null.NullDriver` that records the calls, so the engine's logic runs without a GPU.
"""

from __future__ import annotations

from ..model._errors import CudaError, NoDeviceError

try:  # cuda.bindings imports without a driver; calls fail later, which probe() reports
    from cuda.bindings import driver as drv
except ImportError as e:  # pragma: no cover - dependency missing entirely
    drv = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None

# Errors after which the CUDA context is unusable: CUDA's errors of this kind are sticky, and every later
# call in the process fails. Only a new process can use that GPU again.
STICKY = frozenset({
    214,  # CUDA_ERROR_ECC_UNCORRECTABLE
    700,  # CUDA_ERROR_ILLEGAL_ADDRESS
    702,  # CUDA_ERROR_LAUNCH_TIMEOUT
    709,  # CUDA_ERROR_CONTEXT_IS_DESTROYED
    710,  # CUDA_ERROR_ASSERT
    714,  # CUDA_ERROR_HARDWARE_STACK_ERROR
    715,  # CUDA_ERROR_ILLEGAL_INSTRUCTION
    716,  # CUDA_ERROR_MISALIGNED_ADDRESS
    717,  # CUDA_ERROR_INVALID_ADDRESS_SPACE
    718,  # CUDA_ERROR_INVALID_PC
    719,  # CUDA_ERROR_LAUNCH_FAILED
})


def _describe(err) -> tuple[str, str]:
    try:
        _, name = drv.cuGetErrorName(err)
        _, text = drv.cuGetErrorString(err)
        return name.decode(), text.decode()
    except Exception:  # the driver itself may be unusable (or absent, under the null driver)
        try:
            return drv.CUresult(int(err)).name, "no explanation available"
        except Exception:
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


def is_sticky(err: BaseException) -> bool:
    """True when ``err`` is a CudaError that left the CUDA context unusable (an illegal address, say)."""
    return isinstance(err, CudaError) and err.code in STICKY


def require_driver(api=None):
    """The driver ``api`` (default: cuda.bindings), initialised; raises NoDeviceError with the reason."""
    if api is None:
        if drv is None:
            raise NoDeviceError(f"cuda-bindings is not importable ({_IMPORT_ERROR})")
        api = drv
    try:
        check(api.cuInit(0), "cuInit")
        count = check(api.cuDeviceGetCount(), "cuDeviceGetCount")
    except CudaError as e:
        raise NoDeviceError(f"the CUDA driver refused to start ({e.name}: {e.explanation})") from e
    except Exception as e:  # cuda.pathfinder's DynamicLibNotFoundError when there is no driver library
        raise NoDeviceError(f"no NVIDIA driver library on this machine ({type(e).__name__}: {e})") from e
    if count == 0:
        raise NoDeviceError("the driver found no CUDA device")
    return api


def probe() -> tuple[bool, str]:
    """(True, '') when a CUDA device is usable, else (False, reason). Never raises."""
    try:
        require_driver()
    except NoDeviceError as e:
        return False, e.reason
    return True, ""
