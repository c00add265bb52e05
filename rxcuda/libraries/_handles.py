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
:class:`DeviceLibraries` plus the call's own device memory and modules, and ``close()`` gives all of it
back; the last reference on a device destroys its handles and plans. Memory, modules and driver calls come
from the one CUDA layer (``rxcuda.cuda``); the context is the caller's (the engine's device), never one
made here.
"""

from __future__ import annotations

import importlib
import threading

import numpy as np

from ..cuda import _host
from ..cuda._context import require_current
from ..cuda._memory import BufferPool, DeviceBuffer
from ..cuda._modules import ModuleCache
from ..model import _dtypes
from ..model._describe import KernelCode

MiB = 1 << 20
DEFAULT_GEMM_WORKSPACE = 64 * MiB  # measured: no memory nodes for 64/512/2048 GEMMs (32 MiB was not enough)
DEFAULT_BLAS_WORKSPACE = 4 * MiB  # level-1/2 calls


def binding(name: str):
    """``nvmath.bindings.<name>`` imported on first use (importing it loads no CUDA library yet)."""
    return importlib.import_module(f"nvmath.bindings.{name}")


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


class Resources:
    """What a library call's ``setup`` returns: a reference on the device's handles plus its own memory and
    modules, all from the CUDA layer (``rxcuda.cuda``).

    Made in the context current on the calling thread (the engine's device), which must be on
    ``device_ordinal``. ``extra`` holds whatever the call stores (its plan, generator, workspace ...):
    handles, plans and its own allocations, never the pointers of the buffers it is captured with — those
    come in every capture's ``CaptureArgs``, so a rebound buffer only needs a recapture. ``close()`` runs
    the call's cleanups, unloads its modules, frees its memory and drops the reference on the device cache.
    """

    def __init__(self, device_ordinal: int):
        require_current(device_ordinal, "library call setup")
        self.host = _host.current()  # the CPU device's driver where it is the current one: no library handles
        self._libs = DeviceLibraries.acquire(device_ordinal) if self.host is None else None
        self.pool = BufferPool(api=self.host)
        self.modules = ModuleCache(api=self.host)
        self.cleanups: list = []
        self.extra: dict = {}
        self.closed = False

    @property
    def libs(self) -> DeviceLibraries:
        """The device's library handles (a GPU's: the CPU device computes library calls with NumPy)."""
        if self._libs is None:
            raise RuntimeError("the CPU device has no cuBLAS/cuFFT/cuRAND/cuSPARSE/cuSOLVER handles: a library "
                               "call computes there with NumPy (rxcuda/libraries/_host.py)")
        return self._libs

    def alloc(self, nbytes: int) -> DeviceBuffer:
        """Device memory of at least ``nbytes`` (at least one byte), owned by the call until ``close()``."""
        return self.pool.acquire(max(int(nbytes), 1))

    def constant(self, value, dtype) -> DeviceBuffer:
        """A device copy of one scalar (a fixed alpha/beta or a scale factor), written before it returns."""
        host = np.array([value], dtype=_dtypes.to_numpy(dtype))
        buf = self.alloc(host.nbytes)
        buf.upload(host, 0)  # setup time, outside any capture; waits for the copy
        return buf

    def load(self, code: KernelCode):
        """The CUfunction of ``code``, loaded through the CUDA layer's module cache; unloaded on close."""
        return self.modules.load(code).function

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        errors = []
        release = self._libs.release if self._libs is not None else None
        for fn in (*reversed(self.cleanups), self.modules.close, self.pool.close, release):
            if fn is None:
                continue
            try:
                fn()
            except Exception as e:  # keep releasing the rest
                errors.append(e)
        if errors:
            raise errors[0]


def close_resources(state) -> None:
    """A call's ``teardown``: close what its ``setup`` returned."""
    if state is not None:
        state.close()
