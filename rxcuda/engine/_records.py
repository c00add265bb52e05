"""What the engine tells its users: frames, applied updates and diagnostics, and the reporter that
publishes diagnostics and keeps the blocks' states.

``Frame`` and ``AppliedUpdate`` are named tuples: one is made per frame, on the frame path.
"""

from __future__ import annotations

import collections
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import attrs

from ..cuda import _native
from ..model._events import Tier
from ..streams._broadcast import Broadcast

log = logging.getLogger("rxcuda")


class Frame(NamedTuple):
    """What one tick did: its index, host time, tiers applied, the engine state after it, whether a graph
    was launched, its GPU time (with profiling, ``Engine(timing=True)`` or any ``engine.profile`` level, and a
    frame that was waited for), how many frames the launch ran (``engine.run_batch``: several, GPU time for
    all of them), with finer levels the GPU time of each block and kernel and the host phases, and the
    ``While`` regions that ran all their ``max_iterations`` passes (``loops_at_bound``).

    ``state`` is ``"ok"``, ``"error"`` (a block failed: the last good graph runs, or, when no build has
    succeeded yet, nothing runs and ``launched`` is False) or ``"idle"`` (no graph, and nothing failed: an empty
    engine).
    """

    index: int  # type: ignore[assignment]  # the field shadows tuple.index, as in any named tuple with it
    host_us: float
    tiers: tuple[Tier, ...]
    state: str
    launched: bool
    gpu_us: float | None = None
    frames: int = 1  # frames this launch ran: more than one for engine.run_batch (index is the last one's)
    # with profiling (engine.profile), for a frame that was waited for: GPU time per block and per kernel
    # (name -> UnitTime with .gpu_us), and at the deep level the host phases (name -> us)
    blocks: Mapping | None = None
    kernels: Mapping | None = None
    phases: Mapping | None = None
    # the names of the While regions that ran all their max_iterations passes (rxcuda.engine._loops; for a frame
    # not waited for, as the last frame the GPU finished left them)
    loops_at_bound: tuple[str, ...] = ()


class AppliedUpdate(NamedTuple):
    """An update plan the scheduler applied: which tiers ran, for which blocks, and how long it took."""

    frame: int
    tiers: tuple[Tier, ...]
    blocks: tuple[str, ...]
    seconds: float
    events: int


def _maker(record: type) -> Callable[[tuple], Any]:
    """``make(fields)``: a ``record`` holding ``fields``, without the named tuple's Python-level __new__: the compiled
    path's ``Record`` (which its drain fills in without a Python call), else tuple.__new__."""
    native = _native.hotpath()
    return native.Record(record) if native is not None else functools.partial(tuple.__new__, record)


# the one maker of an AppliedUpdate: applied_update((frame, tiers, blocks, seconds, events)); the engine's reports
# (rxcuda.engine._update.Updater._notify) and the drain of one value, in Python or in C (drain_one in
# rxcuda/cuda/_hotpath.c, handed it), all make theirs with it
applied_update = _maker(AppliedUpdate)


@attrs.frozen
class Diagnostic:
    """An error or warning about a block, port or file, published instead of stopping the frames; "info"
    when a block recovered from one.

    ``details`` carries structured extras, e.g. a compiler's (file, line, column, message) entries or the
    planner's other problems.
    """

    severity: str
    subject: str
    message: str
    frame: int
    block: int | None = None
    details: tuple = ()


class Reporter:
    """Publishes diagnostics (``stream``, ``log``), sets the state of the block concerned, and keeps the
    engine's overall state ("ok" or "error")."""

    def __init__(self, blocks: dict, frame) -> None:
        self._blocks = blocks  # the engine's id -> Block registry (shared, not copied)
        self._frame = frame  # () -> the current frame index
        self.log: collections.deque[Diagnostic] = collections.deque(maxlen=1000)
        self.stream = Broadcast(on_error=self._subscriber_failed)
        self.state = "ok"
        self.warned: set[str] = set()  # what was shown as a warning (rxcuda.engine._build: once per message)

    def block_for(self, err: Exception):
        """The block an error names (``err.subject`` is 'block' or 'block.port'), if any."""
        subject = getattr(err, "subject", None)
        if not subject:
            return None
        for b in self._blocks.values():
            if subject == b.name or subject.startswith(b.name + "."):
                return b
        return None

    def error(self, err: Exception, block, what: str, *, keeps: str = "the last good graph keeps running"):
        """Report a failed step: the block (if known) goes to "error", and a diagnostic is published."""
        if block is not None:
            block.state, block.message = "error", str(err)
            self.state = "error"
        subject = block.name if block else (getattr(err, "subject", None) or getattr(err, "path", None) or "engine")
        details = tuple(getattr(err, "diagnostics", ())) + tuple(getattr(err, "problems", ()))
        self.publish(Diagnostic("error", subject, f"{what} failed, {keeps}: {err}", self._frame(),
                                block.id if block else None, details))

    def warn(self, subject: str, message: str, block=None, source: str | None = None) -> None:
        """Publish a warning. With a ``block`` and a ``source`` (what raised it: "plan", "occupancy",
        "append:<port>", ...) the block's state becomes "warning" (unless it is in error) until
        :meth:`recover` clears that source."""
        if block is not None and source is not None:
            block._warnings[source] = message
            if block.state != "error":
                block.state, block.message = "warning", message
        self.publish(Diagnostic("warning", subject, message, self._frame(), block.id if block else None))

    def recover(self, block, source: str | None = None, why: str = "") -> None:
        """``source`` no longer applies to ``block``; a block whose state was "warning" or "error" and has no
        warning left returns to "ok", with an "info" diagnostic saying it recovered."""
        if source is not None:
            block._warnings.pop(source, None)
        if block.state == "warning" and block._warnings:
            block.message = next(iter(block._warnings.values()))
            return
        if block.state in ("warning", "error") and not block._warnings:
            was = block.state
            block.state, block.message = "ok", ""
            self.refresh()
            self.publish(Diagnostic("info", block.name, f"{block.name} recovered from its {was}"
                                    + (f" ({why})" if why else "") + "; its state is ok again", self._frame(),
                                    block.id))

    def publish(self, d: Diagnostic) -> None:
        self.log.append(d)
        level = log.error if d.severity == "error" else log.warning if d.severity == "warning" else log.info
        level("%s: %s", d.subject, d.message)
        self.stream.emit(d)

    def refresh(self) -> None:
        # (a copy: other threads may add blocks meanwhile, and copying a dict's values is one step)
        self.state = "error" if any(b.state == "error" for b in list(self._blocks.values())) else "ok"

    def _subscriber_failed(self, err: Exception, item) -> None:
        # a diagnostics subscriber that raises cannot be told through diagnostics: log it
        log.error("a subscriber of engine.diagnostics raised %s: %s", type(err).__name__, err)

    def close(self) -> None:
        self.stream.close()


__all__ = ["AppliedUpdate", "Diagnostic", "Frame", "Reporter", "applied_update"]
