"""The frame scheduler: one engine thread, driven by a rate or by any Observable clock.

With a rate (frames per second) the engine thread keeps its own clock: frame k is due at t0 + k/rate and
the thread sleeps until then, so a late wake-up (the GIL held by a busy Python thread, say) delays one
frame but never the ones after it -- the period does not drift. Frames that could not start in time merge
into the next and are counted as ``merged``.

With an Observable, each item only bumps a counter and wakes the engine thread (one hop per frame, not per
change event); items that arrive while a frame is being produced merge into one frame.

Work that must run on the GPU thread (reads, writes, rebuilds asked for from elsewhere) is queued with
:meth:`FrameLoop.call` and runs between frames.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import attrs
from reactivex import Observable
from reactivex.disposable import Disposable


@attrs.define
class LoopStats:
    """What the frame loop did: frames produced, clock ticks merged into later frames, and how late the
    engine thread started frames on a rate clock (mostly the wait for the GIL), in milliseconds."""

    frames: int = 0
    merged: int = 0
    lag_ms_total: float = 0.0
    lag_ms_max: float = 0.0

    @property
    def lag_ms_mean(self) -> float:
        return self.lag_ms_total / self.frames if self.frames else 0.0


class FrameLoop:
    """Runs ``tick()`` on a dedicated thread at a rate or whenever a clock emits, until stopped."""

    def __init__(self, tick: Callable[[], None], on_start: Callable[[], None], on_error: Callable[[Exception], None],
                 name: str = "rxcuda-engine"):
        self._tick = tick
        self._on_start = on_start
        self._on_error = on_error
        self._cv = threading.Condition()
        self._requested = 0
        self._calls: collections.deque = collections.deque()
        self._stop = False
        self._period: float | None = None
        self.stats = LoopStats()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._subscription: Any = None

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def frames(self) -> int:
        return self.stats.frames

    @property
    def dropped(self) -> int:
        """Clock ticks merged into a later frame."""
        return self.stats.merged

    def start(self, clock: Observable | float) -> Disposable:
        """``clock``: frames per second (a number > 0) or an Observable whose items each ask for a frame."""
        if isinstance(clock, (int, float)) and not isinstance(clock, bool):
            if not clock > 0:
                raise ValueError(f"a frame rate must be positive (got {clock!r} frames per second)")
            self._period = 1.0 / float(clock)
            self._thread.start()
        elif isinstance(clock, Observable):
            self._thread.start()
            self._subscription = clock.subscribe(on_next=lambda _: self.request(), on_error=self._on_error)
        else:
            raise TypeError(f"the clock must be a frame rate or an Observable (got {type(clock).__name__})")
        return Disposable(self.stop)

    def request(self) -> None:
        with self._cv:
            self._requested += 1
            self._cv.notify()

    def call(self, fn: Callable, *args):
        """Run ``fn(*args)`` on the engine thread and return its result (re-raising its exception)."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        fut: Future = Future()
        with self._cv:
            if self._stop:
                raise RuntimeError("the frame loop has stopped")
            self._calls.append((fn, args, fut))
            self._cv.notify()
        return fut.result()

    def _main(self) -> None:
        self._on_start()
        period = self._period
        next_due = time.perf_counter() + (period or 0.0)
        stats = self.stats
        while True:
            lag = 0.0
            with self._cv:
                if period is None:
                    while not (self._requested or self._calls or self._stop):
                        self._cv.wait()
                    n, self._requested = self._requested, 0
                else:
                    while not (self._calls or self._stop):
                        wait = next_due - time.perf_counter()
                        if wait <= 0:
                            break
                        self._cv.wait(wait)
                    now = time.perf_counter()
                    n = 0
                    if now >= next_due:
                        late = now - next_due
                        n = 1 + int(late // period)  # due ticks, merged into this frame
                        next_due += n * period
                        lag = late - (n - 1) * period
                if self._stop:
                    break
                calls = list(self._calls)
                self._calls.clear()
            for fn, args, fut in calls:
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # handed to the caller's thread
                    fut.set_exception(e)
            if n:
                stats.merged += n - 1
                try:
                    self._tick()
                    stats.frames += 1
                    lag_ms = lag * 1e3
                    stats.lag_ms_total += lag_ms
                    stats.lag_ms_max = max(stats.lag_ms_max, lag_ms)
                except Exception as e:  # a frame failed: report and keep the loop alive
                    self._on_error(e)
        with self._cv:
            calls = list(self._calls)
            self._calls.clear()
        for _fn, _args, fut in calls:
            fut.set_exception(RuntimeError("the frame loop stopped before this call ran"))

    def stop(self) -> None:
        """Unsubscribe the clock, finish the frame in progress, and join the thread."""
        if self._subscription is not None:
            self._subscription.dispose()
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()


class SwitchInterval:
    """The interpreter's GIL switch interval while any engine runs: set by the first run(), restored to what
    it was when the last one stops (the setting is process-wide; several engines may run at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._previous = 0.0
        self._seconds = 0.0

    def acquire(self, seconds: float) -> None:
        with self._lock:
            if self._running == 0:
                self._previous = sys.getswitchinterval()
                self._seconds = seconds
            else:
                self._seconds = min(self._seconds, seconds)
            self._running += 1
            sys.setswitchinterval(self._seconds)

    def release(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                sys.setswitchinterval(self._previous)


SWITCH_INTERVAL = SwitchInterval()
