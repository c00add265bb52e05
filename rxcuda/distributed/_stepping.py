"""How a distributed engine steps its workers each frame: a Ray call per worker (``ray``: across hosts, or
asked for), or, when every worker runs on the driver's host, their clocks (``clock``: ``_clock``'s pipes, no Ray
call per frame). A part of :class:`~rxcuda.distributed.Engine` (its base class), kept apart to keep each module
small.

A frame's steps start all at once, except in turns (``share_gpu="turns"``): workers that share a device
(``_sharing.turn_groups``) are stepped one after another in the links' order, each once the one before answered,
while the groups on other devices and the workers alone on theirs go on at once. A worker answers once its frame
ran on the GPU (its tick waits for it) and, in turns, once its ``ipc`` exports' copies ran (the consumer's wait on
the GPU for the producer's event is then satisfied already): so only one context at a time has work on a shared
GPU. The driver waits for a group's last worker too before the next frame, so that frame's first worker does not
overlap it."""

from __future__ import annotations

import contextlib
import os
import pickle
from typing import Any

from ..engine._engine import Diagnostic
from . import _clock, _placement, _sharing
from ._board import _alive
from ._worker import StepReport

STEPPINGS = ("auto", "ray")
SILENCE_S = 60.0  # a live worker silent this long on a frame is a warning (then waited for on)
START_TIMEOUT_S = 60.0  # how long a worker may take to start its clock
DEAD_CHECK_S = 0.02  # while waiting for Ray steps, the driver checks its host's workers' processes this often


def check_options(max_in_flight, start_timeout, stepping, _share_gpu) -> None:
    """The distributed engine's options checked before anything starts (``share_gpu`` by ``_mps``)."""
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"'max_in_flight' must be a positive int (got {max_in_flight!r})")
    if isinstance(start_timeout, bool) or not isinstance(start_timeout, int | float) or start_timeout <= 0:
        raise ValueError(f"'start_timeout' must be a positive number of seconds (got {start_timeout!r})")
    if stepping not in STEPPINGS:
        raise ValueError(f"'stepping' must be one of {', '.join(STEPPINGS)} (got {stepping!r})")


class WorkerGone(RuntimeError):
    """A worker's process ended while the driver waited for its frame (its clock's pipe hung up, or its process
    on this host is gone)."""


SKIPPED = object()  # a step not waited for: its producer's process ended in this frame (its Ray call will fail)
_EMPTY: dict = {}  # no parameters or writes for a worker this frame (never changed)


class ClockSteps:
    """The clock side of the distributed engine (its state, declared here for the type checker)."""

    _actors: dict[str, Any]
    _ray: Any  # Ray, or _procs
    _where: dict[str, dict]
    _workers: dict[str, _placement.Worker]
    _session: str
    _stepping: str
    _driver_node: str | None
    _clocks: dict[str, _clock.Clock]
    _silent: set
    _index: int
    _split: _placement.Split | None
    _plan: tuple | None
    _down: dict[str, float]
    _gone: set[str]
    _share: Any  # _mps.Share
    _turns: tuple[tuple[str, ...], ...] = ()  # the workers stepped in turns, a group per shared device (the plan's)
    _answered: dict[int, dict]  # frame -> the clock answers read while stepping it in turns (worker -> report)

    def _publish(self, worker: str, d: Diagnostic) -> None:
        raise NotImplementedError

    def _step_failed(self, w: str, err: Exception, params: dict, writes: dict, died: bool | None = None) -> None:
        raise NotImplementedError  # Restarts's, before this class in the engine's bases

    def _clock_applies(self, split: _placement.Split) -> bool:
        """Whether frames step through clocks: stepping "auto", every worker on the driver's host, and no link
        through Ray's object store (its producer's result is handed to its consumer's Ray step)."""
        if self._stepping != "auto" or self._driver_node is None or not hasattr(os, "mkfifo"):
            return False
        if any(ln.via == "store" for ln in split.links):
            return False
        return all(self._where.get(w, {}).get("node") == self._driver_node for w in self._workers)

    def _steppings(self, split: _placement.Split | None) -> dict[str, str]:
        mode = "clock" if split is not None and self._clock_applies(split) else "ray"
        return {w: mode for w in self._workers}

    def _frame_plan(self) -> tuple[tuple, tuple[str, ...]]:
        """``_placement.frame_plan`` with each step's Ray method, made again only when the fragments or the
        workers down change: ((worker, method, producers, two results), ...), and the workers not stepped; with it
        the workers that take turns (:attr:`_turns`, from where each built)."""
        split = self._split
        assert split is not None
        down = frozenset(self._down) | frozenset(self._gone)
        if self._plan is None or self._plan[0] is not split or self._plan[1] != down:
            steps, skipped = _placement.frame_plan(split, down)
            clocked = self._clock_applies(split)
            if clocked:  # a step's method None: through the worker's clock
                self._clock_ready([w for w, *_ in steps])
            else:
                self._clocks_close()
            made = tuple((w, None if clocked else self._actors[w].step.options(num_returns=2) if pair
                          else self._actors[w].step, producers, pair) for w, producers, pair in steps)
            self._turns = _sharing.turn_groups(self._where, self._workers, [w for w, *_ in steps]) \
                if self._share.mode == "turns" else ()
            self._plan = (split, down, (made, skipped))
        return self._plan[2]

    def _step_frame(self, index: int, steps: tuple, params: dict, writes: dict, observed: dict
                    ) -> tuple[dict[str, object], dict[str, object]]:
        """Step frame ``index``'s workers (``steps``: :meth:`_frame_plan`'s, producers first): each through its
        clock or by a Ray call, all at once, but for the workers in turns (:attr:`_turns`): the first of each group
        starts with the others, each next one once the one before answered (:meth:`_take_turns`). A step that takes
        a producer's Ray result starts once that producer's step is made. Returns (each producer's result for its
        consumers over Ray, each worker's report: its ObjectRef, or None through its clock)."""
        outs: dict[str, object] = {}
        reports: dict[str, object] = {}
        todo = list(steps)
        due = {w for w, *_ in steps} - {w for g in self._turns for w in g[1:]}  # may start now

        def step_due() -> None:
            for s in list(todo):
                w, method, producers, pair = s
                if w not in due or any(p not in reports for p in producers):
                    continue
                todo.remove(s)
                if method is None:
                    self._clock_step(w, index, params.get(w, _EMPTY), writes.get(w, _EMPTY), observed[w])
                    reports[w] = None
                    continue
                got = method.remote(index, params.get(w, _EMPTY), writes.get(w, _EMPTY), observed[w],
                                    *(outs[p] for p in producers))
                if pair:  # (what its host exports carry, report): consumers over host links take the first
                    outs[w], reports[w] = got
                else:  # one object, (out, report): fewer objects for Ray to track
                    reports[w] = got

        step_due()
        if self._turns:
            self._take_turns(index, steps, reports, due, step_due)
        return outs, reports

    def _take_turns(self, index: int, steps: tuple, reports: dict, due: set, step_due) -> None:
        """Wait for the workers in turns, each next one of a group stepped (``due``, then ``step_due()``) as soon
        as the one before answered, until every group's last one answered. A clock's answer is kept for the frame's
        gather (:attr:`_answered`); a Ray step's result stays with Ray. A worker whose process ended, or that is
        gone, counts as answered: the next one's frame goes on (its ``ipc`` input keeps its last value)."""
        ray = self._ray
        after = {g[k]: g[k + 1] for g in self._turns for k in range(len(g) - 1)}
        waits = {w for g in self._turns for w in g} & {w for w, *_ in steps}
        answered = self._answered.setdefault(index, {})
        while waits & set(reports):
            running = [w for w in reports if w in waits]
            if reports[running[0]] is None:  # clocks (every worker of a frame is stepped alike)
                clocks = {w: self._clocks[w] for w in running if w in self._clocks}
                got = _clock.wait(clocks, index, lambda w, seconds: self._on_silence(w, index, seconds), first=True)
                done = [w for w in running if w in got or w not in clocks]
                for w in done:
                    answered[w] = self._clock_answer(w, index, got.get(w, "dead"), clocks.get(w))
            else:
                refs = {reports[w]: w for w in running}
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=DEAD_CHECK_S)
                done = [refs[r] for r in ready] + [w for w in running if self._driver_node is not None and
                                                   self._where.get(w, {}).get("node") == self._driver_node and
                                                   "pid" in self._where[w] and not _alive(self._where[w]["pid"])]
            for w in done:
                waits.discard(w)
                if w in after:
                    due.add(after[w])
            step_due()

    def _clock_ready(self, workers) -> None:
        """A clock for each of ``workers`` (made again for a restarted one: a new process, new pipes)."""
        ray = self._ray
        for w in workers:
            pid = self._where[w]["pid"]
            c = self._clocks.get(w)
            if c is not None and c.pid == pid:
                continue
            self._clock_drop(w)
            c = _clock.Clock(self._session, w, pid)
            try:
                ray.get(self._actors[w].start_clock.remote(c.go_path, c.done_path, c.generation),
                        timeout=START_TIMEOUT_S)
            except ray.exceptions.RayError as e:
                c.close()
                self._step_failed(w, e, {}, {})
                continue
            self._clocks[w] = c

    def _clock_drop(self, w: str) -> None:
        c = self._clocks.pop(w, None)
        if c is not None:
            c.close()

    def _clocks_close(self) -> None:
        for w in list(self._clocks):
            self._clock_drop(w)

    def _clock_step(self, w: str, index: int, params: dict, writes: dict, observed: dict) -> None:
        """Step ``w`` through its clock: what changed since the last frame goes with the request in the go pipe
        (or, past ``_clock.INLINE_MAX`` bytes, by a Ray call not waited for, before it)."""
        c = self._clocks.get(w)
        if c is None:
            return  # gone: its answer is "dead"
        c.step(index, self._clock_message(w, c, params, writes, observed))

    def _clock_message(self, w: str, c: _clock.Clock, params: dict, writes: dict, observed: dict) -> bytes:
        """What changed since the last frame, as the control message that goes with the next request (pickled;
        b"" where nothing did, or where it is large and went ahead by a Ray call not waited for)."""
        if not (params or writes or observed is not c.observed):
            return b""
        c.seq += 1
        message = (params, writes, None if observed is c.observed else observed)
        inline = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        if len(inline) > _clock.INLINE_MAX:  # large writes: by a call the driver does not wait for
            self._actors[w].post.remote(c.generation, c.seq, *message)
            inline = b""
        c.observed = observed
        return inline

    def _on_silence(self, w: str, index: int, seconds: float) -> None:
        """Worker ``w``, alive, has not answered frame ``index`` for ``seconds`` (called each ``_clock.CHECK_S``)."""
        if seconds >= SILENCE_S and (w, index) not in self._silent:
            self._silent.add((w, index))
            c = self._clocks.get(w)
            self._publish(w, Diagnostic("warning", w, f"worker '{w}' (process {c.pid if c else '?'}) is alive and has "
                                        f"not finished frame {index} for {seconds:.0f} s; still waiting", index))

    def _gather(self, index: int, steps: tuple, reports: dict) -> dict[str, Any]:
        """Frame ``index``'s results: its Ray steps' (:meth:`_ray_wait`, ``reports`` worker -> ObjectRef) and its
        clocked steps' (:meth:`_clock_wait`, ``reports`` worker -> None), waited for together."""
        refs = {w: ref for w, ref in reports.items() if ref is not None}
        got = self._ray_wait(refs, steps) if refs else {}
        early = self._answered.pop(index, {})  # clocks answered while stepping in turns
        got.update(early)
        if len(refs) + len(early) < len(reports):
            got.update(self._clock_wait(index, [w for w in reports if w not in refs and w not in early]))
        return got

    def _ray_wait(self, refs: dict[str, Any], steps: tuple) -> dict[str, Any]:
        """The results of the Ray steps ``refs`` (worker -> ObjectRef) that succeeded; a worker on this host whose
        process ended while waited for gives a :class:`WorkerGone` at once (Ray takes a second or two to say so),
        and the steps fed by it over ``host`` links :data:`SKIPPED`. A step that failed is left out (its
        ``ray.get`` raises)."""
        ray = self._ray
        left = {ref: w for w, ref in refs.items()}
        got: dict[str, Any] = {}
        local = {w for w in refs if self._driver_node is not None
                 and self._where.get(w, {}).get("node") == self._driver_node and "pid" in self._where.get(w, {})}
        while left:
            ready, _ = ray.wait(list(left), num_returns=len(left), timeout=DEAD_CHECK_S)
            for ref in ready:
                w = left.pop(ref)
                with contextlib.suppress(ray.exceptions.RayError):
                    got[w] = ray.get(ref)
            dead = {w for w in left.values() if w in local and not _alive(self._where[w]["pid"])}
            if not dead:
                continue
            fed = set(dead)
            for w, _method, producers, _pair in steps:  # producers first: what they feed, and so on
                if fed & set(producers):
                    fed.add(w)
            for ref, w in list(left.items()):
                if w in fed:
                    got[w] = WorkerGone(f"process {self._where[w]['pid']} ended") if w in dead else SKIPPED
                    del left[ref]
        return got

    def _clock_wait(self, index: int, workers: list[str]) -> dict[str, StepReport | tuple[Exception, bool | None]]:
        """Each worker's report of frame ``index`` from its clock, or (the error, whether the worker died)."""
        clocks = {w: self._clocks[w] for w in workers if w in self._clocks}
        answers = _clock.wait(clocks, index, lambda w, seconds: self._on_silence(w, index, seconds))
        return {w: self._clock_answer(w, index, answers.get(w, "dead"), clocks.get(w)) for w in workers}

    def _clock_answer(self, w: str, index: int, a, clock) -> StepReport | tuple[Exception, bool | None]:
        """What worker ``w``'s clock answered for frame ``index`` (``_clock.wait``'s answer) as its report, or
        (the error, whether the worker died)."""
        ray = self._ray
        if isinstance(a, str):
            pid = clock.pid if clock is not None else self._where[w]["pid"]
            self._clock_drop(w)
            return WorkerGone(f"process {pid} ended"), True
        status, flags, frame = a
        seen, diags, err = {}, (), None
        if flags & _clock.MORE:
            try:
                more = ray.get(self._actors[w].collect.remote(index))
            except ray.exceptions.RayError as e:
                return e, None
            if more is not None:
                full, seen, diags, err = more
                frame = full or frame
        if status == "failed":
            return RuntimeError(err or "its step failed"), False
        return StepReport(w, index, frame, seen, diags, clock.pid)
