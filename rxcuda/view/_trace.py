"""Traces of a running engine as Chrome/Perfetto trace-event JSON: ``engine.trace(path, frames=n)``.

The trace is made from the engine's own Observables -- ``frames``, ``updates``, ``diagnostics``, ``changes``
and ``file_changes`` -- never from its locks: each item is appended to a list with the time it arrived
(a ``perf_counter_ns`` call and a list append on the engine thread per frame), and all JSON work happens
once, when the trace ends. The file opens unchanged in https://ui.perfetto.dev and chrome://tracing.

What the file holds (``ts`` and ``dur`` in microseconds from the trace's start; ``displayTimeUnit`` "ms"):

- process "rxcuda host", thread "frames": one complete event ("X", category ``frame``) per tick, named
  ``frame N`` (``frames A-B`` for an ``engine.run_batch``), ending when the engine published the frame and
  lasting its ``host_us``; its ``args`` carry the whole :class:`~rxcuda.Frame` (index, tiers, state, GPU
  time, per-block and per-kernel times when measured). With host phases measured (``Frame.phases``:
  apply, launch, sync) they are nested slices of the frame (category ``phase``), in that order.
- threads "updates", "reloads", "diagnostics": instant events ("i"). An applied update (category
  ``update``) is named by its tiers (``update structure``) with the tiers, blocks, events and microseconds
  in ``args``, at the time the update started; a reload (category ``reload``) is a kernel that got new code
  (``reload mul/scalar_mul``) or a watched file saved (``file saved: forces.cu``); a diagnostic (category
  ``diagnostic``) is named ``error: SUBJECT`` / ``warning: SUBJECT`` with its message. Each carries the
  frame it happened before (``args.frame``).
- process "GPU": thread "frame GPU time" with one slice per timed frame (``GPU frame N``, category ``gpu``;
  ``Engine(timing=True)`` or a profile that measures), and one thread per block ("block NAME") when
  per-block times exist (``Frame.blocks``), each block's slice (category ``block``) holding its kernels'
  slices (category ``kernel``, ``Frame.kernels``). GPU durations are measured; where a GPU slice starts is
  placed, not measured: the frame's GPU work starts after the host's apply phase when that is known, else
  it ends where the host frame ends, and blocks follow each other in the order the frame lists them. An
  engine over several devices, profiled, adds a thread per device ("device N") with its part of each frame.
- process "parameters": one counter ("C") per ``block.parameter`` set during the trace, starting with the
  value each parameter had when the trace began (numbers and booleans; other values are left out).
- "M" metadata events name every process and thread used, and keep them in this order.

>>> import numpy as np, rxcuda, tempfile, os
>>> engine = rxcuda.Engine(driver=rxcuda.cuda.NullDriver())
>>> mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=16))
>>> engine.write(mul["x"], np.ones(16, np.float32))
>>> path = os.path.join(tempfile.mkdtemp(), "trace.json")
>>> with engine.trace(path) as trace:
...     for i in range(3):
...         mul.params["scale"].value = float(i)
...         _ = engine.tick()
>>> print(trace.summary())                                                        # doctest: +ELLIPSIS
3 frames: host median ... us, max ... us (frame 1); updates: structure 1, parameters 2; 0 reloads; 0 diagnostics
>>> engine.close()
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from ..engine._engine import Engine
from ..model._errors import EngineClosedError
from ..model._events import BlockAdded, BlockRemoved, CodeChanged, ParameterChanged

_now = time.perf_counter_ns

# processes and threads (tids are unique across processes and differ from every pid: viewers treat a tid
# seen under two pids, or a tid equal to a pid, as one thread)
HOST, GPU, PARAMS = 1, 2, 3
FRAMES, UPDATES, RELOADS, DIAGNOSTICS = 11, 12, 13, 14
COUNTERS = 31
GPU_FRAMES = 1000  # then 1001, 1002, ... one per block
_PROCESSES = {HOST: "rxcuda host", GPU: "GPU", PARAMS: "parameters"}
_THREADS = {FRAMES: "frames", UPDATES: "updates", RELOADS: "reloads", DIAGNOSTICS: "diagnostics",
            COUNTERS: "parameters", GPU_FRAMES: "frame GPU time"}
TIERS = ("structure", "code", "recapture", "parameters")  # highest first
PHASES = ("apply", "launch", "sync")  # the host phases a frame may measure, in the order they run


class Trace:
    """A trace being recorded from an engine; ``engine.trace(path, frames=None)`` makes one.

    Recording starts at once. It ends, and the file is written, when the ``with`` block ends, when
    :meth:`stop` is called, when ``frames`` ticks were recorded (written on the engine thread right after
    the last one, so the frames traced never pay for it), or when the engine closes. ``wait()`` blocks until
    then. ``path`` is where the file goes; its folder must exist.

    >>> trace = engine.trace("frames.json", frames=100)                       # doctest: +SKIP
    >>> running = engine.run(60); trace.wait(); running.dispose()              # doctest: +SKIP
    >>> print(trace.summary())                                                  # doctest: +SKIP
    100 frames: host median 41.2 us, ...
    """

    def __init__(self, engine: Engine, path: str | os.PathLike, frames: int | None = None):
        if not isinstance(engine, Engine):
            raise TypeError(f"trace() records an rxcuda.Engine (got {type(engine).__name__}); "
                            f"use engine.trace(path)")
        if frames is not None and (not isinstance(frames, int) or isinstance(frames, bool) or frames < 1):
            raise ValueError(f"engine.trace(frames=...) takes a positive number of frames, or None to record "
                             f"until the trace is stopped (got {frames!r})")
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise TypeError(f"engine.trace(path) takes a file path for the JSON trace (got {path!r})")
        self.path = Path(path)
        if self.path.is_dir():
            raise IsADirectoryError(f"engine.trace: {self.path} is a folder; give a file path such as "
                                    f"{self.path / 'trace.json'}")
        if not self.path.parent.is_dir():
            raise FileNotFoundError(f"engine.trace: the folder {self.path.parent} does not exist; create it or "
                                    f"write the trace elsewhere")
        if engine.closed:
            raise EngineClosedError("engine.trace: the engine is closed; trace a running engine")
        self.limit = frames
        self._engine = engine
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._stopped = False
        self.error: BaseException | None = None  # what writing the file raised, if it failed
        self._events: list[dict] | None = None
        device = engine.device
        self._meta = {"rxcuda": _version(), "device": getattr(device, "name", "?"),
                      "arch": getattr(device, "arch", "?"), "frames_requested": frames}
        # the recording: (perf_counter_ns, item) pairs, appended from whichever thread published the item
        self._frames: list[tuple[int, Any]] = []
        self._updates: list[tuple[int, Any]] = []
        self._diagnostics: list[tuple[int, Any]] = []
        self._timings: list[tuple[int, Any]] = []  # GPU times that came after their frame (sync=False)
        self._values: list[tuple[int, int, str, Any]] = []
        self._reloads: list[tuple[int, int, str, dict]] = []
        self._names: dict[int, str] = {}
        self._per_device = len(engine.devices.ordinals) > 1
        self._devices: dict[int, tuple] = {}  # frame index -> each device's GPU time (engine.devices.gpu_us)
        self._t0 = _now()
        for b in engine.blocks:  # the names and parameter values the trace starts with
            self._names[b.id] = b.name
            for name, prm in b.params.items():
                self._values.append((self._t0, b.id, name, prm.value))
        self._subs = [
            engine.frames.subscribe(self._on_frame, on_completed=self._on_engine_closed),
            engine.updates.subscribe(self._on_update),
            engine.diagnostics.subscribe(self._on_diagnostic),
            engine.changes.subscribe(self._on_change),
            engine.file_changes.subscribe(self._on_file),
        ]
        timings = getattr(engine, "timings", None)  # profiled frames' GPU times, late for sync=False frames
        if timings is not None:
            self._subs.append(timings.subscribe(self._on_timings))

    # -- recording (cheap: one clock read and one append) ---------------------------------------------------
    def _on_frame(self, frame) -> None:
        frames = self._frames
        frames.append((_now(), frame))
        if self._per_device and frame.gpu_us is not None:  # several devices: each one's part of the frame
            self._devices[frame.index] = self._engine.devices.gpu_us
        if self.limit is not None and len(frames) >= self.limit:
            self.stop()

    def _on_update(self, update) -> None:
        self._updates.append((_now(), update))

    def _on_timings(self, times) -> None:
        self._timings.append((0, times))

    def _on_diagnostic(self, diagnostic) -> None:
        self._diagnostics.append((_now(), diagnostic))

    def _on_change(self, event) -> None:
        if type(event) is ParameterChanged:
            self._values.append((_now(), event.block, event.name, event.value))
        elif isinstance(event, CodeChanged):
            self._reloads.append((_now(), self._engine.frame + 1, "reload",
                                  {"block": event.block, "kernel": event.kernel, "origin": event.code.origin}))
        elif isinstance(event, (BlockAdded, BlockRemoved)):
            self._names[event.block] = event.name

    def _on_file(self, event) -> None:
        self._reloads.append((_now(), self._engine.frame + 1, "file", {"path": event.path}))

    def _on_engine_closed(self) -> None:
        self.stop()

    # -- ending -------------------------------------------------------------------------------------------
    @property
    def frames(self) -> int:
        """Ticks recorded so far (an ``engine.run_batch`` counts once)."""
        return len(self._frames)

    @property
    def done(self) -> bool:
        """Whether recording ended and the file was written (or writing it failed: ``error``)."""
        return self._done.is_set()

    def stop(self) -> Path:
        """Stop recording and write the file (once; later calls only return the path). Returns the path."""
        with self._lock:
            if not self._stopped:
                self._stopped = True
                for s in self._subs:
                    s.dispose()
                try:
                    self._write()
                except BaseException as e:
                    self.error = e
                    raise
                finally:
                    self._done.set()
        if self.error is not None:
            raise self.error
        return self.path

    close = stop

    def wait(self, timeout: float | None = None) -> Path:
        """Wait until the trace has recorded its ``frames`` and written the file; returns the path. Raises
        TimeoutError after ``timeout`` seconds, and what writing the file raised if it failed."""
        if self.limit is None and not self._done.is_set():
            raise ValueError("this trace records until it is stopped (no frames=...): call trace.stop(), or "
                             "use it as a context manager")
        if not self._done.wait(timeout):
            raise TimeoutError(f"engine.trace: {self.frames} of {self.limit} frames recorded after {timeout} s; "
                               f"is the engine ticking?")
        if self.error is not None:
            raise self.error
        return self.path

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "written" if self.done else "recording"
        return f"<Trace {str(self.path)!r} {state}, {self.frames} frames>"

    # -- the trace-event JSON ------------------------------------------------------------------------------
    def events(self) -> list[dict]:
        """The trace events recorded so far, as the file holds them (built once the trace has stopped)."""
        if self._events is not None:
            return self._events
        events = build_events(self._t0, self._frames, self._updates, self._diagnostics, self._values,
                              self._reloads, self._names, self._meta["device"], self._timings, self._devices)
        if self._stopped:
            self._events = events
        return events

    def _write(self) -> None:
        events = self.events()
        tmp = self.path.with_name(self.path.name + ".part")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write('{"traceEvents": [\n')
            f.write(",\n".join(json.dumps(e, separators=(",", ":"), allow_nan=False) for e in events))
            f.write('\n],\n"displayTimeUnit": "ms",\n"otherData": ')
            f.write(json.dumps({**self._meta, "frames": len(self._frames)}, default=str))
            f.write("}\n")
        os.replace(tmp, self.path)

    def summary(self) -> TraceSummary:
        """What the trace saw, in numbers (see :class:`TraceSummary`)."""
        return summarize(self.events())


def trace(engine: Engine, path: str | os.PathLike, frames: int | None = None) -> Trace:
    """Record a Chrome/Perfetto trace of ``engine`` into ``path`` (what ``engine.trace()`` does).

    ``frames``: stop after that many ticks and write the file; ``None``: record until the ``with`` block
    ends or ``trace.stop()``. See :class:`Trace` and the module's docstring for what the file holds.

    >>> with engine.trace("trace.json"):                                      # doctest: +SKIP
    ...     for _ in range(100): engine.tick()
    """
    return Trace(engine, path, frames)


# -- building events ----------------------------------------------------------------------------------------
def build_events(t0: int, frames: Iterable, updates: Iterable = (), diagnostics: Iterable = (),
                 values: Iterable = (), reloads: Iterable = (), names: dict | None = None,
                 device: str = "GPU", timings: Iterable = (), devices: dict | None = None) -> list[dict]:
    """Trace events from recorded items, each a (``perf_counter_ns`` when it arrived, item) pair:
    ``frames`` of :class:`~rxcuda.Frame`, ``updates`` of :class:`~rxcuda.AppliedUpdate`, ``diagnostics`` of
    :class:`~rxcuda.Diagnostic`, ``timings`` of ``engine.timings`` items (GPU times that arrived after their
    frame: ``sync=False``); ``values`` of (ns, block id, parameter, value); ``reloads`` of (ns, frame,
    "reload" or "file", details); ``names``: block id -> name; ``devices``: frame index -> each device's GPU
    time (an engine over several devices: a track "device N" each). Times are microseconds after ``t0``.

    A block's or kernel's time is a number of microseconds, or has ``gpu_us`` and ``start_us`` (from the
    frame's GPU start, as the profiling levels measure it): then it is placed where it ran."""
    names = names or {}
    out: list[dict] = []
    used: set[tuple[int, int]] = {(HOST, FRAMES)}
    gpu_tracks: dict[tuple[str, str], int] = {}  # ("block" | "kernel", name) -> tid
    track_end: dict[int, int] = {}  # tid -> where its last top-level slice ended: slices of a track never overlap
    late = {getattr(t, "frame", None): t for _, t in timings}

    def top(tid: int, start: int, dur: int) -> tuple[int, int]:
        start = max(start, track_end.get(tid, t0))
        track_end[tid] = start + dur
        return start, dur

    def us(ns: int) -> float:
        return round((ns - t0) / 1e3, 3)

    def slice_(name: str, cat: str, pid: int, tid: int, start: int, dur: int, args: dict | None = None) -> None:
        e = {"name": name, "cat": cat, "ph": "X", "ts": us(start), "dur": round(max(dur, 0) / 1e3, 3),
             "pid": pid, "tid": tid}
        if args:
            e["args"] = args
        out.append(e)
        used.add((pid, tid))

    def instant(name: str, cat: str, tid: int, at: int, args: dict) -> None:
        out.append({"name": name, "cat": cat, "ph": "i", "s": "t", "ts": us(at), "pid": HOST, "tid": tid,
                    "args": args})
        used.add((HOST, tid))

    def gpu_track(kind: str, name: str) -> int:
        tid = gpu_tracks.get((kind, name))
        if tid is None:
            tid = gpu_tracks[(kind, name)] = GPU_FRAMES + 1 + len(gpu_tracks)
        return tid

    for arrived, f in frames:
        start, host_ns = top(FRAMES, arrived - _ns(f.host_us), _ns(f.host_us))
        end = start + host_ns
        n = getattr(f, "frames", 1) or 1
        gpu_us, blocks, kernels = f.gpu_us, getattr(f, "blocks", None), getattr(f, "kernels", None)
        if gpu_us is None and blocks is None and f.index in late:  # timed after the frame was published
            t = late[f.index]
            gpu_us, blocks, kernels = t.gpu_us, getattr(t, "blocks", None), getattr(t, "kernels", None)
        phases = getattr(f, "phases", None)
        args: dict[str, Any] = {"index": f.index, "tiers": [str(t) for t in f.tiers], "state": f.state,
                                "launched": f.launched, "host_us": _num(f.host_us), "gpu_us": _num(gpu_us),
                                "frames": n}
        for key, part in (("blocks", blocks), ("kernels", kernels), ("phases", phases)):
            if part:
                args[key] = {str(k): _num(_unit(v)[0]) for k, v in part.items()}
        label = f"frame {f.index}" if n == 1 else f"frames {f.index - n + 1}-{f.index}"
        slice_(label, "frame", HOST, FRAMES, start, end - start, args)
        apply_end = None
        if phases:
            at = start
            for name, value in phases.items():
                dur = min(_ns(value), end - at)
                slice_(str(name), "phase", HOST, FRAMES, at, dur, {"us": _num(value)})
                if name == "apply":
                    apply_end = at + dur
                at += dur
        units = [(str(k), *_unit(v)) for k, v in (blocks or {}).items()]
        k_units = [(str(k), *_unit(v)) for k, v in (kernels or {}).items()]
        # several devices: each unit says its device (its start is from that device's own start of the frame)
        where = {(kind, str(k)): {"device": t.device(k)} for kind, t in (("block", blocks), ("kernel", kernels))
                 if devices and hasattr(t, "device") for k in t}
        gpu_ns = _ns(gpu_us) if gpu_us is not None else None
        span = gpu_ns if gpu_ns is not None else max(
            [_ns(value) + _ns(rel or 0) for _, value, rel in units + k_units], default=0)
        gpu_start = apply_end if apply_end is not None else max(end - span, start)
        if gpu_ns is not None:
            gpu_start, _ = top(GPU_FRAMES, gpu_start, gpu_ns)
            slice_(f"GPU {label}", "gpu", GPU, GPU_FRAMES, gpu_start, gpu_ns, {"index": f.index, "us": _num(gpu_us)})
        for d, dev_us in enumerate((devices or {}).get(f.index, ())):
            if dev_us is not None:  # placed from the frame's GPU start: measured durations, placed starts
                tid = gpu_track("device", str(d))
                at, dur = top(tid, gpu_start, _ns(dev_us))
                slice_(f"device {d}: {label}", "device", GPU, tid, at, dur, {"index": f.index, "us": _num(dev_us)})
        # units without a start of their own: blocks one after another from the GPU start, in the order
        # listed; a block's kernels one after another from the block's start
        seq, block_at, kernel_at = gpu_start, {}, {}
        for name, value, rel in units:
            tid = gpu_track("block", name)
            at, dur = top(tid, gpu_start + _ns(rel) if rel is not None else seq, _ns(value))
            slice_(name, "block", GPU, tid, at, dur, {"index": f.index, "us": _num(value),
                                                      **where.get(("block", name), {})})
            block_at[name], seq = at, at + dur
        for name, value, rel in k_units:
            owner = name.rpartition("/")[0]
            tid = gpu_track("kernel", name)
            guess = kernel_at.get(owner, block_at.get(owner, gpu_start))
            at, dur = top(tid, gpu_start + _ns(rel) if rel is not None else guess, _ns(value))
            slice_(name, "kernel", GPU, tid, at, dur, {"index": f.index, "us": _num(value),
                                                       **where.get(("kernel", name), {})})
            kernel_at[owner] = at + dur

    for arrived, u in updates:
        tiers = [str(t) for t in u.tiers]
        instant(f"update {'+'.join(tiers) or 'none applied'}", "update", UPDATES,
                max(arrived - int(u.seconds * 1e9), t0),
                {"frame": u.frame, "tiers": tiers, "blocks": list(u.blocks), "events": u.events,
                 "us": _num(u.seconds * 1e6)})
    for arrived, frame, kind, details in reloads:
        if kind == "reload":
            block = names.get(details["block"], f"#{details['block']}")
            instant(f"reload {block}/{details['kernel']}", "reload", RELOADS, arrived,
                    {"frame": frame, "block": block, "kernel": details["kernel"],
                     "origin": str(details["origin"])[:200]})
        else:
            instant(f"file saved: {Path(details['path']).name}", "reload", RELOADS, arrived,
                    {"frame": frame, "path": str(details["path"])})
    for arrived, d in diagnostics:  # Diagnostic.frame is the last frame that ran; args.frame the next one
        instant(f"{d.severity}: {d.subject}", "diagnostic", DIAGNOSTICS, arrived,
                {"frame": d.frame + 1, "severity": d.severity, "subject": d.subject, "message": d.message,
                 "details": [str(x) for x in d.details]})
    for at, block_id, name, value in values:
        number = _counter_value(value)
        if number is None:
            continue
        out.append({"name": f"{names.get(block_id, f'#{block_id}')}.{name}", "cat": "parameter", "ph": "C",
                    "ts": us(at), "pid": PARAMS, "tid": COUNTERS, "args": {"value": number}})
        used.add((PARAMS, COUNTERS))

    shift = -min((e["ts"] for e in out), default=0.0)  # a frame that began before the trace did
    if shift > 0:
        for e in out:
            e["ts"] = round(e["ts"] + shift, 3)
    out.sort(key=lambda e: e["ts"])  # stable: a frame's slice stays before the phases it holds
    thread_names = dict(_THREADS)
    thread_names.update({tid: f"{kind} {name}" for (kind, name), tid in gpu_tracks.items()})
    sort_index = {tid: tid for tid in thread_names}
    # each block's kernels right below it, blocks in the order they first appeared
    owner = {tid: name if kind == "block" else name.rpartition("/")[0] for (kind, name), tid in gpu_tracks.items()}
    is_block = {tid: kind == "block" for (kind, _name), tid in gpu_tracks.items()}
    rank: dict[str, int] = {}
    for tid in sorted(owner):
        rank.setdefault(owner[tid], len(rank))
    sort_index.update({tid: GPU_FRAMES + 1 + rank[owner[tid]] * 10_000 + (0 if is_block[tid] else tid)
                       for tid in owner})
    process_names = dict(_PROCESSES)
    process_names[GPU] = f"GPU: {device}"
    meta: list[dict] = []
    for pid in sorted({p for p, _ in used}):
        meta.append(_meta("process_name", pid, pid, {"name": process_names[pid]}))
        meta.append(_meta("process_sort_index", pid, pid, {"sort_index": pid}))
    for pid, tid in sorted(used):
        meta.append(_meta("thread_name", pid, tid, {"name": thread_names[tid]}))
        meta.append(_meta("thread_sort_index", pid, tid, {"sort_index": sort_index[tid]}))
    return meta + out


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _unit(value) -> tuple[Any, float | None]:
    """(GPU microseconds, start in microseconds from the frame's GPU start or None) of a block's or kernel's
    time: a number, or a record with ``gpu_us`` and ``start_us`` (the profiling levels' UnitTime)."""
    return getattr(value, "gpu_us", value), getattr(value, "start_us", None)


def _ns(us_value) -> int:
    try:
        v = float(us_value)
    except (TypeError, ValueError):
        return 0
    return int(round(v * 1e3)) if math.isfinite(v) and v > 0 else 0


def _num(v):
    """A JSON number (or None) for a time or value; NaN and infinities become None."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return round(f, 3) if math.isfinite(f) else None


def _counter_value(v) -> float | None:
    if isinstance(v, bool):
        return float(v)
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rxcuda")
    except PackageNotFoundError:
        return "?"


# -- reading a trace back --------------------------------------------------------------------------------
class TraceFrame(NamedTuple):
    """One frame as a trace file holds it (from its slice's ``args``)."""

    index: int
    host_us: float
    gpu_us: float | None
    tiers: tuple[str, ...]
    state: str
    frames: int
    blocks: dict | None
    phases: dict | None


class TraceMark(NamedTuple):
    """An instant event of a trace: an update (``kind`` "update", ``tiers``), a reload or a diagnostic."""

    kind: str
    frame: int
    name: str
    tiers: tuple[str, ...] = ()
    severity: str = ""


class TraceData(NamedTuple):
    """A trace file read back (:func:`read_trace`): its frames in order and its marks."""

    frames: tuple[TraceFrame, ...]
    updates: tuple[TraceMark, ...]
    reloads: tuple[TraceMark, ...]
    diagnostics: tuple[TraceMark, ...]
    device: str


def read_trace(source: str | os.PathLike | list | dict) -> TraceData:
    """Read a trace written by ``engine.trace`` (a path, or its events / parsed document) back into frames
    and marks. Raises ValueError naming the file when it is not JSON or holds no rxcuda frames.

    >>> data = rxcuda.view.read_trace("trace.json")                          # doctest: +SKIP
    >>> [f.host_us for f in data.frames][:3]                                  # doctest: +SKIP
    [812.4, 14.1, 13.9]
    """
    where = "the events given"
    doc: Any = source
    if isinstance(source, (str, os.PathLike)):
        where = str(source)
        try:
            text = Path(source).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FileNotFoundError(f"no trace file {where}; write one with engine.trace(path)") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} is not a JSON trace ({e}); write one with engine.trace(path)") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ValueError(f"{where} is not a trace-event file (no 'traceEvents' list); write one with "
                         f"engine.trace(path)")
    frames, updates, reloads, diagnostics = [], [], [], []
    other = doc.get("otherData") if isinstance(doc, dict) else None
    device = str(other.get("device", "GPU")) if isinstance(other, dict) else "GPU"
    for e in events:
        if not isinstance(e, dict):
            continue
        cat, ph, args = e.get("cat"), e.get("ph"), e.get("args") or {}
        if ph == "X" and cat == "frame":
            frames.append(TraceFrame(int(args.get("index", len(frames) + 1)), float(e.get("dur", 0.0)),
                                     args.get("gpu_us"), tuple(args.get("tiers", ())), str(args.get("state", "")),
                                     int(args.get("frames", 1)), args.get("blocks"), args.get("phases")))
        elif ph == "i" and cat == "update":
            updates.append(TraceMark("update", int(args.get("frame", 0)), str(e.get("name", "")),
                                     tuple(args.get("tiers", ()))))
        elif ph == "i" and cat == "reload":
            reloads.append(TraceMark("reload", int(args.get("frame", 0)), str(e.get("name", ""))))
        elif ph == "i" and cat == "diagnostic":
            diagnostics.append(TraceMark("diagnostic", int(args.get("frame", 0)), str(e.get("name", "")),
                                         severity=str(args.get("severity", ""))))
        elif ph == "M" and e.get("name") == "process_name" and e.get("pid") == GPU:
            device = str(args.get("name", device)).removeprefix("GPU: ")
    if not frames:
        raise ValueError(f"{where} holds no rxcuda frames (no 'X' events of category 'frame'); write a trace "
                         f"with engine.trace(path) and tick the engine while it records")
    frames.sort(key=lambda f: f.index)
    return TraceData(tuple(frames), tuple(updates), tuple(reloads), tuple(diagnostics), device)


class TraceSummary(NamedTuple):
    """What a trace saw: frame count, host and GPU time per frame (median, 99th percentile, max and the
    slowest frame), updates counted by their highest tier ("none applied": an update that failed, such as a
    rebuild whose last good graph kept running), reloads and diagnostics. ``str()`` gives one line."""

    frames: int
    host_median_us: float
    host_p99_us: float
    host_max_us: float
    slowest_frame: int
    gpu_median_us: float | None
    gpu_max_us: float | None
    updates: dict
    reloads: int
    diagnostics: int

    def __str__(self) -> str:
        text = (f"{self.frames} frames: host median {self.host_median_us:.1f} us, p99 {self.host_p99_us:.1f} us, "
                f"max {self.host_max_us:.1f} us (frame {self.slowest_frame})")
        if self.gpu_median_us is not None:
            text += f"; GPU median {self.gpu_median_us:.1f} us, max {self.gpu_max_us:.1f} us"
        tiers = ", ".join(f"{t} {n}" for t, n in self.updates.items()) or "none"
        return (text + f"; updates: {tiers}; {self.reloads} reload{'s' * (self.reloads != 1)}; "
                f"{self.diagnostics} diagnostic{'s' * (self.diagnostics != 1)}")


def summarize(source) -> TraceSummary:
    """A :class:`TraceSummary` of a trace (a path, a parsed document, a list of events or :class:`TraceData`).

    >>> print(rxcuda.view.summarize("trace.json"))                            # doctest: +SKIP
    100 frames: host median 14.0 us, p99 30.2 us, max 812.4 us (frame 1); updates: structure 1; ...
    """
    data = source if isinstance(source, TraceData) else read_trace(source)
    host = [f.host_us for f in data.frames]
    gpu = [float(f.gpu_us) for f in data.frames if f.gpu_us is not None]
    slowest = max(data.frames, key=lambda f: f.host_us)
    counts: dict[str, int] = {}
    for u in data.updates:
        top = next((t for t in TIERS if t in u.tiers), "none applied")  # e.g. a rebuild that failed
        counts[top] = counts.get(top, 0) + 1
    ordered = {t: counts[t] for t in (*TIERS, "none applied") if t in counts}
    return TraceSummary(len(host), statistics.median(host), _percentile(host, 99), max(host), slowest.index,
                        statistics.median(gpu) if gpu else None, max(gpu) if gpu else None, ordered,
                        len(data.reloads), len(data.diagnostics))


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


__all__ = ["Trace", "TraceData", "TraceFrame", "TraceMark", "TraceSummary", "build_events",
           "read_trace", "summarize", "trace"]
