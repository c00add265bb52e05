"""GPU-driven frames: ``engine.run_batch(k)`` runs k frames with one host launch.

The batch graph (rxcuda.cuda._batch) mirrors the running frame graph inside a device loop. It is made on
first use and kept while the frame graph is: a rebuild or a recapture makes a new one; any other applied
change (parameters, rebinds, code swaps) is re-applied to it before the next batch.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..cuda._batch import BatchGraph
from ..cuda._driver import is_sticky
from ..cuda._memory import copy_dtoh
from ..model import _dtypes
from ..model._errors import CudaError, ValidationError
from ..model._regions import CONDITION_DTYPES
from ._records import Frame
from ._regions import condition_kernels

_now = time.perf_counter_ns
_ident = threading.get_ident


class Batches:
    """The engine's batch graph and the device counter its loop counts down in."""

    def __init__(self, rt, updater):
        self.rt = rt
        self.updater = updater
        self.graph: BatchGraph | None = None
        self._key: tuple | None = None
        self._synced = -1
        self._counter = None  # a pooled 4-byte device buffer
        self._host = np.zeros(1, dtype=np.uint32)

    def stop_flag(self, port_ref, g) -> tuple[int, int]:
        """(device address, bytes) of the flag at ``port_ref``, checked to be one integer or bool value."""
        buf = g.plan.port_buffers.get(port_ref)
        if buf is None:
            raise ValidationError(f"the stop port {port_ref.port} has no buffer in the running graph; give it a "
                                  "connection or an output of a block that runs every frame")
        b = g.plan.buffers[buf]
        if b.dtype is None or _dtypes.dtype_name(b.dtype) not in CONDITION_DTYPES or b.count != 1:
            raise ValidationError(f"run_batch(until=...) takes a flag port: one u32 or bool value, nonzero to stop "
                                  f"(got {b.label}: {b.dtype or 'untyped'}[{b.count}])")
        return g.pointers[buf], _dtypes.itemsize(b.dtype)

    def prepare(self, stop: tuple[int, int] | None) -> BatchGraph:
        """The batch graph for the running frame graph, made or brought up to date."""
        rt = self.rt
        g = rt.running()
        key = (stop, self.updater.recaptures)
        if self.graph is None or self.graph.frame is not g or key != self._key:
            self.close()
            if self._counter is None:
                self._counter = rt.pool.acquire(4)
            kernels = condition_kernels("for")[0]
            init, step = (rt.modules.load(k.code).function for k in kernels)
            self.graph = BatchGraph(g, init, step, self._counter.ptr, rt.device.context, stop, api=rt.api)
            self._key = key
            self._synced = self.updater.applied
        elif self._synced != self.updater.applied:
            self.graph.sync()
            self._synced = self.updater.applied
        return self.graph

    def frames_run(self, k: int) -> int:
        """How many frames the last batch ran (after a wait): k minus what the loop counter has left."""
        rt = self.rt
        copy_dtoh(self._host.ctypes.data, self._counter.ptr, 4, api=rt.api, what="batch counter")
        return k - int(self._host[0])

    def close(self) -> None:
        if self.graph is not None:
            self.graph.close()
            self.graph = None
        self._key = None

    def release(self) -> None:
        self.close()
        if self._counter is not None:
            self.rt.pool.release(self._counter)
            self._counter = None


def run_batch(engine, k: int, until) -> Frame:
    """``engine.run_batch(k, until=...)`` (see its docstring): apply what is pending, launch the batch graph
    once, wait, and report one Frame for the batch."""
    engine._check_open()
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k < 2**32:
        raise ValueError(f"run_batch takes a frame count from 1 to 2**32-1 (got {k!r})")
    if engine._loop is not None and threading.current_thread() is not engine._loop.thread:
        raise RuntimeError("engine.run(...) drives the frames on its own thread; dispose it before calling "
                           "run_batch() yourself")
    t0 = _now()
    if _ident() != engine._gpu_thread:
        engine.device.make_current()
        engine._gpu_thread = _ident()
    rt, io = engine._rt, engine._io
    stop_ref = engine._ref(until) if until is not None else None
    try:
        tiers = engine._updater.apply_pending() if rt.pending.count else ()
        g = rt.graph
        if g is None:
            return engine._tick(True)
        stop = engine._batches.stop_flag(stop_ref, g) if stop_ref is not None else None
        batch = engine._batches.prepare(stop)
        if io.feeds:
            io.stage_feeds(g)
        stream = rt.stream_h
        fast = rt.fast
        prof = engine._profiler
        slot = prof.begin(stream) if prof.level != "none" else -1
        batch.launch(k, stream)
        if slot >= 0:
            prof.record_end(stream, slot)
        if io.taps:
            io.enqueue_taps(g, rt.frame + k)
        fast.wait(stream)
        frames = engine._batches.frames_run(k)
        times = None
        if slot >= 0:  # the batch's GPU time; per-block timings are the last frame's
            prof.finish(slot, rt.frame + frames, g, frames)
            times = prof.collect(True)
    except CudaError as e:
        if is_sticky(e):
            raise engine._lose(e) from e
        raise
    rt.frame += frames
    if io.taps:
        io.deliver_taps(True, engine._warn)
    frame = Frame(rt.frame, (_now() - t0) / 1e3, tiers, rt.reporter.state, True,
                  times.gpu_us if times else None, frames, times.blocks if times else None,
                  times.kernels if times else None)
    engine.last_frame = frame
    if engine._frames.observers:
        engine._frames.emit(frame)
    return frame
