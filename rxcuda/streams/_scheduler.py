"""The frame scheduler: one engine thread, driven by any Observable clock.

Clock items may arrive on any thread at any rate. Each only bumps a counter and wakes the engine thread
(one hop per frame, not per change event); ticks that arrive while a frame is being produced are merged
into one frame and counted as dropped. Work that must run on the GPU thread (reads, writes, rebuilds
asked for from elsewhere) is queued with :meth:`FrameLoop.call` and runs between frames.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from concurrent.futures import Future

from reactivex import Observable
from reactivex.disposable import Disposable


class FrameLoop:
    """Runs ``tick()`` on a dedicated thread whenever ``clock`` emits, until disposed."""

    def __init__(self, tick: Callable[[], None], on_start: Callable[[], None], on_error: Callable[[Exception], None],
                 name: str = "rxcuda-engine"):
        self._tick = tick
        self._on_start = on_start
        self._on_error = on_error
        self._cv = threading.Condition()
        self._requested = 0
        self._calls: collections.deque = collections.deque()
        self._stop = False
        self._clock_done = False
        self.frames = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._subscription = None

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self, clock: Observable) -> Disposable:
        self._thread.start()
        self._subscription = clock.subscribe(on_next=lambda _: self.request(), on_error=self._clock_error,
                                             on_completed=self._clock_completed)
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

    def _clock_error(self, err: Exception) -> None:
        self._on_error(err)

    def _clock_completed(self) -> None:
        with self._cv:
            self._clock_done = True

    def _main(self) -> None:
        self._on_start()
        while True:
            with self._cv:
                while not (self._requested or self._calls or self._stop):
                    self._cv.wait()
                if self._stop:
                    break
                n, self._requested = self._requested, 0
                calls = list(self._calls)
                self._calls.clear()
            for fn, args, fut in calls:
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # handed to the caller's thread
                    fut.set_exception(e)
            if n:
                self.dropped += n - 1
                try:
                    self._tick()
                    self.frames += 1
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
