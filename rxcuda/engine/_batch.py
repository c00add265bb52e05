"""GPU-driven frames: ``engine.run_batch(k)`` runs k frames with one host launch (the frame runner,
``_frames.FrameRunner.run_batch``, launches it).

The batch graph (rxcuda.cuda._batch) mirrors the running frame graph inside a device loop. It is made on
first use and kept while the frame graph is: a rebuild or a recapture makes a new one; any other applied
change (parameters, rebinds, code swaps) is re-applied to it before the next batch.
"""

from __future__ import annotations

import numpy as np

from ..blocks._regions import condition_kernels
from ..cuda._batch import BatchGraph
from ..cuda._memory import copy_dtoh
from ..model import _dtypes
from ..model._errors import ValidationError
from ..model._regions import CONDITION_DTYPES


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
        assert self._counter is not None, "frames_run before a batch was prepared"
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
