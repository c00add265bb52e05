"""The engine: one per GPU. Holds the model (blocks, connections, bindings), folds every change into a
pending plan, and on each tick applies it with the cheapest legal operation, then launches the graph.

Only the thread that calls ``tick()`` (or ``run()``'s thread) touches the GPU. Other threads may set
parameters, connect, add or remove blocks: that only records changes.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Callable

import attrs
import numpy as np
import reactivex
from reactivex import Observable
from reactivex.subject import Subject

from ..cuda._device import Device
from ..cuda._driver import check, drv
from ..cuda._fast import FastDriver
from ..cuda._graph import CompiledGraph, capture_graph
from ..cuda._memory import BufferPool, DeviceBuffer, ExternalArray, as_cupy, resolve_device_array
from ..cuda._modules import ModuleCache
from ..model import _dtypes
from ..model._describe import (
    BlockEntry,
    CallSpec,
    CaptureArgs,
    Connection,
    ExternalBinding,
    PipelineDescription,
    PortRef,
)
from ..model._errors import EngineClosedError, KernelFileError, ValidationError
from ..model._events import BlockAdded, BlockChanged, BlockRemoved, Connected, Disconnected, PortRebound
from ..streams._coalesce import PendingPlan, UpdatePlan
from ..streams._hub import ChangeHub
from ..streams._scheduler import FrameLoop
from ._blocks import Block, PortHandle
from ._ports import InputFeed, OutputTap
from ._reload import HotReload
from .plan._plan import BufferArg, CallNodePlan, GraphPlan, KernelNodePlan, order_blocks, plan


@attrs.frozen
class Frame:
    """What one tick did: its index, host time, GPU time (when the frame was timed and waited for),
    tiers applied, and the engine state after it."""

    index: int
    host_us: float
    tiers: tuple[str, ...]
    state: str
    launched: bool
    gpu_us: float | None = None


@attrs.frozen
class AppliedUpdate:
    """An update plan the scheduler applied: which tiers ran, for which blocks, and how long it took."""

    frame: int
    tiers: tuple[str, ...]
    blocks: tuple[str, ...]
    seconds: float
    events: int


@attrs.frozen
class Diagnostic:
    """An error or warning about a block, port or file, published instead of stopping the frames."""

    severity: str
    subject: str
    message: str
    frame: int
    block: int | None = None
    details: tuple = ()  # e.g. compiler diagnostics (file, line, column, message)


class Engine:
    """Compiles the pipeline into one CUDA graph and launches it every frame.

    >>> import numpy as np, rxcuda
    >>> with rxcuda.Engine() as engine:
    ...     add = engine.add(rxcuda.Block.from_kernel("kernels/vector_add.ptx", size=1024))
    ...     engine.write(add["a"], np.ones(1024, np.float32)); engine.write(add["b"], np.ones(1024, np.float32))
    ...     engine.tick()
    ...     engine.read(add["out"])[:3]
    array([2., 2., 2.], dtype=float32)

    ``sync``: whether ``tick()`` waits for the frame to finish by default.
    """

    def __init__(self, device: int = 0, *, sync: bool = True):
        self.device = Device(device)
        self.sync = sync
        from ..sources._nvrtc import warm_up

        warm_up(self.device.arch)  # NVRTC's ~200 ms first call, paid off the frame path (background thread)
        self._stream = self.device.create_stream()
        self._fast = FastDriver()
        self._stream_h = int(self._stream)
        self._capture_stream = self.device.create_stream()
        self._pool = BufferPool()
        self._modules = ModuleCache()
        self._pending = PendingPlan()
        self._hub = ChangeHub(self._pending)  # every change notification goes through here
        self._lock = threading.RLock()  # the model; never held while waiting for the GPU
        self._blocks: dict[int, Block] = {}
        self._connections: list[Connection] = []
        self._bindings: dict[PortRef, ExternalArray] = {}
        self._fed: set[PortRef] = set()  # inputs the user fills with engine.write
        self._buffers: dict[tuple, DeviceBuffer] = {}
        self._library_state: dict[tuple, object] = {}
        self._library_teardown: dict[tuple, Callable] = {}
        self._graph: CompiledGraph | None = None
        self._node_code: dict[int, str] = {}  # node id -> code key in use (after code swaps)
        self._frame = 0
        self._closed = False
        self._gpu_thread = threading.get_ident()
        self.diagnostic_log: collections.deque[Diagnostic] = collections.deque(maxlen=1000)
        self._diagnostics = Subject()
        self._updates = Subject()
        self._frames = Subject()
        self._file_changes = Subject()
        self._loop: FrameLoop | None = None
        self._reload: HotReload | None = None
        self._feeds: dict[PortRef, tuple[InputFeed, object]] = {}
        self._taps: list[tuple[PortRef, OutputTap]] = []
        self._ev_start = self.device.create_event()
        self._ev_end = self.device.create_event()
        self._ev_start_h, self._ev_end_h = int(self._ev_start), int(self._ev_end)
        self.last_frame: Frame | None = None
        self._state = "ok"  # "error" while any block is in error; kept current by _set_state
        self._staged: dict[PortRef, np.ndarray] = {}  # host data written before its port had a buffer
        self.rebuilds = 0
        self.recaptures = 0

    # -- model: blocks and connections (any thread) --------------------------------------------------------
    def add(self, block: Block) -> Block:
        """Add a block; the next tick rebuilds the graph with it. Returns the block."""
        self._check_open()
        if not isinstance(block, Block):
            raise TypeError(f"engine.add takes a Block (got {type(block).__name__})")
        with self._lock:
            if block._engine is not None:
                raise ValueError(f"{block.name} is already in an engine; remove it there first")
            taken = {b.name for b in self._blocks.values()}
            if block.name in taken:
                i = 2
                while f"{block.name}_{i}" in taken:
                    i += 1
                block._desc = attrs.evolve(block._desc, name=f"{block.name}_{i}")
            self._blocks[block.id] = block
            block._engine = self
            block._sink = self._hub
            block.state, block.message = "not built", ""
        self._hub.add(BlockAdded(block.id, block.name))
        if self._reload is not None:
            self._reload.refresh()
        return block

    def remove(self, block: Block) -> None:
        """Remove a block with its connections and bindings; the next tick rebuilds without it."""
        if self._blocks.get(block.id) is not block:
            raise ValueError(f"{block.name} is not in this engine")
        block.dispose_bindings()  # before the removal event, so no late value recreates its entries
        for ref in [r for r in self._feeds if r.block == block.id]:
            self._close_feed(ref)
        with self._lock:
            del self._blocks[block.id]
            self._connections = [c for c in self._connections if block.id not in (c.src.block, c.dst.block)]
            for ref in [r for r in self._bindings if r.block == block.id]:
                del self._bindings[ref]
            self._fed = {r for r in self._fed if r.block != block.id}
            self._staged = {r: a for r, a in self._staged.items() if r.block != block.id}
            block._engine = None
            block._sink = None
            block.state, block.message = "removed", ""
        self._hub.add(BlockRemoved(block.id, block.name))

    @property
    def blocks(self) -> tuple[Block, ...]:
        with self._lock:
            return tuple(self._blocks.values())

    @property
    def connections(self) -> tuple[tuple[PortHandle, PortHandle], ...]:
        with self._lock:
            return tuple((PortHandle(self._blocks[c.src.block], c.src.port),
                          PortHandle(self._blocks[c.dst.block], c.dst.port)) for c in self._connections)

    def connect(self, src: PortHandle, dst: PortHandle) -> None:
        """Connect an output port to an input port. Raises ValidationError at once if the ports don't fit
        (direction, dtype, size, an existing connection, a cycle); the engine is left unchanged."""
        self._check_open()
        conn = Connection(self._ref(src), self._ref(dst))
        with self._lock:
            trial = self._snapshot(extra=conn)
            from .plan._plan import _validate_connections

            _validate_connections(trial)
            order_blocks(trial)
            self._connections.append(conn)
            self._fed.discard(conn.dst)
            self._staged.pop(conn.dst, None)
        self._hub.add(Connected(conn.src, conn.dst))

    def disconnect(self, src: PortHandle, dst: PortHandle) -> None:
        conn = Connection(self._ref(src), self._ref(dst))
        with self._lock:
            if conn not in self._connections:
                raise ValueError(f"{src!r} is not connected to {dst!r}")
            self._connections.remove(conn)
        self._hub.add(Disconnected(conn.src, conn.dst))

    def bind(self, port: PortHandle, array) -> None:
        """Use a device array (CuPy, PyTorch, anything with __cuda_array_interface__ or DLPack) as a port's
        memory, zero-copy. Rebinding a bound port to another array of the same dtype and at least the same
        size is a warm update (no rebuild). A NumPy array is copied into the port's own buffer instead."""
        self._check_open()
        ref = self._ref(port)
        if isinstance(array, np.ndarray):
            self.write(port, array)
            return
        ext = resolve_device_array(array)
        spec = port.spec
        if spec.dtype and ext.dtype != spec.dtype:
            raise ValidationError(f"cannot bind a {ext.dtype} array to {port.block.name}.{port.name}, which takes "
                                  f"{spec.dtype}; convert it first (arr.astype('{_dtypes.to_numpy(spec.dtype)}'))",
                                  subject=port.block.name)
        if ext.count < spec.count:
            raise ValidationError(f"cannot bind {ext.count} elements to {port.block.name}.{port.name}, which needs "
                                  f"{spec.count}", subject=port.block.name)
        with self._lock:
            if any(c.dst == ref for c in self._connections):
                raise ValidationError(f"{port.block.name}.{port.name} is connected; disconnect it before binding "
                                      "an array", subject=port.block.name)
            was_bound = ref in self._bindings
            self._bindings[ref] = ext
            self._fed.discard(ref)
            self._staged.pop(ref, None)
        if was_bound:
            self._hub.add(PortRebound(ref.block, ref.port, ext))
        else:
            self._hub.add(BlockChanged(ref.block, port.block.name, f"port {port.name} bound to an array"))

    def unbind(self, port: PortHandle) -> None:
        """Give a port its own engine-owned buffer again (a rebuild)."""
        ref = self._ref(port)
        with self._lock:
            if self._bindings.pop(ref, None) is None:
                raise ValueError(f"{port!r} is not bound")
        self._hub.add(BlockChanged(ref.block, port.block.name, f"port {port.name} unbound"))

    def _ref(self, port: PortHandle) -> PortRef:
        if not isinstance(port, PortHandle):
            raise TypeError(f"expected a port such as block['out'] (got {port!r})")
        if self._blocks.get(port.block.id) is not port.block:
            raise ValueError(f"{port.block.name} is not in this engine; engine.add(block) first")
        port.spec  # noqa: B018 - raises a KeyError naming the ports
        return PortRef(port.block.id, port.name)

    def _snapshot(self, extra: Connection | None = None) -> PipelineDescription:
        with self._lock:
            blocks = tuple(BlockEntry(b.id, b.description, b.values(), b.launches()) for b in self._blocks.values())
            conns = tuple(self._connections) + ((extra,) if extra else ())
            binds = {r: ExternalBinding(e.dtype, e.count) for r, e in self._bindings.items()}
            fed = frozenset(self._fed)
        return PipelineDescription(blocks, conns, binds, fed)

    def describe(self) -> PipelineDescription:
        """The pipeline as pure data (what the planner sees)."""
        return self._snapshot()

    # -- frames (the GPU thread) -------------------------------------------------------------------------
    def tick(self, sync: bool | None = None) -> Frame:
        """Apply pending changes, launch the graph once, and (by default) wait for it."""
        if self._closed:
            raise EngineClosedError("the engine is closed; create a new one")
        if self._loop is not None and threading.current_thread() is not self._loop.thread:
            raise RuntimeError("engine.run(...) drives the frames on its own thread; dispose it before calling "
                               "tick() yourself")
        return self._tick(self.sync if sync is None else sync)

    def _tick(self, sync: bool) -> Frame:
        t0 = time.perf_counter_ns()
        if threading.get_ident() != self._gpu_thread:
            self.device.make_current()
            self._gpu_thread = threading.get_ident()
        tiers: tuple[str, ...] = ()
        pending = self._pending
        if pending._count:
            if pending.only_parameters and self._graph is not None and not self._updates.observers:
                self._apply_hot(pending.take_parameters())
                tiers = _HOT
            else:
                tiers = self._apply(pending.drain())
        g = self._graph
        gpu_us = None
        if g is not None:
            if self._feeds:
                self._stage_feeds(g)
            timed = bool(self._frames.observers)
            fast, stream = self._fast, self._stream_h
            if timed:
                fast.record(self._ev_start_h, stream)
            g.launch(stream)
            if timed:
                fast.record(self._ev_end_h, stream)
            if self._taps:
                self._enqueue_taps(g)  # before the sync, so a synced frame's outputs are ready with it
            if sync:
                fast.wait(stream)
                if timed:
                    gpu_us = fast.elapsed_us(self._ev_start_h, self._ev_end_h)
        self._frame += 1
        if g is not None and self._taps:
            self._deliver_taps(sync)
        frame = Frame(self._frame, (time.perf_counter_ns() - t0) / 1e3, tiers,
                      "idle" if g is None else self._state, g is not None, gpu_us)
        self.last_frame = frame
        if self._frames.observers:
            self._frames.on_next(frame)
        return frame

    def run(self, clock, *, sync: bool | None = None, switch_interval: float | None = None):
        """Produce a frame each time ``clock`` (any Observable) emits, on the engine's own thread.

        Returns a disposable; disposing stops the clock and joins the thread. While running, reads and
        writes from other threads are carried out on the engine thread between frames.

        ``switch_interval`` (seconds) sets the interpreter's GIL switch interval while running (restored on
        dispose). With Python threads that produce values flat out, the engine thread can wait up to that
        interval (5 ms by default) for the GIL at each wake-up; 0.0002 kept 60 Hz frames within 3 % under
        one saturating producer in bench/streams.py. Left alone by default: it is process-wide.

        >>> running = engine.run(reactivex.interval(1 / 60))
        >>> ...
        >>> running.dispose()
        """
        self._check_open()
        if self._loop is not None:
            raise RuntimeError("the engine is already running; dispose the previous run() first")
        sync_ = self.sync if sync is None else sync

        def on_error(e: Exception) -> None:
            self._report(e, None, False, "frame")

        loop = FrameLoop(lambda: self._tick(sync_), self.device.make_current, on_error)
        self._loop = loop
        previous = sys.getswitchinterval()
        if switch_interval is not None:
            sys.setswitchinterval(switch_interval)
        stop = loop.start(clock)

        def dispose() -> None:
            stop.dispose()
            if switch_interval is not None:
                sys.setswitchinterval(previous)
            if self._loop is loop:
                self._loop = None
            self._gpu_thread = None

        from reactivex.disposable import Disposable

        return Disposable(dispose)

    @property
    def running(self) -> bool:
        return self._loop is not None

    def _gpu(self, fn, *args):
        """Run ``fn`` where the GPU may be touched: here, or on the engine thread while run() drives frames."""
        loop = self._loop
        if loop is not None and threading.current_thread() is not loop.thread:
            return loop.call(fn, *args)
        if threading.get_ident() != self._gpu_thread:
            self.device.make_current()
            self._gpu_thread = threading.get_ident()
        return fn(*args)

    def rebuild(self) -> None:
        """Apply pending changes now and rebuild the graph, raising the first error instead of reporting it."""
        self._check_open()
        self._gpu(self._rebuild_now)

    def _rebuild_now(self) -> None:
        plan_ = self._pending.drain()
        if plan_:
            self._apply(plan_, raise_errors=True)
        if plan_ is None or not plan_.structure:
            self._build(raise_errors=True)

    def synchronize(self) -> None:
        """Wait for every frame in flight."""
        self._gpu(lambda: check(drv.cuStreamSynchronize(self._stream), "cuStreamSynchronize"))

    @property
    def frame(self) -> int:
        return self._frame

    @property
    def plan(self) -> GraphPlan | None:
        """The plan of the graph now running (None before the first successful build)."""
        return self._graph.plan if self._graph else None

    # -- applying an update plan (dispatch by tier) ------------------------------------------------------
    def _apply(self, up: UpdatePlan, raise_errors: bool = False) -> tuple[str, ...]:
        t0 = time.perf_counter_ns()
        done: list[str] = []
        if (up.structure or self._graph is None) and self._build(raise_errors):
            done.append("structure")
            self._notify_applied(up, done, t0)
            return tuple(done)  # the rebuild read every current value: lower tiers are subsumed
        g = self._graph
        if g is None:
            self._notify_applied(up, done, t0)
            return tuple(done)
        # new code for a block that is not in the running graph (its first build failed): rebuild
        missing = any(k not in g.plan.kernel_nodes and k[0] in self._blocks for k in up.code)
        if missing and self._build(raise_errors):
            done.append("structure")
            self._notify_applied(up, done, t0)
            return tuple(done)
        for (bid, kernel), code in up.code.items():
            if self._swap_code(bid, kernel, code, raise_errors):
                done.append("code")
        for (bid, name) in up.recapture:
            for nid in g.plan.recapture.get((bid, name), ()):
                self._recapture(nid, raise_errors)
                done.append("recapture")
        if up.params or up.rebinds or up.launches:
            self._apply_parameters(g, up)
            done.append("parameters")
        self._notify_applied(up, done, t0)
        return tuple(dict.fromkeys(done))

    def _apply_hot(self, params: dict) -> None:
        """Scalar values only: write each into its nodes' argument storage, one exec update per node."""
        g = self._graph
        views = g.scalar_views
        if len(params) == 1 and not g._dirty:  # the common case: one value, each node updated once
            (key, value), = params.items()
            targets = views.get(key)
            if targets is not None:
                update = g.update_node
                for nid, view in targets:
                    view[0] = value
                    update(nid)
                return
        dirty = g._dirty
        for key, value in params.items():
            targets = views.get(key)
            if targets is None:
                self._apply_parameters(g, UpdatePlan(params={key: value}, events=1))
                continue
            for nid, view in targets:
                view[0] = value
                dirty.add(nid)
        g.flush()

    def _apply_parameters(self, g: CompiledGraph, up: UpdatePlan) -> None:
        p = g.plan
        for key, value in up.params.items():
            slots = p.slots.get(key)
            if slots is not None:
                for nid, arg in slots:
                    g.set_scalar(nid, arg, value)
            sid = p.device_scalars.get(key)
            if sid is not None:
                self._write_device_scalar(g, sid, value)
            for nid in p.recapture.get(key, ()):
                self._recapture(nid, False)
        for (bid, port), ext in up.rebinds.items():
            buf = p.port_buffers.get(PortRef(bid, port))
            if buf is not None and p.buffers[buf].kind == "external":
                g.set_buffer(buf, ext.ptr)
        for (bid, kernel), launch in up.launches.items():
            nid = p.kernel_nodes.get((bid, kernel))
            if nid is not None:
                g.set_launch(nid, launch)
        g.flush()

    def _write_device_scalar(self, g: CompiledGraph, buffer_id: int, value) -> None:
        b = g.plan.buffers[buffer_id]
        host = np.array([value], dtype=_dtypes.to_numpy(b.dtype))
        # pageable HtoD is staged before the call returns, so `host` may go; stream order puts it before the launch
        check(drv.cuMemcpyHtoDAsync(g.pointers[buffer_id], host.ctypes.data, host.nbytes, self._stream),
              "cuMemcpyHtoDAsync")

    def _swap_code(self, bid: int, kernel: str, code, raise_errors: bool) -> bool:
        g = self._graph
        nid = g.plan.kernel_nodes.get((bid, kernel))
        block = self._blocks.get(bid)
        if nid is None or block is None:
            return False
        try:
            loaded = self._modules.load(code)
            g.set_function(nid, loaded.function)
            g.flush()
        except Exception as e:
            g._dirty.discard(nid)
            self._report(e, block, raise_errors, "code swap")
            return False
        self._node_code[nid] = code.key
        self._modules.prune(set(self._node_code.values()))
        block.state, block.message = "ok", ""
        self._refresh_state()
        return True

    def _recapture(self, nid: int, raise_errors: bool) -> None:
        g = self._graph
        block = self._blocks.get(g.plan.nodes[nid].block)
        try:
            g.recapture(nid, self._capture)
            self.recaptures += 1
        except Exception as e:
            self._report(e, block, raise_errors, "recapture")

    # -- structure ----------------------------------------------------------------------------------------
    def _build(self, raise_errors: bool = False) -> bool:
        """Plan, load, allocate, build and instantiate; swap in only on success. Returns success."""
        desc = self._snapshot()
        if not desc.blocks:
            self._retire(None, {})
            self._release_library_state(keep=set())
            return True
        acquired: list[DeviceBuffer] = []
        new: CompiledGraph | None = None
        try:
            gp = plan(desc)
            functions, node_code = {}, {}
            for n in gp.nodes:
                if isinstance(n, KernelNodePlan):
                    spec = desc.block(n.block).desc.kernel(n.kernel)
                    try:
                        functions[n.code_key] = self._modules.load(spec.code).function
                    except KernelFileError as e:
                        raise _BlockFailure(n.block, e) from e
                    node_code[n.id] = n.code_key
            pointers, buffers = {}, {}
            for b in gp.buffers:
                if b.kind == "external":
                    ref = PortRef(b.key[1], b.key[2])
                    pointers[b.id] = self._bindings[ref].ptr
                    continue
                key = (b.key, b.nbytes)
                buf = self._buffers.get(key)
                if buf is None:
                    buf = self._pool.acquire(b.nbytes, zero=True)
                    acquired.append(buf)
                buffers[key] = buf
                pointers[b.id] = buf.ptr
            for (bid, name), sid in gp.device_scalars.items():
                host = np.array([desc.block(bid).value(name)], dtype=_dtypes.to_numpy(gp.buffers[sid].dtype))
                check(drv.cuMemcpyHtoD(pointers[sid], host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
            new = CompiledGraph(gp, functions, pointers, self.device.context, capture=self._capture,
                                fast=self._fast)
            if self._graph is None or not new.adopt_exec(self._graph):
                new.instantiate()
        except Exception as e:
            if new is not None:
                new.close()
            for buf in acquired:
                self._pool.release(buf)
            failure = e.block if isinstance(e, _BlockFailure) else None
            err = e.error if isinstance(e, _BlockFailure) else e
            block = self._blocks.get(failure) if failure else self._block_for(err)
            self._report(err, block, raise_errors, "rebuild")
            return False
        self._retire(new, buffers)
        self._release_library_state(keep={b.id for b in desc.blocks})
        self._node_code = node_code
        self._modules.prune(set(node_code.values()))
        self.rebuilds += 1
        built = {b.id for b in desc.blocks}
        for b in self._blocks.values():
            if b.id in built:
                b.state, b.message = "ok", ""
        self._refresh_state()
        self._upload_staged()
        return True

    def _refresh_state(self) -> None:
        self._state = "error" if any(b.state == "error" for b in self._blocks.values()) else "ok"

    def _upload_staged(self) -> None:
        g = self._graph
        for ref, arr in list(self._staged.items()):
            bid = g.plan.port_buffers.get(ref) if g else None
            if bid is not None:
                DeviceBuffer(g.pointers[bid], g.plan.buffers[bid].nbytes).upload(arr, self._stream)
                del self._staged[ref]

    def _retire(self, new: CompiledGraph | None, buffers: dict) -> None:
        old, self._graph = self._graph, new
        if old is not None:
            # the old exec may be running; wait before its buffers go back to the pool
            check(drv.cuStreamSynchronize(self._stream), "cuStreamSynchronize")
            old.close()
        for key, buf in self._buffers.items():
            if key not in buffers:
                self._pool.release(buf)
        self._buffers = buffers
        if new is None:
            self._node_code = {}
            self._modules.prune(set())

    def _release_library_state(self, keep: set[int]) -> None:
        """Tear down handles/plans/workspaces of calls whose block left (the old graph is already retired)."""
        for skey in [k for k in self._library_state if k[0] not in keep]:
            state = self._library_state.pop(skey)
            teardown = self._library_teardown.pop(skey, None)
            if teardown is not None:
                teardown(state)

    def _capture(self, node: CallNodePlan, pointers) -> tuple[object, CaptureArgs]:
        block = self._blocks[node.block]
        spec: CallSpec = block.description.kernel(node.call)
        # per block and call: two blocks never share a workspace; a rebuild reuses the handles
        skey = (block.id, spec.name, spec.key)
        if skey not in self._library_state:
            self._library_state[skey] = spec.setup(self.device.ordinal) if spec.setup else None
            if spec.teardown:
                self._library_teardown[skey] = spec.teardown
        ptrs, values = {}, {}
        for prm, arg in zip(spec.params, node.args, strict=True):
            if isinstance(arg, BufferArg):
                ptrs[prm.name] = pointers[arg.buffer]
            else:
                values[prm.name] = block.params[arg.name].value if arg.name else arg.value
        args = CaptureArgs(int(self._capture_stream), ptrs, values, self._library_state[skey])
        prepare = getattr(spec, "prepare", None)
        if prepare is not None:  # outside the capture: e.g. re-seeding a cuRAND generator
            prepare(args)
        return capture_graph(self._capture_stream, spec.record, args), args

    # -- data in and out ------------------------------------------------------------------------------
    def _ensure_built(self) -> CompiledGraph:
        if self._pending._count or self._graph is None:
            self._apply(self._pending.drain() or UpdatePlan())
        if self._graph is None:
            why = self.diagnostic_log[-1].message if self.diagnostic_log else "nothing was built"
            raise RuntimeError(f"the pipeline has no working graph yet: {why}")
        return self._graph

    def _port_buffer(self, port: PortHandle) -> tuple[int, int]:
        ref = self._ref(port)
        g = self._ensure_built()
        bid = g.plan.port_buffers.get(ref)
        if bid is None:
            raise RuntimeError(f"{port.block.name}.{port.name} is not in the running graph (its block failed to "
                               "build?); see engine.diagnostics")
        return bid, g.pointers[bid]

    def write(self, port: PortHandle, data) -> None:
        """Copy host data into a port's buffer (synchronously, stream-ordered with the frames).

        Writing to an input that is neither connected nor bound makes it host-fed: it gets its own buffer
        (the first write rebuilds; later writes only copy)."""
        return self._gpu(self._write, port, data)

    def _write(self, port: PortHandle, data) -> None:
        ref = self._ref(port)
        with self._lock:
            newly_fed = (port.spec.direction == "in" and ref not in self._fed and ref not in self._bindings
                         and not any(c.dst == ref for c in self._connections))
            if newly_fed:
                self._fed.add(ref)
        spec = port.spec
        arr = np.ascontiguousarray(data)
        if spec.dtype and arr.dtype != _dtypes.to_numpy(spec.dtype):
            raise ValidationError(f"{port.block.name}.{port.name} takes {spec.dtype}, got {arr.dtype}; convert "
                                  f"with .astype('{_dtypes.to_numpy(spec.dtype)}')", subject=port.block.name)
        if arr.size > spec.count:
            raise ValidationError(f"{arr.size} elements do not fit {port.block.name}.{port.name} "
                                  f"({spec.count} elements)", subject=port.block.name)
        if newly_fed:
            self._hub.add(BlockChanged(ref.block, port.block.name, f"input {port.name} fed from the host"))
        g = self._graph
        if g is None or self._pending._structure or ref not in g.plan.port_buffers:
            # no buffer yet (or one about to change): upload right after the next successful build
            self._staged[ref] = arr.copy()
            return
        bid = g.plan.port_buffers[ref]
        DeviceBuffer(g.pointers[bid], g.plan.buffers[bid].nbytes).upload(arr, self._stream)

    def read(self, port: PortHandle) -> np.ndarray:
        """The port's data as a new NumPy array (waits for the frames in flight). For an append output, only
        the elements appended this frame (up to its capacity)."""
        return self._gpu(self._read, port)

    def _read(self, port: PortHandle) -> np.ndarray:
        bid, ptr = self._port_buffer(port)
        spec = port.spec
        count = spec.count
        if spec.counter is not None:
            count = min(self._count(port), spec.count)
        out = np.empty(count, dtype=_dtypes.to_numpy(spec.dtype) if spec.dtype else np.uint8)
        if count:
            DeviceBuffer(ptr, out.nbytes).download(out, self._stream)
        else:
            check(drv.cuStreamSynchronize(self._stream), "cuStreamSynchronize")
        return out

    def count(self, port: PortHandle) -> int:
        """The raw counter of an append output after the last frame (may exceed the capacity: overflow)."""
        return self._gpu(self._count, port)

    def _count(self, port: PortHandle) -> int:
        ref = self._ref(port)
        g = self._ensure_built()
        cid = g.plan.counters.get(ref)
        if cid is None:
            raise ValueError(f"{port.block.name}.{port.name} is not an append output")
        out = np.empty(1, np.uint32)
        return int(DeviceBuffer(g.pointers[cid], 4).download(out, self._stream)[0])

    def array(self, port: PortHandle):
        """A CuPy view of the port's device buffer (no copy). Valid until the next rebuild that drops it."""
        return self._gpu(self._array, port)

    def _array(self, port: PortHandle):
        bid, ptr = self._port_buffer(port)
        spec = port.spec
        return as_cupy(ptr, self._graph.plan.buffers[bid].nbytes, spec.dtype, (spec.count,), self,
                       self.device.ordinal)

    def counter_array(self, port: PortHandle):
        """A CuPy view (one uint32) of an append output's counter."""
        return self._gpu(self._counter_array, port)

    def _counter_array(self, port: PortHandle):
        ref = self._ref(port)
        g = self._ensure_built()
        cid = g.plan.counters.get(ref)
        if cid is None:
            raise ValueError(f"{port.block.name}.{port.name} is not an append output")
        return as_cupy(g.pointers[cid], 4, "u32", (1,), self, self.device.ordinal)

    # -- diagnostics ---------------------------------------------------------------------------------------
    # -- streams -----------------------------------------------------------------------------------------
    @property
    def diagnostics(self) -> Observable:
        """Errors and warnings (Diagnostic), each naming its block, port or file. Past ones: diagnostic_log."""
        return self._diagnostics

    @property
    def frames(self) -> Observable:
        """One Frame per tick (index, host and GPU time, tiers applied, state), on the engine thread."""
        return self._frames

    @property
    def updates(self) -> Observable:
        """One AppliedUpdate per applied update plan (tiers, blocks, seconds). Subscribing turns off the
        allocation-free hot path, so parameter-only frames are reported too."""
        return self._updates

    @property
    def changes(self) -> Observable:
        """Every change event (ParameterChanged, CodeChanged, Connected, BlockAdded, ...) as it is made."""
        return self._hub.events

    @property
    def parameter_changes(self) -> Observable:
        return self._hub.parameters

    @property
    def structure_changes(self) -> Observable:
        """Blocks added, removed or changed, connections made or removed."""
        return self._hub.structure

    @property
    def code_changes(self) -> Observable:
        return self._hub.code

    @property
    def file_changes(self) -> Observable:
        """FileChanged events from watch() (debounced, deduplicated by content)."""
        return self._file_changes

    def watch(self, *, debounce: float = 0.05, scheduler=None):
        """Reload kernels when their files (.ptx/.cubin/.fatbin/.cu and .json sidecars) are saved.

        Reloading or recompiling happens on the watcher's thread; the new code is swapped in before a
        following frame (in place when the signature is unchanged). A broken save produces one diagnostic
        with the loader's or compiler's message and the old kernel keeps running. Returns a disposable.
        """
        self._check_open()
        if self._reload is None:
            self._reload = HotReload(lambda: self.blocks, self._reload_failed, self._file_changes.on_next,
                                     debounce=debounce, scheduler=scheduler)
        self._reload.refresh()
        from reactivex.disposable import Disposable

        return Disposable(self._stop_watch)

    def _stop_watch(self) -> None:
        if self._reload is not None:
            self._reload.close()
            self._reload = None

    def _reload_failed(self, err: Exception, block, what: str) -> None:
        details = tuple(getattr(err, "diagnostics", ()))
        if block is not None:
            block.state, block.message = "warning", f"{what} failed, the previous kernel keeps running: {err}"
        self._publish(Diagnostic("error", block.name if block else "watch",
                                 f"{what} failed, the previous kernel keeps running: {err}", self._frame,
                                 block.id if block else None, details))

    def feed(self, port: PortHandle, source) -> object:
        """Stream arrays into an input port: each frame uses the newest array ``source`` emitted (NumPy
        through pinned staging, CuPy by a device copy), with no rebuild. Returns a disposable."""
        self._check_open()
        ref = self._ref(port)
        spec = port.spec
        if spec.direction != "in":
            raise ValueError(f"{port.block.name}.{port.name} is an output; feed() takes an input port")
        feed = InputFeed(f"{port.block.name}.{port.name}", spec.dtype, spec.count)
        with self._lock:
            if ref in self._feeds:
                raise ValueError(f"{port.block.name}.{port.name} is already fed by a stream; dispose that first")
            if any(c.dst == ref for c in self._connections) or ref in self._bindings:
                raise ValidationError(f"{port.block.name}.{port.name} is connected or bound; a fed input needs "
                                      "its own buffer", subject=port.block.name)
            newly = ref not in self._fed
            self._fed.add(ref)

        def on_next(arr) -> None:
            try:
                feed.push(arr)
            except (TypeError, ValueError) as e:
                self._warn(feed.label, str(e), port.block)

        sub = source.subscribe(on_next, lambda e: self._warn(feed.label, f"input stream failed: {e}", port.block))
        self._feeds[ref] = (feed, sub)
        if newly:
            self._hub.add(BlockChanged(ref.block, port.block.name, f"input {port.name} fed from a stream"))
        from reactivex.disposable import Disposable

        return Disposable(lambda: self._close_feed(ref))

    def _close_feed(self, ref: PortRef) -> None:
        entry = self._feeds.pop(ref, None)
        if entry is not None:
            feed, sub = entry
            sub.dispose()
            if self._closed:
                return
            self._gpu(feed.close)

    def _stage_feeds(self, g: CompiledGraph) -> None:
        for ref, (feed, _sub) in self._feeds.items():
            if feed.dirty:
                bid = g.plan.port_buffers.get(ref)
                if bid is not None:
                    feed.stage(g.pointers[bid], self._stream)

    def observe(self, port: PortHandle, *, every: int = 1, kind: str = "numpy") -> Observable:
        """An output (or any) port as an Observable emitting after every ``every``-th frame.

        ``kind="numpy"``: a NumPy copy, read back asynchronously (emitted once its copy finished: with
        ``sync=False`` frames that is a frame or two later, with no per-frame wait). ``kind="cupy"``: a
        CuPy array, a zero-copy view when the frame was waited for (valid until the next frame: copy it to
        keep it), else a device copy ordered after the frame. Append outputs emit only appended elements.
        Items are emitted on the engine thread; hop with ``observe_on`` if the consumer is slow.
        """
        if kind not in ("numpy", "cupy"):
            raise ValueError(f"'kind' must be 'numpy' or 'cupy' (got {kind!r})")
        ref = self._ref(port)
        spec = port.spec

        def subscribe(observer, scheduler=None):
            tap = OutputTap(observer.on_next, dtype=spec.dtype, count=spec.count, every=every,
                            as_numpy=kind == "numpy", append=spec.counter is not None)
            entry = (ref, tap)
            self._taps = self._taps + [entry]

            def dispose() -> None:
                self._taps = [t for t in self._taps if t is not entry]
                tap.closed = True
                if not self._closed:
                    self._gpu(tap.close)

            from reactivex.disposable import Disposable

            return Disposable(dispose)

        return reactivex.create(subscribe)

    def _enqueue_taps(self, g: CompiledGraph) -> None:
        frame = self._frame + 1
        for ref, tap in self._taps:
            bid = g.plan.port_buffers.get(ref)
            if bid is None:
                continue
            cid = g.plan.counters.get(ref)
            tap.enqueue(frame, g.pointers[bid], g.pointers[cid] if cid is not None else None, self._stream)

    def _deliver_taps(self, synced: bool) -> None:
        for ref, tap in self._taps:
            try:
                tap.deliver(self._stream, synced, self, self.device.ordinal)
            except Exception as e:  # a subscriber's error must not stop the frames
                block = self._blocks.get(ref.block)
                self._warn(f"observe {block.name if block else ref.block}.{ref.port}", str(e), block)

    def _notify_applied(self, up: UpdatePlan, done, t0) -> None:
        if self._updates.observers:
            dt = (time.perf_counter_ns() - t0) / 1e9
            names = tuple(sorted(self._blocks[b].name if b in self._blocks else f"#{b}" for b in up.blocks()))
            self._updates.on_next(AppliedUpdate(self._frame + 1, tuple(dict.fromkeys(done)), names, dt,
                                                up.events))

    def _block_for(self, err: Exception) -> Block | None:
        subject = getattr(err, "subject", None)
        if not subject:
            return None
        for b in self._blocks.values():
            if subject == b.name or subject.startswith(b.name + "."):
                return b
        return None

    def _report(self, err: Exception, block: Block | None, raise_errors: bool, what: str) -> None:
        if block is not None:
            block.state, block.message = "error", str(err)
            self._state = "error"
        subject = block.name if block else (getattr(err, "subject", None) or getattr(err, "path", None) or "engine")
        d = Diagnostic("error", subject, f"{what} failed, the last good graph keeps running: {err}", self._frame,
                       block.id if block else None, tuple(getattr(err, "diagnostics", ())))
        self._publish(d)
        if raise_errors:
            raise err

    def _warn(self, subject: str, message: str, block: Block | None) -> None:
        self._publish(Diagnostic("warning", subject, message, self._frame, block.id if block else None))

    def _publish(self, d: Diagnostic) -> None:
        self.diagnostic_log.append(d)
        self._diagnostics.on_next(d)

    # -- lifetime ------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed; create a new one")

    def close(self) -> None:
        """Wait for the GPU, then free graphs, modules, buffers, library state and streams."""
        if self._closed:
            return
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
        self._stop_watch()
        for b in list(self._blocks.values()):
            b.dispose_bindings()
        self._closed = True
        for ref in list(self._feeds):
            feed, sub = self._feeds.pop(ref)
            sub.dispose()
            feed.close()
        for _ref, tap in self._taps:
            tap.close()
        self._taps = []
        self.device.make_current()
        drv.cuStreamSynchronize(self._stream)
        self._retire(None, {})
        self._release_library_state(keep=set())
        self._modules.close()
        self._pool.close()
        drv.cuEventDestroy(self._ev_start)
        drv.cuEventDestroy(self._ev_end)
        drv.cuStreamDestroy(self._stream)
        drv.cuStreamDestroy(self._capture_stream)
        for subject in (self._diagnostics, self._updates, self._frames, self._file_changes):
            subject.on_completed()
        self._hub.close()
        for b in self._blocks.values():
            b._sink = None
            b._engine = None
        self.device.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __str__(self) -> str:
        g = self._graph
        lines = [f"engine on {self.device.name} ({self.device.arch}): frame {self._frame}, "
                 f"{len(self._blocks)} blocks, {len(self._connections)} connections, "
                 f"{len(g.plan.nodes) if g else 0} graph nodes, {self.rebuilds} rebuilds"]
        if self.last_frame:
            lines.append(f"  last frame: {self.last_frame.host_us:.1f} us host, tiers {self.last_frame.tiers or '-'}")
        s = self._pool.stats
        lines.append(f"  memory: {s.in_use} buffers in use, {s.bytes_reserved / 2**20:.1f} MiB reserved")
        for b in self._blocks.values():
            lines.append(f"  {b.name}: {b.state}" + (f" — {b.message}" if b.message else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Engine {self.device.name} frame={self._frame} blocks={len(self._blocks)}>"


_HOT = ("parameters",)


class _BlockFailure(Exception):
    def __init__(self, block: int, error: Exception):
        super().__init__(str(error))
        self.block = block
        self.error = error


__all__ = ["AppliedUpdate", "Diagnostic", "Engine", "Frame"]
