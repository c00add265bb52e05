"""Append ports at run time: counts read back without a sync, offered as Observables, and the overflow and
near-full warnings.

An append port's counter is a u32 in device memory that the graph zeroes once per frame before the first
kernel that appends (``rxcuda.plan._appends``). Nothing here runs per frame unless someone reads a
count: ``engine.observe(port.count)`` adds one 4-byte asynchronous copy per frame into a ring of pinned host
buffers (one copy however many subscribe; emitted once the copy has finished, a frame or more later when
frames are not waited for), and an observe of the append data already copies the counter with the data.
Every count that reaches the host that way, and every ``engine.count`` / ``engine.read`` of an append port,
updates the port's :class:`AppendState` and may publish one warning diagnostic.

Warnings, per counter (the append port that owns the buffer; in/out append ports that continue it share its
counter): a count at or above 95 % of the capacity warns once, a count above the capacity (items dropped)
warns once, and neither warns again until an observed count falls below 90 % of the capacity (the episode
ends). A frame whose count arrives after a later frame's (two readers) changes nothing.

In a GPU-driven batch (``engine.run_batch``) no host runs between the batch's frames: the copy, like every
observe tap, is of the batch's last frame only.
"""

from __future__ import annotations

import collections
import math
import threading

import numpy as np
import reactivex
from reactivex import Observable
from reactivex.disposable import Disposable

from ..blocks._appendstate import EPISODE_END_PERCENT, AppendState
from ..cuda._memory import PinnedBuffer, copy_dtoh_async
from ..model._describe import PortRef


def warning_text(kind: str, where: str, state: AppendState, others: list[str]) -> str:
    """The diagnostic for a count that crossed 95 % of the capacity (``near_full``) or exceeded it."""
    raw, cap, frame = state.last_count, state.capacity, state.frame
    fix = (f"give {where} a larger capacity (count=... where the port is declared, or a larger block size)"
           + (f", and {' and '.join(others)}, which continue it, the same" if others else ""))
    if kind == "overflow":
        head = (f"{where} overflowed in frame {frame}: the raw count is {raw} but the capacity is {cap}, so "
                f"{state.dropped} items were dropped")
    else:
        head = (f"{where} is {100.0 * (raw or 0) / cap:.0f} % full in frame {frame}: the raw count is {raw}, the "
                f"capacity {cap}")
    return (f"{head}; {fix}. Said once until the count falls below {EPISODE_END_PERCENT} % of the capacity")


class CountWatch:
    """One append port's counter, copied into a ring of pinned 4-byte host buffers after every ``every``-th
    frame and delivered, oldest first, once each copy has finished: to ``note(ref, frame, raw)`` and to every
    subscriber whose own ``every`` divides the frame. An engine keeps one per observed count in its taps (it
    has the taps' ``enqueue`` / ``deliver`` / ``close`` and an ``on_completed`` for when the engine closes)."""

    def __init__(self, ref: PortRef, note, api, depth: int = 4):
        self.ref = ref
        self._note = note
        self._api = api
        self._depth = depth
        self._ring: list[PinnedBuffer] = []
        self._i = 0
        self._pending: collections.deque[tuple[int, PinnedBuffer]] = collections.deque()
        self._subscribers: tuple[list, ...] = ()  # [observer, every]; replaced, never mutated (other threads)
        self._errors: list[Exception] = []
        self.every = 1
        self.closed = False

    # -- subscribers (any thread) -----------------------------------------------------------------------------
    def add(self, observer, every: int) -> list:
        entry = [observer, every]
        self._subscribers = (*self._subscribers, entry)
        self._refresh_every()
        return entry

    def remove(self, entry: list) -> bool:
        """Drop a subscriber; True when none is left."""
        self._subscribers = tuple(s for s in self._subscribers if s is not entry)
        self._refresh_every()
        return not self._subscribers

    def _refresh_every(self) -> None:
        everies = [s[1] for s in self._subscribers]
        self.every = math.gcd(*everies) if everies else 1

    # -- the taps' interface (the engine thread) ----------------------------------------------------------
    def enqueue(self, frame: int, ptr: int, counter_ptr: int | None, stream) -> None:
        """After the launch, before any sync: queue this frame's 4-byte copy (``ptr`` is the counter)."""
        if frame % self.every:
            return
        if not self._ring:
            self._ring = [PinnedBuffer(4, self._api) for _ in range(self._depth)]
        slot = self._ring[self._i]
        if slot.busy:  # the ring is full: wait for the oldest copy and deliver it first
            self.poll(block_until=slot)
        self._i = (self._i + 1) % self._depth
        copy_dtoh_async(slot.ptr, ptr, 4, stream, api=self._api)
        slot.record(stream)
        self._pending.append((frame, slot))

    def deliver(self, stream, synced: bool, owner, device_id: int) -> None:
        """After the frame (and its sync, if any): deliver every count that has arrived."""
        self.poll()
        if self._errors:
            err, self._errors = self._errors[0], []
            raise err

    def poll(self, block_until: PinnedBuffer | None = None) -> None:
        while self._pending:
            frame, slot = self._pending[0]
            if block_until is not None:
                slot.wait()
            elif not slot.done():
                return
            self._pending.popleft()
            self._deliver(frame, int(slot.view(np.uint32, 1)[0]))
            if slot is block_until:
                return

    def _deliver(self, frame: int, raw: int) -> None:
        try:
            self._note(self.ref, frame, raw)
        except Exception as e:  # reported by the caller (deliver), after every subscriber had its value
            self._errors.append(e)
        if self.closed:
            return
        for observer, every in self._subscribers:
            if frame % every == 0:
                try:
                    observer.on_next(raw)
                except Exception as e:  # a subscriber's error must not keep the others from their value
                    self._errors.append(e)

    def on_completed(self) -> None:
        """The engine closed: every subscriber completes."""
        subscribers, self._subscribers = self._subscribers, ()
        for observer, _every in subscribers:
            observer.on_completed()

    def close(self) -> None:
        self.closed = True
        ring, self._ring, self._pending = self._ring, [], collections.deque()
        for s in ring:
            s.close()


class AppendMonitor:
    """An engine's append ports at run time: the shared count watches, and what every count read back does
    to the ports' :class:`AppendState` and the diagnostics. Runs on the engine's thread (``observe``'s
    subscribe and dispose may come from any thread)."""

    def __init__(self, rt):
        self.rt = rt
        self.watches: dict[PortRef, CountWatch] = {}
        self._lock = threading.Lock()
        self._plan = None
        self._members: dict[int, tuple[PortRef, ...]] = {}

    def counter_of(self, ref: PortRef) -> int | None:
        """The counter buffer id of an append port or of its ``.count``, in the running graph (None: none)."""
        g = self.rt.graph
        if g is None:
            return None
        plan = g.plan
        cid = plan.counters.get(ref)
        if cid is None:
            cid = plan.port_buffers.get(ref)
            if cid is None or plan.buffers[cid].kind != "counter":
                return None
        return cid

    def sharing(self, cid: int) -> tuple[PortRef, ...]:
        """The append ports whose kernels append through counter ``cid``, its owner first (then the in/out
        append ports that continue it, in the order they run)."""
        plan = self.rt.running().plan
        if plan is not self._plan:
            self._plan, self._members = plan, {}
        members = self._members.get(cid)
        if members is None:
            key = plan.buffers[cid].key  # ("counter", owner block, owner port)
            owner = PortRef(key[1], key[2])
            members = (owner, *(r for r, c in plan.counters.items() if c == cid and r != owner))
            self._members[cid] = members
        return members

    def note(self, ref: PortRef, frame: int, raw: int) -> None:
        """A raw count of ``frame`` reached the host for append port ``ref`` (or its ``.count``): update the
        state of every port sharing the counter and publish the warnings due (named after the owner)."""
        cid = self.counter_of(ref)
        if cid is None:
            return
        blocks = self.rt.blocks
        members = self.sharing(cid)
        owner = blocks.get(members[0].block)
        if owner is None:
            return
        capacity = owner.description.port(members[0].port).count
        due: tuple[str, ...] = ()
        for i, r in enumerate(members):
            b = blocks.get(r.block)
            if b is not None:
                got = b._append_state(r.port).update(frame, raw, capacity)
                if i == 0:
                    due = got
        if due:
            where = f"{owner.name}.{members[0].port}"
            others = [f"{blocks[r.block].name}.{r.port}" for r in members[1:] if r.block in blocks]
            state = owner._append_state(members[0].port)
            for kind in due:
                self.rt.reporter.warn(where, warning_text(kind, where, state, others), owner,
                                      source=f"append:{members[0].port}")
        elif f"append:{members[0].port}" in owner._warnings and not owner._append_state(members[0].port)._episode:
            self.rt.reporter.recover(owner, f"append:{members[0].port}", "its append count is back under 90 %")

    def observe(self, ref: PortRef, every: int, gpu, closed, io) -> Observable:
        """The raw count of an append port as an Observable of ints (``engine.observe(port.count)``)."""
        if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
            raise ValueError(f"'every' must be a positive int (got {every!r})")
        api = self.rt.api

        def subscribe(observer, scheduler=None):
            if closed():
                observer.on_completed()
                return Disposable()
            with self._lock:
                found = self.watches.get(ref)
                if found is None:
                    found = self.watches[ref] = CountWatch(ref, self.note, api)
                    io.taps = [*io.taps, (ref, found, found)]
                watch: CountWatch = found
                entry = watch.add(observer, every)

            def dispose() -> None:
                with self._lock:
                    if not watch.remove(entry) or self.watches.get(ref) is not watch:
                        return
                    del self.watches[ref]
                    io.taps = [t for t in io.taps if t[1] is not watch]
                watch.closed = True
                if not closed():
                    gpu(watch.close)

            return Disposable(dispose)

        return reactivex.create(subscribe)


__all__ = ["AppendState", "AppendMonitor", "CountWatch", "warning_text"]
