"""The engine: one per GPU. A small facade over its verbs -- the model (blocks, connections, bindings),
the Structure tier (``_build``), updates by tier (``_update``), data in and out (``_io``) and the frames
(``_frames.FrameRunner``: tick, profiled and debug launches, run_batch, run's frame loop).

Only the thread that calls ``tick()`` (or ``run()``'s thread) touches the GPU. Other threads may set
parameters, connect, add or remove blocks: that only folds a change into the pending plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import overload

import numpy as np
from reactivex import Observable
from reactivex.disposable import Disposable

from ..blocks._blocks import Block, PortHandle, resolve_port
from ..blocks._composite import Composite, CompositeInstance
from ..blocks._regions import Region
from ..cuda import _nvtx
from ..cuda._cpu import CpuDriver
from ..cuda._cpuchoice import choose_driver
from ..cuda._device import Device
from ..cuda._driver import is_sticky
from ..cuda._memory import resolve_device_array
from ..model._describe import PipelineDescription, PortRef
from ..model._errors import CudaError, DeviceLostError, EngineClosedError
from ..model._events import Tier
from ..plan._liveness import BufferStats
from ..plan._plan import GraphPlan
from ..streams._broadcast import Broadcast
from ..streams._scheduler import FrameLoop
from . import _devices, _profile, _shapes_io
from ._batch import Batches
from ._blockside import BlockSide
from ._build import Builder
from ._composites import Composites
from ._frames import FrameRunner, check_frame_count
from ._io import DataIO
from ._model import Model
from ._ports import EngineStream
from ._records import AppliedUpdate, Diagnostic, Frame
from ._region_ops import add_region, remove_region_member
from ._reload import HotReload
from ._replace import replace_block
from ._runtime import Runtime, quietly
from ._streams import EngineStreams
from ._tooltips import Link, engine_text
from ._update import Updater
from ._views import EngineViews

# while run() drives the frames, the interpreter hands the GIL over this often (seconds): with Python
# threads producing values flat out, the engine thread waits up to this long for the GIL at each wake-up
RUN_SWITCH_INTERVAL = 0.0002


class Engine(EngineStreams, EngineViews):
    """Compiles the pipeline into one CUDA graph and launches it every frame.

    >>> import numpy as np, rxcuda
    >>> with rxcuda.Engine() as engine:                                                  # doctest: +SKIP
    ...     add = engine.add(rxcuda.Block.from_kernel("vector_add", size=1024))
    ...     engine.write(add["a"], np.ones(1024, np.float32)); engine.write(add["b"], np.ones(1024, np.float32))
    ...     engine.tick()
    ...     engine.read(add["out"])[:3]
    array([2., 2., 2.], dtype=float32)

    ``device``: the GPU ordinal; ``devices``: several, one pipeline over them (``devices=[0, 1]``, then
    ``engine.add(block, device=1)`` by position; ``devices=["cpu", "cpu"]``: two positions on the CPU device, as
    ``[0, 0]`` on one GPU; ``pipelined=True``: device i works on frame t-i, and
    ``engine.devices.latency`` says how many frames late; docs/devices.md). ``sync``: whether ``tick()`` waits for the
    frame by default. ``timing``:
    record GPU time per frame (``Frame.gpu_us``; two event records a frame): the ``summary`` profiling level.
    ``profile``: the profiling level (``engine.profile``: ``none``, ``summary``, ``per_block``, ``per_kernel``,
    ``deep``, ``deep_sync``). ``debug``: run each frame's
    nodes one by one, waiting after each (slow), so a faulting kernel is named in the error. ``driver``:
    ``None`` for the CUDA driver, or a ``rxcuda.cuda.NullDriver`` that records the driver calls and runs no
    GPU work (tests). ``device="cpu"`` runs the pipeline on the CPU device (docs/cpu.md): the same plan, tiers and
    frames, kernels from their PTX on the host; it is the default where there is no CUDA device
    (``RXCUDA_DEVICE=cpu`` forces it, ``RXCUDA_DEVICE=cuda`` refuses it). ``reuse_memory``: intermediate buffers
    whose lifetimes never overlap share memory (``engine.stats`` tells what that saved); False gives every buffer
    its own (debugging, comparisons).
    """

    def __init__(self, device: int | str = 0, *, devices=None, pipelined: bool = False, sync: bool = True,
                 timing: bool = False, debug: bool = False, profile: str = "none", driver=None,
                 reuse_memory: bool = True):
        level = _profile.check_level(profile)
        device, driver, devices = choose_driver(device, driver, devices)  # ("cpu": the CPU device, docs/cpu.md)
        if devices is not None:  # several devices: the first is the engine's own (docs/devices.md)
            device = _devices.check_devices(devices, device)[0]
        try:
            self._open(device, sync, driver)
        except CudaError as e:
            if is_sticky(e):  # another engine (or library) in this process lost the context
                raise DeviceLostError(e.call, e.name, e.explanation, e.code,
                                      device="cpu" if isinstance(driver, CpuDriver) else device) from e
            raise
        if devices is not None or pipelined:  # (closes the engine if a device cannot be opened)
            _devices.open_devices(self, devices, driver, pipelined)
        self._rt.reuse_memory = bool(reuse_memory)
        self._runner.configure("summary" if timing and level == "none" else level, bool(debug))

    def _open(self, device: int, sync: bool, driver) -> None:
        dev = Device(device, api=driver)
        if driver is None:
            # cuda.core's first import is not thread-safe: make it here, on the caller's thread, before a watcher
            # thread may compile. NVRTC is not warmed up in a background thread here: for ~200 ms that thread
            # competes with the first builds for the GIL and a core; the first compile pays NVRTC's start-up.
            from ..cuda._nvrtc import import_compiler

            import_compiler()
        self.device = dev
        self.sync = sync
        self._rt = rt = Runtime.open(dev, self._subscriber_failed("changes", "the change was applied"))
        self._io = DataIO(rt, lambda ref=None: self._updater.ensure_built(ref), self)
        self._model = Model(rt, self._io)
        self._composites = Composites(rt, self._model)
        self._builder = Builder(rt, self._io.upload_staged)
        self._updater = Updater(rt, self._builder)
        self._batches = Batches(rt, self._updater)  # engine.run_batch's graph, made on first use
        self._frames = Broadcast(on_error=self._subscriber_failed("frames", "the frames go on"))
        self._timings = Broadcast(on_error=self._subscriber_failed("frames", "the frames go on"))
        self._profiler = _profile.Profiler(rt, rt.fast, self._timings.emit)
        self._side = BlockSide(self)  # what blocks ask of the engine (rxcuda.blocks._engineside.EngineSide)
        self._file_changes = Broadcast(on_error=self._subscriber_failed("file_changes", "the reload goes on"))
        self._runner = FrameRunner(rt, self._updater.apply_pending, self._io, self._profiler, self._batches,
                                   self._frames, self._timings)
        self._reload: HotReload | None = None
        self._closed = False
        # under Nsight (NVTX collecting) each frame is an NVTX range; otherwise nothing changes, not even a check
        _nvtx.instrument(self._runner, tick="tick", run_batch="run_batch")

    # -- the model: blocks and connections (any thread) --------------------------------------------------
    @overload
    def add(self, block: Composite, *, device: int | None = None) -> CompositeInstance: ...
    @overload
    def add(self, block: Block, *, device: int | None = None) -> Block: ...
    def add(self, block, *, device: int | None = None):
        """Add a block; the next tick rebuilds the graph with it. Returns the block.

        A composite (``rxcuda.Composite``) is added as a new instance of its blocks, named ``instance/member``,
        with its inner connections; returns the :class:`CompositeInstance` (``instance["x"]`` for its ports).

        A block whose name is taken is renamed ``name_2``, ``name_3``, ... (``block.name`` tells). A region
        (``If``, ``While``, ...) comes with the blocks of its bodies that are not in the engine yet, and its
        condition port is connected. ``device``: with ``Engine(devices=[...])``, the position of the device it
        runs on (default 0); a composite or a region is placed as a whole."""
        self._check_open()
        if device is not None:
            return _devices.add_on(self, self._rt, block, device)
        if isinstance(block, Region):
            add_region(self, block)
            return block
        if isinstance(block, Composite):
            block = self._composites.add(block, self)  # the instance
        else:
            self._model.add(block, self)
        self._watch_new()
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

        >>> twin = engine.replace(mul, Block.from_kernel("scalar_mul", size=1024))  # doctest: +SKIP
        >>> engine.tick().tiers                     # the same description: nothing to do  # doctest: +SKIP
        ()
        """
        self._check_open()
        replace_block(self._rt, self._io, self, old, new, self._composites.replaced)
        self._watch_new()
        return new

    @property
    def composites(self) -> tuple[CompositeInstance, ...]:
        """The composite instances in the engine (outermost ones; ``instance.members`` holds nested ones)."""
        with self._rt.lock:
            return tuple(self._composites.instances.values())

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The blocks in the engine, in the order they were added (a snapshot)."""
        with self._rt.lock:
            return tuple(self._rt.blocks.values())

    @property
    def connections(self) -> tuple[Link, ...]:
        """Every connection as a :class:`Link` ``(src, dst)`` of port handles (with its ``delay``);
        ``str(link)`` tells what travels on it."""
        return self._model.links()

    def connect(self, src: PortHandle, dst: PortHandle, *, delay: int = 0, initial=None) -> None:
        """Connect an output port to an input port. Raises ValidationError at once if the ports don't fit
        (direction, dtype, size, an existing connection, a cycle); the engine is left unchanged.

        ``delay=1``: feedback across frames. The input reads the value the output had at the end of the
        previous frame, so the connection may close a cycle (a block may feed itself). Frame 0 reads
        ``initial``: None (zeros), a number (every element) or an array of the output's dtype and element
        count. Every delayed input fed by one output shares one previous-frame buffer, kept with its contents
        through rebuilds that leave the connection alone (``reset_delays()`` starts it over).

        >>> acc = engine.add(rxcuda.Block.from_kernel("vector_add", size=n))     # doctest: +SKIP
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
        self._model.bind(port, self._gpu(resolve_device_array, array, self._rt.stream_h, self.device.api))

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
        """Apply pending changes (a structural one too, in this tick), launch the graph once, and wait for it."""
        self._check_open()
        runner = self._runner
        if runner.loop is not None:
            runner.check_caller("tick")
        return runner.tick(self.sync if sync is None else sync)

    @property
    def last_frame(self) -> Frame | None:
        """The Frame of the last tick or batch (None before the first)."""
        return self._runner.last

    def run_batch(self, k: int, *, until: PortHandle | None = None) -> Frame:
        """Run ``k`` frames with one host launch, the GPU looping over the frame graph itself; returns when the
        GPU is done, with one :class:`Frame` for the batch (``frames``: how many ran; ``index``: the last).

        Changes made before the call (parameters, code, structure) apply before the batch, as for ``tick``;
        fed inputs are read once per batch and ``observe`` delivers the batch's last frame; append counts are
        the last frame's. With ``until`` (a port holding one u32/bool flag, such as a residual check's
        ``converged``), the batch ends after the first frame that leaves the flag nonzero. A batch gives, bit
        for bit, what ``k`` ticks give. Over several devices the k frames are queued from the host, each
        device's graph k times with no wait between frames (no GPU loop spans devices), and ``until`` is refused.

        >>> frame = engine.run_batch(1000)                       # doctest: +SKIP
        >>> frame = engine.run_batch(500, until=check["done"])   # doctest: +SKIP
        >>> frame.frames                                         # doctest: +SKIP
        37
        """
        self._check_open()
        check_frame_count(k)
        _devices.check_batch(self._rt, until)
        self._runner.check_caller("run_batch")
        return self._runner.run_batch(k, None if until is None else self._ref(until))

    @property
    def timing(self) -> bool:
        """Whether frames are timed (any profiling level but ``none``); setting it True selects ``summary``
        (when no level is set) and False selects ``none`` (from ``summary``)."""
        return self._runner.level != "none"

    @timing.setter
    def timing(self, on: bool) -> None:
        if on and self.profile == "none":
            self.profile = "summary"
        elif not on and self.profile == "summary":
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
        return self._runner.level

    @profile.setter
    def profile(self, level: str) -> None:
        self._runner.configure(_profile.check_level(level), self._runner.debug)

    @property
    def timings(self) -> Observable:
        """Every profiled frame's GPU timings (:class:`rxcuda.engine._profile.FrameTimes`: frame index, GPU us,
        per-block and per-kernel Timings), emitted once the GPU is done with the frame (at once for frames
        that were waited for, a frame or more later for ``sync=False`` frames)."""
        return self._timings.observable

    @property
    def debug(self) -> bool:
        """Run each frame's nodes one by one, waiting after each, so a faulting kernel is named (slow)."""
        return self._runner.debug

    @debug.setter
    def debug(self, on: bool) -> None:
        self._runner.configure(self._runner.level, bool(on))

    def run(self, clock=60.0, *, sync: bool | None = None, switch_interval: float | None = RUN_SWITCH_INTERVAL):
        """Produce frames on the engine's own thread until the returned disposable is disposed.

        ``clock``: a rate in frames per second (the engine keeps its own drift-free clock: frames start at
        t0 + k/rate, and ticks it could not start in time merge into the next frame), or any Observable
        (``reactivex.interval``, a render loop's vsync subject, a camera's frame stream): one frame per item.

        ``switch_interval``: the interpreter's GIL switch interval while running (restored on dispose;
        ``None`` leaves it alone). Python threads producing values flat out hold the GIL up to this long
        each time the engine thread needs it; CPython's default of 5 ms would stall 60 Hz frames.

        Reads, writes and rebuilds asked for from other threads run on the engine thread between frames;
        a structural change is built off the frame thread meanwhile and swapped in at a frame boundary.

        >>> running = engine.run(60)                                              # doctest: +SKIP
        >>> running.dispose()                                                     # doctest: +SKIP
        """
        self._check_open()
        return Disposable(self._runner.run(clock, self.sync if sync is None else sync, switch_interval))

    @property
    def running(self) -> bool:
        """True while :meth:`run` drives the frames."""
        return self._runner.loop is not None

    @property
    def loop(self) -> FrameLoop | None:
        """The frame loop of the current (or last) ``run()``: its ``stats`` count frames, ticks merged into
        later frames, and how late frames started (mostly waiting for the GIL)."""
        return self._runner.loop or self._runner.last_loop

    def _gpu(self, fn, *args):
        """Run ``fn`` where the GPU may be touched: here, or on the engine thread while run() drives frames."""
        if self._runner.lost is not None:
            raise self._runner.lost
        return self._runner.on_gpu(fn, *args)

    def rebuild(self) -> None:
        """Apply pending changes now and rebuild the graph, raising instead of reporting: a planning failure
        is one ValidationError listing every problem found (``err.problems``, warnings included)."""
        self._check_open()
        self._gpu(self._updater.rebuild_now)

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
        """The index of the last frame ticked (frames count from 1; 0 before the first)."""
        return self._rt.frame

    @property
    def plan(self) -> GraphPlan | None:
        """The plan of the graph now running (None before the first successful build)."""
        g = self._rt.graph
        return g.plan if g else None

    @property
    def memory(self):
        """The buffer pool's statistics: allocations, reuses, buffers in use, bytes reserved and at peak (over
        several devices, the totals of their pools; ``engine.devices.memory`` has each position's)."""
        return _devices.memory(self._rt)

    @property
    def devices(self) -> _devices.DeviceReport:
        """The engine's devices: positions, GPUs, how copies go between them, the latency in frames."""
        return _devices.report(self._rt)

    @property
    def stats(self) -> BufferStats:
        """The running graph's buffers: how many, in how many allocations, bytes allocated, bytes they would
        take without memory reuse, and bytes saved (all zero before the first build).

        Over several devices, every device's buffers together (``engine.devices.buffers`` has each's).

        >>> print(engine.stats)                                                   # doctest: +SKIP
        101 buffers in 3 allocations (2 shared groups): 12 KiB allocated, 404 KiB without sharing, ...
        """
        return _devices.buffers(self._rt)

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

    def settled_build(self) -> int | None:
        """The running graph's build (its :attr:`rebuilds` count) while nothing but parameter values waits to be
        applied; None while a change that may move buffers is pending, a graph is being prepared, or none runs.
        A port's device pointer read through :meth:`array` stays valid while this returns the same number."""
        rt = self._rt
        return None if rt.pending.others or rt.preparing or rt.graph is None else self._builder.rebuilds

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

    def read(self, port: PortHandle, *, out=None):
        """The port's data as a new NumPy array (waits for the frames in flight). For an append output, only
        the elements appended this frame (up to its capacity). ``out``: an array to copy into instead of a new one
        (C-contiguous, of the dtype and shape a read returns: ValueError saying which otherwise), e.g. reused
        every frame, or page-locked memory the copy runs into at the bus's pace.

        >>> frame_out = np.empty(engine.shape(mul["out"]), np.float32)           # doctest: +SKIP
        >>> engine.read(mul["out"], out=frame_out) is frame_out                   # doctest: +SKIP
        True
        """
        self._check_open()
        return self._gpu(self._io.read, self._ref(port), port, out)

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

    def _warn(self, subject: str, message: str, block=None) -> None:
        self._rt.reporter.warn(subject, message, block)

    def _subscriber_failed(self, stream: str, goes_on: str) -> Callable[[Exception, object], None]:
        """What a Broadcast of ``engine.<stream>`` calls when a subscriber raises: a warning, and on it goes."""
        return lambda err, item: self._warn(f"engine.{stream}", f"a subscriber raised {type(err).__name__}: {err}; "
                                                                f"{goes_on}")

    # -- lifetime ------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed; create a new one")
        if self._runner.lost is not None:
            raise self._runner.lost

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or the ``with`` block ended); every verb then raises EngineClosedError."""
        return self._closed

    def close(self) -> None:
        """Stop the frames, the watchers and every binding; free graphs, modules, buffers, library state and
        streams; complete every Observable the engine handed out. Never raises: after a lost context it
        releases what it can."""
        if self._closed:
            return
        rt = self._rt
        quietly(self._runner.stop)
        quietly(self._stop_watch)
        for b in list(rt.blocks.values()):
            quietly(b.dispose_bindings)
        self._closed = True
        lost = self._runner.lost is not None
        if not lost:
            quietly(self.device.make_current)
            try:
                rt.synchronize()
            except CudaError as e:
                lost = is_sticky(e)
        quietly(self._builder.prep.close)  # a structural change being prepared is thrown away
        self._io.close()
        if not lost:  # with the context gone, driver calls only fail: the process exit frees everything
            self._runner.close()
            quietly(self._builder.close)
            rt.release()
        elif rt.devices is not None:  # the other devices' contexts are fine: they close as usual
            quietly(rt.devices.close_healthy)
        for stream in (self._frames, self._timings, self._file_changes):
            stream.close()
        self._updater.close()
        rt.reporter.close()
        rt.pending.close()
        self._model.detach_all()
        quietly(self.device.close)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __str__(self) -> str:
        """The device, frame, blocks, graph, last frame, memory and each block's state, on a few lines."""
        return engine_text(self)

    def __repr__(self) -> str:
        return f"<Engine {self.device.name} frame={self._rt.frame} blocks={len(self._rt.blocks)}>"


__all__ = ["AppliedUpdate", "Diagnostic", "Engine", "EngineStream", "Frame", "Tier"]
