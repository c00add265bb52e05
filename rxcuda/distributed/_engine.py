"""The distributed engine: one pipeline, its blocks placed on workers (Ray actors, one Engine each).

The driver keeps the pipeline in a model engine on the null driver (never launched): it validates every
connection and write as a local engine would, and ``describe()`` gives the pipeline as data. Before a frame,
a changed structure is cut into fragments (``_placement.split``) and shipped: each worker builds its own.
Parameter changes are folded per worker (the latest value wins) and travel with the next frame's step.

A frame is one step per worker, all started at once (but for workers that share a device in turns,
``share_gpu="turns"``: one after another, see ``_stepping``): through each worker's clock (``_clock``: named
pipes, no Ray call per frame) when every worker runs on the driver's host, else a Ray call each. Over a link
whose ends meet on a board (``ipc``; ``host`` on one host: ``_board``, ``_hostlink``) the consumer's step waits for
the producer's frame there; over a ``host`` link across hosts the producer's step returns a Ray object reference.
The driver never waits inside a frame (but in turns). At most ``max_in_flight`` frames are outstanding (the
driver waits for the oldest first: nothing queues without bound, and a board's slot, one of ``max_in_flight + 1``,
is never written while read).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from reactivex import Observable
from reactivex.disposable import Disposable
from reactivex.subject import Subject

from ..blocks._blocks import Block, Parameter, PortHandle
from ..cuda import NullDriver
from ..engine._engine import Diagnostic
from ..engine._engine import Engine as LocalEngine
from ..model._describe import PortRef
from ..model._errors import EngineClosedError, ValidationError
from ..model._events import ParameterChanged
from ..plan._plan import plan
from ..streams._broadcast import Broadcast
from ..streams._scheduler import FrameLoop
from . import _board, _mps, _placement, _procs, _sharing
from ._faults import Restarts
from ._ray import backend_module, cluster_address, direct_transports
from ._records import DistributedDescription, DistributedFrame, FragmentDiagnostic, FragmentFrame
from ._stepping import SKIPPED, ClockSteps, WorkerGone, check_options
from ._worker import _zeros


class Engine(Restarts, ClockSteps):
    """A pipeline whose blocks run on several workers: Ray actors holding one rxcuda Engine each, on a GPU (or a
    share of one) or on the null driver. Its verbs are a local engine's: ``add`` (with ``on=``, the worker),
    ``connect``, ``set``/``bind``, ``write``/``read``, ``feed``/``observe``, ``tick``/``run``, ``close``.

    >>> import numpy as np, rxcuda
    >>> from rxcuda.distributed import Engine, Worker
    >>> with Engine({"a": Worker(null=True), "b": Worker(null=True)}) as dist:          # doctest: +SKIP
    ...     first = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, name="first"), on="a")
    ...     second = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, name="second"), on="b")
    ...     dist.connect(first["out"], second["x"])          # carried every frame, a -> b
    ...     dist.write(first["x"], np.ones(1024, np.float32))
    ...     first.params["scale"].value = 2.0                # reaches worker a with the next frame
    ...     frame = dist.tick()
    ...     dist.describe().transports()
    {'first.out -> second.x': 'host'}

    ``workers``: a count (that many one-GPU workers ``w0``, ``w1``, ...), names, or a mapping name ->
    :class:`Worker` (its GPU share, CPUs, Ray node, restarts, or ``null=True``). ``address``: the Ray cluster to
    join when Ray is not initialised yet (None: ``RAY_ADDRESS`` or a new local cluster; a cluster this engine
    started is shut down by ``close()``). ``max_in_flight``: frames submitted and not yet finished.
    ``start_timeout``: seconds to wait for Ray to place every worker (a worker asking for more than the cluster
    has would wait forever). ``stepping``: ``"auto"`` steps the frames of workers all on the driver's host through
    their clocks (named pipes, no Ray call per frame) and otherwise by a Ray call per worker and frame; ``"ray"``
    always by Ray calls. ``standby``: keep a standby actor on the driver's host (one per worker spec and GPU, its
    engine made beforehand) that takes a dead worker over at once, instead of waiting for Ray to restart it.
    ``backend``: ``"ray"``, or ``"process"`` (workers are child processes of this one with standbys of their own,
    on this host and without Ray: what :class:`IsolatedEngine` runs on). ``share_gpu``: ``"off"`` (the default: a GPU
    fault in one worker ends only its context); ``"auto"``: a private MPS daemon where two or more workers share a GPU
    of this host, their frames at once instead of taking turns, a fault in one ending all (``_mps``); ``"mps"``;
    ``"turns"``: workers sharing a device stepped one after another, producers first, each fault its own (no MPS;
    ``_stepping``).
    """

    def __init__(self, workers=2, *, address: str | None = None, max_in_flight: int = 2,
                 start_timeout: float = 120.0, stepping: str = "auto", standby: bool = True, backend: str = "ray",
                 share_gpu: str = "off"):
        check_options(max_in_flight, start_timeout, stepping, _mps.check_share_gpu(share_gpu))
        self._start_timeout = float(start_timeout)
        self._stepping = stepping
        self._workers = _placement.check_workers(workers)
        ray = self._ray = backend_module(backend)
        self._backend = backend
        self._share = _mps.Share(share_gpu, _sharing.candidates(self._workers, backend), placed_first=backend == "ray")
        self._worker_env = self._share.env  # every worker process's: the daemon's variables, behind this engine's gate
        self._owns_ray = False
        if not ray.is_initialized():
            ray.init(address=cluster_address(address), include_dashboard=False)
            self._owns_ray = True
        self.max_in_flight = max_in_flight
        self._lock = threading.RLock()  # the model and what waits for the next frame (any thread)
        self._frame_lock = threading.RLock()  # submitting and finishing frames, shipping the structure
        self._model = LocalEngine(driver=NullDriver())  # the pipeline as the driver holds it; never launched
        self._placement: dict[int, str] = {}
        self._transports: dict[tuple, str] = {}
        self._writes: dict[PortRef, np.ndarray] = {}  # the last array written to each input (replayed on rebuild)
        self._pending_writes: dict[str, dict[PortRef, np.ndarray]] = {w: {} for w in self._workers}
        self._pending_params: dict[str, dict[int, dict]] = {w: {} for w in self._workers}
        self._observed: dict[str, dict[PortRef, int]] = {w: {} for w in self._workers}
        self._taps: dict[PortRef, Subject] = {}
        self._built: dict[str, tuple] = {}  # worker -> the structure its fragment was built from
        self._split: _placement.Split | None = None
        self._plan: tuple | None = None  # (split, workers down) -> how a frame steps each worker (_frame_plan)
        self._dirty = True
        self._inflight: deque = deque()
        self._index = 0
        self._down: dict[str, float] = {}  # worker -> when it was found dead (restarting)
        self._rebuilding: dict[str, tuple] = {}  # worker -> (the ObjectRef of its rebuild, the structure built)
        self._gone: set[str] = set()  # restarts exhausted
        self._init_restarts(standby and backend == "ray")  # child processes keep standbys of their own (_procs)
        self._frames = Broadcast(on_error=self._subscriber_failed)
        self._diagnostics = Broadcast(on_error=lambda e, item: None)
        self._loop: FrameLoop | None = None
        self._stop_run: Callable[[], None] | None = None
        self._closed = False
        self._subs = [self._model.changes.subscribe(self._on_change),
                      self._model.diagnostics.subscribe(lambda d: self._publish("driver", d))]
        self._actors: dict[str, Any] = {}
        self._where: dict[str, dict] = {}
        self._warned: set[tuple] = set()  # the GPUs shared without MPS already warned of
        self._session = uuid.uuid4().hex[:12]  # names the boards of this engine's ipc links and its clocks
        self._clocks: dict = {}  # worker -> its clock, when frames step through clocks
        self._answered: dict = {}  # frame -> clock answers read while stepping in turns (_stepping)
        self._silent: set = set()
        self._driver_node = ray.get_runtime_context().get_node_id()
        try:
            self._start_actors(ray)
            self._share.decide(_sharing.on_one_gpu(self._where, self._workers, self._driver_node))  # before a build
        except BaseException:
            self.close()
            raise

    def _actor_options(self, name: str, w: _placement.Worker) -> dict:
        """The options worker ``name``'s actor is started with (Ray's, or a child process's: see _procs)."""
        return {**w.ray_options(), "name": None} if self._backend == "ray" else _procs.options(name, w.ray_options())

    def _start_actors(self, ray) -> None:
        remote = self._host_class()
        for name, w in self._workers.items():
            opts = self._actor_options(name, w)
            node = opts.pop("node_id", None)
            if node is not None:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
            self._actors[name] = remote.options(**opts).remote(name, w.null, self.max_in_flight + 1, self._session,
                                                                        env=self._worker_env, cpu=w.cpu)
        refs = {a.where.remote(): name for name, a in self._actors.items()}
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self._start_timeout)
        if pending:
            names = [refs[r] for r in pending]
            asked = "; ".join(f"{n}: {self._workers[n]}" for n in names)
            raise RuntimeError(f"Ray placed no actor for worker(s) {', '.join(names)} within {self._start_timeout:g} "
                               f"s: no node has what they ask for ({asked}); the cluster has "
                               f"{ray.available_resources()} free. Ask for less, or add nodes")
        self._where = {refs[r]: where for r, where in zip(ready, ray.get(ready), strict=True)}

    # -- the pipeline --------------------------------------------------------------------------------------
    @property
    def workers(self) -> Mapping[str, _placement.Worker]:
        return dict(self._workers)

    def actor(self, worker: str):
        """The Ray actor of ``worker`` (its handle; ``ray.kill(dist.actor("b"), no_restart=False)`` is a fault
        drill)."""
        return self._actors[_placement.check_worker(worker, self._workers)]

    def where(self, worker: str) -> dict:
        """Where ``worker`` runs: its Ray node id, process id and GPU ids; once built, its GPU's UUID (``gpu``)
        and whether MPS serves that GPU (``mps``); what ``share_gpu`` came to (``share_gpu``: mps, theirs, turns,
        off); the workers it takes turns with on its device, itself included, in the order stepped (``turns``:
        ``share_gpu="turns"``, as the latest frame stepped them; () before the first frame, or where it takes none)."""
        w = _placement.check_worker(worker, self._workers)
        return {**self._where[w], "share_gpu": self._share.mode, "turns": next((g for g in self._turns if w in g), ())}

    def add(self, block: Block, *, on: str | None = None) -> Block:
        """Place ``block`` on worker ``on`` (may be left out when there is one worker); returns the block. Its
        parameters stay settable here (``block.params["k"].value = 2``): the value reaches the worker with the
        next frame."""
        self._check_open()
        if not isinstance(block, Block) or type(block) is not Block:
            raise TypeError(f"a distributed engine places plain blocks (got {type(block).__name__}); composites "
                            "and regions run inside one engine: add them to a local rxcuda.Engine")
        if on is None:
            if len(self._workers) > 1:
                raise ValueError(f"say which worker holds {block.name}: add(block, on=...) (workers: {', '.join(self._workers)})")  # noqa: E501
            on = next(iter(self._workers))
        on = _placement.check_worker(on, self._workers)
        with self._lock:
            self._model.add(block)
            self._placement[block.id] = on
            self._dirty = True
        return block

    def remove(self, block: Block) -> None:
        """Take a block (with its connections) out of the pipeline; its worker rebuilds before the next frame."""
        with self._lock:
            self._model.remove(block)
            self._forget({block.id})

    def _forget(self, ids: set[int]) -> None:
        """Drop what this side keeps for the (removed) blocks ``ids``: placement, values not shipped, writes, taps."""
        for bid in ids:
            if (w := self._placement.pop(bid, None)) is not None:
                self._pending_params[w].pop(bid, None)
        for written in (self._writes, *self._pending_writes.values()):
            for ref in [r for r in written if r.block in ids]:
                del written[ref]
        for ow, seen in self._observed.items():  # replaced, never changed: a frame may be sending the old one
            self._observed[ow] = {r: e for r, e in seen.items() if r.block not in ids}
        for ref in [r for r in self._taps if r.block in ids]:
            self._taps.pop(ref).on_completed()
        self._dirty = True

    def placement(self, block: Block) -> str:
        """The worker that holds ``block``."""
        try:
            return self._placement[block.id]
        except KeyError:
            raise ValidationError(f"{block.name} is not in this distributed engine; add(block, on=...) it first",
                                  subject=block.name) from None

    def connect(self, src: PortHandle, dst: PortHandle, *, transport: str = "auto", delay: int = 0,
                initial=None) -> None:
        """Connect an output to an input, on one worker or across two. Across workers the connection is carried
        every frame by ``transport``: ``"auto"`` (CUDA IPC between GPU workers of one host, else through Ray's
        object store), ``"ipc"`` or ``"host"``. A ValidationError says what does not fit; nothing changes."""
        self._check_open()
        ws, wd = self.placement(src.block), self.placement(dst.block)
        _placement.check_transport(transport, f"{src.block.name}.{src.name} -> {dst.block.name}.{dst.name}",
                                   dst.block.name)  # on one worker too: a misspelled transport is never kept
        if ws != wd:
            if delay:
                raise ValidationError(f"{src.block.name}.{src.name} -> {dst.block.name}.{dst.name}: a delayed "
                                      f"connection lives in one graph, and these blocks run on workers '{ws}' and "
                                      f"'{wd}'; place both on one worker", subject=dst.block.name)
            _, why = _placement._transport(transport, self._workers[ws], self._workers[wd],
                                           self._where[ws].get("node"), self._where[wd].get("node"))
            if why:
                raise ValidationError(f"{src.block.name}.{src.name} -> {dst.block.name}.{dst.name}: {why}",
                                      subject=dst.block.name)
        with self._lock:
            self._model.connect(src, dst, delay=delay, initial=initial)
            self._transports[(PortRef(src.block.id, src.name), PortRef(dst.block.id, dst.name))] = transport
            self._dirty = True

    def disconnect(self, src: PortHandle, dst: PortHandle) -> None:
        with self._lock:
            self._model.disconnect(src, dst)
            self._transports.pop((PortRef(src.block.id, src.name), PortRef(dst.block.id, dst.name)), None)
            self._dirty = True

    # -- parameters ----------------------------------------------------------------------------------------
    def set(self, block: Block, **values) -> None:
        """Set parameters of a block on any worker (checked here; all or none change); they reach the worker
        with the next frame, the latest value winning."""
        self.placement(block)
        block.set(**values)

    def bind(self, param: Parameter, source: Observable):
        """Take a parameter's values from an Observable emitting here, on the driver: values are coalesced (the
        latest before a frame wins) and only that one crosses to the worker. Returns a disposable. A value the
        parameter refuses is a diagnostic from ``driver``."""
        if not isinstance(param, Parameter):
            raise TypeError("bind takes a parameter (block.params['k']) and an Observable; a device array lives in "
                            "one process: write() or feed() the input instead")
        if not any(param is p for b in self._model.blocks for p in b.params.values()):
            raise ValidationError(f"parameter {param.name} belongs to no block of this distributed engine; add the "
                                  "block first", subject=param.name)
        return param.bind(source)

    def _on_change(self, event) -> None:
        if isinstance(event, ParameterChanged):
            w = self._placement.get(event.block)
            if w is not None:
                with self._lock:
                    self._pending_params[w].setdefault(event.block, {})[event.name] = event.value
        else:  # code, launches, structure: the fragment is shipped again before the next frame
            self._dirty = True

    # -- data ----------------------------------------------------------------------------------------------
    def write(self, port: PortHandle, data) -> None:
        """Copy host data into an input on its worker, before the next frame (checked here first). The worker
        keeps getting it after a restart."""
        self._check_open()
        w = self.placement(port.block)
        arr = np.array(data, copy=True)
        ref = PortRef(port.block.id, port.name)
        with self._lock:
            self._model.write(port, arr)  # dtype, size, direction: refused here as a local engine would
            if ref not in self._writes:  # a newly host-fed input: the fragment changes
                self._dirty = True
            self._writes[ref] = arr
            self._pending_writes[w][ref] = arr

    def feed(self, port: PortHandle, source: Observable):
        """Stream arrays into an input on its worker: each frame carries the newest one (coalesced here)."""
        self._check_open()
        self.write(port, _zeros(port))

        def on_next(arr) -> None:
            try:
                self.write(port, arr)
            except (TypeError, ValueError) as e:
                self._publish("driver", Diagnostic("warning", f"{port.block.name}.{port.name}", f"feed: {e}",
                                                   self._index))

        return source.subscribe(on_next)

    def read(self, port: PortHandle, *, out=None):
        """The port's value after the frames submitted so far (waits for them; into ``out`` where given, as
        :meth:`rxcuda.Engine.read`); WorkerDownError while its worker restarts."""
        self._check_open()
        w = self.placement(port.block)
        self._ship()
        self._drain(0)
        return _board.copy_out(self._ask(w, "read", PortRef(port.block.id, port.name)), out)

    def observe(self, port: PortHandle, *, every: int = 1) -> Observable:
        """A port on any worker as a local Observable of NumPy arrays, one after every ``every``-th frame,
        emitted on the thread that drives the frames. Completes when the engine closes."""
        self._check_open()
        if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
            raise ValueError(f"'every' must be a positive int (got {every!r})")
        w = self.placement(port.block)
        ref = PortRef(port.block.id, port.name)
        with self._lock:
            self._model.keep(port)
            self._observed[w] = {**self._observed[w], ref: every}  # replaced: a frame may be sending the old one
            subject = self._taps.setdefault(ref, Subject())

        def subscribe(observer, scheduler=None):
            return subject.subscribe(observer, scheduler=scheduler)

        return Observable(subscribe)  # the subject itself stays private: only frames emit on it

    # -- frames --------------------------------------------------------------------------------------------
    def tick(self) -> DistributedFrame:
        """Ship a changed structure, run one frame on every worker and wait for it."""
        self._check_open()
        if self._loop is not None:
            raise RuntimeError("run() drives the frames; dispose it before calling tick() yourself")
        index = self._submit()
        return self._drain(0).get(index) or DistributedFrame(index, {})

    def run(self, clock=60.0) -> Disposable:
        """Produce frames on a driver thread (``clock``: frames per second, or an Observable) until disposed; at
        most ``max_in_flight`` frames are outstanding."""
        self._check_open()
        if self._loop is not None:
            raise RuntimeError("the distributed engine is already running; dispose the previous run() first")

        def on_error(e: Exception) -> None:
            self._publish("driver", Diagnostic("error", "frame", f"a frame failed, the frames go on: {e}",
                                               self._index))

        def frame() -> None:
            self._submit()

        loop = FrameLoop(frame, lambda: None, on_error)
        self._loop = loop
        stop = loop.start(clock)

        def dispose() -> None:
            stop.dispose()
            self._loop = None
            self._stop_run = None
            self._drain(0)

        self._stop_run = dispose
        return Disposable(dispose)

    @property
    def frames(self) -> Observable:
        """One :class:`FragmentFrame` per worker and frame, tagged with the worker."""
        return self._frames.observable

    @property
    def diagnostics(self) -> Observable:
        """Every worker's diagnostics, and the driver's own (a worker died, is back), as
        :class:`FragmentDiagnostic` tagged with the worker (``driver`` for the driver's model)."""
        return self._diagnostics.observable

    def _submit(self) -> int:
        with self._frame_lock:
            return self._submit_locked()

    def _submit_locked(self) -> int:
        self._check_restarts()  # first: a worker back with a fragment older than the pipeline is shipped again
        self._ship()
        steps, skipped = self._frame_plan()
        with self._lock:
            self._index += 1
            index = self._index
            pending_params, pending_writes = self._pending_params, self._pending_writes
            params = {w: p for w, p in pending_params.items() if p}  # taken: the next frame's start empty
            writes = {w: d for w, d in pending_writes.items() if d}
            for w in params:
                pending_params[w] = {}
            for w in writes:
                pending_writes[w] = {}
            observed = self._observed  # its dicts are replaced, never changed, when a port is observed
        for w in skipped:  # restarting, or fed by a worker that is: what it was to get waits for its next frame
            if w in params or w in writes:
                self._requeue(w, params.get(w, {}), writes.get(w, {}))
        outs, reports = self._step_frame(index, steps, params, writes, observed)  # at once, or in turns
        self._inflight.append((index, steps, skipped, reports, outs, params, writes))
        self._drain(self.max_in_flight)
        return index

    def _drain(self, keep: int) -> dict[int, DistributedFrame]:
        """Wait until at most ``keep`` frames are in flight; publish what the finished ones reported."""
        with self._frame_lock:
            return self._drain_locked(keep)

    def _drain_locked(self, keep: int) -> dict[int, DistributedFrame]:
        ray = self._ray
        done = {}
        while len(self._inflight) > keep:
            index, steps, skipped, reports, outs, params, writes = self._inflight.popleft()
            frames: dict = {w: None for w in (*(w for w, *_ in steps), *skipped)}  # skipped: None (not complete)
            producers = {w: p for w, _method, p, _pair in steps}
            failed: set[str] = set()  # the workers whose step failed in this frame
            got = self._gather(index, steps, reports)  # a failed Ray step is found below, worker by worker
            for w, ref in reports.items():
                if ref is None:
                    rep = got[w]
                    if isinstance(rep, tuple):  # (error, whether the worker died)
                        self._step_failed(w, rep[0], params.get(w, {}), writes.get(w, {}), rep[1])
                        continue
                    self._report(w, index, rep, frames)
                    continue
                if got.get(w) is SKIPPED or failed & set(producers[w]):  # fed by a worker that failed this frame
                    self._requeue(w, params.get(w, {}), writes.get(w, {}))
                    failed.add(w)
                    continue
                try:
                    rep = got[w] if w in got else ray.get(ref)
                    if isinstance(rep, WorkerGone):  # its process ended: found on this host
                        raise rep
                except (WorkerGone, ray.exceptions.RayError) as e:
                    if w in outs:
                        with contextlib.suppress(ray.exceptions.RayError):  # its other result failed too: seen here
                            ray.get(outs[w])
                    self._step_failed(w, e, params.get(w, {}), writes.get(w, {}), isinstance(e, WorkerGone) or None)
                    failed.add(w)
                    continue
                self._report(w, index, rep if w in outs else rep[1], frames)  # one object: (out, report)
            done[index] = DistributedFrame(index, frames)
        return done

    def _report(self, w: str, index: int, rep, frames: dict) -> None:
        """Publish what worker ``w`` reported of frame ``index``: its frame, diagnostics and observed values."""
        frames[w] = rep.frame
        for d in rep.diagnostics:
            self._publish(w, d)
        if rep.frame is not None and self._frames.observers:
            self._frames.emit(FragmentFrame(w, index, rep.frame))
        for pref, value in rep.observed.items():
            subject = self._taps.get(pref)
            if subject is not None:
                try:
                    subject.on_next(value)
                except Exception as e:  # a subscriber's error: reported, the frames go on
                    self._publish("driver", Diagnostic("warning", "observe", f"a subscriber raised "
                                                       f"{type(e).__name__}: {e}; the frames go on", index))

    # -- shipping the structure ----------------------------------------------------------------------------
    def _split_now(self) -> _placement.Split:
        with self._lock:
            desc = self._model.describe()
            nodes = {w: self._where[w].get("node") for w in self._workers}
            return _placement.split(desc, self._placement, self._workers, nodes=nodes,
                                    transports=self._transports, offered=direct_transports(self._ray, nodes))

    def _ship(self, *, strict: bool = False) -> None:
        """Build the fragments whose structure changed (after the frames in flight), before the next frame. A
        change that cannot be built is a diagnostic and the workers keep their last good fragments, as a local
        engine keeps its last good graph; ``strict`` (``rebuild()``, or nothing built yet) raises it instead."""
        if not self._dirty:
            return
        with self._frame_lock:
            try:
                self._ship_locked()
            except (ValidationError, RuntimeError) as e:
                if strict or not self._built:  # nothing built yet: no last good fragment to keep
                    self._dirty = True  # asked again next time
                    raise
                self._publish("driver", Diagnostic("error", getattr(e, "subject", None) or "structure",
                                                   f"the changed pipeline could not be built, the workers keep "
                                                   f"their last good fragments: {e}", self._index))

    def rebuild(self) -> None:
        """Ship a changed structure now, raising what cannot be built (a ValidationError listing every problem
        the planner found, a worker's build error) instead of reporting it."""
        self._check_open()
        self._dirty = True
        self._ship(strict=True)

    def _ship_locked(self) -> None:
        ray = self._ray
        self._drain(0)
        with self._lock:
            self._dirty = False
            if self._placement:  # the whole pipeline validated at once by the planner (nothing set up or captured here)
                plan(self._model.describe(), reuse_memory=False)
            split = self._split_now()
            builds = {}
            for w, frag in split.fragments.items():
                key = _placement.structure(frag)
                was = self._built.get(w)
                if was == key or w in self._down or w in self._gone:
                    continue
                if was is not None and _placement.skeleton(was) == _placement.skeleton(key):
                    # only kernels' code or launches changed
                    builds[w] = (key, self._actors[w].retune.remote(frag))  # Code / Parameters tiers, no rebuild
                    continue
                mine = {b.id for b in frag.description.blocks}
                writes_w = {r: a for r, a in self._writes.items() if r.block in mine}
                builds[w] = (key, self._actors[w].build.remote(frag, writes_w, self._index + 1))
                self._pending_params[w] = {}  # the fragment carries the values
                self._pending_writes[w] = {}
            self._split = split
        failed = None
        for w, (key, ref) in builds.items():
            try:
                built = ray.get(ref)
                self._built[w] = key
                for severity, said in _sharing.placed(self._where, self._warned, w, built, self._share.news):
                    self._publish("driver", Diagnostic(severity, "placement", said, self._index))  # once each
            except ray.exceptions.RayActorError as e:
                self._step_failed(w, e, {}, {})
            except ray.exceptions.RayTaskError as e:
                self._built.pop(w, None)
                failed = failed or e.as_instanceof_cause()
        if failed is not None:
            raise failed

    def describe(self) -> DistributedDescription:
        """The pipeline as data, where each block runs and each link's transport."""
        split = self._split_now() if self._placement else None
        return DistributedDescription(self._model.describe(), dict(self._placement), dict(self._workers),
                                      split.links if split else (), self._steppings(split), str(self._share.choice))

    def to_dot(self) -> str:
        """A picture of the pipeline (DOT text): a cluster per worker, links drawn bold with their transport."""
        from ._dot import distributed_dot
        return distributed_dot(self.describe())

    def save_graph(self, path, format: str | None = None):
        """Write :meth:`to_dot`'s picture to ``path`` (as ``rxcuda.save_graph``: ``.dot``, ``.svg``, ...)."""
        from ._dot import save

        return save(self.to_dot(), path, format)

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the distributed engine is closed; create a new one")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the frames, close every worker's engine and end its actor (no process or GPU memory is left);
        shut Ray down if this engine started it. Never raises."""
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        if self._stop_run is not None:
            with contextlib.suppress(Exception):
                self._stop_run()
        self._inflight.clear()
        self._clocks_close()  # each frame thread told to end, the pipes removed
        order = list(reversed(self._split.order)) if self._split else list(self._actors)
        for w in order:  # consumers first: they unmap what producers exported
            a = self._actors.get(w)
            if a is None:
                continue
            with contextlib.suppress(Exception):
                ray.get(a.close.remote(), timeout=10)
        for a in self._actors.values():
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        self._actors = {}
        self._end_standbys()
        self._share.close()  # its clients gone: the private MPS daemon quits (the process's last engine's close)
        _board.remove_boards(self._session)  # those a killed worker on this host left
        for s in self._subs:
            s.dispose()
        for subject in self._taps.values():
            subject.on_completed()
        self._frames.close()
        self._diagnostics.close()
        self._model.close()
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<distributed Engine workers={list(self._workers)} blocks={len(self._placement)} frame={self._index}>"

    # -- diagnostics -----------------------------------------------------------------------------------------
    def _publish(self, worker: str, d: Diagnostic) -> None:
        self._diagnostics.emit(FragmentDiagnostic(worker, d))

    def _subscriber_failed(self, err: Exception, item) -> None:
        self._publish("driver", Diagnostic("warning", "frames", f"a subscriber raised {type(err).__name__}: {err}; "
                                           "the frames go on", self._index))

