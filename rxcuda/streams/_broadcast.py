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
from typing import Any

from reactivex import Observable, abc
from reactivex.disposable import Disposable


class Broadcast(Observable):
    """Publishes to every current observer. ``on_error`` receives an observer's exception (with the
    observer's ``on_next`` failing, the item still reaches the other observers): the publisher is never
    interrupted by a subscriber.

    >>> from rxcuda.streams import Broadcast
    >>> frames = Broadcast()
    >>> seen = []
    >>> sub = frames.subscribe(seen.append)
    >>> frames.publish(1); frames.publish(2); frames.close()
    >>> seen
    [1, 2]
    """

    def __init__(self, on_error: Callable[[Exception, Any], None] | None = None) -> None:
        super().__init__()
        self.observers: tuple[abc.ObserverBase, ...] = ()
        self._lock = threading.Lock()
        self._closed = False
        self._on_error = on_error

    def _subscribe_core(self, observer: abc.ObserverBase, scheduler: abc.SchedulerBase | None = None
                        ) -> abc.DisposableBase:
        with self._lock:
            if self._closed:
                observer.on_completed()
                return Disposable()
            self.observers = self.observers + (observer,)

        def dispose() -> None:
            with self._lock:
                self.observers = tuple(o for o in self.observers if o is not observer)

        return Disposable(dispose)

    def publish(self, item: Any) -> None:
        """Hand ``item`` to every observer, on the calling thread."""
        for observer in self.observers:
            try:
                observer.on_next(item)
            except Exception as e:  # one subscriber's error must not stop the publisher
                if self._on_error is None:
                    raise
                self._on_error(e, item)

    def close(self) -> None:
        """Complete every observer (the Rx grammar: an engine's streams end when it closes)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            observers, self.observers = self.observers, ()
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
