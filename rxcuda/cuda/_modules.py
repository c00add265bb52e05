"""Loading kernel code into the context: modules cached by content, signatures checked against the kernel."""

from __future__ import annotations

import threading

import attrs

from ..model._describe import KernelCode
from ..model._errors import CudaError, KernelFileError
from ._driver import check, drv
from ._heap import keep_jit_heap

_NOT_SUPPORTED = 801  # CUDA_ERROR_NOT_SUPPORTED: a driver that cannot report a kernel's parameters

_STATIC_SHARED_LIMIT = 48 * 1024


@attrs.define(eq=False)
class LoadedKernel:
    code: KernelCode
    module: object
    function: object  # CUfunction


class ModuleCache:
    """Loaded modules keyed by KernelCode.key; ``prune`` unloads what the current graph no longer uses."""

    def __init__(self, api=None) -> None:
        self._api = api if api is not None else drv
        self._loaded: dict[str, LoadedKernel] = {}
        self.loads = 0
        self.hits = 0
        # a structural change is prepared on a worker thread while the frame thread may swap code in
        self._lock = threading.RLock()

    def __contains__(self, key: str) -> bool:
        return key in self._loaded

    def keys(self) -> frozenset[str]:
        return frozenset(self._loaded)

    def load(self, code: KernelCode) -> LoadedKernel:
        hit = self._loaded.get(code.key)
        if hit is not None:
            self.hits += 1
            return hit
        with self._lock:
            return self._load(code)

    def _load(self, code: KernelCode) -> LoadedKernel:
        api = self._api
        hit = self._loaded.get(code.key)
        if hit is not None:  # loaded by another thread meanwhile
            self.hits += 1
            return hit
        image = code.image
        if code.format == "ptx":
            if not image.endswith(b"\0"):
                image = image + b"\0"
            if api is drv:
                keep_jit_heap()  # the JIT's working memory stays mapped between JITs (see rxcuda.cuda._heap)
        try:
            module = check(api.cuModuleLoadData(image), "cuModuleLoadData")
        except CudaError as e:
            raise KernelFileError(f"{code.origin}: the driver could not load this {code.format} "
                                  f"({e.name}: {e.explanation}); rebuild it for this GPU or toolkit",
                                  path=code.origin) from e
        try:
            function = check(api.cuModuleGetFunction(module, code.entry.encode()), "cuModuleGetFunction")
        except CudaError as e:
            api.cuModuleUnload(module)
            raise KernelFileError(f"{code.origin}: no kernel '{code.entry}' in the loaded module ({e.name}); "
                                  "check the sidecar's 'entry' (a C++ kernel needs extern \"C\" or its mangled "
                                  "name)", path=code.origin) from e
        try:
            _check_params(api, code, function)
            if code.shared_mem > _STATIC_SHARED_LIMIT:
                attr = api.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                check(api.cuFuncSetAttribute(function, attr, code.shared_mem), "cuFuncSetAttribute")
        except Exception:
            api.cuModuleUnload(module)
            raise
        loaded = LoadedKernel(code, module, function)
        self._loaded[code.key] = loaded
        self.loads += 1
        return loaded

    def code_of(self, function) -> KernelCode | None:
        """The code whose loaded function is ``function`` (None: not loaded here). Another device's cache
        loads the same code for its own context (``rxcuda.engine._devices``)."""
        for loaded in self._loaded.values():
            if loaded.function is function or int(loaded.function) == int(function):
                return loaded.code
        return None

    def prune(self, keep: frozenset[str] | set[str]) -> int:
        """Unload every module whose key is not in ``keep``; returns how many were unloaded."""
        with self._lock:
            gone = [k for k in self._loaded if k not in keep]
            for k in gone:
                check(self._api.cuModuleUnload(self._loaded.pop(k).module), "cuModuleUnload")
        return len(gone)

    def close(self) -> None:
        self.prune(frozenset())


def max_active_blocks(function, block_threads: int, shared_mem: int, *, api=None) -> int:
    """How many blocks of ``block_threads`` threads (and ``shared_mem`` bytes of dynamic shared memory) of a
    loaded ``function`` one multiprocessor holds at once (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
    api = api if api is not None else drv
    return check(api.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, block_threads, shared_mem),
                 "cuOccupancyMaxActiveBlocksPerMultiprocessor")


def _check_params(drv, code: KernelCode, function) -> None:
    """The signature we were told must match the kernel's real parameter layout, one by one."""
    params = code.signature.params
    for i, p in enumerate(params):
        err, _offset, size = drv.cuFuncGetParamInfo(function, i)
        if int(err) == _NOT_SUPPORTED:
            return  # this driver cannot tell; the description is trusted
        if err:
            raise KernelFileError(f"{code.origin}: the description lists {len(params)} parameters but kernel "
                                  f"'{code.entry}' has only {i}; parameter {i} ('{p.name}') does not exist — "
                                  "fix the sidecar", path=code.origin)
        if size != p.size:
            raise KernelFileError(f"{code.origin}: parameter {i} ('{p.name}') is described as {p.describe()} "
                                  f"({p.size} bytes) but kernel '{code.entry}' takes {size} bytes there — fix "
                                  "the sidecar", path=code.origin)
    err, _o, _s = drv.cuFuncGetParamInfo(function, len(params))
    if not err:
        raise KernelFileError(f"{code.origin}: kernel '{code.entry}' takes more than the {len(params)} parameters "
                              "described; add the missing ones to the sidecar", path=code.origin)
