"""The per-frame driver calls, made without releasing the GIL.

cuda.bindings releases the GIL around every driver call. That is right for long calls, but on the frame
path it is what makes frames slow under load: each release lets a busy Python thread (a parameter
producer, say) take the GIL, and the engine thread then waits up to the interpreter's switch interval
(5 ms) to get it back — once per call, five calls a frame. Measured on an H200 with one producer thread:
26 ms frames at 60 Hz. The handful of calls a frame makes (graph launch, exec-node update, event record,
stream query) take microseconds, so here they hold the GIL; waiting for the GPU spins on cuStreamQuery for
a short while before falling back to a blocking (GIL-releasing) synchronize.

Falls back to cuda.bindings where libcuda cannot be opened through ctypes.
"""

from __future__ import annotations

import ctypes
import time

from ._driver import check, drv

_NOT_READY = 600  # CUDA_ERROR_NOT_READY


class FastDriver:
    """Frame-path driver calls on raw handles (ints). Each returns the CUresult as an int."""

    def __init__(self, spin_us: float = 2000.0):
        self.spin_ns = int(spin_us * 1e3)
        try:
            lib = ctypes.PyDLL("libcuda.so.1")  # PyDLL: calls keep the GIL
            vp = ctypes.c_void_p
            self._launch = _fn(lib, "cuGraphLaunch", vp, vp)
            self._query = _fn(lib, "cuStreamQuery", vp)
            self._record = _fn(lib, "cuEventRecord", vp, vp)
            self._set_params = _fn(lib, "cuGraphExecKernelNodeSetParams_v2", vp, vp, vp)
            self._elapsed = _fn(lib, "cuEventElapsedTime_v2", ctypes.POINTER(ctypes.c_float), vp, vp)
            self.native = True
        except (OSError, AttributeError):
            self.native = False
        self._ms = ctypes.c_float()

    def launch(self, graph_exec: int, stream: int) -> None:
        err = self._launch(graph_exec, stream) if self.native else drv.cuGraphLaunch(graph_exec, stream)[0]
        if err:
            _raise(err, "cuGraphLaunch")

    def set_kernel_params(self, graph_exec: int, node: int, params) -> None:
        """``params``: a cuda.bindings CUDA_KERNEL_NODE_PARAMS (its struct address is passed)."""
        if self.native:
            err = self._set_params(graph_exec, node, params.getPtr())
        else:
            err = drv.cuGraphExecKernelNodeSetParams(graph_exec, node, params)[0]
        if err:
            _raise(err, "cuGraphExecKernelNodeSetParams")

    def set_kernel_params_raw(self, graph_exec: int, node: int, params_ptr: int, params) -> None:
        """As set_kernel_params, with the struct's address computed once at build time (the hot path)."""
        err = (self._set_params(graph_exec, node, params_ptr) if self.native
               else drv.cuGraphExecKernelNodeSetParams(graph_exec, node, params)[0])
        if err:
            _raise(err, "cuGraphExecKernelNodeSetParams")

    def record(self, event: int, stream: int) -> None:
        err = self._record(event, stream) if self.native else drv.cuEventRecord(event, stream)[0]
        if err:
            _raise(err, "cuEventRecord")

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
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def elapsed_us(self, start: int, end: int) -> float:
        if self.native:
            err = self._elapsed(ctypes.byref(self._ms), start, end)
            if err:
                _raise(err, "cuEventElapsedTime")
            return self._ms.value * 1e3
        return check(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime") * 1e3


def _fn(lib, name: str, *argtypes):
    f = getattr(lib, name)
    f.argtypes = argtypes
    f.restype = ctypes.c_int
    return f


def _raise(err: int, call: str) -> None:
    check((drv.CUresult(err),), call)


def handle(obj) -> int:
    """The raw address of a cuda.bindings handle (CUgraphExec, CUstream, CUevent, CUgraphNode)."""
    return int(obj)
