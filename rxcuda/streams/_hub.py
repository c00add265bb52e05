"""The one place change notifications go: fold into the pending plan, publish to whoever subscribes.

Blocks and the engine hand every change to a :class:`ChangeHub`. It folds the change into the engine's
:class:`PendingPlan` (O(1), under its lock, on the producer's thread) and, only when someone subscribed,
publishes the typed event on an Observable. With no subscribers the hot path allocates no event.
"""

from __future__ import annotations

from reactivex import Observable
from reactivex import operators as ops
from reactivex.subject import Subject

from ..model._events import STRUCTURE_EVENTS, CodeChanged, ParameterChanged
from ._coalesce import PendingPlan


class ChangeHub:
    def __init__(self, pending: PendingPlan):
        self.pending = pending
        self._subject: Subject = Subject()

    def set_parameter(self, block: int, name: str, value) -> None:
        pending = self.pending  # PendingPlan.set_parameter, inlined: this is the hottest call there is
        with pending._lock:
            pending._params[(block, name)] = value
            pending._count += 1
        if self._subject.observers:
            self._subject.on_next(ParameterChanged(block, name, value))

    def add(self, event) -> None:
        self.pending.add(event)
        if self._subject.observers:
            self._subject.on_next(event)

    @property
    def events(self) -> Observable:
        """Every change event, on the thread that made it."""
        return self._subject

    def of_type(self, *types) -> Observable:
        return self._subject.pipe(ops.filter(lambda e: isinstance(e, types)))

    @property
    def parameters(self) -> Observable:
        return self.of_type(ParameterChanged)

    @property
    def structure(self) -> Observable:
        return self.of_type(*STRUCTURE_EVENTS)

    @property
    def code(self) -> Observable:
        return self.of_type(CodeChanged)

    def close(self) -> None:
        self._subject.on_completed()
