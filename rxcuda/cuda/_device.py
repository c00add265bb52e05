"""Device and context: the primary context of one GPU, streams and events on it."""

from __future__ import annotations

import importlib.metadata

from ..model._errors import NoDeviceError
from . import _host, _stream
from ._driver import check, require_driver


class Device:
    """The primary context of GPU ``ordinal``, made current on the calling thread.

    Sharing the primary context is what lets CuPy, PyTorch and rxcuda exchange pointers freely.
    """

    def __init__(self, ordinal: int = 0, *, api=None):
        drv = require_driver(api)
        count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        if not isinstance(ordinal, int) or not 0 <= ordinal < count:
            raise NoDeviceError(f"device {ordinal!r} does not exist; this machine has {count} "
                                f"(use 0..{count - 1})")
        self._drv = drv
        self.api = drv  # every driver call of the layer goes through this (cuda.bindings, or a NullDriver)
        self.ordinal = ordinal
        self.handle = check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = check(drv.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        self._closed = False
        self.make_current()
        self.name = check(drv.cuDeviceGetName(256, self.handle), "cuDeviceGetName").split(b"\0")[0].decode()
        a = drv.CUdevice_attribute
        major = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.handle), "attr")
        minor = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.handle), "attr")
        self.compute_capability = (major, minor)
        self.sm_count = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.handle),
                              "attr")
        self.total_memory = check(drv.cuDeviceTotalMem(self.handle), "cuDeviceTotalMem")

    @property
    def arch(self) -> str:
        """'sm_90' style architecture name, for compilers."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def make_current(self) -> None:
        check(self._drv.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        _host.note_current(self._drv)  # library calls ask which device's context is current (the CPU device's?)

    def create_stream(self):
        """A new non-blocking stream on this device (:func:`rxcuda.cuda._stream.create_stream`)."""
        return _stream.create_stream(api=self._drv)

    def create_event(self, timing: bool = True):
        """A new event (:func:`rxcuda.cuda._stream.create_event`)."""
        return _stream.create_event(timing=timing, api=self._drv)

    def max_threads_per_sm(self) -> int:
        """The most threads one multiprocessor holds at once (asked of the driver on each call)."""
        attr = self._drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
        return check(self._drv.cuDeviceGetAttribute(attr, self.handle), "cuDeviceGetAttribute")

    @property
    def mps(self) -> bool | None:
        """Whether contexts on this GPU are served by NVIDIA's Multi-Process Service (processes sharing the GPU
        run at once instead of taking turns); None where the driver cannot say."""
        attr = getattr(self._drv.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_MPS_ENABLED", None)
        if attr is None:
            return None
        return bool(check(self._drv.cuDeviceGetAttribute(attr, self.handle), "cuDeviceGetAttribute"))

    @property
    def uuid(self) -> str | None:
        """The GPU's UUID as hex (the same in every process, whatever its ``CUDA_VISIBLE_DEVICES``); None where the
        driver has no ``cuDeviceGetUuid``."""
        return _uuid(self._drv, self.handle)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if _host.current() is self._drv:  # this thread's current context is gone with it
                _host.note_current(None)
            check(self._drv.cuDevicePrimaryCtxRelease(self.handle), "cuDevicePrimaryCtxRelease")

    def __repr__(self) -> str:
        return f"<Device {self.ordinal}: {self.name} ({self.arch})>"


def _uuid(drv, handle) -> str | None:
    get = getattr(drv, "cuDeviceGetUuid", None)
    if get is None:
        return None
    return bytes(check(get(handle), "cuDeviceGetUuid").bytes).hex()


def ordinal_of(uuid: str, *, api=None) -> int:
    """The ordinal, in this process (its ``CUDA_VISIBLE_DEVICES``), of the GPU whose UUID is ``uuid`` (as
    :attr:`Device.uuid` gives it); NoDeviceError where this process sees none with it."""
    drv = require_driver(api)
    count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    for i in range(count):
        if _uuid(drv, check(drv.cuDeviceGet(i), "cuDeviceGet")) == uuid:
            return i
    raise NoDeviceError(f"no GPU with UUID {uuid} is visible to this process (it sees {count}); check its "
                        "CUDA_VISIBLE_DEVICES")


def versions() -> dict[str, str]:
    """Versions of the CUDA Python stack as installed."""
    out = {}
    for dist in ("cuda-bindings", "cuda-core", "cupy-cuda13x", "nvmath-python", "nvidia-cuda-nvrtc",
                 "reactivex", "watchdog", "numpy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def device_info() -> dict:
    """Driver, devices and stack versions; ``error`` says why there is no device. Never raises."""
    info: dict = {"versions": versions()}
    try:
        drv = require_driver()
    except NoDeviceError as e:
        info["error"] = e.reason
        return info
    v = check(drv.cuDriverGetVersion(), "cuDriverGetVersion")
    info["driver_cuda"] = f"{v // 1000}.{(v % 1000) // 10}"
    devices = []
    for i in range(check(drv.cuDeviceGetCount(), "cuDeviceGetCount")):
        h = check(drv.cuDeviceGet(i), "cuDeviceGet")
        a = drv.CUdevice_attribute
        name = check(drv.cuDeviceGetName(256, h), "cuDeviceGetName").split(b"\0")[0].decode()
        ma = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, h), "attr")
        mi = check(drv.cuDeviceGetAttribute(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, h), "attr")
        mem = check(drv.cuDeviceTotalMem(h), "cuDeviceTotalMem")
        devices.append({"ordinal": i, "name": name, "compute_capability": f"{ma}.{mi}",
                        "memory_gib": round(mem / 2**30, 1)})
    info["devices"] = devices
    return info
