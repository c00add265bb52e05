"""How a distributed engine steps its workers each frame: a Ray call per worker (``ray``: across hosts, or
asked for), or, when every worker runs on the driver's host, their clocks (``clock``: ``_clock``'s pipes, no Ray
call per frame). A part of :class:`~rxcuda.distributed.Engine` (its base class), kept apart to keep each module
small."""

from __future__ import annotations

import contextlib
import os
import pickle
from typing import Any

from ..engine._engine import Diagnostic
from . import _clock, _placement
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
        if len(refs) < len(reports):
            got.update(self._clock_wait(index, [w for w in reports if w not in refs]))
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
