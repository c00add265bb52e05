"""A worker: what runs inside one Ray actor. It holds one Engine (on the GPU Ray gave the actor, or on the null
driver), builds its :class:`~rxcuda.distributed._placement.Fragment` from the description it is sent, and runs
one step per distributed frame: apply the parameters and writes that came with the step, take in what the
links bring, tick, send out what the links carry on, and report the frame, the observed ports and the
diagnostics back to the driver.

Nothing here imports Ray at module level: the distributed engine wraps :class:`FragmentHost` as an actor
class, and the tests run it in-process as well.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any, NoReturn, TypeVar, cast

import attrs

from ..blocks._blocks import Block, PortHandle
from ..cuda._stream import synchronize
from ..engine import _shapes_io
from ..engine._engine import Diagnostic, Engine, Frame
from ..model._describe import KernelSpec, PortRef
from ..model._errors import DeviceLostError
from . import _board, _clock, _drills, _hostlink, _links, _mps
from ._placement import Fragment, RemoteLink

log = logging.getLogger("rxcuda")

EXIT_CONTEXT_LOST = 70  # the exit status of a worker whose GPU context was lost (EX_SOFTWARE)
_F = TypeVar("_F", bound=Any)
LINK_TIMEOUT_S = 10.0  # how long a consumer waits for its producer's frame on an ipc link before it skips it
# set in a worker process's environment: the positions its engines run over (rxcuda.Engine(devices=[...]), as the
# process sees the ordinals; "cpu" for the CPU device's), e.g. "0,0" (an IsolatedEngine(devices=[...])'s)
WORKER_DEVICES = "RXCUDA_WORKER_DEVICES"


@attrs.frozen
class StepReport:
    """What a worker tells the driver after a step: its frame (None when it was skipped), the observed ports'
    values, the diagnostics its engine published since the last step, and its process id (a new one after a
    restart)."""

    worker: str
    index: int  # the distributed frame
    frame: Frame | None
    observed: Mapping[PortRef, object]
    diagnostics: tuple[Diagnostic, ...]
    pid: int


def _locked(method: _F) -> _F:
    """A worker's method run holding its lock: a Ray call and the clock's frame thread never touch its engine at
    once. A lost GPU context ends the process (see :meth:`FragmentHost._lost`)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            try:
                return method(self, *args, **kwargs)
            except DeviceLostError as e:  # a build, read or write that met a lost context: no call works again
                self._lost(e)

    return cast(_F, run)


class FragmentHost:
    """One worker's engine and fragment. ``null``: the null driver (no GPU); ``cpu``: the CPU device (no GPU,
    kernels run with real numbers; the null driver's ``fail`` too). ``depth``: slots per ``ipc`` link.
    ``session``: names the boards of this distributed engine's ``ipc`` links (one per exported port, shared by
    producer and consumers on one host). ``device_slots``: whether an ``ipc`` link's slots are exported device
    memory (CUDA IPC; the default on a GPU) or the board's shared memory (the default without a GPU, which has
    no memory to export; True there runs the CUDA IPC calls, recorded, with no bytes moving: tests). ``env``:
    the private MPS daemon's variables (``Engine(share_gpu=...)``, ``_mps.enter``), set in this process before it makes
    a CUDA context where the engine chose MPS; ``_mps.TURNS`` in it: the driver steps it in turns, so its ``ipc``
    exports wait for their copies before it answers."""

    def __init__(self, name: str, null: bool, depth: int = 3, session: str | None = None,
                 device_slots: bool | None = None, env: Mapping[str, str] | None = None, cpu: bool = False):
        self._env = dict(env or {})
        _mps.enter(self._env)  # the daemon up and this engine's gate open: before this process's first CUDA call
        self.name = name
        self.null, self.cpu = null and not cpu, cpu  # the null driver; the CPU device (a null driver that computes)
        self.gpuless = null or cpu  # no GPU (as Worker.gpuless)
        self.device_slots = not self.gpuless if device_slots is None else device_slots
        self.depth = depth
        self.session = session or uuid.uuid4().hex[:12]
        self.link_timeout = LINK_TIMEOUT_S
        self.pid = os.getpid()
        self.started = time.time()  # when this process took the worker on (a restart's phases: bench, diagnostics)
        self._drill: str | None = None  # a fault drill the next step runs (crash("frame"), crash("oom"))
        self.engine: Engine | None = None
        self.fragment: Fragment | None = None
        self.blocks: dict[int, Block] = {}  # the driver's block id -> the block built here
        self._diagnostics: list[Diagnostic] = []
        # the links' ends (_links, _hostlink): (exported port, transport) -> the board its links publish on and
        # what fills it; input -> its producer's board and what copies from it; exported port -> its pinned ring
        self._senders: dict[tuple, _links.IpcSender | _hostlink.BoardSender] = {}
        self._receivers: dict[PortRef, Any] = {}
        self._boards: dict[tuple, _board.LinkBoard] = {}
        self._readers: dict[PortRef, _board.BoardReader] = {}
        self._stores: dict[PortRef, _hostlink.StoreSender] = {}
        self.skipped: dict[str, int] = {}  # link label -> frames its producer did not deliver (restarting, late)
        self._delay = 0.0  # seconds added to each step (throttle: a slow worker, for drills and tests)
        self.received: dict[str, int] = {}  # link label -> frames it brought in
        self._link_us: collections.deque[float] = collections.deque(maxlen=1000)  # host time in link ends a frame
        self._lock = threading.RLock()  # a step (the clock's frame thread) against Ray's calls (build, read, ...)
        self._clock: _clock.ClockHand | None = None
        self._next: tuple[dict, dict] = ({}, {})  # the clock's posted parameters and writes for the next step
        self._observed_now: Mapping[PortRef, int] = {}  # the observed ports, as last posted
        self._warm: Engine | None = None  # an engine made beforehand (prewarm), taken by the next build
        self._shared: _hostlink.PinnedArrays | None = None  # what read_shared wrote (pinned for self.engine)
        self._armed: list[tuple[str, str]] = []  # driver calls the next trial fails (arm: tests)

    # -- where it runs -------------------------------------------------------------------------------------
    def where(self) -> dict:
        """The worker's Ray node id, process id, the GPUs Ray gave it (ids as Ray sees them), and the MPS pipe folder
        its CUDA contexts connect to (``mps_pipe``; None: no MPS set up for it)."""
        node, gpus = None, []
        try:
            ray = sys.modules.get("ray")  # a Ray actor has it; a child process (_procs) does not: importing Ray there
            if ray is None or not ray.is_initialized():  # took ~600 ms of a replaced GPU process's build (H100)
                raise LookupError
            ctx = ray.get_runtime_context()
            node, gpus = ctx.get_node_id(), [str(g) for g in ray.get_gpu_ids()]
        except Exception:  # no Ray here, or no actor context
            node = os.environ.get("RXCUDA_WORKER_NODE")  # a child process of the driver's (_procs): its host
        return {"node": node, "pid": self.pid, "gpus": gpus, "mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY")}

    @_locked
    def trial(self, fragment: Fragment, writes: Mapping[PortRef, object]) -> dict:
        """Build ``fragment`` and run one frame of it (waited for), then let it go, keeping this process a warm
        standby: new code proven on the inputs last written before the serving process takes it. A kernel that
        faults ends this process (a lost context), which is the answer; returns the frame's state and the
        seconds it all took."""
        t0 = time.perf_counter()
        self.build(fragment, writes)
        armed, self._armed = self._armed, []
        for call, error in armed:
            self._engine().device.api.fail(call, error)
        state = self._engine().tick().state
        nxt = self._new_engine(self._engine().device.uuid)  # before the close: the context stays made
        self._close_engine()
        self._warm = nxt
        return {"state": state, "seconds": time.perf_counter() - t0}

    def _new_engine(self, gpu: str | None = None) -> Engine:
        """An engine on the null driver, on the CPU device, or on the GPU whose UUID is ``gpu`` (None: the first this
        process sees); over several positions where :data:`WORKER_DEVICES` names them."""
        _mps.enter(self._env)  # a worker placed on a shared GPU: the engine opened the gate after placement
        positions = [d if d == "cpu" else int(d) for d in os.environ.get(WORKER_DEVICES, "").split(",") if d]
        if self.cpu:
            return Engine(devices=positions) if positions else Engine(device="cpu")
        if self.null:
            if positions:
                return Engine(driver=_null_driver(len(set(positions))), devices=positions)
            return Engine(driver=_null_driver())
        if positions:
            return Engine(devices=positions)
        from ..cuda._device import ordinal_of

        return Engine(ordinal_of(gpu) if gpu else 0)

    def prewarm(self, gpu: str | None = None) -> int:
        """Make this process's engine (its CUDA context, streams and memory pool) before any fragment is sent, on
        the GPU whose UUID is ``gpu`` (None: the first this process sees), so that a standby taking a dead worker
        over builds at once; the next :meth:`build` uses it. A first build and frame run in it beforehand, what a
        process pays once (imports, the first module load and launch), and a port's device buffer is looked up as
        a link's end does (through a CuPy view: importing CuPy took ~150 ms of a taken-over worker's first frame).
        Returns the process id."""
        with self._lock:
            if self.engine is None and self._warm is None:
                probe = self._new_engine(gpu)
                try:
                    b = probe.add(Block.from_kernel("scalar_mul", size=256, name="prewarm"))
                    probe.write(b["x"], _zeros(b["x"]))
                    probe.tick()
                    with contextlib.suppress(ImportError):  # no CuPy: no links either, nothing to warm
                        _links.device_pointer(probe, b["out"])
                    self._warm = self._new_engine(gpu)
                finally:
                    probe.close()
        return self.pid

    def adopt(self, name: str) -> None:
        """A standby takes over worker ``name`` (its diagnostics and reports name it from now on)."""
        self.name = name

    # -- the fragment ------------------------------------------------------------------------------------
    @_locked
    def build(self, fragment: Fragment, writes: Mapping[PortRef, object], since: int = 1) -> dict:
        """Build ``fragment`` in a new engine (the old one, if any, is closed): its blocks with their values and
        launches, the connections between them, the inputs links feed, and the arrays last written to its
        inputs (``writes``); then its graph, raising what the planner or the driver refuses. Its ``ipc`` exports
        serve frames from ``since`` on (the consumers skip older ones, its predecessor's). Returns
        :meth:`where`, with how many blocks were built, the GPU's UUID (``gpu``) and whether MPS serves it
        (``mps``)."""
        t0 = time.perf_counter()
        # the new engine made before the old one closes: the process's CUDA context stays made (closing the last
        # engine releases it, and making it again costs ~200 ms on an H100)
        engine, self._warm = self._warm or self._new_engine(), None
        self._close_engine()
        self.engine = engine
        engine.device.make_current()  # this thread's (a closed engine leaves none current)
        engine.diagnostics.subscribe(self._diagnostics.append)
        desc = fragment.description
        regions = {r.id: r for r in desc.regions}
        blocks: dict[int, Block] = {}
        for entry in desc.blocks:
            b = Block(entry.desc) if entry.id not in regions else _region(entry.desc, regions[entry.id].kind)
            if entry.values:
                b.set(**entry.values)
            for kernel, la in entry.launches.items():
                b.set_launch(kernel, grid=la.grid, block=la.block, shared_mem=la.shared_mem)
            blocks[entry.id] = b
        for r in regions.values():  # the blocks of their bodies, by the ids the description names
            blocks[r.id].bodies = tuple(tuple(blocks[m] for m in body) for body in r.bodies)  # type: ignore[attr-defined]
            blocks[r.id].unroll = r.unroll  # type: ignore[attr-defined]
        inner = {m for r in regions.values() for m in r.members}
        for entry in desc.blocks:  # a region with its bodies (nested ones inside it), then the blocks outside any
            if entry.id not in inner:  # (on its position, where the engine has several: a region as a whole)
                engine.add(blocks[entry.id], device=desc.placement.get(entry.id))
        self.blocks = blocks
        self.fragment = fragment
        for c in desc.connections:
            engine.connect(self.port(c.src), self.port(c.dst), delay=c.delay, initial=c.initial)
        for ref in desc.kept:
            engine.keep(self.port(ref))
        for ln in fragment.imports:  # a link's input is fed from the host side: it gets its own buffer
            engine.write(self.port(ln.dst), _zeros(self.port(ln.dst)))
        for ref in desc.fed:
            if ref in writes:
                engine.write(self.port(ref), writes[ref])
            elif not any(ln.dst == ref for ln in fragment.imports):
                engine.write(self.port(ref), _zeros(self.port(ref)))
        for ref, shape in desc.shapes.items():
            engine.resize(self.port(ref), shape)
        t1 = time.perf_counter()
        engine.rebuild()  # built now: a fragment that cannot be built raises here, where the driver ships it
        t2 = time.perf_counter()
        for ln in fragment.exports:
            if ln.via == "board" and (ln.src, ln.transport) not in self._boards:
                self._boards[(ln.src, ln.transport)] = self._export(engine, ln, since)
            elif ln.via == "store" and ln.src not in self._stores:
                self._stores[ln.src] = _hostlink.StoreSender(engine, self.port(ln.src), ln.nbytes, self.depth)
        for ln in fragment.imports:
            dst = self.port(ln.dst)
            if ln.via == "store":
                self._receivers[ln.dst] = _hostlink.StoreReceiver(engine, dst)
                continue
            reader = self._readers[ln.dst] = _board.BoardReader(self._board_path(ln))
            self._receivers[ln.dst] = (_links.IpcReceiver(engine, dst) if ln.transport == "ipc" and self.device_slots
                                       else _hostlink.BoardReceiver(engine, dst, reader))
        device = engine.device
        return {**self.where(), "blocks": len(blocks), "gpu": device.uuid, "mps": device.mps, "started": self.started,
                "built": time.time(), "build_s": time.perf_counter() - t0,
                "build_phases": {"blocks": t1 - t0, "graph": t2 - t1}}

    def _board_path(self, ln: RemoteLink) -> str:
        """The board of a link's exported port and transport (producer and consumer derive it alike)."""
        return _board.board_path(self.session, ln.src.block, ln.src.port + ("" if ln.transport == "ipc" else "~h"))

    def _export(self, engine: Engine, ln: RemoteLink, since: int) -> _board.LinkBoard:
        """The board an exported port's links of one transport publish on: for ``ipc`` on GPUs, slots in device
        memory (exported once, their handles on the board); else the board's own shared memory, pinned."""
        path, key, port = self._board_path(ln), (ln.src, ln.transport), self.port(ln.src)
        if ln.transport != "ipc" or not self.device_slots:
            board = _board.LinkBoard.create(path, depth=self.depth, nbytes=ln.nbytes, data=True, since=since)
            try:
                self._senders[key] = _hostlink.BoardSender(engine, port, board)
            except BaseException:
                board.close(unlink=True)
                raise
            return board
        sender = self._senders[key] = _links.IpcSender(engine, port, ln.nbytes, self.depth,
                                                       settle=_mps.TURNS in self._env)  # stepped in turns
        return _board.LinkBoard.create(path, depth=self.depth, nbytes=ln.nbytes, data=False, since=since,
                                       handles=sender.handles())

    @_locked
    def retune(self, fragment: Fragment) -> list[str]:
        """Take a fragment that differs from the one built only in kernels' code or launches: each change is
        made in place on its block (a code swap, a launch update: the Code and Parameters tiers at the next
        frame, no rebuild of the fragment). Returns what changed, as ``block.kernel: code|launch``."""
        self._engine()
        changed = []
        for entry in fragment.description.blocks:
            block = self.blocks[entry.id]
            for k in entry.desc.kernels:
                now = block.description.kernel(k.name)
                if isinstance(k, KernelSpec) and isinstance(now, KernelSpec) and now.code.key != k.code.key:
                    block.set_code(k.name, k.code)
                    changed.append(f"{block.name}.{k.name}: code")
            for kernel, la in entry.launches.items():
                if block.launches().get(kernel) != la:
                    block.set_launch(kernel, grid=la.grid, block=la.block, shared_mem=la.shared_mem)
                    changed.append(f"{block.name}.{kernel}: launch")
        self.fragment = fragment
        return changed

    def port(self, ref: PortRef) -> PortHandle:
        try:
            return self.blocks[ref.block][ref.port]
        except KeyError:
            raise KeyError(f"worker '{self.name}' holds no block with id {ref.block} (it holds "
                           f"{', '.join(b.name for b in self.blocks.values()) or 'none'})") from None

    # -- frames ----------------------------------------------------------------------------------------
    @_locked
    def step(self, index: int, params: Mapping[int, Mapping[str, object]], writes: Mapping[PortRef, object],
             observed: Mapping[PortRef, int], *payloads) -> tuple[dict, StepReport]:
        """One distributed frame: parameters (latest values, coalesced by the driver), host writes, what the
        links bring (``payloads``: one dict src port -> data per producer over a ``host`` link, None from one
        that skipped the frame; an ``ipc`` link's frame is waited for on its board), then a tick, then what this
        worker's exports carry on. Returns (what its ``host`` exports carry, report). A step that fails tells the
        consumers of its ``ipc`` exports that this frame will not come."""
        try:
            return self._step(index, params, writes, observed, payloads)
        except DeviceLostError as e:  # in the tick or in a read after it
            self._lost(e)
        except BaseException:
            for board in self._boards.values():
                board.skip(index)
            raise

    def _apply(self, engine: Engine, params, writes) -> None:
        """A frame's parameter values (a refused one is a warning diagnostic) and host writes, before its tick."""
        for bid, values in params.items():
            block = self.blocks.get(bid)
            if block is None:
                continue
            try:
                block.set(**values)
            except (TypeError, ValueError) as e:
                self._diagnostics.append(Diagnostic("warning", block.name, f"parameter refused on worker "
                                                    f"'{self.name}': {e}", engine.frame, None))
        for ref, data in writes.items():
            engine.write(self.port(ref), data)

    def _step(self, index: int, params, writes, observed, payloads) -> tuple[dict, StepReport]:
        engine = self._engine()
        if self._drill is not None:
            drill, self._drill = self._drill, None
            if drill == "oom":
                _drills.out_of_memory()
            raise RuntimeError(f"fault drill: worker '{self.name}' raised in its step of frame {index}")
        if self._delay:
            time.sleep(self._delay)
        self._apply(engine, params, writes)
        incoming: dict[PortRef, Any] = {}
        for p in payloads:
            if p:
                incoming.update(p)
        assert self.fragment is not None
        t0 = time.perf_counter()
        waited = 0.0
        copied: list[_board.LinkBoard] = []  # boards whose slots this frame copied from: checked after it
        for ln in self.fragment.imports:
            receiver = self._receivers[ln.dst]
            if ln.via == "board":
                w0 = time.perf_counter()
                reader = self._readers[ln.dst]
                status = reader.wait(index, self.link_timeout)
                waited += time.perf_counter() - w0
                if status != _board.READY:
                    self._missed(ln, index, status)
                    continue
                receiver.receive(reader, index)
                if isinstance(receiver, _hostlink.BoardReceiver) and reader.board is not None:
                    copied.append(reader.board)
            else:
                data = incoming.get(ln.src)
                if data is None:  # its producer skipped the frame (restarting): the input keeps its last value
                    continue
                receiver.receive(data)
            self.received[ln.label] = self.received.get(ln.label, 0) + 1
        link_s = time.perf_counter() - t0 - waited
        frame = engine.tick()  # waited for: the copies into its inputs, before its launch, are done too
        t0 = time.perf_counter()
        for board in copied:
            board.check(index)
        out: dict[PortRef, object] = {src: s.send(index) for src, s in self._stores.items()}
        for key, board in self._boards.items():
            board.publish(index, self._senders[key].send(index))
        if self.fragment.imports or self.fragment.exports:
            self._link_us.append((link_s + time.perf_counter() - t0) * 1e6)
        seen = {ref: engine.read(self.port(ref)) for ref, every in observed.items() if index % every == 0}
        diags, self._diagnostics = tuple(self._diagnostics), []
        return out, StepReport(self.name, index, frame, seen, diags, self.pid)

    def _missed(self, ln: RemoteLink, index: int, status: str) -> None:
        """An ipc link's producer did not deliver frame ``index``: the input keeps its last value."""
        self.skipped[ln.label] = self.skipped.get(ln.label, 0) + 1
        if status == _board.LATE:
            self._diagnostics.append(Diagnostic(
                "warning", ln.label, f"worker '{self.name}': the producer of {ln.label} published no frame {index} "
                f"within {self.link_timeout:g} s; this frame's input keeps its last value", index, None))

    @_locked
    def read(self, ref: PortRef):
        """A port's value now (waits for the frames in flight)."""
        return self._engine().read(self.port(ref))

    @_locked
    def read_shared(self, ref: PortRef, into: tuple[str, int] | None = None) -> tuple:
        """:meth:`read` into shared memory (``_hostlink.PinnedArrays``, pinned for this engine's driver: the copy
        from the device lands there directly): the handle (path, shape, dtype) the driver takes it by. ``into``:
        (path, bytes) of a file the driver made (a slab, ``_readback``) to copy it into where it fits, else this
        process's own file."""
        engine, port = self._engine(), self.port(ref)
        shared = self._shared
        if shared is None or shared.engine is not engine:  # the first read, or a new engine (a rebuilt fragment)
            if shared is not None:
                shared.close()
            shared = self._shared = _hostlink.PinnedArrays(f"rxcuda-{self.session}-read-{self.pid}", engine)
        name = f"{ref.block}-{ref.port}"
        layout = _shapes_io.read_layout(port.spec, engine.shape(port))
        if layout is None:  # an append output (as many elements as were appended): read, then copied in
            return shared.put(name, engine.read(port))
        shape, dtype = layout
        if into is not None and math.prod(shape) * dtype.itemsize <= into[1]:
            view = shared.at(into[0], shape, dtype)
            try:
                engine.read(port, out=view)
                return into[0], shape, dtype
            except ValueError:
                del view  # its shape changes with the next frame: as below
        handle, view = shared.slot(name, shape, dtype)
        try:
            engine.read(port, out=view)
        except ValueError:  # its shape changes with the next frame (a resize not run yet): as it runs now
            del view
            return shared.put(name, engine.read(port))
        return handle

    @_locked
    def write(self, ref: PortRef, data) -> None:
        self._engine().write(self.port(ref), data)

    @_locked
    def describe(self):
        """The fragment as the engine here holds it (its own block ids)."""
        return self._engine().describe()

    @_locked
    def stats(self) -> dict:
        """What the worker has done: frames, rebuilds, frames each link brought in and each skipped, how many of
        its ipc inputs' frames were not published yet when its step asked (``waited``: its producer's step ran
        alongside), the median host time a frame spends in the ends of its links besides such waits (``link_us``,
        the last 1000 frames), the frames its current clock stepped (``clock_frames``), its process, the bytes its
        memory pool reserved and its graph's buffers (``buffers``: ``str(engine.stats)``), and whether the boards its
        ``host`` links copy into and out of are pinned here (``pinned``: False where the driver refused, and its
        copies are staged)."""
        e = self._engine()
        ends = [*self._senders.values(), *self._receivers.values()]
        return {"frame": e.frame, "rebuilds": e.rebuilds, "pid": self.pid, "received": dict(self.received),
                "bytes_reserved": int(e.memory.bytes_reserved), "buffers": str(e.stats),
                "skipped": dict(self.skipped), "waited": sum(r.waited for r in self._readers.values()),
                "link_us": statistics.median(self._link_us) if self._link_us else None,
                "clock_frames": self._clock.frames if self._clock is not None else 0,
                "pinned": [end.pinned for end in ends if hasattr(end, "pinned")],
                "state": e.last_frame.state if e.last_frame else "not built"}

    def throttle(self, seconds: float) -> None:
        """Make every step take ``seconds`` longer: a slow worker, to see backpressure at work."""
        self._delay = float(seconds)

    def _lost(self, err: DeviceLostError) -> NoReturn:
        """The GPU context is gone for this process (a sticky error): end the process, so that Ray restarts the
        worker in a new one with a new context, where it rebuilds its fragment."""
        log.critical("rxcuda worker '%s' (process %d) lost its GPU context and exits for Ray to restart it: %s",
                     self.name, self.pid, err)
        from . import _procs

        if self._clock is not None:
            self._clock.hang_up()  # the driver waiting for this frame hears of it at once
        _procs.last_words(str(err))  # in a child process of the driver's (_procs): the reason reaches it
        os._exit(EXIT_CONTEXT_LOST)

    @_locked
    def inject(self, call: str, error: str = "CUDA_ERROR_ILLEGAL_ADDRESS", times: int = 1) -> None:
        """Make the next ``times`` calls of ``call`` fail with ``error`` in this worker's null driver: a lost
        context (or another driver error) without a GPU, for tests and fault drills."""
        api = self._engine().device.api
        if not hasattr(api, "fail"):
            raise RuntimeError(f"worker '{self.name}' runs on a GPU: inject() fails calls of the null driver only")
        api.fail(call, error, times)

    def arm(self, call: str, error: str = "CUDA_ERROR_ILLEGAL_ADDRESS") -> None:
        """Make the next :meth:`trial`'s null driver fail ``call`` with ``error`` (tests of trial runs)."""
        self._armed.append((call, error))

    def crash(self, how: str = "exit") -> None:
        """A fault drill (tests, bench): ``"exit"`` ends the process at once (``os._exit``), ``"kill"`` sends it
        SIGKILL between frames, ``"segfault"`` makes it read address 0, ``"oom"`` is host memory running out as
        Linux ends it: in its next step (mid-frame, on the thread that steps it) the worker allocates and touches
        host memory and is killed by SIGKILL, as the kernel's OOM killer (or a cgroup's memory limit) kills the
        process it picks (no real OOM is made: that would starve everything else on the host), ``"frame"``
        makes its next step raise in the frame thread (the process lives on), ``"context"`` makes its next launch
        lose the GPU context (without a GPU only: its launch fails with CUDA_ERROR_ILLEGAL_ADDRESS, and the worker
        ends as on a GPU)."""
        _drills.crash(self, how)

    @_locked
    def close(self) -> None:
        self.stop_clock()
        self._close_engine()
        warm, self._warm = self._warm, None
        if warm is not None:
            warm.close()

    # -- the clock: frames stepped through pipes (same host), not a Ray call each ----------------------------------
    def start_clock(self, go: str, done: str, generation: int) -> int:
        """Take frames from the driver's pipes ``go`` / ``done`` (see ``_clock``) on a frame thread; returns the
        process id (the driver checks it while it waits)."""
        self.stop_clock()
        self._next, self._observed_now = ({}, {}), {}
        self._clock = _clock.ClockHand(go, done, generation, self._clock_step, self._clock_apply,
                                       lambda what: self.read_shared(*what))
        return self.pid

    def post(self, generation: int, seq: int, params: Mapping, writes: Mapping, observed: Mapping | None) -> None:
        """Control message ``seq`` of clock ``generation``: parameters, writes and (when they changed) the observed
        ports, applied before the frame whose request names it. One for an older clock is dropped."""
        hand = self._clock
        if hand is not None and hand.generation == generation:
            hand.post(seq, (params, writes, observed))

    def collect(self, index: int):
        """What frame ``index``'s answer did not hold: (frame, observed values, diagnostics, error)."""
        hand = self._clock
        return hand.more.pop(index, None) if hand is not None else None

    def stop_clock(self) -> None:
        hand, self._clock = self._clock, None
        if hand is not None:
            hand.stop()

    def _clock_apply(self, messages: list) -> None:
        params, writes = self._next
        for p, w, observed in messages:
            for bid, values in p.items():
                params[bid] = {**params.get(bid, {}), **values}
            writes.update(w)
            if observed is not None:
                self._observed_now = observed

    def _clock_step(self, index: int):
        with self._lock:
            params, writes = self._next
            if params or writes:  # (else the two empty dicts stay this clock's: none made for the common frame)
                self._next = ({}, {})
            frag, engine = self.fragment, self.engine
            if (engine is not None and frag is not None and not (self._observed_now or self._delay or self._drill)
                    and not frag.imports and not frag.exports):  # no links, nothing observed: step()'s general path
                try:  # skipped (the parameters and writes since the last frame, then the frame)
                    if params or writes:
                        self._apply(engine, params, writes)
                    frame = engine.tick()
                except DeviceLostError as e:
                    self._lost(e)
                if not self._diagnostics:
                    return frame, None
                diags, self._diagnostics = tuple(self._diagnostics), []
                return frame, ({}, diags)
            if not (params or writes):
                params, writes = {}, {}  # not the clock's own (the general step may keep them)
            _out, rep = self.step(index, params, writes, self._observed_now)
        return rep.frame, (rep.observed, rep.diagnostics) if rep.observed or rep.diagnostics else None

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError(f"worker '{self.name}' has no fragment yet; the distributed engine builds it "
                               "before the first frame")
        return self.engine

    def _close_engine(self) -> None:
        engine = self.engine
        if engine is None:
            return
        if not engine.closed:
            try:  # the links' copies run on the engine's stream: let them finish before their memory goes
                engine.device.make_current()
                synchronize(int(engine.stream), api=engine.device.api, what="closing a worker's links")
            except Exception:
                pass
        for r in self._receivers.values():
            r.close()
        for reader in self._readers.values():
            reader.close()
        pinned = [s for s in self._senders.values() if isinstance(s, _hostlink.BoardSender)]
        for s in pinned:  # unpinned before its board is unmapped
            s.close()
        for board in self._boards.values():
            board.close(unlink=True)  # retired first: a consumer holding it looks for the next one
        for rest in [*(s for s in self._senders.values() if s not in pinned), *self._stores.values()]:
            rest.close()
        self._receivers, self._senders, self._readers, self._boards, self._stores = {}, {}, {}, {}, {}
        if self._shared is not None and self._shared.engine is engine:  # unpinned while its context lives
            self._shared.close()
            self._shared = None
        engine.close()
        self.engine = None


def _region(desc, kind: str) -> Block:
    """A region block (``If``, ``While``, ...) of ``kind`` as the description has it; its bodies are set by the
    caller and its condition is one of the fragment's connections."""
    from ..blocks._regions import For, If, IfElse, Region, While

    region: Region = object.__new__({"if": If, "ifelse": IfElse, "while": While, "for": For}[kind])
    Block.__init__(region, desc)
    region.condition = None  # connected with the other connections
    return region


def _null_driver(devices: int = 1):
    from ..cuda import NullDriver

    return NullDriver(devices=devices)


def _zeros(port: PortHandle):
    import numpy as np

    from ..model import _dtypes

    spec = port.spec
    return np.zeros(spec.shape, _dtypes.to_numpy(spec.dtype) if spec.dtype else np.uint8)

