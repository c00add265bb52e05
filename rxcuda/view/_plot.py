"""The frame-time picture: host and GPU time per frame from a trace, with tier changes and reloads marked.

``plot_frames("trace.json", "frames.png")`` (or ``rxcuda plot trace.json -o frames.png``) draws what a person
looks at to see a stutter: one line for the host time of each frame, one for its GPU time when the trace
measured it, a vertical mark at each frame that applied an update, coloured by its highest tier (structure,
code, recapture, parameters), a dashed black mark at each reload, red crosses along the top at diagnostics,
and the slowest frame named. A y axis spanning more than a factor of 30 between the median and the slowest
frame is drawn in log scale unless ``log`` says otherwise.

Needs matplotlib (the optional extra: ``pip install '.[view]'``); it draws with the Agg canvas directly,
so it neither needs a display nor changes pyplot's backend.

>>> rxcuda.view.plot_frames("trace.json", "frames.png")                        # doctest: +SKIP
PosixPath('frames.png')
"""

from __future__ import annotations

import os
import statistics
import textwrap
from pathlib import Path

from ..model._errors import RxcudaError
from ._trace import TIERS, TraceData, read_trace, summarize

TIER_COLORS = {"structure": "#d62728", "code": "#ff7f0e", "recapture": "#9467bd", "parameters": "#2ca02c"}
FORMATS = (".png", ".svg", ".pdf", ".jpg", ".jpeg")
LOG_RATIO = 30.0  # slowest / median frame above which the y axis is logarithmic


class MatplotlibNotFoundError(RxcudaError, ImportError):
    """Drawing frame times needs matplotlib (an optional extra); the message says how to install it."""


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
    except ImportError as e:
        raise MatplotlibNotFoundError(f"drawing frame times needs matplotlib ({e}); install it with pip install "
                                      f"'.[view]' in rxcuda's checkout (or pip install matplotlib)") from None
    return Figure, FigureCanvasAgg, Line2D


def plot_frames(trace: str | os.PathLike | TraceData, out: str | os.PathLike, *, log: bool | None = None,
                title: str | None = None, dpi: int = 120) -> Path:
    """Draw host and GPU time per frame of a trace (a path written by ``engine.trace``, or its
    :func:`read_trace` data) into ``out`` (.png, .svg, .pdf or .jpg). Returns ``out`` as a Path.

    ``log``: y axis in log scale (True), linear (False) or chosen from the data (None). ``title``: the
    picture's title (default: the device and the trace's summary).

    >>> rxcuda.view.plot_frames("trace.json", "frames.png", log=True)            # doctest: +SKIP
    """
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise ValueError(f"plot_frames writes {', '.join(FORMATS)} files (got {str(out)!r}); name the picture "
                         f"e.g. frames.png")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"plot_frames: the folder {out.parent} does not exist; create it or write the "
                                f"picture elsewhere")
    if log not in (None, True, False):
        raise TypeError(f"plot_frames(log=...) takes True, False or None (got {log!r})")
    data = trace if isinstance(trace, TraceData) else read_trace(trace)
    Figure, FigureCanvasAgg, Line2D = _matplotlib()

    frames = data.frames
    x = [f.index for f in frames]
    host = [f.host_us for f in frames]
    gpu = [(f.index, float(f.gpu_us)) for f in frames if f.gpu_us is not None]
    summary = summarize(data)
    fig = Figure(figsize=(11, 4.8), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    handles = []
    (line,) = ax.plot(x, host, color="#1f77b4", lw=1.2, marker="." if len(x) <= 200 else None, label="host")
    handles.append(line)
    if gpu:
        (line,) = ax.plot([i for i, _ in gpu], [v for _, v in gpu], color="#ff7f0e", lw=1.2,
                          marker="." if len(gpu) <= 200 else None, label="GPU")
        handles.append(line)
    values = host + [v for _, v in gpu]
    positive = [v for v in values if v > 0]
    median = statistics.median(positive) if positive else 0.0
    use_log = log if log is not None else bool(positive) and max(positive) > LOG_RATIO * median
    if use_log and positive:
        ax.set_yscale("log")
    tiers_seen: dict[str, None] = {}
    for u in data.updates:
        top = next((t for t in TIERS if t in u.tiers), None)
        if top is None:
            continue
        tiers_seen[top] = None
        ax.axvline(u.frame, color=TIER_COLORS[top], lw=1.0, alpha=0.55, zorder=0)
    for tier in TIERS:
        if tier in tiers_seen:
            handles.append(Line2D([], [], color=TIER_COLORS[tier], lw=1.5, label=f"{tier} update"))
    for r in data.reloads:
        ax.axvline(r.frame, color="black", lw=1.0, ls="--", alpha=0.8, zorder=0)
    if data.reloads:
        handles.append(Line2D([], [], color="black", lw=1.0, ls="--", label="reload"))
    if data.diagnostics:
        ax.plot([d.frame for d in data.diagnostics], [1.0] * len(data.diagnostics), "x", color="#d62728", ms=8,
                transform=ax.get_xaxis_transform(), clip_on=False)
        handles.append(Line2D([], [], color="#d62728", marker="x", ls="", label="diagnostic"))
    slowest = max(frames, key=lambda f: f.host_us)
    why = f", {'+'.join(slowest.tiers)}" if slowest.tiers else ""
    ax.annotate(f"frame {slowest.index}: {slowest.host_us:.0f} us{why}", (slowest.index, slowest.host_us),
                xytext=(8, -4), textcoords="offset points", fontsize=8, va="top")
    ax.set_xlabel("frame")
    ax.set_ylabel("time per frame (us" + (", log scale)" if use_log else ")"))
    ax.grid(True, which="major", alpha=0.3)
    ax.margins(x=0.01)
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.85)
    head = title if title is not None else f"rxcuda frame times on {data.device}"
    ax.set_title(f"{head}\n" + textwrap.fill(str(summary), 130), fontsize=9, loc="left")
    fig.savefig(out)
    return out


__all__ = ["MatplotlibNotFoundError", "plot_frames"]
