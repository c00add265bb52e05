"""rxcuda's own Rx operators, in RxPY's style.

Each public operator is a function returning ``Callable[[Observable], Observable]`` for ``.pipe(...)``.
State lives per subscription in the ``subscribe`` closure, timers sit in serial disposables, everything a
subscription owns is torn down by one composite disposable, and anything time-based takes
``scheduler=None`` (falling back to the subscriber's scheduler, then to
:class:`reactivex.scheduler.TimeoutScheduler`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from reactivex import Observable, abc, typing
from reactivex.disposable import (
    CompositeDisposable,
    Disposable,
    SerialDisposable,
    SingleAssignmentDisposable,
)
from reactivex.scheduler import TimeoutScheduler

from ..model._events import FileChanged

_T = TypeVar("_T")

Digest = Callable[[str], str | None]


def file_digest(path: str | os.PathLike[str]) -> str | None:
    """The sha256 hex digest of a file's content, or None when there is nothing whole to read.

    None means "skip this one": the file is missing (deleted, or renamed away mid-save), unreadable, a
    directory, empty (editors truncate before they write), or it changed size or mtime while it was read
    (a write in progress). The writer's next event schedules another look.

    >>> file_digest("kernels/forces.cu")  # doctest: +SKIP
    '3f1a...'
    """
    try:
        with open(path, "rb") as f:
            before = os.fstat(f.fileno())
            data = f.read()
            after = os.fstat(f.fileno())
    except OSError:
        return None
    if not data or (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        return None
    return hashlib.sha256(data).hexdigest()


def debounce_by_content(
    duetime: typing.RelativeTime,
    digest: Digest = file_digest,
    scheduler: abc.SchedulerBase | None = None,
    *,
    initial: Mapping[str, str] | Callable[[], Mapping[str, str]] | None = None,
) -> Callable[[Observable[Any]], Observable[FileChanged]]:
    """Turn bursts of raw file events (paths) into one :class:`FileChanged` per real content change.

    Per path, a burst (editors save through probes, temp files, renames and several writes) is debounced:
    ``duetime`` after the path's last event, its content ``digest`` is taken; the change is emitted only
    if that digest differs from the last one emitted for the path. A save with no change, or a touch,
    emits nothing; a file that is missing or half written (``digest`` returns None) is skipped. Paths are
    independent: a burst on ``a.cu`` does not delay ``b.cu``.

    ``initial`` seeds the known digests (a mapping, or a function called on each subscribe), so the first
    save of an unchanged file emits nothing either. On completion, pending paths are checked at once;
    on error or disposal, pending timers are cancelled.

    Emissions come from the scheduler's thread (a timer thread by default) and are serialized.

    >>> raw_paths.pipe(debounce_by_content(0.05)).subscribe(print)  # doctest: +SKIP
    FileChanged(path='/src/forces.cu', digest='3f1a...')

    With a ``TestScheduler``, ``debounce_by_content(40)`` turns ``on_next(250, 'a.cu')`` into a
    ``FileChanged('a.cu', ...)`` at 290.
    """

    def _debounce_by_content(source: Observable[Any]) -> Observable[FileChanged]:
        def subscribe(
            observer: abc.ObserverBase[FileChanged], scheduler_: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            _scheduler = scheduler or scheduler_ or TimeoutScheduler.singleton()
            # Two locks. ``state`` guards the dicts and is never held while calling out, so the
            # producer's thread (a watchdog dispatcher) only ever waits for a few dict operations.
            # ``gate`` serializes calls to the observer (timers of different paths fire on different
            # threads); it is reentrant so a downstream observer may dispose us from inside on_next.
            state = threading.Lock()
            gate = threading.RLock()
            timers: dict[str, SerialDisposable] = {}
            generation: dict[str, int] = {}  # bumped per event: a timer acts only if still current
            pending: dict[str, int] = {}  # paths whose timer has not fired yet -> its generation
            seed = initial() if callable(initial) else initial
            last: dict[str, str] = dict(seed or {})
            group = CompositeDisposable()
            stopped = False

            def fail(exc: Exception) -> None:
                nonlocal stopped
                with gate:
                    with state:
                        if stopped:
                            return
                        stopped = True
                    group.dispose()
                    observer.on_error(exc)

            def check(path: str, gen: int) -> None:
                try:
                    d = digest(path)  # outside both locks: a slow disk blocks nobody
                except Exception as exc:  # a user function's error goes downstream
                    fail(exc)
                    return
                with gate:
                    with state:
                        if stopped or generation.get(path) != gen:
                            return  # a newer event arrived while we read: its own timer takes over
                        pending.pop(path, None)
                        if d is None or last.get(path) == d:
                            return
                        last[path] = d
                    observer.on_next(FileChanged(path, d))

            def on_next(value: Any) -> None:
                path = os.fspath(value)
                with state:
                    if stopped:
                        return
                    gen = generation[path] = generation.get(path, 0) + 1
                    pending[path] = gen
                    timer = timers.get(path)
                    if timer is None:
                        timer = timers[path] = SerialDisposable()
                        group.add(timer)

                def action(_: abc.SchedulerBase, __: Any = None) -> None:
                    check(path, gen)

                d = SingleAssignmentDisposable()
                timer.disposable = d  # cancels the path's previous timer
                d.disposable = _scheduler.schedule_relative(duetime, action)

            def on_completed() -> None:
                nonlocal stopped
                with gate:
                    with state:
                        if stopped:
                            return
                        flush = list(pending.items())
                    group.dispose()
                    for path, gen in flush:
                        check(path, gen)
                    with state:
                        if stopped:  # a digest failed during the flush
                            return
                        stopped = True
                    observer.on_completed()

            def stop() -> None:
                nonlocal stopped
                with state:
                    stopped = True

            subscription = source.subscribe(on_next, fail, on_completed, scheduler=scheduler_)
            return CompositeDisposable(subscription, group, Disposable(stop))

        return Observable(subscribe)

    return _debounce_by_content


class _Folds(Protocol):
    def add(self, event: Any) -> None: ...


def coalesce_into(pending: _Folds) -> Callable[[Observable[Any]], Observable[Any]]:
    """Fold every change event into ``pending`` (a :class:`PendingPlan`) on the emitting thread.

    A sink shaped as an operator: items are folded (under the plan's lock, O(1), no thread hop) and
    not passed on; completion and errors are. The folding starts on subscribe and stops on dispose, so
    the subscription *is* the binding:

    >>> d = changes.pipe(coalesce_into(pending)).subscribe(on_error=report)  # doctest: +SKIP
    >>> d.dispose()  # doctest: +SKIP

    A value that is not a change event ends the stream with the plan's ``TypeError``. To fold and also
    see the events, fold with ``ops.do_action(pending.add)`` instead.
    """

    def _coalesce_into(source: Observable[Any]) -> Observable[Any]:
        def subscribe(
            observer: abc.ObserverBase[Any], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            add = pending.add

            def on_next(event: Any) -> None:
                try:
                    add(event)
                except Exception as exc:  # RxPY routes operator errors downstream
                    observer.on_error(exc)

            return source.subscribe(on_next, observer.on_error, observer.on_completed, scheduler=scheduler)

        return Observable(subscribe)

    return _coalesce_into


def sample_every(n: int) -> Callable[[Observable[_T]], Observable[_T]]:
    """Pass the first item and every ``n``-th after it (items 0, n, 2n, ...) of each subscription.

    For outputs that need not be seen every frame: ``engine_output.pipe(sample_every(10))`` shows
    frames 0, 10, 20, ... The first item passes so a subscriber sees a value at once.

    >>> reactivex.of(0, 1, 2, 3, 4).pipe(sample_every(2)).subscribe(print)  # doctest: +SKIP
    0
    2
    4
    """
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"'n' must be a positive int (got {n!r})")
    if n <= 0:
        raise ValueError(f"'n' must be a positive int (got {n!r})")

    def _sample_every(source: Observable[_T]) -> Observable[_T]:
        def subscribe(
            observer: abc.ObserverBase[_T], scheduler: abc.SchedulerBase | None = None
        ) -> abc.DisposableBase:
            countdown = 0  # items to drop before the next one passes

            def on_next(value: _T) -> None:
                nonlocal countdown
                if countdown == 0:
                    countdown = n - 1
                    observer.on_next(value)
                else:
                    countdown -= 1

            return source.subscribe(on_next, observer.on_error, observer.on_completed, scheduler=scheduler)

        return Observable(subscribe)

    return _sample_every
