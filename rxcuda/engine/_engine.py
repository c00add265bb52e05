"""The engine: one per GPU. A small facade over its verbs -- the model (blocks, connections, bindings),
the Structure tier (``_build``), updates by tier (``_update``), data in and out (``_io``) -- and the frame
loop that applies what is pending and launches the graph.

Only the thread that calls ``tick()`` (or ``run()``'s thread) touches the GPU. Other threads may set
parameters, connect, add or remove blocks: that only folds a change into the pending plan.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import overload

import numpy as np
from reactivex import Observable
from reactivex.disposable import Disposable

from ..cuda import _nvtx
from ..cuda._device import Device
from ..cuda._driver import is_sticky
from ..cuda._fast import FastDriver
from ..cuda._memory import BufferPool, resolve_device_array
from ..cuda._modules import ModuleCache
from ..cuda._stream import destroy_event, destroy_stream
from ..model import _dtypes
from ..model._describe import PipelineDescription, PortRef
from ..model._errors import CudaError, DeviceLostError, EngineClosedError
from ..model._events import Tier
from ..streams._broadcast import Broadcast
from ..streams._coalesce import PendingPlan, UpdatePlan
from ..streams._scheduler import SWITCH_INTERVAL, FrameLoop
from . import _batch, _profile, _shapes_io
from ._batch import Batches
from ._blocks import Block, PortHandle, resolve_port
from ._build import Builder
from ._composite import Composite, CompositeInstance, Composites
from ._io import DataIO
from ._model import Model
from ._ports import EngineStream
from ._records import AppliedUpdate, Diagnostic, Frame, Reporter
from ._regions import Region, add_region, remove_region_member
from ._reload import HotReload
from ._replace import replace_block
from ._runtime import Runtime, quietly
from ._tooltips import Link
from ._update import Updater
from .plan._liveness import BufferStats, buffer_stats
from .plan._plan import GraphPlan

_now = time.perf_counter_ns
_ident = threading.get_ident
_tuple_new = tuple.__new__
_UNTIMED = _profile.UNTIMED


# while run() drives the frames, the interpreter hands the GIL over this often (seconds): with Python
# threads producing values flat out, the engine thread waits up to this long for the GIL at each wake-up
RUN_SWITCH_INTERVAL = 0.0002


class Engine:
    """Compiles the pipeline into one CUDA graph and launches it every frame.

    >>> import numpy as np, rxcuda
    >>> with rxcuda.Engine() as engine:                                                  # doctest: +SKIP
    ...     add = engine.add(rxcuda.Block.from_kernel("kernels/vector_add.ptx", size=1024))
    ...     engine.write(add["a"], np.ones(1024, np.float32)); engine.write(add["b"], np.ones(1024, np.float32))
    ...     engine.tick()
    ...     engine.read(add["out"])[:3]
    array([2., 2., 2.], dtype=float32)

    ``device``: the GPU ordinal. ``sync``: whether ``tick()`` waits for the frame by default. ``timing``:
    record GPU time per frame (``Frame.gpu_us``; two event records a frame): the ``summary`` profiling level.
    ``profile``: the profiling level (``engine.profile``: ``none``, ``summary``, ``per_block``, ``per_kernel``,
    ``deep``, ``deep_sync``). ``debug``: run each frame's
    nodes one by one, waiting after each (slow), so a faulting kernel is named in the error. ``driver``:
    ``None`` for the CUDA driver, or a ``rxcuda.cuda.NullDriver`` that records the driver calls and runs no
    GPU work (tests). ``reuse_memory``: intermediate buffers whose lifetimes never overlap share memory
    (``engine.stats`` tells what that saved); False gives every buffer its own (debugging, comparisons).
    """

    def __init__(self, device: int = 0, *, sync: bool = True, timing: bool = False, debug: bool = False,
                 profile: str = "none", driver=None, reuse_memory: bool = True):
        self._debug = False
        self._profile_level = "none"
        self.debug = debug
        self.profile = _profile.check_level(profile)
        self.timing = timing
        try:
            self._open(device, sync, driver)
        except CudaError as e:
            if is_sticky(e):  # another engine (or library) in this process lost the context
                raise DeviceLostError(e.call, e.name, e.explanation, e.code, device=device) from e
            raise
        self._rt.reuse_memory = bool(reuse_memory)
        self.profile = self._profile_level  # now that the runtime exists: tell it what to stamp

    def _open(self, device: int, sync: bool, driver) -> None:
        dev = Device(device, api=driver)
        api = dev.api
        if driver is None:
            from ..sources import _nvrtc  # imported here, on the caller's thread, before any other thread

            _nvrtc.warm_up(dev.arch)  # NVRTC's ~200 ms first call, paid off the frame path (background thread)
        self.device = dev
        self.sync = sync
        blocks: dict[int, Block] = {}
        rt = Runtime(
            device=dev, api=api, fast=FastDriver(api=api), stream=dev.create_stream(),
            capture_stream=dev.create_stream(), pool=BufferPool(api), modules=ModuleCache(api),
            pending=PendingPlan(self._change_subscriber_failed), reporter=Reporter(blocks, self._frame_index),
            blocks=blocks)
        self._rt: Runtime = rt
        self._io = DataIO(rt, self._ensure_built, self)
        self._model = Model(rt, self._io)
        self._composites = Composites(rt, self._model)
        self._builder = Builder(rt, self._io.upload_staged)
        self._updater = Updater(rt, self._builder)
        self._batches = Batches(rt, self._updater)  # engine.run_batch's graph, made on first use
        self._frames = Broadcast(on_error=self._frame_subscriber_failed)
        self._timings = Broadcast(on_error=self._frame_subscriber_failed)
        self._profiler = _profile.Profiler(rt, rt.fast, self._timings.emit)
        self._file_changes = Broadcast(on_error=self._file_subscriber_failed)
        self._loop: FrameLoop | None = None
        self._last_loop: FrameLoop | None = None
        self._stop_run: Callable[[], None] | None = None  # ends the run() in progress
        self._reload: HotReload | None = None
        self._ev_start = dev.create_event()
        self._ev_end = dev.create_event()
        self._ev_start_h, self._ev_end_h = int(self._ev_start), int(self._ev_end)
        self._gpu_thread: int | None = threading.get_ident()
        self._closed = False
        self._lost: DeviceLostError | None = None
        self.last_frame: Frame | None = None
        # under Nsight (NVTX collecting) each frame is an NVTX range; otherwise nothing changes, not even a check
        _nvtx.instrument(self, _tick="tick", run_batch="run_batch")

    # -- the model: blocks and connections (any thread) --------------------------------------------------
    @overload
    def add(self, block: Composite) -> CompositeInstance: ...
    @overload
    def add(self, block: Block) -> Block: ...
    def add(self, block):
        """Add a block; the next tick rebuilds the graph with it. Returns the block.

        A composite (``rxcuda.Composite``) is added as a new instance of its blocks, named ``instance/member``,
        with its inner connections; returns the :class:`CompositeInstance` (``instance["x"]`` for its ports).

        A block whose name is taken is renamed ``name_2``, ``name_3``, ... (``block.name`` tells). A region
        (``If``, ``While``, ...) comes with the blocks of its bodies that are not in the engine yet, and its
        condition port is connected."""
        self._check_open()
        if isinstance(block, Composite):
            inst = self._composites.add(block, self)
            if self._reload is not None:
                self._reload.refresh()
            return inst
        if isinstance(block, Region):
            add_region(self, block)
            return block
        self._model.add(block, self)
        if self._reload is not None:
            self._reload.refresh()
        return block

    def remove(self, block: Block | CompositeInstance) -> None:
        """Remove a block with its connections and bindings; the next tick rebuilds without it. Removing a
        region removes the blocks of its bodies too; removing a block of a region's body takes it out of the
        body. Removing a composite instance removes every block inside it (a block inside one is removed only
        with it)."""
        if isinstance(block, CompositeInstance):
            self._composites.remove(block, self._gpu)
            return
        self._composites.check_removable(block)
        if isinstance(block, Region) or self._rt.regions:
            remove_region_member(self, block)
            return
        self._model.remove(block, self._gpu)

    def replace(self, old: Block, new: Block) -> Block:
        """Put ``new`` in ``old``'s place (the hot-swap); returns ``new``.

        ``new`` takes ``old``'s name and keeps every connection (both directions), bound array, host-written
        or stream-fed input and observed port, matched by port name: each must be a port of ``new`` that fits
        (same direction, and the type and size its other end or stream needs), else a ValidationError names
        the port and the engine is unchanged. Parameter values carry over: each parameter of ``new`` whose
        name and type match one of ``old``'s takes the value ``old`` had, unless you changed it on ``new``
        after making it (a value other than its default); a launch set on ``old`` carries over to ``new``'s
        kernel of the same name unless ``new`` has its own. ``old``'s parameter bindings (``param.bind``)
        end; composite parameters that set ``old`` now set ``new``.

        When ``new``'s description equals ``old``'s (its name and parameter defaults aside), the running graph
        is kept: nothing is rebuilt, and values or launches that differ are hot updates. Otherwise the next
        tick rebuilds.

        >>> twin = engine.replace(mul, Block.from_kernel("kernels/scalar_mul.ptx", size=1024))  # doctest: +SKIP
        >>> engine.tick().tiers                     # the same description: nothing to do  # doctest: +SKIP
        ()
        """
        self._check_open()
        replace_block(self._rt, self._io, self, old, new, self._composites.replaced)
        if self._reload is not None:
            self._reload.refresh()
        return new

    @property
    def composites(self) -> tuple[CompositeInstance, ...]:
        """The composite instances in the engine (outermost ones; ``instance.members`` holds nested ones)."""
        with self._rt.lock:
            return tuple(self._composites.instances.values())

    @property
    def blocks(self) -> tuple[Block, ...]:
        with self._rt.lock:
            return tuple(self._rt.blocks.values())

    @property
    def connections(self) -> tuple[Link, ...]:
        """Every connection as a :class:`Link` ``(src, dst)`` of port handles (with its ``delay``);
        ``str(link)`` tells what travels on it."""
        rt = self._rt
        with rt.lock:
            return tuple(Link(PortHandle(rt.blocks[c.src.block], c.src.port),
                              PortHandle(rt.blocks[c.dst.block], c.dst.port), getattr(c, "delay", 0))
                         for c in rt.connections.values())

    def connect(self, src: PortHandle, dst: PortHandle, *, delay: int = 0, initial=None) -> None:
        """Connect an output port to an input port. Raises ValidationError at once if the ports don't fit
        (direction, dtype, size, an existing connection, a cycle); the engine is left unchanged.

        ``delay=1``: feedback across frames. The input reads the value the output had at the end of the
        previous frame, so the connection may close a cycle (a block may feed itself). Frame 0 reads
        ``initial``: None (zeros), a number (every element) or an array of the output's dtype and element
        count. Every delayed input fed by one output shares one previous-frame buffer, kept with its contents
        through rebuilds that leave the connection alone (``reset_delays()`` starts it over).

        >>> acc = engine.add(rxcuda.Block.from_kernel("kernels/vector_add.ptx", size=n))     # doctest: +SKIP
        >>> engine.connect(acc["out"], acc["a"], delay=1)   # out = previous out + b        # doctest: +SKIP
        """
        self._check_open()
        self._model.connect(src, dst, delay, initial)

    def disconnect(self, src: PortHandle, dst: PortHandle) -> None:
        """Remove a connection, delayed or not (a rebuild on the next tick). The last delayed connection from
        an output takes its previous-frame buffer with it."""
        self._model.disconnect(src, dst)

    def reset_delays(self) -> None:
        """Give every delayed connection's previous-frame buffer its frame-0 value again (zeros, or the
        ``initial`` given to ``connect``), after the frames in flight: the next frame reads it as frame 0 did.
        Feedback state (an accumulator, particle positions) starts over; nothing is rebuilt.

        >>> engine.reset_delays()                                                        # doctest: +SKIP
        """
        self._check_open()
        self._gpu(self._builder.delays.reset)

    def bind(self, port: PortHandle, array) -> None:
        """Use a device array (CuPy, PyTorch, anything with DLPack or ``__cuda_array_interface__``) as a
        port's memory, zero-copy. The engine's stream waits for the array's producer stream first (the
        protocols' contract; an event wait, no device sync): for work you queue on it later, call
        ``engine.wait(stream)``. Rebinding a bound port to another array of the same dtype and at least the
        same size is a warm update (no rebuild). A read-only array is refused for a port the pipeline writes.
        A NumPy array is copied into the port's own buffer."""
        self._check_open()
        if isinstance(array, np.ndarray):
            self.write(port, array)
            return
        self._model.bind(port, self._gpu(resolve_device_array, array, self._rt.stream_h))

    def unbind(self, port: PortHandle) -> None:
        """Give a port its own engine-owned buffer again (a rebuild)."""
        self._model.unbind(port)

    def _ref(self, port: PortHandle) -> PortRef:
        return resolve_port(port, self._rt.blocks)

    def describe(self) -> PipelineDescription:
        """The pipeline as pure data (what ``rxcuda.plan`` takes)."""
        return self._rt.snapshot()

    # -- frames (the GPU thread) ---------------------------------------------------------------------------
    def tick(self, sync: bool | None = None) -> Frame:
        """Apply pending changes, launch the graph once, and (by default) wait for it."""
        self._check_open()
        if self._loop is not None and threading.current_thread() is not self._loop.thread:
            raise RuntimeError("engine.run(...) drives the frames on its own thread; dispose it before calling "
                               "tick() yourself")
        return self._tick(self.sync if sync is None else sync)

    def _tick(self, sync: bool) -> Frame:
        t0 = _now()
        if _ident() != self._gpu_thread:
            self.device.make_current()
            self._gpu_thread = _ident()
        rt = self._rt
        try:
            tiers = self._updater.apply_pending() if rt.pending.count else ()
            g = rt.graph
            timed = _UNTIMED
            if g is not None:
                io = self._io
                if io.feeds:
                    io.stage_feeds(g)
                stream = rt.stream_h
                if self._plain:  # no profiling, no debug: the frame is one launch (and a wait)
                    err = g.launcher(stream)
                    if err:
                        rt.fast.raise_for(err, "cuGraphLaunch")
                    if io.taps:
                        io.enqueue_taps(g, rt.frame + 1)  # before the sync: a synced frame's outputs come with it
                    if sync:
                        rt.fast.wait(stream)
                else:
                    timed = _profile.launch_instrumented(self, g, stream, sync, t0)
        except CudaError as e:
            if is_sticky(e):
                raise self._lose(e) from e
            raise
        rt.frame += 1
        if g is not None and self._io.taps:
            self._io.deliver_taps(sync, self._warn)
        frame = _tuple_new(Frame, (rt.frame, (_now() - t0) / 1e3, tiers, "idle" if g is None else rt.reporter.state,
                                   g is not None, *timed))  # Frame(...) without its Python-level __new__
        self.last_frame = frame
        if self._frames.observers:
            self._frames.emit(frame)
        return frame

    def run_batch(self, k: int, *, until: PortHandle | None = None) -> Frame:
        """Run ``k`` frames with one host launch, the GPU looping over the frame graph itself; returns when the
        GPU is done, with one :class:`Frame` for the batch (``frames``: how many ran; ``index``: the last).

        Changes made before the call (parameters, code, structure) apply before the batch, as for ``tick``;
        fed inputs are read once per batch and ``observe`` delivers the batch's last frame; append counts are
        the last frame's. With ``until`` (a port holding one u32/bool flag, such as a residual check's
        ``converged``), the batch ends after the first frame that leaves the flag nonzero. A batch gives, bit
        for bit, what ``k`` ticks give.

        >>> frame = engine.run_batch(1000)                       # doctest: +SKIP
        >>> frame = engine.run_batch(500, until=check["done"])   # doctest: +SKIP
        >>> frame.frames                                         # doctest: +SKIP
        37
        """
        return _batch.run_batch(self, k, until)

    @property
    def timing(self) -> bool:
        """Whether frames are timed (any profiling level but ``none``); setting it True selects ``summary``
        (when no level is set) and False selects ``none`` (from ``summary``)."""
        return self._profile_level != "none"

    @timing.setter
    def timing(self, on: bool) -> None:
        if on and self._profile_level == "none":
            self.profile = "summary"
        elif not on and self._profile_level == "summary":
            self.profile = "none"

    @property
    def profile(self) -> str:
        """The profiling level: ``none``, ``summary``, ``per_block``, ``per_kernel``, ``deep`` or ``deep_sync``
        (see rxcuda.engine._profile for what each measures and costs). Changeable while the engine runs; a
        change that adds or removes stamp nodes (to or from ``per_block``/``per_kernel``/``deep``) rebuilds
        the graph, any other takes effect at the next frame.

        >>> engine.profile = "per_block"           # doctest: +SKIP
        >>> engine.tick().blocks["forces"].gpu_us  # doctest: +SKIP
        41.7
        """
        return self._profile_level

    @profile.setter
    def profile(self, level: str) -> None:
        level = _profile.check_level(level)
        before = _profile.stamps_for(self._profile_level)
        self._profile_level = level
        self._plain = level == "none" and not self._debug
        rt = getattr(self, "_rt", None)
        if rt is None:  # during construction
            return
        self._profiler.level = level
        rt.stamps = _profile.stamps_for(level)
        if rt.stamps != before and rt.blocks:
            from ..model._events import ProfileChanged

            rt.pending.add(ProfileChanged(level))

    @property
    def timings(self) -> Observable:
        """Every profiled frame's GPU timings (:class:`rxcuda.engine._profile.FrameTimes`: frame index, GPU us,
        per-block and per-kernel Timings), emitted once the GPU is done with the frame (at once for frames
        that were waited for, a frame or more later for ``sync=False`` frames)."""
        return self._timings.observable

    @property
    def debug(self) -> bool:
        """Run each frame's nodes one by one, waiting after each, so a faulting kernel is named (slow)."""
        return self._debug

    @debug.setter
    def debug(self, on: bool) -> None:
        self._debug = bool(on)
        self._plain = self._profile_level == "none" and not self._debug

    def _lose(self, err: CudaError) -> DeviceLostError:
        """The context is gone (sticky error): say so once, clearly, and refuse GPU work from now on."""
        if self._lost is None:
            g = self._rt.graph
            if err.node is not None:  # Engine(debug=True) found the node
                kernels: tuple[str, ...] = (err.node,)
            else:
                kernels = tuple(dict.fromkeys(n.label for n in g.plan.nodes)) if g is not None else ()
            self._lost = DeviceLostError(err.call, err.name, err.explanation, err.code, device=self.device.ordinal,
                                         kernels=kernels[:8], exact=err.node is not None)
            self._rt.reporter.publish(Diagnostic("error", "engine", str(self._lost), self._rt.frame))
        return self._lost

    def run(self, clock=60.0, *, sync: bool | None = None, switch_interval: float | None = RUN_SWITCH_INTERVAL):
        """Produce frames on the engine's own thread until the returned disposable is disposed.

        ``clock``: a rate in frames per second (the engine keeps its own drift-free clock: frames start at
        t0 + k/rate, and ticks it could not start in time merge into the next frame), or any Observable
        (``reactivex.interval``, a render loop's vsync subject, a camera's frame stream): one frame per item.

        ``switch_interval``: the interpreter's GIL switch interval while running (restored on dispose;
        ``None`` leaves it alone). Python threads producing values flat out hold the GIL up to this long
        each time the engine thread needs it; CPython's default of 5 ms would stall 60 Hz frames.

        Reads, writes and rebuilds asked for from other threads run on the engine thread between frames.

        >>> running = engine.run(60)                                              # doctest: +SKIP
        >>> running.dispose()                                                     # doctest: +SKIP
        """
        self._check_open()
        if self._loop is not None:
            raise RuntimeError("the engine is already running; dispose the previous run() first")
        sync_ = self.sync if sync is None else sync

        def on_error(e: Exception) -> None:
            self._rt.reporter.error(e, None, "frame", keeps="the frame loop goes on")

        def tick() -> None:
            self._tick(sync_)

        loop = FrameLoop(tick, self.device.make_current, on_error)
        self._loop = self._last_loop = loop
        try:
            stop = loop.start(clock)  # a bad clock raises before the thread starts
        except BaseException:
            self._loop = None
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
            if self._loop is loop:
                self._loop = None
            self._gpu_thread = None
            self._stop_run = None

        self._stop_run = dispose
        return Disposable(dispose)

    @property
    def running(self) -> bool:
        return self._loop is not None

    @property
    def loop(self) -> FrameLoop | None:
        """The frame loop of the current (or last) ``run()``: its ``stats`` count frames, ticks merged into
        later frames, and how late frames started (mostly waiting for the GIL)."""
        return self._loop or self._last_loop

    def _gpu(self, fn, *args):
        """Run ``fn`` where the GPU may be touched: here, or on the engine thread while run() drives frames."""
        if self._lost is not None:
            raise self._lost
        loop = self._loop
        if loop is not None and threading.current_thread() is not loop.thread:
            return loop.call(fn, *args)
        if threading.get_ident() != self._gpu_thread:
            self.device.make_current()
            self._gpu_thread = threading.get_ident()
        try:
            return fn(*args)
        except CudaError as e:
            if is_sticky(e):
                raise self._lose(e) from e
            raise

    def rebuild(self) -> None:
        """Apply pending changes now and rebuild the graph, raising instead of reporting: a planning failure
        is one ValidationError listing every problem found (``err.problems``, warnings included)."""
        self._check_open()
        self._gpu(self._rebuild_now)

    def _rebuild_now(self) -> None:
        up = self._rt.pending.drain()
        if up is not None:
            self._updater.apply(up, raise_errors=True)
        if up is None or not up.structure:
            self._builder.build(raise_errors=True)

    def _ensure_built(self):
        rt = self._rt
        if rt.pending.count or rt.graph is None:
            self._updater.apply(rt.pending.drain() or UpdatePlan())
        if rt.graph is None:
            log = rt.reporter.log
            why = log[-1].message if log else "nothing was built"
            raise RuntimeError(f"the pipeline has no working graph yet: {why}")
        return rt.graph

    def synchronize(self) -> None:
        """Wait for every frame in flight."""
        self._gpu(self._rt.synchronize)

    def wait(self, stream_or_event) -> None:
        """Order the next frames after your own GPU work: the engine's stream waits (on the GPU, not the host)
        for everything queued so far on ``stream_or_event`` (a CuPy/PyTorch/cuda.core stream, anything with
        ``__cuda_stream__``, or an event).

        >>> y = cupy.asarray(x) * 2            # on CuPy's current stream           # doctest: +SKIP
        >>> engine.bind(blk["x"], y); engine.wait(cupy.cuda.get_current_stream())   # doctest: +SKIP
        """
        self._check_open()
        self._gpu(self._io.wait, stream_or_event)

    @property
    def stream(self) -> EngineStream:
        """The engine's CUDA stream (``__cuda_stream__``): queue your work on it to order it with the frames."""
        return EngineStream(self._rt.stream_h, self.device.ordinal)

    @property
    def frame(self) -> int:
        return self._rt.frame

    @property
    def plan(self) -> GraphPlan | None:
        """The plan of the graph now running (None before the first successful build)."""
        g = self._rt.graph
        return g.plan if g else None

    @property
    def memory(self):
        """The buffer pool's statistics: allocations, reuses, buffers in use, bytes reserved and at peak."""
        return self._rt.pool.stats

    @property
    def stats(self) -> BufferStats:
        """The running graph's buffers: how many, in how many allocations, bytes allocated, bytes they would
        take without memory reuse, and bytes saved (all zero before the first build).

        >>> print(engine.stats)                                                   # doctest: +SKIP
        101 buffers in 3 allocations (2 shared groups): 12 KiB allocated, 404 KiB without sharing, ...
        """
        g = self._rt.graph
        return buffer_stats(g.plan if g else None)

    @property
    def reuse_memory(self) -> bool:
        """Whether buffers whose lifetimes never overlap share memory (``Engine(reuse_memory=...)``)."""
        return self._rt.reuse_memory

    def keep(self, port: PortHandle) -> None:
        """Give a port memory of its own that memory reuse never shares, so its value after a frame can be
        read. ``read``, ``array``, ``observe``, ``write``, ``feed`` and ``bind`` keep their port themselves;
        keep a port before the frame whose value you will read (the first read of a port that shared memory
        rebuilds the graph, and the value of the frame before may be gone)."""
        self._check_open()
        self._io.keep(self._ref(port), port)

    @property
    def rebuilds(self) -> int:
        """Successful Structure-tier rebuilds so far."""
        return self._builder.rebuilds

    @property
    def recaptures(self) -> int:
        """Library call nodes captured again in place so far."""
        return self._updater.recaptures

    # -- data in and out -----------------------------------------------------------------------------------
    def write(self, port: PortHandle, data, *, resize: bool = False) -> None:
        """Copy host data into a port's buffer (synchronously, stream-ordered with the frames).

        Writing to an input that is neither connected nor bound makes it host-fed: it gets its own buffer
        (the first write rebuilds; later writes only copy). A rejected write changes nothing. A smaller array
        fills the start of the buffer. ``resize=True``: the input takes the array's shape (see
        :meth:`resize`). A vector port (float4) takes its scalar type with the lanes on a last axis, a float32
        array shaped (n, 4); a struct port a structured array of its layout."""
        self._check_open()
        ref = self._ref(port)
        return self._gpu(self._io.write, ref, port, data, resize)

    def resize(self, port: PortHandle, shape) -> None:
        """Give an input a new shape; it flows downstream at the next frame through every port that follows
        it (``Block.from_kernel``'s ports do, with their "size" scalars and grids). Where every buffer it
        touches still fits its pool size class, the buffers stay and only the kernel nodes' grids and sizes
        change (exec-node updates, the Parameters tier); otherwise the affected buffers are reallocated and
        the graph rebuilt (cuGraphExecUpdate where the topology allows). The input must be host-fed, bound
        or unused (a connected input takes its source's shape). A shape the input itself refuses raises a
        ValidationError here; one that some port downstream cannot take fails the next rebuild (a diagnostic
        naming both ports and both shapes; the last good graph keeps running, ``engine.rebuild()`` raises it).

        >>> engine.resize(add["a"], (2048,)); engine.resize(add["b"], (2048,))        # doctest: +SKIP
        >>> engine.tick(); engine.shape(mul["out"])                                     # doctest: +SKIP
        (2048,)
        """
        self._check_open()
        ref = self._ref(port)
        _shapes_io.resize(self._rt, ref, port, _shapes_io.check_resize(self._rt, ref, port, shape))

    def shape(self, port: PortHandle) -> tuple[int, ...]:
        """The port's shape: in the running graph, or as resized for the next frame."""
        ref = self._ref(port)
        return _shapes_io.current_shape(self._rt, ref, port.spec)

    def read(self, port: PortHandle):
        """The port's data as a new NumPy array (waits for the frames in flight). For an append output, only
        the elements appended this frame (up to its capacity)."""
        self._check_open()
        return self._gpu(self._io.read, self._ref(port), port)

    def count(self, port: PortHandle) -> int:
        """The raw counter of an append output after the last frame (may exceed the capacity: overflow)."""
        self._check_open()
        return self._gpu(self._io.count, self._ref(port), port)

    def array(self, port: PortHandle):
        """A CuPy view of the port's device buffer (no copy). Valid until the next rebuild that drops it."""
        self._check_open()
        return self._gpu(self._io.array, self._ref(port), port)

    def counter_array(self, port: PortHandle):
        """A CuPy view (one uint32) of an append output's counter."""
        self._check_open()
        return self._gpu(self._io.counter_array, self._ref(port), port)

    def feed(self, port: PortHandle, source: Observable) -> Disposable:
        """Stream arrays into an input port: each frame uses the newest array ``source`` emitted (NumPy
        through pinned staging, a device array by a device copy ordered after its producer's stream), with
        no rebuild. Returns a disposable."""
        self._check_open()
        ref = self._ref(port)
        self._io.feed(ref, port, source, self._warn)
        return Disposable(lambda: None if self._closed else self._io.close_feed(ref, self._gpu))

    def observe(self, port: PortHandle, *, every: int = 1, kind: str = "numpy") -> Observable:
        """An output (or any) port as an Observable emitting after every ``every``-th frame.

        ``kind="numpy"``: a NumPy copy, read back asynchronously (emitted once its copy finished: with
        ``sync=False`` frames that is a frame or two later, with no per-frame wait). ``kind="cupy"``: a
        CuPy array, a zero-copy view when the frame was waited for (valid until the next frame: copy it to
        keep it), else a device copy ordered after the frame. Append outputs emit only appended elements.
        Items are emitted on the engine thread; hop with ``observe_on`` if the consumer is slow. The
        Observable completes when the engine closes.
        """
        self._check_open()
        return self._io.observe(self._ref(port), port, every, kind, self._gpu, lambda: self._closed)

    # -- streams -------------------------------------------------------------------------------------------
    @property
    def diagnostics(self) -> Observable:
        """Errors and warnings (Diagnostic), each naming its block, port or file. Past ones: diagnostic_log."""
        return self._rt.reporter.stream.observable

    @property
    def diagnostic_log(self):
        """The last 1000 diagnostics, oldest first."""
        return self._rt.reporter.log

    @property
    def frames(self) -> Observable:
        """One Frame per tick (index, host time, tiers applied, state, GPU time with ``timing``), on the
        engine thread. A subscriber that raises is reported as a diagnostic; the frames go on."""
        return self._frames.observable

    @property
    def updates(self) -> Observable:
        """One AppliedUpdate per applied update plan (tiers, blocks, seconds)."""
        return self._updater.updates.observable

    @property
    def changes(self) -> Observable:
        """Every change event (ParameterChanged, CodeChanged, Connected, BlockAdded, ...) as it is made."""
        return self._rt.pending.changes

    @property
    def parameter_changes(self) -> Observable:
        from ..model._events import ParameterChanged

        return self._rt.pending.of_type(ParameterChanged)

    @property
    def structure_changes(self) -> Observable:
        """Blocks added, removed or changed, connections made or removed."""
        from ..model._events import STRUCTURE_EVENTS

        return self._rt.pending.of_type(*STRUCTURE_EVENTS)

    @property
    def code_changes(self) -> Observable:
        from ..model._events import CodeChanged

        return self._rt.pending.of_type(CodeChanged)

    @property
    def file_changes(self) -> Observable:
        """FileChanged events from watch() (debounced, deduplicated by content)."""
        return self._file_changes.observable

    def watch(self, *, debounce: float = 0.05, scheduler=None) -> Disposable:
        """Reload kernels when their files (.ptx/.cubin/.fatbin/.cu and .json sidecars) are saved.

        Reloading or recompiling happens on the watcher's thread; the new code is swapped in before a
        following frame (in place when the signature is unchanged). A broken save produces one diagnostic
        with the loader's or compiler's message and the old kernel keeps running. Returns a disposable.
        """
        self._check_open()
        if self._reload is None:
            self._reload = HotReload(lambda: self.blocks, self._reload_failed, self._file_changes.emit,
                                     debounce=debounce, scheduler=scheduler)
        self._reload.refresh()
        return Disposable(self._stop_watch)

    def _stop_watch(self) -> None:
        if self._reload is not None:
            self._reload.close()
            self._reload = None

    def _reload_failed(self, err: Exception, block, what: str) -> None:
        if block is not None:
            block.state, block.message = "warning", f"{what} failed, the previous kernel keeps running: {err}"
        details = tuple(getattr(err, "diagnostics", ()))
        self._rt.reporter.publish(Diagnostic("error", block.name if block else "watch",
                                             f"{what} failed, the previous kernel keeps running: {err}",
                                             self._rt.frame, block.id if block else None, details))

    def _warn(self, subject: str, message: str, block=None) -> None:
        self._rt.reporter.warn(subject, message, block)

    def _frame_index(self) -> int:
        return self._rt.frame

    def _change_subscriber_failed(self, err: Exception, event) -> None:
        self._warn("engine.changes", f"a subscriber raised {type(err).__name__}: {err}; the change was applied")

    def _file_subscriber_failed(self, err: Exception, event) -> None:
        self._warn("engine.file_changes", f"a subscriber raised {type(err).__name__}: {err}; the reload goes on")

    def _frame_subscriber_failed(self, err: Exception, frame) -> None:
        self._warn("engine.frames", f"a subscriber raised {type(err).__name__}: {err}; the frames go on")

    # -- lifetime ------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed; create a new one")
        if self._lost is not None:
            raise self._lost

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the frames, the watchers and every binding; free graphs, modules, buffers, library state and
        streams; complete every Observable the engine handed out. Never raises: after a lost context it
        releases what it can."""
        if self._closed:
            return
        rt = self._rt
        if self._stop_run is not None:
            quietly(self._stop_run)
        quietly(self._stop_watch)
        for b in list(rt.blocks.values()):
            quietly(b.dispose_bindings)
        self._closed = True
        lost = self._lost is not None
        if not lost:
            quietly(self.device.make_current)
            try:
                rt.synchronize()
            except CudaError as e:
                lost = is_sticky(e)
        self._io.close()
        if not lost:  # with the context gone, driver calls only fail: the process exit frees everything
            quietly(self._batches.release)
            quietly(self._profiler.close)
            quietly(self._builder.close)
            quietly(rt.modules.close)
            quietly(rt.pool.close)
            for ev in (self._ev_start, self._ev_end):
                quietly(lambda ev=ev: destroy_event(ev, api=rt.api))
            for s in (rt.stream, rt.capture_stream):
                quietly(lambda s=s: destroy_stream(s, api=rt.api))
        for stream in (self._frames, self._timings, self._file_changes):
            stream.close()
        self._updater.close()
        rt.reporter.close()
        rt.pending.close()
        for b in rt.blocks.values():
            b._sink = None
            b._engine = None
        quietly(self.device.close)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __str__(self) -> str:
        rt = self._rt
        g = rt.graph
        last_ms = self._builder.last_build_ms
        lines = [f"engine on {self.device.name} ({self.device.arch}): frame {rt.frame}, "
                 f"{len(rt.blocks)} blocks, {len(rt.connections)} connections, "
                 f"{len(g.plan.nodes) if g else 0} graph nodes, {self.rebuilds} rebuilds"
                 + (f" (the last took {last_ms:.1f} ms)" if last_ms is not None else "")
                 + f", profile {self.profile}"]
        if self.last_frame:
            f = self.last_frame
            gpu = f", {f.gpu_us:.1f} us GPU" if f.gpu_us is not None else ""
            lines.append(f"  last frame: {f.host_us:.1f} us host{gpu}, tiers {f.tiers or '-'}")
        s = rt.pool.stats
        lines.append(f"  memory: {s.in_use} buffers in use, {s.bytes_reserved / 2**20:.1f} MiB reserved")
        classes = rt.pool.by_class()
        if classes:
            size = _dtypes.format_bytes
            lines.append("    by pool class: " + ", ".join(f"{size(c)} x{u}" + (f" (+{f} free)" if f else "")
                                                       for c, (u, f) in classes.items()))
        if g is not None:
            lines.append(f"    graph buffers: {self.stats}")
        for b in rt.blocks.values():
            lines.append(f"  {b.name}: {b.state}" + (f" — {b.message}" if b.message else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Engine {self.device.name} frame={self._rt.frame} blocks={len(self._rt.blocks)}>"



__all__ = ["AppliedUpdate", "Diagnostic", "Engine", "EngineStream", "Frame", "Tier"]
