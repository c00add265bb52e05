"""A traced function's program on ``cuda``, captured into one CUDA graph and replayed (``rt.function``).

At the first call of a signature the program runs twice as it will be captured (kernels compiled and loaded,
the tuned NVRTC builds swapped in, the cuBLAS handle made: nothing of that may happen inside a capture), then once
more under stream capture through ``rxcuda.cuda._capture`` with the writes of the trace at its end. Every buffer
the captured run allocates is kept for the graph's life (a recording allocator), so the graph owns its
intermediates and outputs. A repeat call with the same buffers is one ``cuGraphLaunch`` on the backend's stream.

**Binding.** A graph reads and writes the buffers it was captured with (the arguments' data, the tensors the
function reads from outside, the write targets). A call whose buffers sit at the same addresses replays that
graph; other addresses capture a graph for them (up to :data:`LIMIT` per trace, ``stats.captures`` counts
them). So keep the data in the same tensors and write new values into them (``x[...] = batch``), as with
``torch.cuda.graphs``.

**Outputs** live in the graph's buffers. Before a replay overwrites them, an output tensor of an earlier call that
is still referenced gets its own copy (so results stay valid; drop them, or read ``float(loss)`` at once, to
skip that copy).

Matmuls run through ``_gemm.Gemm`` (cuBLAS through nvmath's bindings, host-side ``alpha``/``beta``, a fixed
workspace), because CuPy refuses cuBLAS while a stream captures.
"""

from __future__ import annotations

import weakref

import numpy as np

from ..cuda._capture import CapturedGraph, capture
from ._cache import STATS
from ._errors import CaptureError

LIMIT = 8
"""Graphs kept per trace (one per set of bound buffer addresses); a new one beyond this drops the oldest."""


def _address(a) -> int:
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    if ptr is not None:
        return int(ptr)
    if isinstance(a, np.ndarray):
        return int(a.ctypes.data)
    return id(a)


class _Graph:
    __slots__ = ("graph", "outputs", "kept")

    def __init__(self, graph: CapturedGraph, outputs: list, kept: list):
        self.graph, self.outputs, self.kept = graph, outputs, kept


class Replays:
    """The CUDA graphs of one trace (``_function._Trace``), by the addresses of the buffers they are bound to."""

    def __init__(self, trace):
        self.trace = trace
        self.program = trace.program
        self.backend = self.program.cuda
        self.graphs: dict[tuple, _Graph] = {}
        self.returned: list[weakref.ref] = []  # the output nodes of the last call (copied before an overwrite)

    def run(self, arrays: list, buffers: list, stats) -> list:
        be = self.backend
        kind = be.cp.ndarray
        targets = [b.array if type(b.array) is kind else be.cp.asarray(b.array) for b in buffers]
        key = tuple(a.data.ptr if type(a) is kind else _address(a) for a in arrays) + \
            tuple(t.data.ptr if type(t) is kind else _address(t) for t in targets)
        g = self.graphs.get(key)
        self._protect()
        if g is None:
            g = self._capture(key, arrays, targets)
            stats.captures += 1
        g.graph.launch(be.stream.ptr)
        stats.graph_launches += 1
        STATS.launches += 1
        for b in buffers:
            b.bump()
        return g.outputs

    def hold(self, outputs: list) -> None:
        """Remember the tensors a call returned: the next replay copies those still referenced first."""
        self.returned = [weakref.ref(t.node) for t in outputs]

    def _protect(self) -> None:
        for ref in self.returned:
            node = ref()
            if node is not None and node.op == "const":
                buf = node.attrs[0]
                with self.backend.stream:
                    buf.array = buf.array.copy()
        self.returned = []

    def _capture(self, key: tuple, arrays: list, targets: list) -> _Graph:
        be, program, nouts = self.backend, self.program, self.trace.nouts
        cp = be.cp
        from ._cuda import FACTORY

        be.capturing = True  # matmuls through Gemm, before and during the capture
        try:
            for _ in range(2):  # compile and load every kernel; the second launch starts the tuned builds
                program.run_arrays(arrays, STATS)
            FACTORY.wait(60.0)
            program.run_arrays(arrays, STATS)  # swaps the tuned builds in (module loads: not while capturing)
            be.stream.synchronize()
            kept: list = []
            outputs: list = []
            previous = cp.cuda.get_allocator()

            def allocate(size: int):
                memory = previous(size)
                kept.append(memory)  # the graph reads and writes it at every replay
                return memory

            def record() -> None:
                values = program.run_arrays(arrays, STATS, keep=kept)
                with be.stream:
                    for target, value in zip(targets, values[nouts:], strict=True):
                        target[...] = value
                outputs.extend(values[:nouts])

            cp.cuda.set_allocator(allocate)
            try:
                graph = capture(be.stream.ptr, record)
            except Exception as e:
                raise CaptureError(
                    f"rxcuda.tensor.function '{self.trace.owner.name}' could not be captured into a CUDA graph: "
                    f"{type(e).__name__}: {e}. A function that moves data between host and device (.to('cpu'), "
                    "NumPy arrays or Python lists used inside it) cannot be captured: make that data a CUDA tensor "
                    "and pass it in, or use rt.function(f, graphs=False)") from e
            finally:
                cp.cuda.set_allocator(previous)
        finally:
            be.capturing = False
        kept.extend(arrays)
        g = _Graph(graph, outputs, kept)
        if len(self.graphs) >= LIMIT:
            old = self.graphs.pop(next(iter(self.graphs)))
            old.graph.close()
        self.graphs[key] = g
        return g

    def close(self) -> None:
        for g in self.graphs.values():
            g.graph.close()
        self.graphs.clear()
