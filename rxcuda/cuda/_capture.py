"""Work issued on a stream, captured into a CUDA graph and replayed: the verbs ``rxcuda.tensor.function`` uses.

:func:`capture` runs a Python callable while ``stream`` is in capture mode (relaxed: the array library may take
memory from its pool meanwhile), and returns a :class:`CapturedGraph`: the instantiated graph, whose
:meth:`~CapturedGraph.launch` is one ``cuGraphLaunch`` made with the GIL held (``_fast.FastDriver``), counted in
``launches``. A failure inside the callable ends the capture and destroys what was captured before it re-raises.

>>> from rxcuda.cuda import NullDriver
>>> api = NullDriver()
>>> g = capture(7, lambda: None, api=api)
>>> g.launch(7)
>>> api.names()[-3:], g.launches
(['cuStreamEndCapture', 'cuGraphInstantiate', 'cuGraphLaunch'], 1)
>>> g.close()
>>> api.leaks()
{}
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

from ._driver import check, drv
from ._fast import FastDriver

_FAST: dict[int, FastDriver] = {}


def _fast(api) -> FastDriver:
    """One FastDriver per driver api (loading libcuda for the GIL-held calls happens once)."""
    fast = _FAST.get(id(api))
    if fast is None or fast.api is not api:
        fast = _FAST[id(api)] = FastDriver(api=api)
    return fast


def _destroy(api, graph, graph_exec) -> None:
    with contextlib.suppress(Exception):  # a finalizer: the context may be gone already
        if graph_exec is not None:
            api.cuGraphExecDestroy(graph_exec)
        api.cuGraphDestroy(graph)


class CapturedGraph:
    """An instantiated graph made by :func:`capture`: :meth:`launch` replays it on a stream; :meth:`close`
    destroys it (and so does garbage collection, as a safety net)."""

    def __init__(self, graph, api=None):
        self._api = api if api is not None else drv
        try:
            self.exec = check(self._api.cuGraphInstantiate(graph, 0), "cuGraphInstantiate (captured tensor program)")
        except BaseException:
            self._api.cuGraphDestroy(graph)
            raise
        self.graph = graph
        self.launches = 0
        fast = _fast(self._api)
        self._launch = fast.launcher(int(self.exec))
        self._finalizer = weakref.finalize(self, _destroy, self._api, graph, self.exec)
        self._finalizer.atexit = False

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def launch(self, stream: int) -> None:
        """Replay the graph on ``stream`` (a handle as an int): one driver call."""
        if self.closed:
            raise RuntimeError("this captured graph is closed; capture the work again")
        err = self._launch(stream)
        if err:
            FastDriver.raise_for(err, "cuGraphLaunch (captured tensor program)")
        self.launches += 1

    def close(self) -> None:
        """Destroy the graph and its executable form; a second close does nothing."""
        self._finalizer()


def capture(stream: int, record: Callable[[], object], api=None) -> CapturedGraph:
    """Capture the work ``record()`` issues on ``stream`` into a graph and instantiate it. Relaxed capture
    mode: allocations from a memory pool (outside the stream) stay legal while it runs; work issued on the legacy
    default stream or a synchronizing call fails the capture with the driver's error."""
    api = api if api is not None else drv
    mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    check(api.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")
    try:
        record()
    except BaseException:
        err, graph = api.cuStreamEndCapture(stream)
        if not err and graph is not None:
            api.cuGraphDestroy(graph)
        raise
    graph = check(api.cuStreamEndCapture(stream), "cuStreamEndCapture (the work issued while capturing)")
    return CapturedGraph(graph, api)
