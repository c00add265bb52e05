"""Stream capture on the CPU device: work issued on a capturing stream becomes nodes of a graph, as on a GPU.

``cuStreamBeginCapture`` opens a graph for the stream; kernel launches, memsets, device-to-device copies and host
functions (``cuLaunchHostFunc``) issued on it until ``cuStreamEndCapture`` are added to that graph, each after the
one before, instead of running. A host function issued on a stream that does not capture runs at once (the CPU
device is synchronous). Copies between host and device memory cannot be captured, as from pageable memory on a
GPU: they fail the call.

>>> from rxcuda.cuda._cpu import CpuDriver
>>> api = CpuDriver()
>>> seen = []
>>> _ = api.cuStreamBeginCapture(5, 0)
>>> _ = api.cuLaunchHostFunc(5, seen.append, "ran")
>>> _, graph = api.cuStreamEndCapture(5)
>>> seen
[]
>>> _, ex = api.cuGraphInstantiate(graph, 0)
>>> _ = api.cuGraphLaunch(ex, 5)
>>> seen
['ran']
"""

from __future__ import annotations

from cuda.bindings import driver as _real

_R = _real.CUresult


class CaptureMixin:
    """The capture calls of :class:`~rxcuda.cuda._cpu.CpuDriver` (kept apart for the size of that module)."""

    _capturing: dict[int, list]  # stream -> [graph, the last node added]

    def cuStreamBeginCapture(self, stream, mode):
        s = int(stream)
        if s in self._capturing:
            self.calls.append(("cuStreamBeginCapture", (s, mode)))
            return (_R.CUDA_ERROR_ILLEGAL_STATE,)
        graph = self.cuGraphCreate(0)[1]
        self._capturing[s] = [int(graph), None]
        return self._call("cuStreamBeginCapture", (s, mode))

    def cuStreamEndCapture(self, stream):
        entry = self._capturing.pop(int(stream), None)
        if entry is None:
            self.calls.append(("cuStreamEndCapture", (int(stream),)))
            return (_R.CUDA_ERROR_ILLEGAL_STATE, None)
        return self._call("cuStreamEndCapture", (int(stream),), (_real.CUgraph(entry[0]),))

    def cuStreamIsCapturing(self, stream):
        status = _real.CUstreamCaptureStatus
        state = status.CU_STREAM_CAPTURE_STATUS_ACTIVE if int(stream) in self._capturing else \
            status.CU_STREAM_CAPTURE_STATUS_NONE
        return self._call("cuStreamIsCapturing", (int(stream),), (state,))

    def captured(self, stream, kind: str, data) -> bool:
        """Add a node of ``kind`` to the graph ``stream`` captures into, after the last one; False where the stream
        does not capture (the caller runs the work now)."""
        entry = self._capturing.get(int(stream)) if self._capturing else None
        if entry is None:
            return False
        h = int(self._new("node", _real.CUgraphNode))
        self._graphs[entry[0]].append((h, self._node(kind, data, (entry[1],) if entry[1] else ())))
        self._node_graph[h] = entry[0]
        entry[1] = h
        return True

    def refuse_in_capture(self, call: str, stream) -> None:
        if self._capturing and int(stream) in self._capturing:
            raise self._fail(call, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
                             "a copy between host and device memory cannot be captured on the CPU device")

    def cuLaunchHostFunc(self, stream, fn, user_data):
        if not self.captured(stream, "host", (fn, user_data)):
            fn(user_data)
        return self._call("cuLaunchHostFunc", (int(stream),))
