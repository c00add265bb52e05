"""The live page of an :class:`~rxcuda.distributed.IsolatedEngine` (``iso.serve()``): the view's server runs in
the user's process, beside the pipeline it shows, so the page stays up and connected while the GPU process faults
and is replaced.

:class:`IsolatedSource` is the view's narrow interface (``rxcuda/view/_source.py``) over the isolated engine:

- frames: the engine's :class:`~rxcuda.Frame` per frame; their times are the GPU process's (``host_us`` the
  host time of its tick, ``gpu_us`` None: its engine profiles nothing). A frame in which no GPU process ran
  (the one a fault ended, ``"idle"`` ones while the standby takes over) has no time: ``None``, not a zero;
- updates: what the frames' tiers say was applied in the GPU process (structure, code, recapture), and a frame
  whose state differs from the one before (a fault, frames clean again): the blocks' states are drawn again;
- diagnostics: the GPU process's, the engine's own (the fault, the rollback, the process back), with ``block``
  the id of the user's block of that name (the GPU process numbers its blocks its own way);
- parameters: the user's blocks, set through :meth:`IsolatedEngine.set <rxcuda.distributed.Engine.set>`;
- graph: the pipeline as this process holds it; a block's state is derived from the diagnostics (an error about
  it until a later frame ran clean, a warning until an info clears it) and the frames ("not built" before the
  first good one);
- status: the GPU process's engine (bytes reserved, its buffers, its frames and rebuilds since its last build),
  fetched about once a second off the server's thread and shown with its age; the faults survived and the process
  serving now. What no GPU process reports (rebuilds over the processes, memory by pool class, append counters)
  is ``None`` and listed in ``unmeasured``: the page says "not measured".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from reactivex import Observable
from reactivex import operators as ops

from ..engine._engine import Diagnostic, Frame
from ..model._events import Tier
from ..plan._plan import plan
from ..view._collect import pipeline_graph
from ..view._dot import _WORST_FIRST
from ..view._serve import LiveView
from ..view._source import Source
from . import _procs

STATS_EVERY_S = 1.0  # the GPU process's stats are asked for at most this often
STATS_TIMEOUT_S = 2.0
UNMEASURED = ("rebuilds over its processes", "memory by pool class", "append counters")  # what it does not report


class Applied(NamedTuple):
    """What the collector reads as an update: a frame whose tiers say the GPU process applied more than parameter
    values, or whose state differs from the frame before (``tiers`` empty: a fault ended it, or frames run clean
    again), after which the blocks' states are shown again."""

    frame: int
    tiers: tuple[Tier, ...]


class IsolatedSource(Source):
    """What the live view reads of an isolated engine (see the module docstring). ``worker``: the name of its
    one worker."""

    def __init__(self, iso: Any, worker: str):
        self._iso = iso
        self._worker = worker
        model = iso._model
        self.frames = iso.frames.pipe(ops.map(_untimed))
        self.updates = iso.frames.pipe(ops.map(self._applied), ops.filter(lambda a: a is not None))
        self._state = ""  # the latest frame's state
        self.diagnostics = iso.diagnostics.pipe(ops.map(self._named))
        self.parameter_changes = model.parameter_changes
        self.structure_changes = model.structure_changes
        self.file_changes = model.file_changes
        self._stats: tuple[dict, float] | None = None  # the GPU process's stats, when they came
        self._asked = 0.0
        self._asking = threading.Lock()

    @property
    def frame(self) -> int:
        return self._iso._index

    @property
    def closed(self) -> bool:
        return self._iso.closed

    @property
    def blocks(self) -> tuple[Any, ...]:
        return self._iso._model.blocks

    def set(self, block, **values) -> None:
        self._iso.set(block, **values)

    def observe(self, port, every: int) -> Observable:
        return self._iso.observe(port, every=every)

    def _applied(self, f: Frame) -> Applied | None:
        moved, self._state = f.state != self._state, f.state
        tiers = tuple(t for t in f.tiers if t != Tier.PARAMETERS)
        return Applied(f.index, tiers) if moved or tiers else None

    def _named(self, d: Diagnostic) -> Diagnostic:
        """``d`` with ``block`` the id of the user's block its subject names (None where it names none)."""
        bid = _block_named(self._iso._model.blocks, d.subject)
        return d if bid == d.block else Diagnostic(d.severity, d.subject, d.message, d.frame, bid, d.details)

    # -- the messages ------------------------------------------------------------------------------------
    def about(self) -> dict:
        iso = self._iso
        null = iso._null
        return {"device": _device(iso, self._worker), "profile": "none", "frame": iso._index, "measured": not null,
                "unmeasured": "the null driver runs nothing on a GPU: its times and port values are not measurements"
                              if null else ""}

    def graph(self) -> dict:
        iso = self._iso
        with iso._lock:
            model = iso._model
            desc = model.describe()
            blocks = model.blocks
            composites = model.composites
            log = list(iso.diagnostic_log)
        try:
            shapes = plan(desc, reuse_memory=False)  # the ports' resolved shapes (as the GPU process plans them)
        except Exception:  # a pipeline that cannot be built: the declared shapes (its diagnostic says why)
            shapes = None
        states, messages = _states(blocks, log, iso.last_good)
        parts = {"desc": desc, "states": states, "messages": messages, "composites": composites, "plan": shapes}
        return pipeline_graph(parts, blocks, 1)

    def status(self) -> dict:
        self._ask()
        iso = self._iso
        got = self._stats
        child, age = (got[0], time.monotonic() - got[1]) if got is not None else ({}, None)
        lines = [f"GPU side in process {iso.pid} ({_n(iso.restarts, 'process')} replaced so far; "
                 f"{_n(len(iso.faults), 'fault')} survived)"]
        if iso.faults:
            f = iso.faults[-1]
            back = f"; the next good frame {f.recovered_s * 1e3:.0f} ms after" if f.recovered_s is not None else ""
            lines.append(f"last fault: frame {f.frame} ({f.kind}){back}")
        if child:
            lines.append(f"its engine, {age:.1f} s ago: frame {child.get('frame')} and "
                         f"{_n(child.get('rebuilds', 0), 'rebuild')} since its last build")
            if child.get("buffers"):
                lines.append(str(child["buffers"]))
        else:
            lines.append("its engine's figures: not measured (no answer from the GPU process yet)")
        reserved = child.get("bytes_reserved")
        return {"type": "status", "rebuilds": None,  # each GPU process counts its own: none counts them all
                "memory": {"bytes_reserved": None if reserved is None else int(reserved), "by_class": []},
                "stats": "\n".join(lines), "appends": {}, "unmeasured": list(UNMEASURED)}

    def _ask(self) -> None:
        """Ask the GPU process for its stats on a thread of its own (never on the server's loop: a call waits
        while the process is replaced), at most once a second and one call at a time."""
        iso = self._iso
        now = time.monotonic()
        if now - self._asked < STATS_EVERY_S or iso.closed or self._worker in iso._down:
            return
        if not self._asking.acquire(blocking=False):
            return
        self._asked = now

        def ask() -> None:
            try:
                ref = iso._actors[self._worker].stats.remote()
                self._stats = (_procs.get(ref, timeout=STATS_TIMEOUT_S), time.monotonic())
            except Exception:  # replaced, closed, or nothing built yet: the last answer stays, with its age
                pass
            finally:
                self._asking.release()

        threading.Thread(target=ask, name="rxcuda-live-view-stats", daemon=True).start()


def _untimed(f: Frame) -> Frame:
    """A frame no GPU process ran (IsolatedEngine makes those with a host time of 0.0) has no time at all."""
    if not f.launched and f.host_us == 0.0 and f.gpu_us is None and not f.tiers:
        return f._replace(host_us=None)  # type: ignore[arg-type]  # the view reads None as "not measured"
    return f


def _block_named(blocks, subject: str) -> int | None:
    """The id of the block ``subject`` names (``block`` or ``block.port``, ``block.kernel``), the longest name
    first."""
    best = None
    for b in blocks:
        if (subject == b.name or subject.startswith(b.name + ".")) and (best is None or len(b.name) > len(best.name)):
            best = b
    return best.id if best is not None else None


def _states(blocks, log: Iterable[Diagnostic], last_good: int) -> tuple[dict[int, str], dict[int, str]]:
    """Each block's state and message: "not built" before the first good frame, else "ok", an error about it
    until a later frame ran clean, a warning until an info clears it."""
    base = "ok" if last_good else "not built"
    states = {b.id: base for b in blocks}
    messages: dict[int, str] = {}
    for d in log:
        bid = _block_named(blocks, d.subject)
        if bid is None:
            continue
        if d.severity == "info":
            states[bid], messages[bid] = base, ""
        elif d.severity == "error" and d.frame >= last_good:
            states[bid], messages[bid] = "error", d.message
        elif d.severity == "warning" and _WORST_FIRST.index(states[bid]) > 0:
            states[bid], messages[bid] = "warning", d.message
    return states, {k: v for k, v in messages.items() if v and states[k] != "ok"}


def _device(iso: Any, worker: str) -> str:
    where = iso._where.get(worker, {})
    if iso._null:
        what = "the null driver"
    elif iso._cpu:
        what = "the CPU device"
    else:
        what = f"GPU {iso.device_index}" + (f" ({where['gpu'][:12]}…)" if where.get("gpu") else "")
    return f"{what}, in process {where.get('pid', '?')} (isolated)"


def _n(k, word: str) -> str:
    return f"{k} {word}" + ("" if k == 1 else "es" if word.endswith("s") else "s")


def serve(iso: Any, worker: str, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          params: Iterable | None = None) -> LiveView:
    """The live view of isolated engine ``iso`` (``iso.serve()``)."""
    return LiveView(IsolatedSource(iso, worker), host, port, token, params)


__all__ = ["IsolatedSource", "serve"]
