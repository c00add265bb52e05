"""Seeing inside the engine: its picture, its trace, its live view, its GL interop and how a notebook shows it. A
mixin of :class:`rxcuda.Engine` (``_engine``): each method is the engine's own, and the work is done in
``rxcuda.view`` (above the engine, which never imports it), whose functions it calls through
:mod:`rxcuda.model._provided` -- but for the driver's picture of the running graph (``save_driver_graph``), which
the CUDA layer draws here."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable
from typing import Any

from ..model._provided import provided


class EngineViews:
    """What an Engine shows of itself (see :class:`rxcuda.Engine`); done by ``rxcuda.view``, but for the driver's
    own picture (``save_driver_graph``), which the CUDA layer draws."""

    _updater: Any  # (the Engine's)

    def _check_open(self) -> None:  # the Engine's own check (it raises EngineClosedError once closed)
        raise NotImplementedError

    def _gpu(self, fn, *args):  # the Engine's: run fn where the GPU may be touched
        raise NotImplementedError

    def to_dot(self) -> str:
        """DOT text of the pipeline: blocks with their ports and states, connections, regions and composites
        (:func:`rxcuda.to_dot`; pure Python, no Graphviz needed)."""
        return provided("to_dot")(self)

    def save_graph(self, path: str | os.PathLike, format: str | None = None) -> pathlib.Path:
        """Write a picture of the pipeline (svg, png or pdf through Graphviz, or the DOT text for .dot); returns
        the path (:func:`rxcuda.save_graph`). A picture needs Graphviz: ``pip install '.[view]'`` and its
        ``dot`` program (apt install graphviz).

        >>> engine.save_graph("pipeline.svg")                # doctest: +SKIP
        """
        return provided("save_graph")(self, path, format)

    def save_driver_graph(self, path: str | os.PathLike, *, verbose: bool = False) -> pathlib.Path:
        """Write the CUDA driver's own DOT picture of the graph the engine runs (``cuGraphDebugDotPrint``) to
        ``path``; returns the path. It shows what the driver built -- node types, kernel names, memset and copy
        nodes, conditional nodes -- for debugging the build itself; ``verbose=True`` adds every node's parameters
        and handles. Pending changes are applied first (the graph is built if it was not yet). On the null driver
        the file says it is the null driver's. (The engine's own work, no extra needed;
        :func:`rxcuda.view.save_driver_graph` calls it.)

        >>> engine.save_driver_graph("driver.dot")           # doctest: +SKIP
        """
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"'path' is a file name or a path (got {path!r})")
        path = pathlib.Path(path)
        if not path.parent.is_dir():
            raise FileNotFoundError(f"cannot write {str(path)!r}: the folder {str(path.parent)!r} does not exist")
        self._check_open()

        def write() -> None:
            self._updater.ensure_built().debug_dot(path, verbose=bool(verbose))

        self._gpu(write)
        return path

    def trace(self, path: str | os.PathLike, frames: int | None = None) -> Any:
        """Record a Chrome/Perfetto trace of this engine into ``path``: per frame the host time (and phases),
        the GPU time (per block, when measured), applied updates with their tiers, reloads and diagnostics, and
        parameter values as counters. Returns a :class:`rxcuda.view.Trace`, which is a context manager.

        ``frames``: stop after that many ticks and write the file; ``None``: record until the ``with`` block
        ends (or ``trace.stop()``). Open the file in https://ui.perfetto.dev or chrome://tracing;
        ``rxcuda plot TRACE -o frames.png`` draws its frame times.

        >>> with engine.trace("trace.json") as t:                                   # doctest: +SKIP
        ...     for _ in range(100): engine.tick()
        >>> print(t.summary())                                                        # doctest: +SKIP
        """
        return provided("trace")(self, path, frames)

    def serve(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
              params: Iterable | None = None) -> Any:
        """Serve this engine as a live web page: the pipeline as a graph with states, frame times, diagnostics,
        memory, and every scalar parameter (or only those named in ``params``: ``"block.param"`` names or
        blocks) as a control that sets it. Returns a :class:`rxcuda.view.LiveView` (``.url``; ``wait(seconds)``
        keeps serving; ``dispose()`` or a ``with`` block stops it; so does ``engine.close()``); see
        :func:`rxcuda.view.serve` for ``host``, ``port`` and ``token``. Needs aiohttp: ``pip install '.[view]'``.

        >>> running = engine.run(60)                              # doctest: +SKIP
        >>> with engine.serve(params=["mul.scale"]) as view:      # doctest: +SKIP
        ...     print(view.url, "- serving for 60 s")
        ...     view.wait(60)
        """
        return provided("serve")(self, host, port, token, params)

    def gl_buffer(self, port: Any, glo: int) -> Any:
        """Share ``port``'s memory with the OpenGL buffer object named ``glo`` (zero-copy); returns a
        :class:`rxcuda.view.GLBuffer`. Any GL binding makes the object (examples/particles_gl.py uses moderngl:
        ``pip install '.[gl]'``); rxcuda needs only its name and a current GL context."""
        return provided("gl_buffer")(self, port, glo)

    def gl_texture(self, port: Any, glo: int) -> Any:
        """Copy the 2-D ``port`` into the OpenGL texture named ``glo`` on the GPU after every frame; returns a
        :class:`rxcuda.view.GLTexture`."""
        return provided("gl_texture")(self, port, glo)

    def _repr_html_(self) -> str:  # how Jupyter shows an engine
        return provided("engine_html")(self)


__all__ = ["EngineViews"]
