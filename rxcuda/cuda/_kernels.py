"""Kernels loaded and launched from Python, outside a graph: load a module from a code image (with JIT options
for PTX), get a function from it, and launch it on a stream with arguments packed once at load.

``rxcuda.tensor`` launches its generated kernels through these verbs on the stream of the CuPy arrays it hands
out, so nothing outside this layer calls the driver. A :class:`KernelLauncher` decides everything that does not
change between launches when it is made (the argument slots, their ``void**`` array, the packing format), so a
launch is one ``struct.pack_into`` and one ``cuLaunchKernel``.

>>> from rxcuda.cuda import NullDriver
>>> api = NullDriver()
>>> module = load_module(b".version 7.0", ptx=True, optimization_level=0, api=api)
>>> launch = KernelLauncher(module.function("rx_group"), ("pointer", "<f4"), api=api)
>>> launch(4, 256, (0x7F0000000000, 1.5), stream=0)
>>> api.names()[-1], launch.launches
('cuLaunchKernel', 1)
>>> module.close()
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from ..model._errors import CudaError
from ._driver import check, drv
from ._heap import keep_jit_heap

# a value's struct code by NumPy dtype kind and size: little-endian standard sizes (pointers are 8 bytes)
_CODES = {("f", 4): "f", ("f", 8): "d", ("i", 1): "b", ("i", 2): "h", ("i", 4): "i", ("i", 8): "q",
          ("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q", ("b", 1): "B"}
_SLOT = 8  # every argument in its own 8-byte slot: the driver reads each through its own pointer


def _unload(api, handle) -> None:
    with contextlib.suppress(Exception):  # a finalizer: the context may be gone already
        api.cuModuleUnload(handle)


class KernelModule:
    """A module loaded into the current context (see :func:`load_module`): :meth:`function` gets a kernel from
    it; :meth:`close` unloads it (and so does garbage collection, as a safety net)."""

    def __init__(self, handle, origin: str, api=None):
        self.handle = handle
        self.origin = origin
        self._api = api if api is not None else drv
        self._finalizer = weakref.finalize(self, _unload, self._api, handle)
        self._finalizer.atexit = False  # at exit the context goes with the process

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def function(self, entry: str) -> KernelFunction:
        """The kernel ``entry`` of this module; CudaError naming the entry if the module has none."""
        if self.closed:
            raise CudaError("cuModuleGetFunction", "CUDA_ERROR_INVALID_HANDLE",
                            f"the module of {self.origin} is closed; load it again")
        try:
            handle = check(self._api.cuModuleGetFunction(self.handle, entry.encode()), "cuModuleGetFunction")
        except CudaError as e:
            raise CudaError(f"cuModuleGetFunction ({self.origin})", e.name,
                            f"{e.explanation}: no kernel '{entry}' in this module (a C++ kernel needs extern \"C\" "
                            "or its mangled name)", e.code) from e
        return KernelFunction(self, entry, handle)

    def close(self) -> None:
        """Unload the module (its functions cannot be launched afterwards); a second close does nothing."""
        self._finalizer()

    def __repr__(self) -> str:
        return f"KernelModule({self.origin}{', closed' if self.closed else ''})"


class KernelFunction:
    """One kernel of a :class:`KernelModule` (which it keeps alive): its entry name and driver handle."""

    __slots__ = ("module", "entry", "handle")

    def __init__(self, module: KernelModule, entry: str, handle):
        self.module, self.entry, self.handle = module, entry, handle

    def __repr__(self) -> str:
        return f"KernelFunction({self.entry!r} of {self.module.origin})"


def load_module(image: bytes, *, ptx: bool = False, optimization_level: int | None = None,
                origin: str = "kernel code", api=None) -> KernelModule:
    """Load ``image`` (a cubin or fatbin, or PTX text with ``ptx=True``, which the driver JIT-compiles) into the
    current context. ``optimization_level`` (0..4, PTX only) is the JIT's ``CU_JIT_OPTIMIZATION_LEVEL``: 0 JITs
    fastest. ``origin`` names the code in errors. CudaError with the driver's reason if it cannot be loaded."""
    api = api if api is not None else drv
    if ptx and not image.endswith(b"\0"):
        image += b"\0"  # the driver reads PTX as a C string
    if optimization_level is not None and not (isinstance(optimization_level, int) and 0 <= optimization_level <= 4):
        raise ValueError(f"'optimization_level' must be an int in 0..4 (got {optimization_level!r})")
    if ptx and api is drv:
        keep_jit_heap()  # the JIT's working memory stays mapped between JITs (see rxcuda.cuda._heap)
    try:
        if optimization_level is not None and ptx:
            level = api.CUjit_option.CU_JIT_OPTIMIZATION_LEVEL
            handle = check(api.cuModuleLoadDataEx(image, 1, [level], [optimization_level]), "cuModuleLoadDataEx")
        else:
            handle = check(api.cuModuleLoadData(image), "cuModuleLoadData")
    except CudaError as e:
        log = _jit_log(api, image) if ptx else ""
        raise CudaError(f"{e.call} ({origin})", e.name, f"{e.explanation}: the driver could not load this "
                        f"{'PTX' if ptx else 'module image'}" + (f"; the JIT says: {log}" if log else ""),
                        e.code) from e
    return KernelModule(handle, origin, api)


def _jit_log(api, image: bytes) -> str:
    """The PTX JIT's error log for ``image`` (loaded again with a log buffer, only after it failed): what the JIT
    did not accept, line by line; '' where it cannot be had."""
    try:
        size = 1 << 13
        buf = bytearray(size)
        opt = api.CUjit_option
        err, handle = api.cuModuleLoadDataEx(image, 2, [opt.CU_JIT_ERROR_LOG_BUFFER,
                                                        opt.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES], [buf, size])
        if not err and handle is not None:  # it loaded this time: nothing to say, and nothing kept
            api.cuModuleUnload(handle)
        return bytes(buf).split(b"\0", 1)[0].decode(errors="replace").strip()[:2000]
    except Exception:  # (a driver without logs, a null driver): the error alone
        return ""


def _code(kind) -> str:
    if kind == "pointer":
        return "Q"
    dt = np.dtype(kind)
    code = _CODES.get((dt.kind, dt.itemsize))
    if code is None:
        raise ValueError(f"a kernel parameter is 'pointer' or a numeric dtype; {dt} has no kernel argument type")
    return code


class _Launch:
    """What every launcher shares: ``_storage`` (the arguments, packed over its first bytes by ``_packing`` at each
    call), ``_params_ptr`` (the ``void**`` the driver reads them through), made once by the subclass; the lock, the
    launch and its error. The driver copies the arguments when the launch is issued, so the storage is reused at
    once; the lock keeps launches from two threads apart. ``launches`` counts the calls."""

    function: KernelFunction
    _packing: struct.Struct
    _storage: ctypes.Array
    _params_ptr: int

    def _ready(self, function: KernelFunction, api) -> None:
        self.function = function
        self._api = api if api is not None else drv
        self._handle = function.handle
        self._lock = threading.Lock()
        self.launches = 0

    def _refused(self, args: Sequence, e: struct.error) -> str:
        raise NotImplementedError

    def __call__(self, grid, block, args: Sequence, stream: int, shared_mem: int = 0) -> None:
        """Launch on ``stream`` (a handle as an int) with ``grid`` and ``block`` (ints or 3-tuples) and ``args``."""
        gx, gy, gz = (grid, 1, 1) if type(grid) is int else grid
        bx, by, bz = (block, 1, 1) if type(block) is int else block
        with self._lock:
            try:
                self._packing.pack_into(self._storage, 0, *args)
            except struct.error as e:
                raise ValueError(self._refused(args, e)) from None
            err = self._api.cuLaunchKernel(self._handle, gx, gy, gz, bx, by, bz, shared_mem, stream,
                                           self._params_ptr, 0)[0]
            self.launches += 1
        if err:
            check((err,), f"cuLaunchKernel ({self.function.entry} of {self.function.module.origin})")


class KernelLauncher(_Launch):
    """Launches ``function`` with arguments of the kinds ``params`` (``"pointer"``: a device address as an int;
    else a NumPy dtype: the value is packed as that type, e.g. ``"<f4"``; a bool as one byte): one value per
    parameter, each in its own 8-byte slot that the ``void**`` points at.

    The argument storage, its ``void**`` array and the packing format are made here, once; each call packs the
    values into the storage and makes one ``cuLaunchKernel`` (see :class:`_Launch`)."""

    def __init__(self, function: KernelFunction, params: Sequence, *, api=None):
        self.params = tuple(params)
        codes = [_code(p) for p in self.params]
        self._packing = struct.Struct("<" + "".join(c + "x" * (_SLOT - struct.calcsize("<" + c)) for c in codes))
        self._storage = ctypes.create_string_buffer(max(self._packing.size, _SLOT))
        base = ctypes.addressof(self._storage)
        self._pointers = (ctypes.c_void_p * max(len(codes), 1))(*[base + _SLOT * k for k in range(len(codes))])
        self._params_ptr = ctypes.addressof(self._pointers) if codes else 0
        self._ready(function, api)

    def _refused(self, args: Sequence, e: struct.error) -> str:
        return f"{len(args)} arguments for kernel '{self.function.entry}' with parameters {self.params}: {e}"


class BlockLauncher(_Launch):
    """Launches ``function`` whose one parameter is a struct passed by value (a *parameter block*): ``template``
    (bytes) is its content, made once; each call packs ``args`` with ``values`` (a ``struct.Struct``) over its
    first bytes and makes one ``cuLaunchKernel`` (see :class:`_Launch`). For kernels that take many values or a
    small program in their parameters, such as the tensor interpreter."""

    def __init__(self, function: KernelFunction, template: bytes, values: struct.Struct, *, api=None):
        if values.size > len(template):
            raise ValueError(f"the values ({values.size} bytes) do not fit the parameter block of "
                             f"{len(template)} bytes of kernel '{function.entry}'")
        self.values = self._packing = values
        self._storage = ctypes.create_string_buffer(bytes(template), len(template))
        self._pointer = (ctypes.c_void_p * 1)(ctypes.addressof(self._storage))
        self._params_ptr = ctypes.addressof(self._pointer)
        self._ready(function, api)

    def _refused(self, args: Sequence, e: struct.error) -> str:
        return (f"{len(args)} values for the parameter block of kernel '{self.function.entry}' "
                f"({self.values.format}): {e}")
