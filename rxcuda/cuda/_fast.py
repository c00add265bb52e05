"""The per-frame driver calls, made without releasing the GIL.

cuda.bindings releases the GIL around every driver call. That is right for long calls, but on the frame
path it is what makes frames slow under load: each release lets a busy Python thread (a parameter
producer, say) take the GIL, and the engine thread then waits up to the interpreter's switch interval
(5 ms) to get it back — once per call, five calls a frame. Measured on an H200 with one producer thread:
26 ms frames at 60 Hz. The handful of calls a frame makes (graph launch, exec-node update, event record,
stream query) take microseconds, so here they hold the GIL; waiting for the GPU spins on cuStreamQuery for
a short while before falling back to a blocking (GIL-releasing) synchronize.

The library is the one cuda.bindings itself loaded (found through cuda.pathfinder). Where it cannot be
opened through ctypes, or the layer runs on a null driver, the calls go through the driver ``api`` (which
releases the GIL); the real-driver case says so once in the log.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import time

import numpy as np

from . import _native
from ._driver import check, drv

log = logging.getLogger("rxcuda")
_warned = False


def _libcuda() -> ctypes.PyDLL:
    """libcuda as cuda.bindings loads it, opened so that calls keep the GIL."""
    from cuda.pathfinder import load_nvidia_dynamic_lib

    return ctypes.PyDLL(load_nvidia_dynamic_lib("cuda").abs_path)

_NOT_READY = 600  # CUDA_ERROR_NOT_READY


class FastDriver:
    """Frame-path driver calls on raw handles (ints). Each returns the CUresult as an int."""

    def __init__(self, spin_us: float = 2000.0, api=None):
        global _warned
        self.spin_ns = int(spin_us * 1e3)
        self.api = api if api is not None else drv
        self.native = False
        if self.api is not drv:  # a null driver: every call goes through it and is recorded
            self._ms = ctypes.c_float()
            return
        try:
            lib = _libcuda()
            vp = ctypes.c_void_p
            self._launch = _fn(lib, "cuGraphLaunch", vp, vp)
            self._query = _fn(lib, "cuStreamQuery", vp)
            self._record = _fn(lib, "cuEventRecord", vp, vp)
            self._event_query = _fn(lib, "cuEventQuery", vp)
            self._set_params = _fn(lib, "cuGraphExecKernelNodeSetParams_v2", vp, vp, vp)
            self._elapsed = _fn(lib, "cuEventElapsedTime_v2", ctypes.POINTER(ctypes.c_float), vp, vp)
            self._add_node = ctypes.cast(lib.cuGraphAddKernelNode_v2, vp).value
            self.native = True
        except Exception as e:  # OSError, AttributeError, pathfinder's DynamicLibNotFoundError
            if not _warned:
                _warned = True
                log.warning("rxcuda: the per-frame driver calls fall back to cuda.bindings (they release the GIL, "
                            "so frames may slow down under busy Python threads): %s", e)
        self._ms = ctypes.c_float()

    @functools.cached_property
    def batches(self) -> bool:
        """Whether ``add_kernel_nodes`` can add a build's kernel nodes in one compiled call (the real driver and
        the compiled module; elsewhere each node adds itself through cuda.bindings or the null driver)."""
        return self.native and _native.hotpath() is not None

    def add_kernel_nodes(self, graph, nodes: list, deps) -> list[int]:
        """Add kernel ``nodes`` (whose CUDA_KERNEL_NODE_PARAMS are at ``node.params_ptr``) to ``graph``, node i after
        the nodes ``deps[i]`` names by index (each below i), in one call of the compiled module
        (``add_kernel_nodes`` in _hotpath.c, the GIL released): the nodes' handles as ints. Only where
        ``batches``. Raises the CudaError of the first node the driver refuses, naming it."""
        n = len(nodes)
        params = np.fromiter([node.params_ptr for node in nodes], dtype=np.uint64, count=n)
        counts = np.fromiter(map(len, deps), dtype=np.int64, count=n)
        flat = np.fromiter(itertools.chain.from_iterable(deps), dtype=np.int64, count=int(counts.sum()))
        out = np.zeros(max(n, 1), dtype=np.uint64)
        hp = _native.hotpath()
        assert hp is not None
        failed, err = hp.add_kernel_nodes(self._add_node, int(graph), params.ctypes.data, counts.ctypes.data,
                                          flat.ctypes.data, out.ctypes.data, n)
        if err == -1:
            raise RuntimeError(f"{nodes[failed].plan.label}: a dependency does not name an earlier node")
        if err:
            _raise(err, f"cuGraphAddKernelNode ({nodes[failed].plan.label})")
        return out[:n].tolist()

    def launch(self, graph_exec: int, stream: int) -> None:
        err = self._launch(graph_exec, stream) if self.native else self.api.cuGraphLaunch(graph_exec, stream)[0]
        if err:
            _raise(err, "cuGraphLaunch")

    def set_kernel_params_raw(self, graph_exec: int, node: int, params_ptr: int, params) -> None:
        """As set_kernel_params, with the struct's address computed once at build time (the hot path)."""
        err = (self._set_params(graph_exec, node, params_ptr) if self.native
               else self.api.cuGraphExecKernelNodeSetParams(graph_exec, node, params)[0])
        if err:
            _raise(err, "cuGraphExecKernelNodeSetParams")

    def launcher(self, graph_exec: int):
        """A callable ``(stream) -> CUresult as int`` launching this executable graph, bound once."""
        if self.native:
            return functools.partial(self._launch, graph_exec)
        api = self.api
        return lambda stream: int(api.cuGraphLaunch(graph_exec, stream)[0])

    def node_updater(self, graph_exec: int, node: int, params_ptr: int, params):
        """A zero-argument callable applying one kernel node's staged parameters; returns the CUresult as an
        int. Bound once per graph, so the hot path is one call (``raise_for`` turns a non-zero result into
        the CudaError)."""
        if self.native:
            return functools.partial(self._set_params, graph_exec, node, params_ptr)
        api = self.api
        bound = getattr(api, "kernel_node_updater", None)  # a driver with its own bound path (the CPU device's)
        if bound is not None:
            return bound(graph_exec, node, params_ptr, params)
        return lambda: int(api.cuGraphExecKernelNodeSetParams(graph_exec, node, params)[0])

    @staticmethod
    def raise_for(err: int, call: str = "cuGraphExecKernelNodeSetParams") -> None:
        _raise(err, call)

    def record(self, event: int, stream: int) -> None:
        err = self._record(event, stream) if self.native else self.api.cuEventRecord(event, stream)[0]
        if err:
            _raise(err, "cuEventRecord")

    def done(self, event: int) -> bool:
        """Whether the work before ``event`` has finished; never waits."""
        err = self._event_query(event) if self.native else int(self.api.cuEventQuery(event)[0])
        if err == _NOT_READY:
            return False
        if err:
            _raise(err, "cuEventQuery")
        return True

    def wait(self, stream: int) -> None:
        """Wait for the stream: spin (GIL held) up to ``spin_us``, then block (GIL released)."""
        if self.native:
            deadline = time.perf_counter_ns() + self.spin_ns
            query = self._query
            while True:
                err = query(stream)
                if err != _NOT_READY:
                    if err:
                        _raise(err, "cuStreamQuery")
                    return
                if time.perf_counter_ns() > deadline:
                    break
        check(self.api.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def elapsed_us(self, start: int, end: int) -> float:
        if self.native:
            err = self._elapsed(ctypes.byref(self._ms), start, end)
            if err:
                _raise(err, "cuEventElapsedTime")
            return self._ms.value * 1e3
        return check(self.api.cuEventElapsedTime(start, end), "cuEventElapsedTime") * 1e3


def native_call(update) -> tuple[int, int, int, int]:
    """(function address, graph exec, node, params address) of an exec-node update that ``node_updater`` bound
    to the driver's own function, for the compiled parameter path (rxcuda.cuda._native) to call directly;
    (0, 0, 0, 0) for any other update (a null driver's: the compiled path calls it as it is)."""
    if type(update) is functools.partial and isinstance(update.func, ctypes._CFuncPtr) and len(update.args) == 3:
        return (ctypes.cast(update.func, ctypes.c_void_p).value or 0, *update.args)
    return 0, 0, 0, 0


def _fn(lib, name: str, *argtypes):
    f = getattr(lib, name)
    f.argtypes = argtypes
    f.restype = ctypes.c_int
    return f


def _raise(err: int, call: str) -> None:
    check((drv.CUresult(err),), call)

