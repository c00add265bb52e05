"""The frame runner: the one object that launches frames, and the thread that may touch the GPU.

``engine.tick()``, the profiled and debug launches, ``engine.run_batch`` and ``engine.run``'s frame loop all
go through one :class:`FrameRunner`. It is handed what a frame needs -- the runtime it reads the running
graph from, the stream and fast driver, the pending plan's ``apply``, data in and out, the profiler's
rings, the batch graph and the frames streams -- and never the Engine, whose verbs only check their
arguments and delegate here (see docs/architecture.md). It is where several devices' graphs will launch.

A frame, in order: apply what is pending (``Updater.apply_pending``), stage fed inputs, launch (one
``cuGraphLaunch`` with no profiling; event records, stamp rows or node-by-node eager launches with it),
queue the observed outputs' copies, wait when asked, count the frame, deliver outputs, publish the Frame.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..cuda._cpu import CpuDriver
from ..cuda._driver import is_sticky
from ..cuda._stream import destroy_event
from ..model._errors import CudaError, DeviceLostError
from ..model._events import ProfileChanged, merge_tiers
from ..streams._broadcast import Broadcast
from ..streams._scheduler import SWITCH_INTERVAL, FrameLoop
from ._batch import Batches
from ._devices import DeviceGraphs
from ._io import DataIO
from ._loops import LoopBounds
from ._profile import Phases, Profiler, stamps_for
from ._records import Diagnostic, Frame
from ._runtime import Runtime

_now = time.perf_counter_ns
_ident = threading.get_ident
_tuple_new = tuple.__new__
UNTIMED = (None, 1, None, None, None)  # a frame's (gpu_us, frames, blocks, kernels, phases) when nothing is timed


def check_frame_count(k) -> None:
    """``engine.run_batch``'s frame count: an int from 1 to 2**32-1 (the device loop counts in 32 bits)."""
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k < 2**32:
        raise ValueError(f"run_batch takes a frame count from 1 to 2**32-1 (got {k!r})")


class FrameRunner:
    """Launches the frames of one engine (see the module's docstring for what it is handed).

    ``plain``: no profiling and no debug, so a frame is one launch (and a wait); ``configure`` keeps it.
    ``gpu_thread``: the thread that made the device current last (the frame thread while ``run`` drives).
    """

    def __init__(self, rt: Runtime, apply_pending: Callable[..., tuple], io: DataIO, profiler: Profiler,
                 batches: Batches, frames: Broadcast, timings: Broadcast):
        self.rt = rt  # the running graph (rt.graph) and the frame count (rt.frame), shared with the builder
        self.apply_pending = apply_pending
        self.pending = rt.pending
        self.io = io
        self.profiler = profiler
        self.batches = batches
        self.frames = frames
        self.timings = timings
        self.lost: DeviceLostError | None = None  # the context is gone: every GPU verb raises this
        self.device = rt.device
        self.fast = rt.fast
        self.stream = rt.stream_h
        self.reporter = rt.reporter
        self.loops = LoopBounds(rt)  # the Whiles that ran all their passes (read after a frame with regions)
        self.level = "none"  # the profiling level (rxcuda.engine._profile)
        self.debug = False
        self.plain = True
        self.last: Frame | None = None
        self.gpu_thread: int | None = _ident()
        self.loop: FrameLoop | None = None  # the frame loop of run() while it drives
        self.last_loop: FrameLoop | None = None
        self._stop: Callable[[], None] | None = None  # ends the run() in progress
        # the summary level's event pair (the common profiled frame: two records, no ring)
        self._ev_start, self._ev_end = rt.device.create_event(), rt.device.create_event()
        self._ev_start_h, self._ev_end_h = int(self._ev_start), int(self._ev_end)

    def configure(self, level: str, debug: bool) -> None:
        """The profiling level (a checked one of rxcuda.engine._profile.LEVELS) and debug mode the next frames
        run with. A level that adds or removes stamp nodes asks for a rebuild (a ProfileChanged)."""
        rt = self.rt
        before = rt.stamps
        self.level = self.profiler.level = level
        self.debug = debug
        self.plain = level == "none" and not debug
        rt.stamps = stamps_for(level)
        if rt.devices is not None:  # several devices: each device's part of a frame is timed too
            rt.devices.timed = level != "none"
        if rt.stamps != before and rt.blocks:
            rt.pending.add(ProfileChanged(level))

    def lose(self, err: CudaError) -> DeviceLostError:
        """The context is gone (sticky error): say so once, clearly, and refuse GPU work from now on."""
        if self.lost is None:
            g = self.rt.graph
            if err.node is not None:  # Engine(debug=True) found the node
                kernels: tuple[str, ...] = (err.node,)
            else:
                kernels = tuple(dict.fromkeys(n.label for n in g.plan.nodes)) if g is not None else ()
            device: int | str = "cpu" if isinstance(self.device.api, CpuDriver) else self.device.ordinal
            if self.rt.devices is not None and device != "cpu":  # several GPUs: the lost one, its kernels
                device, kernels = self.rt.devices.fault(g, kernels)
            self.lost = DeviceLostError(err.call, err.name, err.explanation, err.code, device=device,
                                        kernels=kernels[:8], exact=err.node is not None)
            self.reporter.publish(Diagnostic("error", "engine", str(self.lost), self.rt.frame))
        return self.lost

    # -- one frame -----------------------------------------------------------------------------------
    def tick(self, sync: bool) -> Frame:
        """Apply what is pending, launch the running graph once (if there is one), publish the Frame."""
        t0 = _now()
        if _ident() != self.gpu_thread:
            self.device.make_current()
            self.gpu_thread = _ident()
        rt = self.rt
        try:
            # under run() a structural change is prepared off this thread and swapped in once ready
            tiers = self.apply_pending(False, self.loop is not None) if self.pending.count or rt.preparing else ()
            if rt.carried:  # applied since the last frame by a read or array() that needed them
                tiers, rt.carried = merge_tiers(rt.carried, tiers), ()
            g = rt.graph
            timed = UNTIMED
            if g is not None:
                io = self.io
                if io.feeds:
                    io.stage_feeds(g)
                if self.plain:  # no profiling, no debug: the frame is one launch (and a wait)
                    stream = self.stream
                    err = g.launcher(stream)
                    if err:
                        self.fast.raise_for(err, "cuGraphLaunch")
                    if rt.after_launch:  # a rebuild's old graph: destroyed while this frame runs
                        rt.launched()
                    if io.taps:
                        io.enqueue_taps(g, rt.frame + 1)  # before the sync: a synced frame's outputs come with it
                    if sync:
                        self.fast.wait(stream)
                else:
                    timed = self._instrumented(g, sync, t0)
                    if rt.after_launch:
                        rt.launched()
        except CudaError as e:
            if is_sticky(e):
                raise self.lose(e) from e
            raise
        rt.frame += 1
        if g is not None and self.io.taps:
            self.io.deliver_taps(sync, self.reporter.warn)
        # a While that ran all its passes: a host memory read per While (graphs without regions skip it)
        bounded = self.loops.check(g, rt.frame) if g is not None and g.regions else ()
        state = self.reporter.state
        if g is None and state != "error":
            state = "idle"  # (no graph because nothing was built; a failed first build is an "error" frame)
        frame = _tuple_new(Frame, (rt.frame, (_now() - t0) / 1e3, tiers, state, g is not None,
                                   *timed, bounded))  # Frame(...) without its Python-level __new__
        self.last = frame
        if self.frames.observers:
            self.frames.emit(frame)
        return frame

    def _instrumented(self, g, sync: bool, t0: int) -> tuple:
        """A frame with profiling (see rxcuda.engine._profile) or ``debug`` (node by node, each waited for):
        (gpu_us, frames, blocks, kernels, phases) for its Frame."""
        fast, prof, io, stream = self.fast, self.profiler, self.io, self.stream
        frame = self.rt.frame + 1
        level = prof.level
        if level == "summary" and sync and not self.debug and not self.timings.observers:
            # the common case kept lean: one event pair, read after the wait, nothing queued
            fast.record(self._ev_start_h, stream)
            err = g.launcher(stream)
            if err:
                fast.raise_for(err, "cuGraphLaunch")
            fast.record(self._ev_end_h, stream)
            if io.taps:
                io.enqueue_taps(g, frame)
            fast.wait(stream)
            return fast.elapsed_us(self._ev_start_h, self._ev_end_h), 1, None, None, None
        phases = Phases() if level == "deep" else None
        if phases is not None:
            phases.t = t0
            phases.mark("apply")
        if level == "deep_sync":
            eager = prof.run_eager(g, stream, frame)
            if io.taps:
                io.enqueue_taps(g, frame)
            return eager.gpu_us, 1, eager.blocks, eager.kernels, None
        slot = prof.begin(stream) if level != "none" else -1
        if self.debug:
            g.run_eagerly(stream, check_each=True)
        else:
            err = g.launcher(stream)
            if err:
                fast.raise_for(err, "cuGraphLaunch")
        if slot >= 0:
            prof.end(stream, slot, frame, g)
        if io.taps:
            io.enqueue_taps(g, frame)
        if phases is not None:
            phases.mark("launch")
        if sync:
            fast.wait(stream)
            if phases is not None:
                phases.mark("sync")
        if slot < 0:
            return UNTIMED
        times = prof.collect(sync)
        if times is None or times.frame != frame:  # this frame's timings come later (engine.timings)
            return None, 1, None, None, phases.out if phases else None
        return times.gpu_us, 1, times.blocks, times.kernels, phases.out if phases else None

    # -- k frames, one launch ------------------------------------------------------------------------
    def run_batch(self, k: int, stop_ref) -> Frame:
        """``engine.run_batch(k, until=...)`` (see its docstring): apply what is pending, launch the batch graph
        once (over several devices: each device's graphs k times, queued from the host), wait, and publish one
        Frame for the batch. ``k``: checked by ``check_frame_count``; ``stop_ref``:
        the PortRef of the stop flag, or None."""
        t0 = _now()
        if _ident() != self.gpu_thread:
            self.device.make_current()
            self.gpu_thread = _ident()
        rt, io, batches, prof, stream = self.rt, self.io, self.batches, self.profiler, self.stream
        try:
            tiers = self.apply_pending() if self.pending.count or rt.preparing else ()
            if rt.carried:
                tiers, rt.carried = merge_tiers(rt.carried, tiers), ()
            g = rt.graph
            if g is None:
                return self.tick(True)
            stop = batches.stop_flag(stop_ref, g) if stop_ref is not None else None
            # several devices: no GPU loop spans them, so the frames are queued from the host (launch_frames)
            batch = batches.prepare(stop) if rt.devices is None else None
            if io.feeds:
                io.stage_feeds(g)
            slot = prof.begin(stream) if prof.level != "none" else -1
            if batch is not None:
                batch.launch(k, stream)
            else:
                assert isinstance(g, DeviceGraphs)
                if err := g.launch_frames(stream, k):
                    self.fast.raise_for(err, "cuGraphLaunch")
            if slot >= 0:
                prof.record_end(stream, slot)
            if io.taps:
                io.enqueue_taps(g, rt.frame + k)
            self.fast.wait(stream)
            frames = batches.frames_run(k) if batch is not None else k
            times = None
            if slot >= 0:  # the batch's GPU time; per-block timings are the last frame's
                prof.finish(slot, rt.frame + frames, g, frames)
                times = prof.collect(True)
        except CudaError as e:
            if is_sticky(e):
                raise self.lose(e) from e
            raise
        rt.frame += frames
        if io.taps:
            io.deliver_taps(True, self.reporter.warn)
        bounded = self.loops.check(g, rt.frame) if g.regions else ()  # (the batch's last frame)
        frame = Frame(rt.frame, (_now() - t0) / 1e3, tiers, self.reporter.state, True,
                      times.gpu_us if times else None, frames, times.blocks if times else None,
                      times.kernels if times else None, loops_at_bound=bounded)
        self.last = frame
        if self.frames.observers:
            self.frames.emit(frame)
        return frame

    # -- the frame thread ----------------------------------------------------------------------------
    def check_caller(self, verb: str) -> None:
        """Refuse a frame asked for from another thread while ``run`` drives the frames."""
        loop = self.loop
        if loop is not None and threading.current_thread() is not loop.thread:
            raise RuntimeError(f"engine.run(...) drives the frames on its own thread; dispose it before calling "
                               f"{verb}() yourself")

    def on_gpu(self, fn, *args):
        """Run ``fn(*args)`` where the GPU may be touched: here, or on the frame thread while ``run`` drives;
        a sticky driver error becomes the engine's DeviceLostError."""
        loop = self.loop
        if loop is not None and threading.current_thread() is not loop.thread:
            return loop.call(fn, *args)
        if _ident() != self.gpu_thread:
            self.device.make_current()
            self.gpu_thread = _ident()
        try:
            return fn(*args)
        except CudaError as e:
            if is_sticky(e):
                raise self.lose(e) from e
            raise

    def run(self, clock, sync: bool, switch_interval: float | None) -> Callable[[], None]:
        """Drive frames on a thread of their own (``engine.run``, see its docstring); returns what stops it."""
        if self.loop is not None:
            raise RuntimeError("the engine is already running; dispose the previous run() first")
        reporter = self.reporter

        def on_error(e: Exception) -> None:
            reporter.error(e, None, "frame", keeps="the frame loop goes on")

        def tick() -> None:
            self.tick(sync)

        loop = FrameLoop(tick, self.device.make_current, on_error)
        self.loop = self.last_loop = loop
        try:
            stop = loop.start(clock)  # a bad clock raises before the thread starts
        except BaseException:
            self.loop = None
            raise
        if switch_interval is not None:
            SWITCH_INTERVAL.acquire(switch_interval)
        stopped = False

        def dispose() -> None:
            nonlocal stopped
            if stopped:
                return
            stopped = True
            stop.dispose()
            if switch_interval is not None:
                SWITCH_INTERVAL.release()
            if self.loop is loop:
                self.loop = None
            self.gpu_thread = None
            if self._stop is dispose:
                self._stop = None

        self._stop = dispose
        return dispose

    def stop(self) -> None:
        """End the ``run`` in progress, if any (``engine.close``)."""
        if self._stop is not None:
            self._stop()

    def close(self) -> None:
        """Free the batch graph, the profiler's rings and the frame events (the caller waited for the GPU)."""
        from ._runtime import quietly

        api = self.rt.api
        quietly(self.batches.release)
        quietly(self.profiler.close)
        for ev in (self._ev_start, self._ev_end):
            quietly(lambda ev=ev: destroy_event(ev, api=api))
