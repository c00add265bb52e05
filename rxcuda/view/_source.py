"""What the live view reads from what it serves: :class:`Source`, a narrow interface, and :class:`EngineSource`,
the one for an in-process :class:`rxcuda.Engine`.

The server (``_serve``) and the collector (``_collect``) touch nothing else: the streams they subscribe to, the
frame index, whether it closed, the blocks (for the controls), a parameter set, a port observed (previews), and
three messages built on demand (the hello's engine, ``graph`` and ``status``: PROTOCOL.md). An engine whose GPU
side runs elsewhere (``rxcuda.IsolatedEngine``: ``rxcuda/distributed/_isoview.py``) gives the view a source of
its own, which says ``None`` (the page: "not measured") for the figures it cannot get, never a made-up number.

>>> import rxcuda
>>> with rxcuda.Engine(driver=rxcuda.cuda.NullDriver()) as engine:
...     _ = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=16))
...     src = EngineSource(engine)
...     [b.name for b in src.blocks], src.about()["measured"], src.graph()["type"]
(['scalar_mul'], False, 'graph')
"""

from __future__ import annotations

from typing import Any

from reactivex import Observable

from ..engine._engine import Engine
from ._collect import graph_message, status_message


class Source:
    """What the live view shows of a running pipeline (see the module docstring). ``frames`` emits objects with
    ``index``, ``host_us``, ``gpu_us`` (None: not measured), ``tiers`` and ``blocks`` (as :class:`rxcuda.Frame`)
    and completes when the pipeline closes; ``updates`` objects with ``tiers``; ``diagnostics``
    :class:`rxcuda.Diagnostic` whose ``block`` is the id of one of :attr:`blocks`; the three change streams
    as an Engine's."""

    frames: Observable
    updates: Observable
    diagnostics: Observable
    parameter_changes: Observable
    structure_changes: Observable
    file_changes: Observable

    @property
    def frame(self) -> int:
        """The index of the latest frame."""
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        raise NotImplementedError

    @property
    def blocks(self) -> tuple[Any, ...]:
        """The blocks whose parameters the page shows and sets (the user's own)."""
        raise NotImplementedError

    def set(self, block, **values) -> None:
        """Set parameters of ``block`` through the engine's public path (every check Python makes)."""
        raise NotImplementedError

    def observe(self, port, every: int) -> Observable:
        raise NotImplementedError

    def about(self) -> dict:
        """The hello message's ``engine``: device, profile, frame, measured, unmeasured."""
        raise NotImplementedError

    def graph(self) -> dict:
        """The ``graph`` message."""
        raise NotImplementedError

    def status(self) -> dict:
        """The ``status`` message."""
        raise NotImplementedError


class EngineSource(Source):
    """An in-process :class:`rxcuda.Engine` as the live view's source: its own streams and figures."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.frames = engine.frames
        self.updates = engine.updates
        self.diagnostics = engine.diagnostics
        self.parameter_changes = engine.parameter_changes
        self.structure_changes = engine.structure_changes
        self.file_changes = engine.file_changes

    @property
    def frame(self) -> int:
        return self.engine.frame

    @property
    def closed(self) -> bool:
        return self.engine.closed

    @property
    def blocks(self) -> tuple[Any, ...]:
        return self.engine.blocks

    def set(self, block, **values) -> None:
        block.set(**values)

    def observe(self, port, every: int) -> Observable:
        return self.engine.observe(port, every=every)

    def about(self) -> dict:
        engine = self.engine
        api = getattr(engine.device, "api", None)  # a driver that measures nothing says so (the null driver)
        return {"device": getattr(engine.device, "name", "?"), "profile": engine.profile, "frame": engine.frame,
                "measured": getattr(api, "measures", True), "unmeasured": getattr(api, "unmeasured", "")}

    def graph(self) -> dict:
        return graph_message(self.engine)

    def status(self) -> dict:
        return status_message(self.engine)


def as_source(x) -> Source:
    """``x`` as the live view's source: a :class:`Source` as it is, an Engine wrapped; else TypeError."""
    if isinstance(x, Source):
        return x
    if isinstance(x, Engine):
        return EngineSource(x)
    made = getattr(x, "_live_source", None)  # an engine whose GPU side runs elsewhere makes its own
    if made is not None:
        return made()
    raise TypeError(f"serve() shows an rxcuda.Engine or an rxcuda.IsolatedEngine (got {type(x).__name__}); use "
                    "engine.serve()")


__all__ = ["EngineSource", "Source", "as_source"]
