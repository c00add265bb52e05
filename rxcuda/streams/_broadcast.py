"""A hot, read-only Observable the engine publishes on: cheap enough for the per-frame path.

RxPY's ``Subject`` takes a lock and copies its observer list on every item (~0.6 us); a frame or a
parameter change published to one subscriber should cost far less. :class:`Broadcast` keeps its observers
in a tuple (replaced, never mutated, on subscribe and dispose), so publishing is a loop over a tuple. It
is an ordinary ``reactivex.Observable`` to its users (``pipe``, ``subscribe``), but they cannot push into
it, and it completes when its owner closes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

from reactivex import Observable, abc
from reactivex.disposable import Disposable


class Broadcast:
    """The publishing side: ``emit`` hands an item to every current observer; ``observable`` is what
    subscribers get -- an ordinary, read-only ``reactivex.Observable`` (``pipe``, ``subscribe``) with no way
    to push into it. ``on_error`` receives an observer's exception (the item still reaches the other
    observers): the publisher is never interrupted by a subscriber.

    >>> from rxcuda.streams import Broadcast
    >>> frames = Broadcast()
    >>> seen = []
    >>> sub = frames.observable.subscribe(seen.append)
    >>> frames.emit(1); frames.emit(2); frames.close()
    >>> seen
    [1, 2]
    >>> hasattr(frames.observable, "emit") or hasattr(frames.observable, "on_next")
    False
    """

    def __init__(self, on_error: Callable[[Exception, Any], None] | None = None,
                 on_observers: Callable[[], None] | None = None) -> None:
        self.observers: tuple[abc.ObserverBase, ...] = ()
        self._lock = threading.Lock()
        self._closed = False
        self._on_error = on_error
        # called after ``observers`` changed (a subscription came or went): for a publisher that keeps its own
        # copy of who listens where its hot path reads it (rxcuda.streams._coalesce.PendingPlan._observed)
        self._on_observers = on_observers
        self.observable: Observable = _Subscribers(self)

    def add(self, observer: abc.ObserverBase) -> abc.DisposableBase:
        with self._lock:
            if self._closed:
                observer.on_completed()
                return Disposable()
            self.observers = self.observers + (observer,)
        if self._on_observers is not None:
            self._on_observers()

        def dispose() -> None:
            with self._lock:
                self.observers = tuple(o for o in self.observers if o is not observer)
            if self._on_observers is not None:
                self._on_observers()

        return Disposable(dispose)

    def emit(self, item: Any) -> None:
        """Hand ``item`` to every observer, on the calling thread.

        The parameter path (a setter's change, the hot path's AppliedUpdate) runs this loop inline over
        ``observers`` and calls :meth:`failed` from its ``except``: one Python call less per item."""
        for observer in self.observers:
            try:
                observer.on_next(item)
            except Exception as e:  # one subscriber's error must not stop the publisher
                self.failed(e, item)

    def failed(self, err: Exception, item: Any) -> None:
        """An observer raised ``err`` on ``item``: hand it to ``on_error``, or re-raise it where there is none
        (called from an ``except`` block)."""
        if self._on_error is None:
            raise err
        self._on_error(err, item)

    def close(self) -> None:
        """Complete every observer (the Rx grammar: an engine's streams end when it closes)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            observers, self.observers = self.observers, ()
        if self._on_observers is not None:
            self._on_observers()
        for observer in observers:
            try:
                observer.on_completed()
            except Exception as e:
                if self._on_error is None:
                    raise
                self._on_error(e, None)

    @property
    def closed(self) -> bool:
        return self._closed


class _Subscribers(Observable):
    """What a Broadcast's subscribers see. Plain callbacks are called directly (no auto-detaching wrapper:
    the publisher already isolates a failing callback), which keeps publishing cheap."""

    def __init__(self, broadcast: Broadcast) -> None:
        super().__init__()
        self._broadcast = broadcast

    def subscribe(self, on_next=None, on_error=None, on_completed=None, *, scheduler=None) -> abc.DisposableBase:
        if on_next is None or isinstance(on_next, abc.ObserverBase) or hasattr(on_next, "on_next"):
            return super().subscribe(on_next, on_error, on_completed, scheduler=scheduler)
        return self._broadcast.add(cast(abc.ObserverBase, _Callbacks(on_next, on_error, on_completed)))

    def _subscribe_core(self, observer: abc.ObserverBase, scheduler: abc.SchedulerBase | None = None
                        ) -> abc.DisposableBase:
        return self._broadcast.add(observer)


class _Callbacks:
    """An observer made of plain callbacks, called directly."""

    __slots__ = ("on_next", "_on_error", "_on_completed")

    def __init__(self, on_next, on_error, on_completed) -> None:
        self.on_next = on_next
        self._on_error = on_error
        self._on_completed = on_completed

    def on_error(self, error: Exception) -> None:
        if self._on_error is not None:
            self._on_error(error)

    def on_completed(self) -> None:
        if self._on_completed is not None:
            self._on_completed()
