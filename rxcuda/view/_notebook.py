"""An engine in a notebook: ``Engine._repr_html_`` (installed by ``rxcuda.view``; the engine never imports it).

Jupyter shows an engine as its pipeline's picture (inline SVG where Graphviz's ``dot`` is installed, else the
DOT text folded away), its state, the last frame's timings, its blocks with their parameters, and memory.

>>> import rxcuda
>>> with rxcuda.Engine(driver=rxcuda.cuda.NullDriver()) as engine:
...     mul = engine.add(rxcuda.Block.from_kernel("kernels/scalar_mul.ptx", size=64, name="mul"))
...     _ = engine.tick()
...     page = engine._repr_html_()
>>> "<table" in page and "mul" in page and "last frame" in page
True
"""

from __future__ import annotations

import html

from ..engine._engine import Engine
from ..model import _dtypes
from ..model._words import counted
from ._dot import GraphvizNotFoundError, render, to_dot

_STATE_COLOURS = {"ok": "#1a7f37", "error": "#cf222e", "warning": "#9a6700", "idle": "#57606a"}


def picture(engine: Engine) -> str:
    """The pipeline's picture as inline SVG, or (no Graphviz) its DOT text in a folded ``<details>``."""
    text = to_dot(engine)
    try:
        svg = render(text, "svg").decode()
    except (GraphvizNotFoundError, OSError) as e:  # dot missing: the text still says everything
        why = html.escape(str(e).split(":")[0])
        return (f"<details><summary>pipeline as DOT text ({why}; pip install graphviz and apt install graphviz "
                f"for the picture)</summary><pre>{html.escape(text)}</pre></details>")
    return svg[svg.find("<svg"):]  # drop the XML prologue: the SVG goes inline


def engine_state(engine: Engine) -> str:
    """``closed``, ``not built``, ``ok``, ``error`` or ``idle``, and ``running`` while ``run()`` drives it."""
    if engine.closed:
        return "closed"
    last = getattr(engine, "last_frame", None)
    state = last.state if last is not None else ("not built" if engine.plan is None else "ok")
    if any(b.state == "error" for b in engine.blocks):
        state = "error"
    return f"{state}, running" if engine.running else state


def engine_html(engine: Engine) -> str:
    """The HTML Jupyter shows for an engine (``engine._repr_html_()``)."""
    e = html.escape
    if engine.closed:
        return f"<div><b>rxcuda engine</b>: closed after {counted(engine.frame, 'frame')}</div>"
    state = engine_state(engine)
    colour = _STATE_COLOURS.get(state.split(",")[0], "#57606a")
    device = getattr(engine.device, "name", "a GPU")
    rows = [f"<b>rxcuda engine</b> on {e(device)}: frame {engine.frame}, state "
            f"<span style='color:{colour}'><b>{e(state)}</b></span>, {counted(engine.rebuilds, 'rebuild')}"]
    last = getattr(engine, "last_frame", None)
    if last is not None:
        gpu = f", {last.gpu_us:.1f} us GPU" if last.gpu_us is not None else " (GPU time: Engine(timing=True))"
        tiers = ", ".join(t.name.lower() for t in last.tiers) or "none"
        rows.append(f"last frame: {last.host_us:.1f} us host{gpu}; tiers applied: {e(tiers)}")
    else:
        rows.append("last frame: none yet (engine.tick() or engine.run())")
    pool = engine.memory
    size = _dtypes.format_bytes
    rows.append(f"memory: {pool.in_use} buffers in use, {size(pool.bytes_reserved)} reserved"
                + (f"; graph buffers: {e(str(engine.stats))}" if engine.plan is not None else ""))
    table = ["<table><tr><th style='text-align:left'>block</th><th style='text-align:left'>state</th>"
             "<th style='text-align:left'>parameters</th></tr>"]
    for b in engine.blocks:
        params = ", ".join(f"{e(n)} = {e(repr(p.value))}" for n, p in b.params.items())
        message = f" — {e(b.message)}" if b.message else ""
        colour = _STATE_COLOURS.get(b.state, "inherit")
        table.append(f"<tr><td>{e(b.name)}</td><td style='color:{colour}'>{e(b.state)}{message}</td>"
                     f"<td>{params}</td></tr>")
    table.append("</table>")
    return "<div>" + "<br>".join(rows) + picture(engine) + "".join(table) + "</div>"


__all__ = ["engine_html", "engine_state", "picture"]
