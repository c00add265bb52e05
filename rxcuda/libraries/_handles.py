"""Per-device cache of library handles, plans, generators and workspaces.

Everything here is created in a call's ``setup`` — before any capture — and released in its ``teardown``.
Nothing is created while a stream captures: cublasCreate, cufftMakePlan, cusparseCreate and cuMemAlloc
are not capturable, and a captured cuBLAS call without a preset workspace records MEM_ALLOC/MEM_FREE
nodes, which make the captured graph unusable as a child-graph node.

Sharing rules (the engine captures on one thread, so handle *state* set right before a call is what the
call uses):

- one cuBLAS handle per device, in ``CUBLAS_POINTER_MODE_DEVICE``; every call sets its stream and its
  *own* workspace on the handle right before issuing its work, so two calls that the graph runs
  concurrently never share scratch memory;
- cuFFT plans are shared per (shape, layout, type, batch); auto-allocation is off and each call sets its
  own work area before executing;
- one cuSPARSE handle (pointer mode device) and one cuSOLVER-dense handle per device;
- cuRAND generators are per call (seed and offset are generator state).

:class:`Resources` is what a call's ``setup`` returns: it holds a reference on the device's
:class:`DeviceLibraries` plus the call's own device allocations, and ``close()`` gives all of it back;
the last reference on a device destroys its handles and plans.
"""

from __future__ import annotations

import ctypes
import importlib
import threading

import numpy as np

from ..model._errors import CudaError, NoDeviceError

MiB = 1 << 20
DEFAULT_GEMM_WORKSPACE = 64 * MiB  # measured: no memory nodes for 64/512/2048 GEMMs (32 MiB was not enough)
DEFAULT_BLAS_WORKSPACE = 4 * MiB  # level-1/2 calls


NUMPY_DTYPES = {
    "f16": np.float16, "bf16": np.uint16, "f32": np.float32, "f64": np.float64, "c64": np.complex64,
    "c128": np.complex128, "i32": np.int32, "i64": np.int64, "u8": np.uint8, "u32": np.uint32, "u64": np.uint64,
}  # fmt: skip


def binding(name: str):
    """``nvmath.bindings.<name>`` imported on first use (importing it loads no CUDA library yet)."""
    return importlib.import_module(f"nvmath.bindings.{name}")


def driver():
    from cuda.bindings import driver as drv

    return drv


def check(result, call: str):
    """Unpack a cuda.bindings driver result tuple; raise CudaError on failure."""
    drv = driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        _, text = drv.cuGetErrorString(err)
        raise CudaError(call, _text(name) or str(err), _text(text) or "", code=int(err))
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else tuple(rest)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def ensure_context(device_ordinal: int) -> None:
    """Make sure a context on ``device_ordinal`` is current (the primary one if none is)."""
    drv = driver()
    try:
        ctx = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    except Exception as e:  # no driver at all: cuda.pathfinder raises DynamicLibNotFoundError
        if isinstance(e, CudaError):
            ctx = None
        else:
            raise NoDeviceError(f"{type(e).__name__}: {e}") from e
    if ctx is not None and int(ctx) != 0:
        current = int(check(drv.cuCtxGetDevice(), "cuCtxGetDevice"))
        if current != device_ordinal:
            raise CudaError(
                "setup",
                "CUDA_ERROR_INVALID_CONTEXT",
                f"the current context is on device {current}, but the call was set up for device "
                f"{device_ordinal}; make device {device_ordinal} current first",
            )
        return
    from cuda.core import Device

    Device(device_ordinal).set_current()


class DeviceMemory:
    """A plain cuMemAlloc allocation (not stream-ordered, so never a memory node)."""

    __slots__ = ("ptr", "nbytes")

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(check(driver().cuMemAlloc(self.nbytes), "cuMemAlloc"))

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        """Synchronous host-to-device copy (setup time only)."""
        data = np.ascontiguousarray(array)
        if offset + data.nbytes > self.nbytes:
            raise ValueError(f"write of {data.nbytes} bytes at {offset} overflows {self.nbytes} bytes")
        check(driver().cuMemcpyHtoD(self.ptr + offset, data.ctypes.data, data.nbytes), "cuMemcpyHtoD")

    def read(self, dtype, count: int, offset: int = 0) -> np.ndarray:
        out = np.empty(count, dtype=NUMPY_DTYPES.get(dtype, dtype))
        check(driver().cuMemcpyDtoH(out.ctypes.data, self.ptr + offset, out.nbytes), "cuMemcpyDtoH")
        return out

    def free(self) -> None:
        if self.ptr:
            check(driver().cuMemFree(self.ptr), "cuMemFree")
            self.ptr = 0


class DeviceLibraries:
    """Library handles of one device, shared by every call set up on it, reference-counted."""

    _registry: dict[int, DeviceLibraries] = {}
    _lock = threading.Lock()

    def __init__(self, device_ordinal: int):
        self.device = device_ordinal
        self.refs = 0
        self._cublas: int | None = None
        self._cusparse: int | None = None
        self._cusolver: int | None = None
        self._plans: dict[tuple, tuple[int, int]] = {}
        self._generators: set[int] = set()
        self.created = {"cublas": 0, "cufft_plan": 0, "curand": 0, "cusparse": 0, "cusolver": 0}

    # -- lifetime ---------------------------------------------------------------------------------------
    @classmethod
    def acquire(cls, device_ordinal: int) -> DeviceLibraries:
        with cls._lock:
            libs = cls._registry.get(device_ordinal)
            if libs is None:
                libs = cls._registry[device_ordinal] = cls(device_ordinal)
            libs.refs += 1
            return libs

    def release(self) -> None:
        with DeviceLibraries._lock:
            self.refs -= 1
            if self.refs > 0:
                return
            if DeviceLibraries._registry.get(self.device) is self:
                del DeviceLibraries._registry[self.device]
        self._destroy()

    @classmethod
    def live(cls, device_ordinal: int) -> DeviceLibraries | None:
        """The cache of a device if any call holds it (for tests and diagnostics)."""
        return cls._registry.get(device_ordinal)

    def _destroy(self) -> None:
        errors = []

        def attempt(fn, *args):
            try:
                fn(*args)
            except Exception as e:  # keep releasing the rest
                errors.append(e)

        if self._plans:
            cufft = binding("cufft")
            for plan, _ in self._plans.values():
                attempt(cufft.destroy, plan)
            self._plans.clear()
        if self._generators:
            curand = binding("curand")
            for gen in list(self._generators):
                attempt(curand.destroy_generator, gen)
            self._generators.clear()
        if self._cublas is not None:
            attempt(binding("cublas").destroy, self._cublas)
            self._cublas = None
        if self._cusparse is not None:
            attempt(binding("cusparse").destroy, self._cusparse)
            self._cusparse = None
        if self._cusolver is not None:
            attempt(binding("cusolverDn").destroy, self._cusolver)
            self._cusolver = None
        if errors:
            raise errors[0]

    # -- handles ----------------------------------------------------------------------------------------
    def cublas(self) -> int:
        """The device's cuBLAS handle, in device pointer mode (alpha/beta are device pointers)."""
        if self._cublas is None:
            cublas = binding("cublas")
            handle = cublas.create()
            cublas.set_pointer_mode(handle, int(cublas.PointerMode.DEVICE))
            self._cublas = handle
            self.created["cublas"] += 1
        return self._cublas

    def cusparse(self) -> int:
        """The device's cuSPARSE handle, in device pointer mode."""
        if self._cusparse is None:
            cusparse = binding("cusparse")
            handle = cusparse.create()
            cusparse.set_pointer_mode(handle, int(cusparse.PointerMode.DEVICE))
            self._cusparse = handle
            self.created["cusparse"] += 1
        return self._cusparse

    def cusolver(self) -> int:
        """The device's cuSOLVER dense handle."""
        if self._cusolver is None:
            self._cusolver = binding("cusolverDn").create()
            self.created["cusolver"] += 1
        return self._cusolver

    def fft_plan(self, key: tuple) -> tuple[int, int]:
        """(plan, work size in bytes) for ``key`` = make_plan_many64 arguments after the plan handle.

        The plan is made with auto-allocation off: its user sets a work area before every execution.
        """
        found = self._plans.get(key)
        if found is None:
            cufft = binding("cufft")
            plan = cufft.create()
            try:
                cufft.set_auto_allocation(plan, 0)
                work = int(cufft.make_plan_many64(plan, *key))
            except Exception:
                cufft.destroy(plan)
                raise
            found = self._plans[key] = (plan, work)
            self.created["cufft_plan"] += 1
        return found

    def curand_generator(self, rng_type: int) -> int:
        """A new cuRAND generator owned by the caller (give it back with :meth:`drop_generator`)."""
        gen = binding("curand").create_generator(rng_type)
        self._generators.add(gen)
        self.created["curand"] += 1
        return gen

    def drop_generator(self, gen: int) -> None:
        if gen in self._generators:
            self._generators.discard(gen)
            binding("curand").destroy_generator(gen)


def _is_text(image: bytes) -> bool:
    return image[:1] not in (b"\x7f", b"\x50", b"\xba") and b"\0" not in image[:64]


class Resources:
    """What a library call's ``setup`` returns: a reference on the device's handles plus its own memory.

    ``extra`` holds whatever the call stores (its plan, generator, workspace layout ...); ``close()`` frees
    the call's allocations, runs its cleanups and drops the reference on the device cache.
    """

    def __init__(self, device_ordinal: int):
        ensure_context(device_ordinal)
        self.device = device_ordinal
        self.libs = DeviceLibraries.acquire(device_ordinal)
        self.memory: list[DeviceMemory] = []
        self.cleanups: list = []
        self.extra: dict = {}
        self.closed = False

    def alloc(self, nbytes: int) -> DeviceMemory:
        mem = DeviceMemory(nbytes)
        self.memory.append(mem)
        return mem

    def constant(self, value, dtype) -> DeviceMemory:
        """A device copy of one scalar (a fixed alpha/beta or a scale factor)."""
        arr = np.asarray([value], dtype=NUMPY_DTYPES.get(dtype, dtype))
        mem = self.alloc(arr.nbytes)
        mem.write(arr)
        return mem

    def load_module(self, image: bytes, entry: str):
        """CUfunction of ``entry`` in a PTX/cubin/fatbin image; the module is unloaded on close."""
        data = image + b"\0" if _is_text(image) and not image.endswith(b"\0") else image
        module = check(driver().cuModuleLoadData(data), "cuModuleLoadData")
        self.cleanups.append(lambda: check(driver().cuModuleUnload(module), "cuModuleUnload"))
        return check(driver().cuModuleGetFunction(module, entry.encode()), f"cuModuleGetFunction({entry})")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        errors = []
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception as e:
                errors.append(e)
        for mem in self.memory:
            try:
                mem.free()
            except Exception as e:
                errors.append(e)
        self.memory.clear()
        try:
            self.libs.release()
        except Exception as e:
            errors.append(e)
        if errors:
            raise errors[0]


def open_resources(device_ordinal: int) -> Resources:
    return Resources(device_ordinal)


def close_resources(state) -> None:
    if state is not None:
        state.close()


# -- kernel launches (generated kernels and engine kernels inside a chain) ------------------------------
_CTYPES = {
    "f16": ctypes.c_uint16,
    "bf16": ctypes.c_uint16,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
    "i8": ctypes.c_int8,
    "i16": ctypes.c_int16,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "u8": ctypes.c_uint8,
    "u16": ctypes.c_uint16,
    "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64,
}
_CTYPES_BY_SIZE = {1: ctypes.c_uint8, 2: ctypes.c_uint16, 4: ctypes.c_uint32, 8: ctypes.c_uint64}


def scalar_ctype(dtype: str | None, size: int):
    if dtype in _CTYPES:
        return _CTYPES[dtype]
    return _CTYPES_BY_SIZE[size]


def launch_kernel(func, grid, block, shared_mem: int, stream: int, args: list[tuple[object, object]]) -> None:
    """cuLaunchKernel on ``stream`` with (value, ctype) arguments (pointers as (int, c_void_p))."""
    values = tuple(v for v, _ in args)
    types = tuple(t for _, t in args)
    check(
        driver().cuLaunchKernel(func, *grid, *block, shared_mem, stream, (values, types), 0),
        "cuLaunchKernel",
    )


def device_arch(device_ordinal: int) -> str:
    """'sm_90' etc. for a device."""
    from cuda.core import Device

    return "sm_" + Device(device_ordinal).arch


def compile_cubin(source: str, name: str, arch: str) -> bytes:
    """NVRTC-compile CUDA C++ to a cubin for ``arch`` ('sm_90'); setup time only."""
    from cuda.core import Program, ProgramOptions

    obj = Program(source, "c++", ProgramOptions(name=name, arch=arch, std="c++17")).compile("cubin")
    return bytes(obj.code)
