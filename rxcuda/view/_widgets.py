"""Notebook controls for a running engine (ipywidgets, the ``notebook`` extra): ``rxcuda.view.widgets(engine)``.

A slider (or a number box) per parameter, bound both ways: moving it calls ``block.set(...)``, so it goes
through the same checks as Python (types, declared ranges, a count's buffers); a refused value shows the
message under the controls and the slider returns to the parameter's value. A change made from code (or a
binding, or the live view) moves the slider: the controls follow ``engine.parameter_changes``. A count's
slider ends at ``Parameter.limit`` and follows it when a buffer is resized. Below the controls: the frame
times as a live plot, and a preview of each port in ``previews`` (a line for 1-D data, an image for 2-D).

Everything is updated from the frames the engine produces (``engine.run()`` in the background, or ticks),
at most every ``interval`` seconds, so a 60 fps engine sends the notebook a few small messages a second.

>>> controls = rxcuda.view.widgets(engine, previews=[blur["out"]])           # doctest: +SKIP
>>> controls                                                                  # doctest: +SKIP
>>> running = engine.run(60)                                                  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import math
import struct
import threading
import time
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..engine._engine import Engine
from ..model._errors import EngineClosedError
from ..model._words import counted
from ._serve import exposed_names
from ._source import as_source

PLOT_W, PLOT_H = 360, 90


class WidgetsNotFoundError(ImportError):
    """rxcuda.view.widgets needs ipywidgets (``pip install '.[notebook]'``)."""


def _ipywidgets():
    try:
        import ipywidgets
    except ImportError:
        raise WidgetsNotFoundError("rxcuda.view.widgets needs ipywidgets, which is not installed: pip install "
                                   "'.[notebook]' in rxcuda's checkout (or pip install ipywidgets)") from None
    return ipywidgets


def control_for(param, w):
    """The widget for one parameter: a slider where it has both ends (declared ``min``/``max``, or a count's
    ``limit``), else a number box."""
    label = f"{param._block.name}.{param.name}"
    style, layout = {"description_width": "initial"}, w.Layout(width="420px")
    if param.dtype.startswith("f"):
        if param.min is not None and param.max is not None:
            step = param.step or (param.max - param.min) / 100
            return w.FloatSlider(value=param.value, min=param.min, max=param.max, step=step, description=label,
                                 continuous_update=True, style=style, layout=layout, readout_format=".4g")
        return w.FloatText(value=param.value, description=label, style=style, layout=layout)
    limit = param.limit
    lo = param.min if param.min is not None else (0 if limit is not None or param.dtype.startswith("u") else None)
    hi = param.max if param.max is not None else limit
    if lo is not None and hi is not None:
        return w.IntSlider(value=param.value, min=lo, max=hi, step=param.step or 1, description=label,
                           style=style, layout=layout)
    return w.IntText(value=param.value, description=label, style=style, layout=layout)


def png(image: np.ndarray) -> bytes:
    """A PNG of a 2-D array (gray, scaled from its min to its max) or an (h, w, 3) uint8 RGB image."""
    a = np.asarray(image)
    if a.ndim == 3 and a.shape[2] in (3, 4) and a.dtype == np.uint8:
        pixels, colour = np.ascontiguousarray(a[..., :3]), 2
    else:
        a = np.nan_to_num(a.astype(np.float64).reshape(a.shape[0], -1))
        lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
        pixels, colour = ((a - lo) * (255.0 / (hi - lo) if hi > lo else 0.0)).astype(np.uint8), 0
    h, w = pixels.shape[:2]
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def sparkline(series: dict[str, Iterable[float]], unit: str = "", width: int = PLOT_W, height: int = PLOT_H) -> str:
    """An inline SVG of one or more series (name -> values) on a shared scale, with the latest values."""
    colours = ("#0969da", "#bf3989", "#1a7f37")
    data = {k: np.asarray([v for v in vs if v is not None and math.isfinite(v)], np.float64) for k, vs in
            series.items()}
    data = {k: v for k, v in data.items() if v.size}
    if not data:
        return f"<svg width='{width}' height='{height}'><text x='4' y='16' font-size='12'>no data yet</text></svg>"
    top = max(float(v.max()) for v in data.values()) or 1.0
    bottom = min(0.0, min(float(v.min()) for v in data.values()))
    parts, legend = [], []
    for (name, v), colour in zip(data.items(), colours, strict=False):
        if v.size > 2 * width:  # one point per pixel column or so
            v = v[:: v.size // width]
        xs = np.linspace(0, width, max(v.size, 2))[: v.size]
        ys = height - 14 - (v - bottom) / (top - bottom or 1.0) * (height - 18)
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True))
        parts.append(f"<polyline fill='none' stroke='{colour}' stroke-width='1.2' points='{points}'/>")
        legend.append(f"<tspan fill='{colour}'>{name} {v[-1]:.4g}{unit}</tspan>")
    text = f"<text x='4' y='{height - 2}' font-size='11'>{'  '.join(legend)}  (max {top:.4g}{unit})</text>"
    return f"<svg width='{width}' height='{height}' style='background:#f6f8fa'>{''.join(parts)}{text}</svg>"


class Widgets:
    """The notebook controls of one engine (see the module docstring); shown by displaying the object.

    ``controls``: ``"block.param"`` -> its widget. ``message``: the last refusal. ``plot``: the frame times.
    ``previews``: ``"block.port"`` -> its widget. ``refresh()`` redraws now; ``close()`` unsubscribes.
    """

    def __init__(self, engine: Engine | Any, params=None, previews=(), *, every: int = 4, interval: float = 0.2,
                 history: int = 240):
        w = _ipywidgets()
        try:
            src = as_source(engine)  # an Engine, or an IsolatedEngine (parameters set in this process)
        except TypeError:
            raise TypeError("widgets() shows an rxcuda.Engine or an rxcuda.IsolatedEngine (got "
                            f"{type(engine).__name__})") from None
        if src.closed:
            raise EngineClosedError("rxcuda.view.widgets: the engine is closed; show a running engine")
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(f"widgets(every=...) must be a positive int: preview every n-th frame (got {every!r})")
        self.engine, self.interval, self._src = engine, interval, src
        try:
            names = exposed_names(src, params) if params is not None else {
                f"{b.name}.{p}" for b in src.blocks for p in b.params}
        except ValueError as e:
            raise ValueError(str(e).replace("engine.serve(params=...)", "widgets(params=...)")) from None
        blocks = {b.name: b for b in src.blocks}
        self.params = {}
        for name in sorted(names):
            block, _, param = name.rpartition(".")
            self.params[name] = blocks[block].params[param]
        self.controls = {name: control_for(p, w) for name, p in self.params.items()}
        for name, widget in self.controls.items():
            widget.observe(lambda change, name=name: self._moved(name, change["new"]), names="value")
        self.message = w.HTML("")
        self.plot = w.HTML(sparkline({}))
        self.previews: dict[str, object] = {}
        self._latest: dict[str, np.ndarray] = {}
        self._times: collections.deque = collections.deque(maxlen=history)
        self._lock = threading.Lock()
        self._last_draw = 0.0
        self._subs = [src.parameter_changes.subscribe(self._changed_from_code),
                      src.frames.subscribe(self._frame)]
        for port in previews:
            key = f"{port.block.name}.{port.name}"
            self.previews[key] = w.HTML(f"<i>{key}: waiting for a frame</i>")
            self._subs.append(src.observe(port, every).subscribe(
                lambda a, key=key: self._store(key, a)))
        rows = [w.HTML(f"<b>{counted(len(self.controls), 'parameter')}</b>"), *self.controls.values(), self.message,
                w.HTML("<b>frame time</b>"), self.plot]
        rows += [w.VBox([w.HTML(f"<b>{k}</b>"), v]) for k, v in self.previews.items()]
        self.box = w.VBox(rows)

    # -- both ways ---------------------------------------------------------------------------------------------
    def _moved(self, name: str, value) -> None:
        """The user moved a control: set the parameter through the block's own checks."""
        param = self.params[name]
        if value == param.value:  # the echo of a change from code, or a control put back
            return
        try:
            self._src.set(param._block, **{param.name: value})
        except (TypeError, ValueError) as e:  # BoundsError is a ValueError
            self.message.value = f"<span style='color:#cf222e'>{_escape(str(e))}</span>"
            self.controls[name].value = param.value  # the control returns to what the parameter holds
        else:
            self.message.value = ""

    def _changed_from_code(self, event) -> None:
        block = next((b for b in self._src.blocks if b.id == event.block), None)
        key = f"{block.name}.{event.name}" if block is not None else None
        widget = self.controls.get(key) if key else None
        if widget is not None and widget.value != event.value:
            # a slider clamps what it is given (and would then set the clamped value): widen it first, as when
            # a count's limit grew and the next refresh has not moved the slider's end yet
            if hasattr(widget, "max") and event.value > widget.max:
                widget.max = event.value
            if hasattr(widget, "min") and event.value < widget.min:
                widget.min = event.value
            widget.value = event.value

    # -- frames ----------------------------------------------------------------------------------------------
    def _frame(self, frame) -> None:  # on the engine thread: store, and draw now and then
        self._times.append((frame.host_us, frame.gpu_us))
        if time.monotonic() - self._last_draw >= self.interval:
            self.refresh()

    def _store(self, key: str, array) -> None:
        with self._lock:
            self._latest[key] = np.asarray(array)

    def refresh(self) -> None:
        """Redraw the frame-time plot and the previews, and move each count slider's end to its limit."""
        self._last_draw = time.monotonic()
        times = list(self._times)
        self.plot.value = sparkline({"host": [h for h, _ in times], "GPU": [g for _, g in times]}, " us")
        with self._lock:
            latest = dict(self._latest)
        for key, a in latest.items():
            self._draw(key, a)
        for name, param in self.params.items():
            limit, widget = param.limit, self.controls[name]
            if limit is not None and param.max is None and hasattr(widget, "max") and widget.max != limit:
                widget.max = limit

    def _draw(self, key: str, a: np.ndarray) -> None:
        w = _ipywidgets()
        old = self.previews[key]
        image = a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (3, 4) and a.dtype == np.uint8)
        if image:
            data = png(a)
            if not isinstance(old, w.Image):
                old = self.previews[key] = w.Image(format="png")
                self._replace(key, old)
            old.value = data
        else:
            if not isinstance(old, w.HTML):
                old = self.previews[key] = w.HTML()
                self._replace(key, old)
            flat = a.reshape(-1) if a.dtype.kind in "fiu" else np.zeros(0)
            old.value = sparkline({key: flat.astype(np.float64)})

    def _replace(self, key: str, widget) -> None:
        for row in self.box.children:
            if getattr(row, "children", None) and row.children[0].value == f"<b>{key}</b>":
                row.children = (row.children[0], widget)

    # -- showing, closing --------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"<rxcuda.view.Widgets: {len(self.controls)} controls, {len(self.previews)} previews"
                f"{', closed' if not self._subs else ''}>")

    def _repr_mimebundle_(self, **kwargs):
        return self.box._repr_mimebundle_(**kwargs)

    def close(self) -> None:
        """Unsubscribe from the engine and close the widgets (idempotent)."""
        subs, self._subs = self._subs, []
        for s in subs:
            s.dispose()
        self.box.close()


def _escape(text: str) -> str:
    import html

    return html.escape(text)


def widgets(engine: Engine | Any, params=None, previews=(), *, every: int = 4, interval: float = 0.2) -> Widgets:
    """Notebook controls for ``engine``: a control per parameter (``params``: names such as ``"blur.radius"``
    or blocks, as for ``engine.serve``; default all), the frame times, and previews of the ports in
    ``previews`` (read every ``every``-th frame). Display the result in a cell. See the module docstring.

    >>> controls = rxcuda.view.widgets(engine, params=["mul.scale"])            # doctest: +SKIP
    >>> controls.controls["mul.scale"].value = 2.0   # as if the slider moved: mul.set(scale=2.0)  # doctest: +SKIP
    """
    return Widgets(engine, params, previews, every=every, interval=interval)


__all__ = ["Widgets", "WidgetsNotFoundError", "control_for", "png", "sparkline", "widgets"]
