"""A distributed engine's faults: a worker whose step failed or whose process died, its restart and the rebuild of
its fragment, and the diagnostics that say so. A part of :class:`~rxcuda.distributed.Engine` (its base class), kept
apart to keep each module small.

A dead worker comes back in one of two ways. Where a **standby** is ready (an actor started beforehand on the
driver's host, with rxcuda imported and its engine made on the dead worker's GPU: ``prewarm``), it takes the
worker over at once: the dead actor is ended for good and the standby builds the fragment, then a new standby is
started. Otherwise Ray restarts the actor in a new process, which then builds the fragment. Measured on a 2-core
machine without a GPU (null driver), Ray's restart of an actor took 1.4-3.2 s of the 2-4.4 s from a death to the
next frame; its build 0.14-0.6 s; finding the death ~15 ms; the rest a few ms (bench/distributed.py prints the
phases per kind of death)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ..engine._engine import Diagnostic
from . import _placement
from ._placement import Split
from ._ray import names_actor as _names
from ._worker import FragmentHost

_WHERE = ("node", "pid", "gpus", "gpu", "mps", "build_s", "build_phases")  # what a rebuilt worker's answer keeps
RESTART_PATIENCE_S = 120.0  # how long a dead worker may take to be restarted and rebuilt before it is given up


class WorkerDownError(RuntimeError):
    """A call that needs a worker whose process died: it is restarting (or, its restarts spent, down for good).
    ``worker`` names it. Reading its ports works again once it is back (an info diagnostic says when)."""

    def __init__(self, message: str, worker: str):
        super().__init__(message)
        self.worker = worker


class Restarts:
    """What the distributed engine does when a worker fails a frame or dies (the engine's own state, declared
    here for the type checker)."""

    _actors: dict[str, Any]
    _ray: Any  # Ray, or _procs
    _workers: dict[str, _placement.Worker]
    _down: dict[str, float]
    _gone: set[str]
    _rebuilding: dict[str, tuple]
    _built: dict[str, tuple]
    _where: dict[str, dict]
    _writes: dict
    _placement: dict[int, str]
    _index: int
    _dirty: bool
    _recoveries: list[dict]
    _driver_node: str | None
    _session: str
    _worker_env: dict  # the variables every worker process gets (a private MPS daemon's)
    max_in_flight: int
    _use_standby: bool
    _standbys: dict[tuple, tuple[Any, Any]]  # (worker spec, GPU UUID) -> (the standby actor, its prewarm's ref)
    _deaths: dict[str, int]
    _lock: Any
    _pending_params: dict[str, dict[int, dict]]
    _pending_writes: dict[str, dict]
    _standby_seen: tuple | None
    _promoted: dict[str, str | None]  # worker -> the GPU of the standby that took it over

    def _publish(self, worker: str, d: Diagnostic) -> None:
        raise NotImplementedError

    def _host_class(self) -> Any:
        """FragmentHost as this engine's actor class, made once: Ray exports an actor class to the cluster the
        first time one of its actors starts (disassembling the class's code for an identifier: ~200 ms), so a class
        made again for each standby put that export on the path from a worker's death to its next frame."""
        cls = getattr(self, "_host_cls", None)
        if cls is None:
            cls = self._host_cls = self._ray.remote(FragmentHost)
        return cls

    def _init_restarts(self, standby: bool) -> None:
        self._recoveries = []  # each recovery's phases, wall-clock times (bench/distributed.py)
        self._use_standby = bool(standby)
        self._standbys = {}
        self._standby_seen = None
        self._deaths = {}
        self._promoted = {}

    def _requeue(self, w: str, params: dict, writes: dict) -> None:
        """A worker skipped a frame: what it was to get waits for its next one (newer values win)."""
        with self._lock:
            for bid, values in params.items():
                self._pending_params[w][bid] = {**values, **self._pending_params[w].get(bid, {})}
            self._pending_writes[w] = {**writes, **self._pending_writes[w]}

    def _split_now(self) -> Split:
        raise NotImplementedError

    def _step_failed(self, w: str, err: Exception, params: dict, writes: dict, died: bool | None = None) -> None:
        """``died``: whether the worker's process ended (None: as the Ray error says)."""
        ray = self._ray
        if died is None:
            died = isinstance(err, ray.exceptions.RayActorError) and _names(err, self._actors[w])
        self._requeue(w, params, writes)
        if not died:
            if isinstance(err, ray.exceptions.RayActorError):
                return  # a producer of this worker died in this frame: that one is reported
            self._publish(w, Diagnostic("error", w, f"worker '{w}' failed a frame: {err}", self._index))
            return
        if w in self._down or w in self._gone:
            return
        self._down[w] = time.time()
        self._deaths[w] = self._deaths.get(w, 0) + 1
        restarts = self._workers[w].max_restarts
        standby = self._take_standby(w) if self._deaths[w] <= restarts else None
        how = f"Ray restarts it (at most {restarts} restarts)"
        if standby is not None:
            with contextlib.suppress(Exception):
                ray.kill(self._actors[w], no_restart=True)
            self._actors[w], self._promoted[w] = standby
            how = "a standby process takes it over"
        self._publish(w, Diagnostic("error", w, f"worker '{w}' died ({type(err).__name__}: {err}); {how} and it "
                                    "rebuilds its fragment from the description with the last parameter values and "
                                    "inputs; the other workers keep running", self._index))
        self._rebuild(w)

    # -- standbys: actors started beforehand that take a dead worker over ------------------------------------------
    def _standby_key(self, w: str) -> tuple | None:
        """Which standby can take worker ``w`` over: one per worker spec and GPU, on the driver's host (where its
        ``ipc`` links and clock work); None where none can (another host, no restarts, its GPU not known yet)."""
        spec, where = self._workers[w], self._where.get(w, {})
        if not self._use_standby or spec.max_restarts == 0 or self._driver_node is None or \
                where.get("node") != self._driver_node:
            return None
        if spec.gpuless:
            return (spec, None)
        return (spec, where["gpu"]) if where.get("gpu") else None

    def _keep_standbys(self) -> None:
        """Start the standbys the workers have none of (a GPU worker's once it built: its GPU is known then)."""
        for w in self._workers:
            key = self._standby_key(w)
            if key is None or key in self._standbys:
                continue
            spec, gpu = key
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            # no CPU or GPU of Ray's asked: it waits idle, and takes over the GPU share of the worker it replaces
            actor = self._host_class().options(
                num_cpus=0, num_gpus=0, max_restarts=spec.max_restarts, max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(str(self._driver_node), soft=False),
            ).remote("standby", spec.null, self.max_in_flight + 1, self._session, env=self._worker_env, cpu=spec.cpu)
            self._standbys[key] = (actor, actor.prewarm.remote(gpu))

    def _take_standby(self, w: str) -> tuple[Any, str | None] | None:
        """The standby ready to take ``w`` over (it leaves the pool) and the GPU it made its engine on, or None."""
        ray = self._ray
        key = self._standby_key(w)
        got = self._standbys.get(key) if key is not None else None
        if key is None or got is None or not ray.wait([got[1]], timeout=0)[0]:
            return None
        del self._standbys[key]
        try:
            ray.get(got[1])
        except ray.exceptions.RayError as e:
            with contextlib.suppress(Exception):
                ray.kill(got[0], no_restart=True)
            self._publish(w, Diagnostic("warning", w, f"the standby that was to take worker '{w}' over could not "
                                        f"make its engine ({type(e).__name__}: {e}); Ray restarts the worker instead",
                                        self._index))
            return None
        return got[0], key[1]

    def _end_standbys(self) -> None:
        ray = self._ray
        for actor, _ref in self._standbys.values():
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self._standbys = {}

    def _rebuild(self, w: str) -> None:
        """Ask a restarting worker to build its fragment as the description holds it now (its last parameter
        values, the last arrays written to its inputs); Ray queues the call until the actor is back."""
        frag = self._split_now().fragments[w]
        writes_w = {r: a for r, a in self._writes.items() if self._placement.get(r.block) == w}
        actor = self._actors[w]
        if w in self._promoted:  # a standby's process (again after Ray restarted it): its GPU by UUID, its name
            actor.prewarm.remote(self._promoted[w])
            actor.adopt.remote(w)
        self._rebuilding[w] = (actor.build.remote(frag, writes_w, self._index + 1), _placement.structure(frag))

    def _check_restarts(self) -> None:
        ray = self._ray
        seen = (len(self._built), len(self._standbys))  # what can change which standbys are needed
        if self._use_standby and not self._down and seen != self._standby_seen:
            self._standby_seen = seen
            self._keep_standbys()
        for w, (ref, key) in list(self._rebuilding.items()):
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue
            del self._rebuilding[w]
            since = self._down[w]
            try:
                where = ray.get(ref)
            except ray.exceptions.ActorUnavailableError:
                # the call reached the actor while Ray was still restarting it: ask again, for a while
                if time.time() - since < RESTART_PATIENCE_S:
                    self._rebuild(w)
                    continue
                self._down.pop(w)
                self._gone.add(w)
                self._publish(w, Diagnostic("error", w, f"worker '{w}' was not back within {RESTART_PATIENCE_S:g} s; "
                                            "its blocks stay down until the engine is made again", self._index))
                continue
            except ray.exceptions.RayError as e:
                self._down.pop(w)
                self._gone.add(w)
                self._publish(w, Diagnostic("error", w, f"worker '{w}' could not be restarted ({e}); its blocks "
                                            "stay down until the engine is made again", self._index))
                continue
            self._down.pop(w)
            self._built[w] = key
            self._dirty = True  # a structure changed while it was down reaches it with the next frame
            self._where[w] = {k: where[k] for k in _WHERE if k in where}
            back = time.time()
            started = max(where.get("started", since), since)  # a standby started before the death
            built = where.get("built", back)
            self._recoveries.append({"worker": w, "found": since, "started": started, "built": built, "back": back})
            self._publish(w, Diagnostic("info", w, f"worker '{w}' is back after {back - since:.2f} s (process "
                                        f"{where['pid']}, up {started - since:.2f} s after its death was found): its "
                                        f"fragment was rebuilt with the last parameter values and inputs in "
                                        f"{built - started:.2f} s", self._index))

    def _down_error(self, w: str) -> WorkerDownError:
        if w in self._gone:
            return WorkerDownError(f"worker '{w}' died and was not restarted; its blocks stay down until the engine "
                                   "is made again", w)
        return WorkerDownError(f"worker '{w}' is restarting (its process died {time.time() - self._down[w]:.2f} s "
                               "ago); its ports can be read again once it is back (an info diagnostic says so)", w)

    def _ask(self, w: str, method: str, *args):
        """Worker ``w``'s ``method(*args)``, waited for. A worker that is down, or found dead by this call, raises
        :class:`WorkerDownError` (and is restarted); an error the method raised is raised as itself; any other
        failure of Ray's is a RuntimeError naming the worker: never Ray's own exception."""
        ray = self._ray
        self._check_restarts()
        if w in self._down or w in self._gone:
            raise self._down_error(w)
        actor = self._actors[w]
        try:
            return ray.get(getattr(actor, method).remote(*args))
        except ray.exceptions.RayTaskError as e:
            raise e.as_instanceof_cause() from None
        except ray.exceptions.RayError as e:
            if isinstance(e, ray.exceptions.RayActorError) and _names(e, actor):
                self._step_failed(w, e, {}, {}, died=True)
                raise self._down_error(w) from None
            raise RuntimeError(f"worker '{w}': {method} failed ({type(e).__name__}: {e})") from None

