"""A distributed engine's faults: a worker whose step failed or whose process died, its restart by Ray and the
rebuild of its fragment, and the diagnostics that say so. A part of :class:`~rxcuda.distributed.Engine` (its base
class), kept apart to keep each module small."""

from __future__ import annotations

import time
from typing import Any

from ..engine._engine import Diagnostic
from . import _placement
from ._ray import names_actor as _names

_WHERE = ("node", "pid", "gpus", "gpu", "mps", "build_s", "build_phases")  # what a rebuilt worker's answer keeps
RESTART_PATIENCE_S = 120.0  # how long a dead worker may take to be restarted and rebuilt before it is given up


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

    def _publish(self, worker: str, d: Diagnostic) -> None:
        raise NotImplementedError

    def _requeue(self, w: str, params: dict, writes: dict) -> None:
        raise NotImplementedError

    def _split_now(self) -> _placement.Split:
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
        self._down[w] = time.perf_counter()
        restarts = self._workers[w].max_restarts
        self._publish(w, Diagnostic("error", w, f"worker '{w}' died ({type(err).__name__}); Ray restarts it (at most "
                                    f"{restarts} restarts) and it rebuilds its fragment from the description with "
                                    "the last parameter values; the other workers keep running", self._index))
        self._rebuild(w)

    def _rebuild(self, w: str) -> None:
        """Ask a restarting worker to build its fragment as the description holds it now (its last parameter
        values, the last arrays written to its inputs); Ray queues the call until the actor is back."""
        frag = self._split_now().fragments[w]
        writes_w = {r: a for r, a in self._writes.items() if self._placement.get(r.block) == w}
        self._rebuilding[w] = (self._actors[w].build.remote(frag, writes_w, self._index + 1),
                               _placement.structure(frag))

    def _check_restarts(self) -> None:
        ray = self._ray
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
                if time.perf_counter() - since < RESTART_PATIENCE_S:
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
            self._dirty = True  # what changed while it was down (a block removed) is shipped first
            self._where[w] = {k: where[k] for k in _WHERE if k in where}
            self._publish(w, Diagnostic("info", w, f"worker '{w}' is back after {time.perf_counter() - since:.1f} s "
                                        f"(process {where['pid']}): its fragment was rebuilt with the last "
                                        "parameter values", self._index))

