"""Coalescing change events into one pending update plan, drained by the scheduler once per frame.

The pending plan is the one change path: blocks and the engine hand it every change (a parameter value
without any event object), it folds the change in O(1) under one lock on the producer's thread, and -- only
when someone subscribed -- publishes the typed event on :attr:`PendingPlan.changes`.

Rules (tested in tests/unit/test_coalesce.py):

1. Latest value wins per key: a parameter (block, name), a port binding (block, port), a launch
   (block, kernel), a kernel's code (block, kernel).
2. Equal priorities keep arrival order: keys stay in the order they first arrived.
3. A structure change subsumes lower tiers *when the rebuild succeeds*: the rebuild reads every current
   value from the model, so code, recapture and parameter entries are carried in the plan but need no
   separate operation. If the rebuild fails, the scheduler applies them to the last good graph instead, so
   nothing is lost.
4. A code change of a kernel subsumes nothing of its parameters (arguments survive a function swap), but
   an event for a block that is later removed is dropped from the lower tiers.
5. Producers only take a lock and touch a dict: O(1), no GPU, no thread hop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import attrs
from reactivex import Observable
from reactivex import operators as ops

from ..model._describe import KernelCode, Launch
from ..model._events import (
    STRUCTURE_EVENTS,
    BlockRemoved,
    CodeChanged,
    Connected,
    Disconnected,
    LaunchChanged,
    ParameterChanged,
    PortRebound,
    Tier,
)
from ._broadcast import Broadcast

_tuple_new = tuple.__new__  # builds a named tuple without its Python-level __new__ (the hot path)


@attrs.frozen(eq=False)
class UpdatePlan:
    """Everything that changed since the last frame, coalesced. Immutable once drained."""

    structure: tuple = ()
    code: dict[tuple[int, str], KernelCode] = attrs.field(factory=dict)
    params: dict[tuple[int, str], Any] = attrs.field(factory=dict)
    rebinds: dict[tuple[int, str], Any] = attrs.field(factory=dict)
    launches: dict[tuple[int, str], Launch] = attrs.field(factory=dict)
    events: int = 0

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """Tiers present, highest first (the order the scheduler applies them). A parameter of a library
        call or a rebound array it reads turns into a Recapture when applied: only the graph knows that."""
        present = []
        if self.structure:
            present.append(Tier.STRUCTURE)
        if self.code:
            present.append(Tier.CODE)
        if self.params or self.rebinds or self.launches:
            present.append(Tier.PARAMETERS)
        return tuple(present)

    def blocks(self) -> frozenset[int]:
        """Ids of the blocks this plan touches (structure events name theirs or their ports')."""
        ids: set[int] = set()
        for ev in self.structure:
            if isinstance(ev, (Connected, Disconnected)):
                ids.update((ev.src.block, ev.dst.block))
            elif hasattr(ev, "block"):  # (a profiling change names no block)
                ids.add(ev.block)
        for d in (self.code, self.params, self.rebinds, self.launches):
            ids.update(k[0] for k in d)
        return frozenset(ids)

    def __bool__(self) -> bool:
        return self.events > 0


class PendingPlan:
    """The fold target: producers hand changes in from any thread; the engine thread drains them.

    ``set_parameter`` is the hot path (no event object unless someone subscribed to ``changes``);
    ``add`` takes any change event.

    The engine's pending plan is a subclass with the compiled path's ``PendingBase`` first
    (rxcuda.engine._runtime.pending_plan): its hot fields (:attr:`HOT_FIELDS`) live in C, and ``set_value`` is its C
    twin of the one below.
    """

    # the fields the compiled PendingBase holds (rxcuda/cuda/_hotpath.c's pending_base takes them in this order, with
    # HOT_NAMES: the method that publishes a folded value and the Broadcast of changes); ``_event_type`` is the
    # compiled fold's alone (the type of the ParameterChanged it publishes itself)
    HOT_FIELDS = ("_lock", "_params", "count", "others", "value_folds", "_observed", "_event_type")
    HOT_NAMES = ("_publish_value", "_changes")

    def __init__(self, on_subscriber_error=None) -> None:
        self._lock = threading.Lock()
        self._observed: tuple = ()  # the observers of parameter changes: ``changes``' and ``of_type``'s, in order
        # on_subscriber_error(err, event): where a failing subscriber of ``changes`` is reported (the
        # change itself is folded first, so it is never lost); None lets the error reach the producer
        self._changes = Broadcast(on_error=on_subscriber_error, on_observers=self._observers_changed)
        # what ``of_type`` subscribers hear, split by kind so that a parameter change reaches only those who asked
        # for parameter changes (the live view subscribes to parameter and structure changes: before the split
        # both Rx filters ran on every parameter change)
        self._values = Broadcast(on_error=on_subscriber_error, on_observers=self._observers_changed)
        self._others = Broadcast(on_error=on_subscriber_error)  # every other change event
        # parameter values and launches ever folded, never reset: while it stands still, no block in the engine
        # changed a value or a launch (a snapshot then reuses the last one's entries: Runtime._entries)
        self.value_folds = 0
        self._reset()

    def _observers_changed(self) -> None:
        self._observed = self._changes.observers + self._values.observers

    def _reset(self) -> None:
        self._structure: list = []
        self._code: dict = {}
        self._params: dict = {}
        self._rebinds: dict = {}
        self._launches: dict = {}
        # read without the lock by the engine thread (a stale answer only delays a change by a frame):
        self.count = 0  # changes folded since the last drain
        self.others = 0  # ... of which not parameter values

    @property
    def dirty(self) -> bool:
        """True when something is pending. Read without the lock: a stale answer only delays a frame."""
        return self.count > 0

    @property
    def structure_pending(self) -> bool:
        """True when a structure change waits for the next rebuild. Read without the lock."""
        return bool(self._structure)

    # -- producers (any thread) ----------------------------------------------------------------------
    def set_parameter(self, block: int, name: str, value) -> None:
        """The hottest change there is: one dict store under the lock, no event object."""
        self.set_value((block, name), value)

    def set_value(self, key: tuple[int, str], value) -> None:
        """``set_parameter`` with the (block id, parameter) key made by the caller: one dict store under the
        lock; a ParameterChanged only when someone subscribed."""
        lock = self._lock
        lock.acquire()  # (cheaper than ``with``; nothing between can raise: the key is a tuple of int and str)
        self._params[key] = value
        self.count += 1
        self.value_folds += 1
        lock.release()
        if self._observed:
            self._publish_value(key, value)

    def _publish_value(self, key: tuple[int, str], value) -> None:
        """A value just folded, as a ParameterChanged to its observers (``changes``' and ``of_type``'s): Broadcast.emit
        of both, inline."""
        event = _tuple_new(ParameterChanged, (key[0], key[1], value))
        for observer in self._observed:
            try:
                observer.on_next(event)
            except Exception as e:
                self._changes.failed(e, event)

    def add(self, event) -> None:
        with self._lock:
            self._fold(event)
        self._publish(event)

    def add_all(self, events: Iterable) -> None:
        events = list(events)
        with self._lock:
            for ev in events:
                self._fold(ev)
        for ev in events:
            self._publish(ev)

    def _publish(self, event) -> None:
        """Hand a folded ``event`` to ``changes`` and to the ``of_type`` subscribers of its kind."""
        if self._changes.observers:
            self._changes.emit(event)
        kind = self._values if isinstance(event, ParameterChanged) else self._others
        if kind.observers:
            kind.emit(event)

    def _fold(self, ev) -> None:
        self.count += 1
        t = type(ev)
        if t is ParameterChanged:
            self._params[(ev.block, ev.name)] = ev.value
            self.value_folds += 1
            return
        self.others += 1
        if t is PortRebound:
            self._rebinds[(ev.block, ev.port)] = ev.array
        elif t is LaunchChanged:
            self._launches[(ev.block, ev.kernel)] = ev.launch
            self.value_folds += 1
        elif t is CodeChanged:
            self._code[(ev.block, ev.kernel)] = ev.code
        elif isinstance(ev, STRUCTURE_EVENTS):
            self._structure.append(ev)
            if isinstance(ev, BlockRemoved):
                for d in (self._code, self._params, self._rebinds, self._launches):
                    for key in [k for k in d if k[0] == ev.block]:
                        del d[key]
        else:
            self.count -= 1
            self.others -= 1
            raise TypeError(f"not a change event: {ev!r}")

    # -- the engine thread ---------------------------------------------------------------------------
    def take_parameters(self) -> dict:
        """Drain when only parameter values are pending: no plan object, one dict swap."""
        lock = self._lock
        lock.acquire()  # (as in set_value: nothing between can raise)
        params = self._params
        self._params = {}
        self.count = self.others  # 0 unless a change of another kind just arrived (drained next time)
        lock.release()
        return params

    def drain(self) -> UpdatePlan | None:
        """Take everything pending as one plan (None when nothing is), leaving the pending plan empty."""
        if not self.count:
            return None
        with self._lock:
            plan = UpdatePlan(
                structure=tuple(self._structure),
                code=self._code,
                params=self._params,
                rebinds=self._rebinds,
                launches=self._launches,
                events=self.count,
            )
            self._reset()
        return plan

    # -- what subscribers see ------------------------------------------------------------------------
    @property
    def changes(self) -> Observable:
        """Every change event, on the thread that made it (read-only; completes on ``close``)."""
        return self._changes.observable

    def of_type(self, *types) -> Observable:
        """The change events of ``types``, as ``changes`` hands them (the same thread, the same order). Parameter
        changes alone are a plain stream of their own: a parameter change calls no filter of another kind's
        subscribers (nor a filter of its own).

        >>> from rxcuda.model._events import BlockAdded, ParameterChanged
        >>> pending, seen = PendingPlan(), []
        >>> subs = [pending.of_type(ParameterChanged).subscribe(seen.append),
        ...         pending.of_type(BlockAdded).subscribe(seen.append)]
        >>> pending.set_parameter(1, "gain", 0.5); pending.add(BlockAdded(2, "mix"))
        >>> seen
        [ParameterChanged(block=1, name='gain', value=0.5), BlockAdded(block=2, name='mix')]
        """
        if types == (ParameterChanged,):
            return self._values.observable
        source = self._others if ParameterChanged not in types else self._changes
        return source.observable.pipe(ops.filter(lambda e: isinstance(e, types)))

    def close(self) -> None:
        self._changes.close()
        self._values.close()
        self._others.close()
