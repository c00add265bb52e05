"""An engine whose GPU side runs in a supervised child process, so that a faulting or hanging kernel costs
frames, not the session.

After a kernel faults (an illegal address, a trap, a failed device assert), every CUDA context of the faulting
process is lost, a second context and a reset primary context included; a child process's fault leaves the
parent untouched (measured on an H100, driver 580: ../shared/GPU-FACTS.md, "Faults"). So the pipeline the user
holds lives here, in the user's process (blocks, parameters, bindings, the arrays written, observers), and its
GPU side is one worker of the distributed engine's kind (``FragmentHost``) in a child process (``_procs``: no
Ray), stepped through its clock (named pipes). When the child dies -- a lost context makes it exit, a frame past
its deadline makes this side kill it -- the frame is reported (``Frame.state == "error"`` and one error
:class:`Diagnostic` with the CUDA error and the kernels of the frame), code that had not yet completed a frame is
rolled back to the last code that did and quarantined (not taken again until its file or code changes), and the
standby process (started beforehand, its CUDA context made) takes over: it builds the pipeline from its
description with the last parameter values and the arrays last written, and frames resume.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import attrs
from reactivex import Observable
from reactivex.disposable import Disposable

from ..blocks._blocks import Block, PortHandle
from ..blocks._composite import Composite, CompositeInstance
from ..cuda._cpuchoice import cpu_by_default
from ..cuda._driver import probe
from ..engine._devices import check_position
from ..engine._engine import Diagnostic, Frame
from ..model._describe import KernelSpec, PortRef
from ..model._errors import NoDeviceError
from ..model._events import ParameterChanged
from ..streams._broadcast import Broadcast
from . import _board, _clock, _isogl, _isoview, _placement, _procs, _readback
from ._engine import Engine as _Distributed
from ._isorecords import Fault, RestartingError, _check_devices, _how, _loops, _members, _said, _visible
from ._placement import Worker
from ._records import DistributedFrame, FragmentFrame
from ._worker import WORKER_DEVICES

WORKER = "gpu"  # the one worker's name
DEADLINE_S = 5.0  # a frame not finished by then is a hang: its process is ended and replaced
HOLD_AFTER = 3  # faults in a row with no good frame between them, after which frames wait for a change
TRIAL_BUILD_S = 10.0  # what a trial run's build may take beyond the deadline of its frame


class IsolatedEngine(_Distributed):
    """A pipeline on one GPU whose kernels run in a supervised child process: a kernel that faults (an index
    past a buffer, a null pointer, ``__trap()``) or never finishes costs frames, not your Python session.

    >>> import numpy as np, rxcuda
    >>> with rxcuda.IsolatedEngine() as engine:                                  # doctest: +SKIP
    ...     mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, scale=2.0))
    ...     engine.write(mul["x"], np.ones(1024, np.float32))
    ...     frame = engine.tick()                   # built and launched in the GPU process
    ...     float(engine.read(mul["out"])[0])
    2.0

    Its verbs are the distributed engine's (``add``, ``connect``, ``set``/``bind``, ``write``/``read``,
    ``feed``/``observe``, ``tick``/``run``, ``watch``, ``close``), with ``serve`` and ``gl_buffer`` (OpenGL drawing
    that survives a fault); ``tick()`` returns a :class:`Frame` and
    ``diagnostics`` emits :class:`Diagnostic` as a local engine's do. ``device``: the GPU (its index), or
    ``"cpu"``: the CPU device (docs/cpu.md), whose illegal addresses are faults like a GPU's; left out, as
    ``rxcuda.Engine()``: GPU 0, or the CPU device where there is no GPU (``RXCUDA_DEVICE`` decides as there).
    ``devices``: several positions, as ``rxcuda.Engine(devices=[...])`` (docs/devices.md): GPU ordinals
    (``[0, 0]``: two positions on one GPU) or ``["cpu", "cpu"]``; the GPU process's engine has them, and
    ``add(block, device=k)`` places a block on position ``k`` there (a fault on any position is survived alike);
    ``null=True``: the null driver (no GPU: tests). ``deadline``: seconds a frame may take before it counts as a
    hang and the process is replaced. ``standby``: keep a spare process ready (its CUDA context made), so
    that a restart does not wait for a new interpreter. ``trial``: new code (a saved file under :meth:`watch`,
    ``set_code``) first runs one frame of the pipeline in the standby, on the inputs last written, and reaches
    the running graph only if that frame ran clean: code that faults there costs no frame at all.
    ``max_restarts``: how many processes may be replaced in this engine's life.

    After a fault, :attr:`faults` lists what happened; frames in which no GPU process served are ``"idle"``
    (not launched). GPU-side state that lived only on the device (a delayed connection's feedback, an output
    never read) restarts from its initial value.
    """

    def __init__(self, *, device: int | str | None = None, devices=None, null: bool = False,
                 deadline: float = DEADLINE_S, standby: bool = True, trial: bool = True, max_restarts: int = 1000,
                 max_in_flight: int = 2):
        if isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0:
            raise ValueError(f"'deadline' must be a positive number of seconds (got {deadline!r})")
        self.devices = _check_devices(devices, device, null)  # the positions (None: one device)
        if self.devices is not None:
            device = self.devices[0]
        if device is None:  # as rxcuda.Engine(): GPU 0, else the CPU device (RXCUDA_DEVICE=cpu/cuda decides)
            device = "cpu" if not null and cpu_by_default() else 0
        cpu = isinstance(device, str) and device.lower() == "cpu"
        if not cpu and (isinstance(device, bool) or not isinstance(device, int) or device < 0):
            raise ValueError(f"'device' must be a GPU's index, an int >= 0, or 'cpu' (got {device!r})")
        self._cpu = cpu and not null
        self._gl_side: _isogl.GLSide | None = None  # this process's CUDA side of the GL buffers (gl_buffer)
        if not null and not cpu:
            ok, why = probe()
            if not ok:  # said here, not by a GPU process that fails to start
                raise NoDeviceError(f"{why} (rxcuda.IsolatedEngine(device='cpu') runs on the CPU device, "
                                    "IsolatedEngine(null=True) on the null driver)")
        self.deadline = float(deadline)
        self.trial = bool(trial) and standby  # new code runs once in the standby before the GPU process takes it
        self.trial_s: list[float] = []  # how long each trial run took (from the change shipped to its answer)
        self.device_index = device
        self._positions: dict[int, int] = {}  # block id -> its position in ``devices``, where not the first
        self._keep_spare = standby
        self._null = null
        self.faults: list[Fault] = []
        self._good: dict[tuple[int, str], Any] = {}  # (block id, kernel) -> the code that completed a frame
        self._bad: dict[tuple[int, str], set[str]] = {}  # (block id, kernel) -> keys of code that faulted
        self._code_moved = True  # code or structure changed since the last good frame (take _good again)
        self._faulted: set[int] = set()  # frames a fault ended
        self._in_a_row = 0  # faults since the last good frame
        self._held = False  # frames wait for a change (the same fault came back HOLD_AFTER times)
        self._last_ok: Frame | None = None
        self.last_good = 0  # the index of the latest frame that ran clean (0: none yet)
        self.diagnostic_log: deque[Diagnostic] = deque(maxlen=1000)  # the latest diagnostics, as a local engine's
        self._plain = Broadcast(on_error=lambda e, item: None)  # Diagnostic, as a local engine's
        self._iframes = Broadcast(on_error=lambda e, item: None)  # Frame, as a local engine's
        super().__init__({WORKER: Worker(null=null, max_restarts=max_restarts)}, backend="process",
                         max_in_flight=max_in_flight)
        self._shared = _board.SharedArrays(f"rxcuda-{self._session}-read")  # reads come back through memory
        self._slabs = _readback.ReadSlabs(f"rxcuda-{self._session}-slab")  # large ones as arrays in it (no copy)

    # -- the child process ---------------------------------------------------------------------------------
    def _actor_options(self, name: str, w: Worker) -> dict:
        opts = super()._actor_options(name, w)
        env = dict(opts.get("env") or {})
        gpus = list(dict.fromkeys(self.devices or (self.device_index,)))  # the GPUs, each once, in order
        if self._cpu:  # the child's engines on the CPU device (its process holds no GPU engine: docs/cpu.md)
            env["RXCUDA_DEVICE"] = "cpu"
        elif not self._null:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(_visible(int(g)) for g in gpus)
        if self.devices is not None:  # the child's engine over these positions (ordinals as the child sees them)
            env[WORKER_DEVICES] = ",".join("cpu" if self._cpu else str(gpus.index(d)) for d in self.devices)
        opts.update(env=env, standby=self._keep_spare)
        return opts

    @property
    def pid(self) -> int | None:
        """The process the GPU side runs in now (another one after each fault)."""
        return _procs.actor_of(self._actors[WORKER]).pid()

    @property
    def restarts(self) -> int:
        """How many GPU processes were replaced so far."""
        return _procs.actor_of(self._actors[WORKER]).restarts

    def add(self, block, *, on: str | None = None, device: int | None = None):  # type: ignore[override]
        """Add a block, a tensor program's block (``rxcuda.tensor.block``), a region (``If``, ``While``, ...) with
        the blocks of its bodies, or a composite (``rxcuda.Composite``: a new instance of its blocks, named
        ``instance/member``, with its inner connections, as ``rxcuda.Engine.add`` makes one; returns the
        :class:`~rxcuda.CompositeInstance`) to the pipeline; it is built in the GPU process before the next frame,
        from the pipeline's description (plain blocks and connections: an instance's parameters set its blocks'
        here). ``device``: with ``devices=[...]``, the position it runs on (default 0; a region or a composite
        as a whole)."""
        position = 0 if device is None else check_position(device, len(self.devices or (0,)))
        if not isinstance(block, Composite) and (not isinstance(block, Block) or type(block) is Block):
            with self._lock:  # placed before a frame can ship it
                plain = super().add(block, on=on or WORKER)
                if position:
                    self._positions[plain.id] = position
            return plain
        self._check_open()
        with self._lock:
            if isinstance(block, Composite):
                instance = self._model.add(block)
                added: Block | CompositeInstance = instance
                members = list(instance.blocks)
            else:
                added = self._model.add(block)
                members = _members(block)
            for b in members:
                self._placement[b.id] = WORKER
                if position:
                    self._positions[b.id] = position
            self._dirty = True
        return added

    def remove(self, block) -> None:  # type: ignore[override]
        """Take a block (a region with the blocks of its bodies, a composite instance with every block inside)
        out of the pipeline."""
        self._check_open()
        inner = {b.id for b in (block.blocks if isinstance(block, CompositeInstance) else _members(block))}
        with self._lock:
            self._model.remove(block)
            self._forget(inner)
            self._slabs.forget(inner)
            for bid in inner:
                self._positions.pop(bid, None)

    def watch(self, *, debounce: float = 0.05) -> Disposable:
        """Reload kernels when their files are saved: the new code is compiled here and swapped into the GPU
        process before a following frame; code that faults is rolled back and not taken again until its file
        changes."""
        return self._model.watch(debounce=debounce)

    # -- frames ----------------------------------------------------------------------------------------------
    def tick(self) -> Frame:  # type: ignore[override]
        """Run one frame in the GPU process and wait for it. A frame a fault ended has ``state == "error"``
        (a diagnostic says what happened); while the process is replaced, frames are ``"idle"``."""
        self._check_open()
        if self._loop is not None:
            raise RuntimeError("run() drives the frames; dispose it before calling tick() yourself")
        with self._frame_lock:
            frame = self._fast_tick()
        if frame is not None:
            return frame
        index = self._submit()
        got = self._drain(0).get(index)
        return self._frame_of(index, got, emit=False)

    def _fast_tick(self) -> Frame | None:
        """The common frame, when nothing is to be shipped, no restart is under way, nothing is in flight and the
        clock runs: one request (with the parameters and writes since the last frame) and its answer, without the
        distributed engine's general bookkeeping. None where the general path must run."""
        c = self._clocks.get(WORKER)
        plan = self._plan
        if (c is None or plan is None or plan[0] is not self._split or plan[1] or self._dirty or self._inflight
                or self._down or self._rebuilding or self._held):
            return None
        with self._lock:
            params, writes = self._pending_params[WORKER], self._pending_writes[WORKER]
            if params:
                self._pending_params[WORKER] = {}
            if writes:
                self._pending_writes[WORKER] = {}
            observed = self._observed[WORKER]
            self._index += 1
            index = self._index
        inline = self._clock_message(WORKER, c, params, writes, observed)
        if c.can_mail and len(inline) <= _clock.MAIL_INLINE_MAX:  # the request in shared memory: no system call
            c.mail(index, inline)
            got = _clock.answer_mail(c, index, lambda w, seconds: self._on_silence(w, index, seconds))
        else:
            c.step(index, inline)
            got = _clock.answer(c, index, lambda w, seconds: self._on_silence(w, index, seconds))
        if type(got) is tuple and got[0] == "done" and not got[1] & _clock.MORE:  # a frame and nothing more to
            frame = got[2]  # collect (no diagnostics, no observed values): _report's one job that is left here
            if self._frames.observers:
                self._frames.emit(FragmentFrame(WORKER, index, frame))
            return self._worker_frame(index, frame)
        rep = self._clock_answer(WORKER, index, got, c)
        frames: dict = {WORKER: None}
        if isinstance(rep, tuple):
            self._step_failed(WORKER, rep[0], params, writes, rep[1])
        else:
            self._report(WORKER, index, rep, frames)
        return self._frame_of(index, DistributedFrame(index, frames))

    def _submit_locked(self) -> int:
        self._quarantine()
        if self._held:
            self._index += 1
            return self._index
        if WORKER in self._down and WORKER not in self._rebuilding:  # held until now: replace the process
            self._rebuild(WORKER)
        return super()._submit_locked()

    def _drain(self, keep: int) -> dict[int, DistributedFrame]:
        done = super()._drain(keep)
        for index, df in done.items():
            self._frame_of(index, df)
        return done

    def _frame_of(self, index: int, df: DistributedFrame | None, emit: bool = True) -> Frame:
        """The Frame of distributed frame ``index`` (:meth:`_worker_frame` of the GPU process's)."""
        return self._worker_frame(index, df.fragments.get(WORKER) if df is not None else None, emit)

    def _worker_frame(self, index: int, f: Frame | None, emit: bool = True) -> Frame:
        """Frame ``index`` as this engine gives it, from the GPU process's frame ``f`` (None: no GPU process ran
        it); with ``emit`` (off where its drain did it already) a good one moves the last good code on, and it is
        emitted on :attr:`frames`."""
        if f is not None:
            if f.state == "ok":
                if emit:
                    self._good_frame()
                if index > self.last_good:
                    self.last_good = index
            frame = _clock.reindexed(f, index)
        else:
            frame = Frame(index, 0.0, (), "error" if index in self._faulted else "idle", False)
        if emit and self._iframes.observers:
            self._iframes.emit(frame)
        return frame

    @property
    def frames(self) -> Observable:
        """One :class:`Frame` per frame, as a local engine's (``"error"`` for a frame a fault ended)."""
        return self._iframes.observable

    @property
    def diagnostics(self) -> Observable:
        """The GPU process's diagnostics, this side's (a fault, a rollback, the process back), as
        :class:`Diagnostic`."""
        return self._plain.observable

    def _publish(self, worker: str, d: Diagnostic) -> None:
        super()._publish(worker, d)
        self.diagnostic_log.append(d)
        self._plain.emit(d)

    def serve(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
              params: Iterable | None = None):
        """Serve this engine as a live web page, as ``rxcuda.Engine.serve`` does (the pipeline with its states,
        frame times, diagnostics, parameters as controls that set them through :meth:`set`, port previews). The
        page's server runs in this process: it stays up and connected while the GPU process faults and is
        replaced, and shows the fault's diagnostic, the rollback and the frames resuming. Figures the GPU process
        does not report are shown as not measured (``rxcuda/distributed/_isoview.py`` says which). Returns a
        :class:`rxcuda.view.LiveView`; ``close()`` stops it too."""
        self._check_open()
        return _isoview.serve(self, WORKER, host, port, token, params)

    def gl_buffer(self, port: PortHandle, glo: int) -> _isogl.IsolatedGLBuffer:
        """Draw ``port`` with the OpenGL buffer object named ``glo``, as :meth:`rxcuda.Engine.gl_buffer` does, in a
        way a fault cannot break: the buffer is registered in this process (whose CUDA context the GPU process's
        fault leaves working), the GPU process exports the port after each frame (CUDA IPC memory on a GPU, shared
        memory on the CPU device), and ``shared.tick()`` runs the frame and copies it into the buffer (one
        device-to-device copy on a GPU; on the CPU device one host upload). After a fault GL keeps the last good
        frame, and the next good frames draw again. Any typed port of this engine may be shared (its memory is
        not bound to the buffer, so a connected output works too). Tick from the thread of the GL context::

            shared = iso.gl_buffer(render["vertices"], vbo.glo)     # moderngl: ctx.buffer(reserve=n * 16)
            while drawing:
                shared.tick()                        # the frame in the GPU process, then the copy
                vao.render(moderngl.POINTS)          # GL draws what the frame wrote (the last good one)

        Returns an :class:`~rxcuda.distributed._isogl.IsolatedGLBuffer` (``close()`` stops sharing)."""
        self._check_open()
        _isogl.check(self, port, glo)
        if self._gl_side is None:
            self._gl_side = _isogl.GLSide(self.device_index, cpu=self._cpu, null=self._null)
        shared = _isogl.IsolatedGLBuffer(self, self._gl_side, port, glo)
        self._dirty = True  # the GPU process exports the port from the next frame on
        return shared

    def gl_texture(self, port: PortHandle, glo: int):
        """Refused: the isolated engine copies into GL buffers only (:meth:`gl_buffer`)."""
        raise NotImplementedError(f"IsolatedEngine shares GL buffers, not textures: draw {port.block.name}."
                                  f"{port.name} through a GL buffer (iso.gl_buffer(port, vbo.glo)), or copy it into "
                                  "the texture from iso.read() (moderngl: texture.write(iso.read(port)))")

    def _live_source(self):
        """What the live page and the notebook controls (``rxcuda.view.widgets(iso)``) read of this engine."""
        return _isoview.IsolatedSource(self, WORKER)

    # -- faults ----------------------------------------------------------------------------------------------
    def _good_frame(self) -> None:
        self._in_a_row = 0
        if self.faults and self.faults[-1].recovered_s is None:
            f = self.faults[-1]
            self.faults[-1] = attrs.evolve(f, recovered_s=time.perf_counter() - f.seen_at)
        if self._code_moved:
            self._code_moved = False
            self._good = self._codes()

    def _codes(self) -> dict[tuple[int, str], Any]:
        with self._lock:
            return {(b.id, k.name): k.code for b in self._model.blocks for k in b.description.kernels
                    if isinstance(k, KernelSpec)}

    def _on_change(self, event) -> None:  # (the model's changes, subscribed by the distributed engine)
        self._held = False  # a change: frames are tried again
        if type(event) is not ParameterChanged:
            self._code_moved = True
        super()._on_change(event)

    def _step_failed(self, w: str, err: Exception, params: dict, writes: dict, died: bool | None = None) -> None:
        if died is False or (died is None and not isinstance(err, _procs.RayActorError)):
            super()._step_failed(w, err, params, writes, died)
            return
        if w in self._down or w in self._gone:
            self._requeue(w, params, writes)
            return
        now = time.perf_counter()
        index = self._index
        self._faulted.add(index)
        actor = _procs.actor_of(self._actors[w])
        actor.settle()
        death = actor.deaths[-1] if actor.deaths else {}
        words, cause, code = _said(death.get("words")), death.get("cause"), death.get("exit")
        kind = "hang" if cause == "deadline" else "fault" if words else "crash"
        rolled = self._roll_back()
        what = {"hang": f"did not finish within its deadline of {self.deadline:g} s and its GPU process was ended"
                        + _loops(self._model.blocks),
                "fault": f"faulted on the GPU: {words}",
                "crash": f"ended with its GPU process ({_how(code)})"}[kind]
        subject, block_id = "frame", None
        if rolled:
            names = ", ".join(f"{k} (code from {src})" for k, src in rolled)
            what += (f". Rolled back to the last good code, and not taken again until it changes: {names}")
            subject = rolled[0][0].split(".")[0]
            block_id = next((b.id for b in self._model.blocks if b.name == subject), None)
        self._in_a_row += 1
        if self._in_a_row >= HOLD_AFTER and not rolled:
            self._held = True
            what += (f". The same pipeline faulted {self._in_a_row} times in a row: frames wait until a parameter, "
                     "code or the structure changes")
        else:
            what += ". The GPU process is replaced and rebuilds the pipeline with the last values and inputs"
        self.faults.append(Fault(index, kind, words or what, rolled, now))
        self._requeue(w, params, writes)
        self._down[w] = time.time()  # (wall clock, as the distributed engine's restarts count)
        self._publish(w, Diagnostic("error", subject, f"frame {index} {what}", index, block_id))
        if not self._held:
            self._rebuild(w)

    def _split_now(self) -> _placement.Split:
        """The distributed engine's split, with the blocks' positions (``devices``) in the GPU process's fragment
        and the GL buffers' ports exported to this process (:mod:`._isogl`)."""
        split = _isogl.with_exports(super()._split_now(), WORKER, self._gl_side)
        frag = split.fragments.get(WORKER)
        if not self._positions or frag is None:
            return split
        with self._lock:
            mine = {b.id: self._positions[b.id] for b in frag.description.blocks if b.id in self._positions}
        frag = attrs.evolve(frag, description=attrs.evolve(frag.description, placement=mine))
        return attrs.evolve(split, fragments={**split.fragments, WORKER: frag})

    def _ship_locked(self) -> None:
        if self.trial and self._good and WORKER in self._built and WORKER not in self._down:
            self._try_first()
        super()._ship_locked()

    def _try_first(self) -> None:
        """Only code (or launches) changed since the GPU process built the pipeline: run the new pipeline once in
        the standby first. Code that faults or hangs there is rolled back and quarantined before the GPU process
        sees it; a build error is left to the GPU process's own report."""
        with self._lock:
            frag = self._split_now().fragments.get(WORKER)
        was = self._built[WORKER]
        if frag is None or (key := _placement.structure(frag)) == was or \
                _placement.skeleton(key) != _placement.skeleton(was):
            return
        mine = {b.id for b in frag.description.blocks}
        writes = {r: a for r, a in self._writes.items() if r.block in mine}
        actor = _procs.actor_of(self._actors[WORKER])
        t0 = time.perf_counter()
        trial = attrs.evolve(frag, exports=())  # (a GL buffer's board stays the serving process's)
        ref = actor.call_standby("trial", (trial, writes), {}, timeout=self.deadline)
        if ref is None:
            return  # no standby ready: the code goes in untried
        try:
            ref.result(self.deadline + TRIAL_BUILD_S)
        except _procs.GetTimeoutError:
            actor.kill_standby("deadline")
            self._trial_failed(f"did not finish within the deadline of {self.deadline:g} s")
        except _procs.RayActorError as e:
            self._trial_failed(f"faulted: {_said(e.last_words) or e}")
        except _procs.RayTaskError:
            pass  # it cannot be built: the GPU process reports that as it would without a trial
        else:
            self.trial_s.append(time.perf_counter() - t0)

    def _trial_failed(self, what: str) -> None:
        rolled = self._roll_back()
        names = ", ".join(f"{k} (code from {src})" for k, src in rolled) or "the new code"
        subject = rolled[0][0].split(".")[0] if rolled else "trial"
        block_id = next((b.id for b in self._model.blocks if b.name == subject), None)
        message = (f"{names}: its trial run in the standby process {what}. It never reached the running graph: the "
                   "last good code keeps running, and this code is not taken again until it changes")
        self.faults.append(Fault(self._index, "trial", message, rolled, time.perf_counter(), 0.0))
        self._publish(WORKER, Diagnostic("error", subject, message, self._index, block_id))

    def _roll_back(self) -> tuple[tuple[str, str], ...]:
        """Code that had not completed a frame when the fault came goes back to the code that had; its key is
        remembered (quarantine)."""
        out = []
        now = self._codes()
        for key, code in now.items():
            good = self._good.get(key)
            if good is None or good.key == code.key:
                continue
            self._bad.setdefault(key, set()).add(code.key)
            block = self._block(key[0])
            if block is not None:
                block.set_code(key[1], good)
                out.append((f"{block.name}.{key[1]}", code.origin))
        return tuple(out)

    def _quarantine(self) -> None:
        """Code that faulted before, set again (the same file saved unchanged, set_code with it) goes back to the
        last good code with a diagnostic, before it reaches the GPU process."""
        if not self._bad or not self._dirty:
            return
        for key, code in self._codes().items():
            if code.key in self._bad.get(key, ()):
                good, block = self._good.get(key), self._block(key[0])
                if good is None or block is None:
                    continue
                block.set_code(key[1], good)
                self._publish(WORKER, Diagnostic("error", block.name, f"{block.name}.{key[1]}: the code from "
                                                 f"{code.origin} faulted before and is not taken again until it "
                                                 "changes; the last good code keeps running", self._index, block.id))

    def _block(self, bid: int) -> Block | None:
        return next((b for b in self._model.blocks if b.id == bid), None)

    def _check_restarts(self) -> None:
        was = WORKER in self._down
        super()._check_restarts()
        if was and WORKER not in self._down and self.faults and self.faults[-1].back_s is None:
            f = self.faults[-1]
            self.faults[-1] = attrs.evolve(f, back_s=time.perf_counter() - f.seen_at,
                                           build_s=self._where.get(WORKER, {}).get("build_s"))

    def _on_silence(self, w: str, index: int, seconds: float) -> None:
        if seconds >= self.deadline:
            _procs.actor_of(self._actors[w]).kill(no_restart=False, cause="deadline")
            return
        super()._on_silence(w, index, seconds)

    # -- data ----------------------------------------------------------------------------------------------------
    def read(self, port: PortHandle, *, out=None):
        """The port's value after the frames submitted so far (into ``out`` where given, as
        :meth:`rxcuda.Engine.read`). While the GPU process is replaced after a fault, waits for it (up to the
        deadline plus a start) and reads the rebuilt pipeline's value; raises :class:`RestartingError` if it does
        not come back. The GPU process copies the port into page-locked shared memory: a read of 64 KiB or more
        without ``out`` comes back as an array in that memory, with no copy in this process (``_readback``);
        others are copied out of it. Through the frame clock when it runs (no call between threads), else by a
        call."""
        self._check_open()
        self.placement(port.block)
        ref = PortRef(port.block.id, port.name)
        end = time.monotonic() + self.deadline + _procs.START_TIMEOUT_S
        while True:
            with self._frame_lock:
                self._ship()
                self._drain(0)
                self._wait_back(end)
                into = self._slabs.offer(ref) if out is None else None  # a large read lands in an array of yours
                got = self._clock_read(ref, into)
                if got is not None and got[0]:  # (its array made in the lock: no other read is offered its slab)
                    return self._take(ref, got[1], out)
            if got is not None:
                raise got[1]
            try:  # (a call, outside the lock: never into a slab)
                handle = _procs.get(self._actors[WORKER].read_shared.remote(ref, None),
                                    timeout=max(0.0, end - time.monotonic()))
                return self._take(ref, handle, out)
            except _procs.RayActorError:
                continue  # it died while reading: the restart is seen by the next frame's check
            except _procs.GetTimeoutError:
                _procs.actor_of(self._actors[WORKER]).kill(no_restart=False, cause="deadline")
                raise RestartingError(f"reading {port.block.name}.{port.name} took past the deadline; the GPU "
                                      "process was ended and is replaced") from None

    def _clock_read(self, ref: PortRef, into: tuple[str, int] | None) -> tuple | None:
        """(ok, the handle or the error) of a read through the GPU process's clock, when nothing else is under
        way; None where the call must do it (no clock, frames in flight, a restart, or the process died)."""
        c = self._clocks.get(WORKER)
        if c is None or self._inflight or self._down or self._rebuilding or self._held:
            return None
        got = _clock.answer(c, c.read((ref, into)), lambda w, seconds: self._on_silence(w, self._index, seconds))
        return None if got == "dead" else got

    def _take(self, ref: PortRef, handle: tuple, out):
        """The array the GPU process's answer ``handle`` (path, shape, dtype) names: a slab's memory itself, else
        copied out of its own file (into ``out`` where given)."""
        path, shape, dtype = handle
        self._slabs.learn(ref, math.prod(shape) * dtype.itemsize)
        got = self._slabs.array(path, shape, dtype)
        return self._shared.take(handle, out) if got is None else got

    def _wait_back(self, end: float) -> None:
        while WORKER in self._down and time.monotonic() < end:
            self._check_restarts()
            if WORKER in self._down:
                time.sleep(0.002)
        if WORKER in self._down or WORKER in self._gone:
            raise RestartingError("the GPU process is being replaced after a fault and is not back yet")

    def close(self) -> None:
        """Stop the frames, end the GPU process (and its standby) and remove what they left in shared memory."""
        if self._gl_side is not None:  # (its mappings of the GPU process's memory closed before that process ends)
            self._gl_side.close()
            self._gl_side = None
        super().close()
        self._shared.close()
        self._slabs.close()
        self._iframes.close()  # completes the subscribers (a live page stops with the engine)
        self._plain.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until a GPU process serves the pipeline again (after a fault)."""
        self._wait_back(time.monotonic() + timeout)

    def __repr__(self) -> str:
        where = f"devices={list(self.devices)}" if self.devices is not None else f"device={self.device_index}"
        return (f"<IsolatedEngine {where} blocks={len(self._placement)} frame={self._index} "
                f"faults={len(self.faults)}>")
