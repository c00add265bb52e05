"""Binding a parameter to an Observable: each value is handed to a setter on the thread that emits it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from reactivex import Observable, abc
from reactivex.disposable import Disposable


def bind_parameter(
    source: Observable[Any],
    set_value: Callable[[Any], None],
    on_error: Callable[[Exception], None],
) -> abc.DisposableBase:
    """Subscribe to ``source`` and call ``set_value(value)`` for each item, on whatever thread emits it.

    ``set_value`` is meant to be O(1) (the engine folds the value into its pending plan: the latest value
    per parameter wins per frame), so no thread hop is needed. An error from ``source`` ends this binding
    only and is passed to ``on_error``; an exception from ``set_value`` is passed to ``on_error`` too, and
    the binding stays alive for the next value. Completion ends the binding; the last value stays.

    Disposing unsubscribes, and once ``dispose()`` returns, ``set_value`` is not called again -- not even
    by a value already in flight on another thread (that one is waited for). It may be called from inside
    ``set_value``, but not while holding a lock that ``set_value`` takes.

    >>> d = bind_parameter(sensor.pipe(ops.throttle_first(1 / 60)),  # doctest: +SKIP
    ...                    lambda v: pending.set_parameter(block_id, "gravity", v), report)
    >>> d.dispose()  # doctest: +SKIP
    """
    lock = threading.RLock()  # reentrant: set_value may dispose its own binding
    bound = True

    def on_next(value: Any) -> None:
        with lock:
            if not bound:
                return
            try:
                set_value(value)
            except Exception as exc:  # one bad value must not end the binding
                on_error(exc)

    def unbind() -> None:
        nonlocal bound
        with lock:
            bound = False
        subscription.dispose()

    subscription = source.subscribe(on_next, on_error)
    return Disposable(unbind)
