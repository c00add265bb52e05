"""The engine: one per GPU. Holds the model (blocks, connections, bindings), folds every change into a
pending plan, and on each tick applies it with the cheapest legal operation, then launches the graph.

Only the thread that calls ``tick()`` (or ``run()``'s thread) touches the GPU. Other threads may set
parameters, connect, add or remove blocks: that only records changes.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import attrs
import numpy as np

from .. import _dtypes
from .._errors import EngineClosedError, KernelFileError, ValidationError
from ..streams._coalesce import PendingPlan, UpdatePlan
from ..streams._events import BlockAdded, BlockChanged, BlockRemoved, Connected, Disconnected, PortRebound
from ._blocks import Block, PortHandle
from ._describe import (
    BlockEntry,
    CallSpec,
    CaptureArgs,
    Connection,
    ExternalBinding,
    KernelSpec,
    PipelineDescription,
    PortRef,
)
from ._device import Device
from ._driver import check, drv
from ._graph import CompiledGraph, capture_graph
from ._memory import BufferPool, DeviceBuffer, ExternalArray, as_cupy, resolve_device_array
from ._modules import ModuleCache
from ._plan import BufferArg, CallNodePlan, GraphPlan, KernelNodePlan, order_blocks, plan


@attrs.frozen
class Frame:
    """What one tick did: its index, host time, tiers applied, and the engine state after it."""

    index: int
    host_us: float
    tiers: tuple[str, ...]
    state: str
    launched: bool


@attrs.frozen
class Diagnostic:
    """An error or warning about a block, port or file, published instead of stopping the frames."""

    severity: str
    subject: str
    message: str
    frame: int
    block: int | None = None


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
        self._stream = self.device.create_stream()
        self._capture_stream = self.device.create_stream()
        self._pool = BufferPool()
        self._modules = ModuleCache()
        self._pending = PendingPlan()
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
        self.diagnostics: collections.deque[Diagnostic] = collections.deque(maxlen=1000)
        self._diagnostic_listeners: list[Callable[[Diagnostic], None]] = []
        self._applied_listeners: list[Callable[[UpdatePlan, tuple[str, ...], float], None]] = []
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
            block._sink = self._pending
            block.state, block.message = "not built", ""
        self._pending.add(BlockAdded(block.id, block.name))
        return block

    def remove(self, block: Block) -> None:
        """Remove a block with its connections and bindings; the next tick rebuilds without it."""
        with self._lock:
            if self._blocks.get(block.id) is not block:
                raise ValueError(f"{block.name} is not in this engine")
            del self._blocks[block.id]
            self._connections = [c for c in self._connections if block.id not in (c.src.block, c.dst.block)]
            for ref in [r for r in self._bindings if r.block == block.id]:
                del self._bindings[ref]
            self._fed = {r for r in self._fed if r.block != block.id}
            self._staged = {r: a for r, a in self._staged.items() if r.block != block.id}
            block._engine = None
            block._sink = None
            block.state, block.message = "removed", ""
        self._pending.add(BlockRemoved(block.id, block.name))

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
            from ._plan import _validate_connections

            _validate_connections(trial)
            order_blocks(trial)
            self._connections.append(conn)
            self._fed.discard(conn.dst)
        self._pending.add(Connected(conn.src, conn.dst))

    def disconnect(self, src: PortHandle, dst: PortHandle) -> None:
        conn = Connection(self._ref(src), self._ref(dst))
        with self._lock:
            if conn not in self._connections:
                raise ValueError(f"{src!r} is not connected to {dst!r}")
            self._connections.remove(conn)
        self._pending.add(Disconnected(conn.src, conn.dst))

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
        if was_bound:
            self._pending.add(PortRebound(ref.block, ref.port, ext))
        else:
            self._pending.add(BlockChanged(ref.block, port.block.name, f"port {port.name} bound to an array"))

    def unbind(self, port: PortHandle) -> None:
        """Give a port its own engine-owned buffer again (a rebuild)."""
        ref = self._ref(port)
        with self._lock:
            if self._bindings.pop(ref, None) is None:
                raise ValueError(f"{port!r} is not bound")
        self._pending.add(BlockChanged(ref.block, port.block.name, f"port {port.name} unbound"))

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
        t0 = time.perf_counter_ns()
        if threading.get_ident() != self._gpu_thread:
            self.device.make_current()
            self._gpu_thread = threading.get_ident()
        tiers: tuple[str, ...] = ()
        pending = self._pending
        if pending._count:
            if pending.only_parameters and self._graph is not None and not self._applied_listeners:
                self._apply_hot(pending.take_parameters())
                tiers = _HOT
            else:
                tiers = self._apply(pending.drain())
        g = self._graph
        if g is not None:
            g.launch(self._stream)
            if self.sync if sync is None else sync:
                err, = drv.cuStreamSynchronize(self._stream)
                if err:
                    check((err,), "cuStreamSynchronize")
        self._frame += 1
        frame = Frame(self._frame, (time.perf_counter_ns() - t0) / 1e3, tiers,
                      "idle" if g is None else self._state, g is not None)
        self.last_frame = frame
        return frame

    def rebuild(self) -> None:
        """Apply pending changes now and rebuild the graph, raising the first error instead of reporting it."""
        self._check_open()
        plan_ = self._pending.drain()
        if plan_:
            self._apply(plan_, raise_errors=True)
        if plan_ is None or not plan_.structure:
            self._build(raise_errors=True)

    def synchronize(self) -> None:
        check(drv.cuStreamSynchronize(self._stream), "cuStreamSynchronize")

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
        if up.structure or self._graph is None:
            if self._build(raise_errors):
                done.append("structure")
                self._notify_applied(up, done, t0)
                return tuple(done)  # the rebuild read every current value: lower tiers are subsumed
        g = self._graph
        if g is None:
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
            new = CompiledGraph(gp, functions, pointers, self.device.context, capture=self._capture)
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

    def _capture(self, node: CallNodePlan, pointers) -> tuple[object, CaptureArgs]:
        block = self._blocks[node.block]
        spec: CallSpec = block.description.kernel(node.call)
        skey = (spec.name, spec.key, id(spec.setup))
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
        return capture_graph(self._capture_stream, spec.record, args), args

    # -- data in and out ------------------------------------------------------------------------------
    def _ensure_built(self) -> CompiledGraph:
        if self._pending._count or self._graph is None:
            self._apply(self._pending.drain() or UpdatePlan())
        if self._graph is None:
            why = self.diagnostics[-1].message if self.diagnostics else "nothing was built"
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
            self._pending.add(BlockChanged(ref.block, port.block.name, f"input {port.name} fed from the host"))
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
        bid, ptr = self._port_buffer(port)
        spec = port.spec
        count = spec.count
        if spec.counter is not None:
            count = min(self.count(port), spec.count)
        out = np.empty(count, dtype=_dtypes.to_numpy(spec.dtype) if spec.dtype else np.uint8)
        if count:
            DeviceBuffer(ptr, out.nbytes).download(out, self._stream)
        else:
            self.synchronize()
        return out

    def count(self, port: PortHandle) -> int:
        """The raw counter of an append output after the last frame (may exceed the capacity: overflow)."""
        ref = self._ref(port)
        g = self._ensure_built()
        cid = g.plan.counters.get(ref)
        if cid is None:
            raise ValueError(f"{port.block.name}.{port.name} is not an append output")
        out = np.empty(1, np.uint32)
        return int(DeviceBuffer(g.pointers[cid], 4).download(out, self._stream)[0])

    def array(self, port: PortHandle):
        """A CuPy view of the port's device buffer (no copy). Valid until the next rebuild that drops it."""
        bid, ptr = self._port_buffer(port)
        spec = port.spec
        return as_cupy(ptr, self._graph.plan.buffers[bid].nbytes, spec.dtype, (spec.count,), self,
                       self.device.ordinal)

    def counter_array(self, port: PortHandle):
        """A CuPy view (one uint32) of an append output's counter."""
        ref = self._ref(port)
        g = self._ensure_built()
        cid = g.plan.counters.get(ref)
        if cid is None:
            raise ValueError(f"{port.block.name}.{port.name} is not an append output")
        return as_cupy(g.pointers[cid], 4, "u32", (1,), self, self.device.ordinal)

    # -- diagnostics ---------------------------------------------------------------------------------------
    def on_diagnostic(self, fn: Callable[[Diagnostic], None]) -> Callable[[], None]:
        """Call ``fn`` for every diagnostic; returns a function that stops it."""
        self._diagnostic_listeners.append(fn)
        return lambda: self._diagnostic_listeners.remove(fn) if fn in self._diagnostic_listeners else None

    def on_applied(self, fn: Callable[[UpdatePlan, tuple[str, ...], float], None]) -> Callable[[], None]:
        """Call ``fn(plan, tiers_done, seconds)`` after each update plan is applied."""
        self._applied_listeners.append(fn)
        return lambda: self._applied_listeners.remove(fn) if fn in self._applied_listeners else None

    def _notify_applied(self, up: UpdatePlan, done, t0) -> None:
        if self._applied_listeners:
            dt = (time.perf_counter_ns() - t0) / 1e9
            for fn in list(self._applied_listeners):
                fn(up, tuple(done), dt)

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
                       block.id if block else None)
        self.diagnostics.append(d)
        for fn in list(self._diagnostic_listeners):
            fn(d)
        if raise_errors:
            raise err

    # -- lifetime ------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed; create a new one")

    def close(self) -> None:
        """Wait for the GPU, then free graphs, modules, buffers, library state and streams."""
        if self._closed:
            return
        self._closed = True
        self.device.make_current()
        drv.cuStreamSynchronize(self._stream)
        self._retire(None, {})
        for key, fn in self._library_teardown.items():
            fn(self._library_state.get(key))
        self._library_state.clear()
        self._modules.close()
        self._pool.close()
        drv.cuStreamDestroy(self._stream)
        drv.cuStreamDestroy(self._capture_stream)
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


__all__ = ["Engine", "Frame", "Diagnostic", "KernelSpec"]
