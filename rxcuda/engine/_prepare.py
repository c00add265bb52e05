"""Structural changes prepared off the frame thread, swapped in at a frame boundary.

While ``engine.run`` drives the frames, a structural change (a block added or removed, a connection made or
removed, a binding, a resize that does not fit) is not built on the frame thread: the Structure tier hands it
to :class:`Preparer`, whose worker thread (the device's context current on it) plans, loads, allocates, builds
and instantiates the new graph (``Builder.prepare``) while the last good graph keeps launching on the clock.
The first frame after the worker is done swaps the new graph in (``Builder.install``: the frame thread pays
only that) and launches it. What carries over, exactly:

- buffers kept by key (delayed connections' previous-frame buffers, append counters, host-fed inputs) are the
  same memory in both graphs, so the state the old graph's frames left is what the new one reads;
- parameter values, launches, rebound arrays and code applied to the running graph while the new one was
  prepared are applied to the new one too, before its first launch (the log replayed by ``swap``);
- data written to an input meanwhile is uploaded into the new graph's buffer at the swap.

A structural change that arrives during a preparation folds into the next one, started at the swap. A
failure on the worker keeps the last good graph and is reported at the swap, as a failed build on the frame
thread is. The old graph, and the library state of blocks that left, are freed on the worker once the GPU is
done with them. ``tick()`` called directly (and every verb that needs the graph as it is now) waits for a
preparation in flight and applies what is pending in that same tick: see docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import gc
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures

from ..cuda import _nvtx
from ..model._events import Tier
from ..streams._coalesce import UpdatePlan
from ._shapes_io import follow_shapes

_now = time.perf_counter_ns


class Worker:
    """One daemon thread that runs tasks in the order given, with the device's context current on it.

    >>> class Dev:
    ...     def make_current(self): pass
    >>> w = Worker(Dev())
    >>> w.submit(lambda x: x + 1, 41).result()
    42
    >>> w.close()
    """

    def __init__(self, device, name: str = "rxcuda-prepare"):
        self._device = device
        self._name = name
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable, *args) -> Future:
        """Run ``fn(*args)`` on the worker after the tasks before it; its Future holds the result or error."""
        fut: Future = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
                self._thread.start()
            self._tasks.put((fn, args, fut))
        return fut

    def _main(self) -> None:
        current = False
        while True:
            item = self._tasks.get()
            if item is None:
                return
            fn, args, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                if not current:
                    self._device.make_current()
                    current = True
                fut.set_result(fn(*args))
            except BaseException as e:  # handed to whoever reads the Future
                fut.set_exception(e)

    def close(self) -> None:
        """Run the tasks already given, then end the thread (a later ``submit`` starts a new one)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._tasks.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join()


class Preparer:
    """The Structure tier's preparation off the frame thread (see the module's docstring).

    The frame thread reads ``rt.preparing`` once per frame (set while a preparation is in flight); everything
    else here runs on the frame thread except ``Builder.prepare`` and the old graph's release, on the worker.
    ``swaps``: preparations swapped in; ``last_swap_us``: the frame thread's time for the last swap (the
    worker's time for the last preparation is the builder's ``last_build_ms``).
    """

    def __init__(self, rt, builder):
        self.rt = rt
        self.builder = builder
        self.worker = Worker(rt.device)
        self.job: Future | None = None
        self.again = False  # a structural change arrived during the preparation: the next one takes it
        self._blocks: set = set()  # what the preparation in flight was asked for (its AppliedUpdate)
        self._events = 0
        self._next_blocks: set = set()
        self._next_events = 0
        self._t0 = 0
        self._log = _Log()
        self._retire_errors: list[BaseException] = []
        self.swaps = 0
        self.last_swap_us: float | None = None

    # -- the frame thread ----------------------------------------------------------------------------
    def request(self, up: UpdatePlan) -> None:
        """A drained plan with structural changes: prepare a new graph now, or fold them into the next
        preparation when one is in flight."""
        if self.job is not None:
            self.again = True
            self._next_blocks |= up.blocks()
            self._next_events += up.events
            return
        self._start(set(up.blocks()), up.events)

    def _start(self, blocks: set, events: int) -> None:
        self._blocks, self._events, self._t0 = blocks, events, _now()
        self._log = _Log()
        self.job = self.worker.submit(self._prepare)
        self.rt.preparing = True

    def log(self, up: UpdatePlan) -> None:
        """Lower tiers applied to the running graph during the preparation: the new graph gets them too."""
        self._log.add(up)

    @property
    def ready(self) -> bool:
        """True when the preparation in flight is done (built, or failed) and can be swapped in."""
        job = self.job
        return job is not None and job.done()

    def swap(self, updater, raise_errors: bool = False) -> tuple[Tier, ...]:
        """Swap the finished preparation in (or report its failure: the last good graph keeps running), apply
        what was logged meanwhile to the new graph, and start the next preparation if a change folded in.
        Returns the tiers applied."""
        job, self.job = self.job, None
        assert job is not None and job.done(), "swap() before the preparation finished"
        t0 = _now()
        builder, rt = self.builder, self.rt
        log, self._log = self._log, _Log()
        blocks, events, started = self._blocks, self._events, self._t0
        tiers: tuple[Tier, ...] = ()
        try:
            self._report_retire_errors()
            try:
                prepared = job.result()
            except Exception as e:
                builder.report_failure(e, raise_errors)  # the log already reached the running graph
            else:
                with _nvtx.range("swap"):
                    installed = prepared is not None and builder.install(prepared, later=self._later)
                if installed:
                    assert prepared is not None
                    follow_shapes(rt)
                    tiers = (Tier.PARAMETERS,) if prepared.in_place else (Tier.STRUCTURE,)
                    self.swaps += 1
                    updater.replay(log.plan())
                elif builder.build(raise_errors):  # nothing left to build, or a resize that no longer fits
                    tiers = (Tier.PARAMETERS,) if builder.last_in_place else (Tier.STRUCTURE,)
        finally:
            if self.again:
                self.again = False
                self._start(self._next_blocks, self._next_events)
                self._next_blocks, self._next_events = set(), 0
            else:
                rt.preparing = False
            self.last_swap_us = (_now() - t0) / 1e3
        if updater.updates.observers:
            updater._notify(blocks, tiers, started, events)
        return tiers

    def settle(self, updater, raise_errors: bool = False) -> tuple[Tier, ...]:
        """Wait for the preparation in flight and swap it in; a change folded into the next one is built
        here, on this thread (``tick()`` called directly, ``engine.rebuild()``, reads). Returns the tiers."""
        if self.job is None:
            return ()
        wait_futures([self.job])
        again, self.again = self.again, False
        self._next_blocks, self._next_events = set(), 0
        tiers = self.swap(updater, raise_errors and not again)
        if again and self.builder.build(raise_errors):
            tiers += (Tier.PARAMETERS,) if self.builder.last_in_place else (Tier.STRUCTURE,)
        return tiers

    def close(self) -> None:
        """Wait for the preparation in flight and throw its graph away; end the worker after the old graphs
        it still had to free. Never raises."""
        job, self.job = self.job, None
        self.again = False
        if job is not None:
            try:
                prepared = job.result()
            except BaseException:
                prepared = None
            if prepared is not None:
                with contextlib.suppress(Exception):  # closing frees what it can
                    self.builder.discard(prepared)
        self.worker.close()
        self.rt.preparing = False

    # -- the worker ----------------------------------------------------------------------------------
    def _prepare(self):
        """On the worker: describe the pipeline as it is now and build it (None: no blocks are left)."""
        t0 = time.perf_counter()
        paused = gc.isenabled()  # see Builder.build: a large build's garbage would trigger collections
        if paused:
            gc.disable()
        try:
            desc = self.rt.snapshot()
            if not desc.blocks:
                return None
            with _nvtx.range("prepare structure"):  # (a range under Nsight; nothing otherwise)
                job = self.builder.prepare(desc, background=True)
            self.builder.last_build_ms = (time.perf_counter() - t0) * 1e3
            return job
        finally:
            if paused:
                gc.enable()
                # the young objects the preparation left would be collected by the next allocation, on
                # whichever thread makes it (the frame thread, during the swap): collect them here instead
                gc.collect(1)

    def _later(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the worker (the old graph's release); its error is reported at the next swap."""
        def done(f: Future) -> None:
            e = f.exception()
            if e is not None:
                self._retire_errors.append(e)

        self.worker.submit(fn).add_done_callback(done)

    def _report_retire_errors(self) -> None:
        errors, self._retire_errors = self._retire_errors, []
        for e in errors:
            self.rt.reporter.warn("engine", f"freeing the previous graph failed: {type(e).__name__}: {e}")


class _Log:
    """The lower tiers applied to the running graph during a preparation, latest value per key."""

    def __init__(self) -> None:
        self.code: dict = {}
        self.params: dict = {}
        self.rebinds: dict = {}
        self.launches: dict = {}

    def add(self, up: UpdatePlan) -> None:
        self.code.update(up.code)
        self.params.update(up.params)
        self.rebinds.update(up.rebinds)
        self.launches.update(up.launches)

    def plan(self) -> UpdatePlan:
        return UpdatePlan(code=self.code, params=self.params, rebinds=self.rebinds, launches=self.launches)
