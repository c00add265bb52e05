"""Data in and out of a running pipeline: write, read, count, array views, streamed inputs (feed), output
taps (observe), and ordering after the user's own GPU work (wait).

Everything here runs on the engine's thread (the facade routes calls there while ``run()`` drives the
frames) and every copy goes on the engine's stream, ordered with the frames.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import reactivex
from reactivex import Observable
from reactivex.disposable import Disposable

from ..cuda._graph import CompiledGraph
from ..cuda._memory import DeviceBuffer, as_cupy
from ..cuda._stream import wait_event, wait_stream
from ..model import _dtypes
from ..model._describe import CountSpec, PortRef
from ..model._errors import ValidationError
from ..model._events import BlockChanged
from ..plan._liveness import holds_own_value
from . import _shapes_io
from ._append import AppendMonitor
from ._ports import InputFeed, OutputTap
from ._runtime import Runtime, quietly


class DataIO:
    def __init__(self, rt: Runtime, ensure_built: Callable[..., CompiledGraph], owner):
        self.rt = rt
        self._ensure_built = ensure_built
        self._owner = owner  # kept alive by CuPy views of port buffers
        self.staged: dict[PortRef, np.ndarray] = {}  # host data written before its port had a buffer
        self.feeds: dict[PortRef, tuple[InputFeed, Any]] = {}  # (feed, subscription)
        self.taps: list[tuple[PortRef, OutputTap, Any]] = []  # (port, tap, observer)
        self.tap_shapes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tap -> (spec, [shape])
        self.tap_plan: object = None  # the plan the taps' shapes were last checked against
        self.feed_specs: dict[PortRef, Any] = {}  # fed port -> its spec, for resizes
        self.feed_plan: object = None
        self.appends = AppendMonitor(rt)  # append ports' counts read back: states, warnings, count watches

    # -- write / read --------------------------------------------------------------------------------
    def keep(self, ref: PortRef, port, reading: bool = False) -> None:
        """Keep the port out of memory reuse (``PipelineDescription.kept``). Where it shares memory in the
        running graph a rebuild is queued that gives it memory of its own (the next build, or the read that
        follows). ``reading``: say so when that rebuild cannot bring the last frame's value along."""
        rt = self.rt
        if ref in rt.kept:
            return
        with rt.lock:
            rt.kept.add(ref)
        g = rt.graph
        if g is None or not g.plan.storage:
            return
        bid = g.plan.port_buffers.get(ref)
        if bid is None or bid not in g.plan.storage:
            return
        name = f"{port.block.name}.{port.name}"
        rt.pending.add(BlockChanged(ref.block, port.block.name, f"{name} kept: it gets memory of its own"))
        if reading and rt.frame and not holds_own_value(g.plan, bid):
            rt.reporter.warn(name, f"{name} shared its memory with later buffers (memory reuse), so its value from "
                             "the last frame is gone: this read gives zeros, and from the next frame on the port has "
                             f"memory of its own. Call engine.keep({port.block.name}['{port.name}']) before the "
                             "first frame to read it from the start, or create the engine with "
                             "Engine(reuse_memory=False)", port.block)

    def write(self, ref: PortRef, port, data, resize: bool = False) -> None:
        rt = self.rt
        spec = port.spec
        # check before anything changes: a rejected write must not make the input host-fed (element types,
        # shapes, vector lanes on a last axis, structs: rxcuda.engine._shapes_io)
        arr, _shape, new_shape = _shapes_io.host_elements(port, data, _shapes_io.current_shape(rt, ref, spec),
                                                          resize)
        if new_shape is not None:
            _shapes_io.resize(rt, ref, port, _shapes_io.check_resize(rt, ref, port, new_shape))
        self.keep(ref, port)
        with rt.lock:
            newly_fed = (spec.direction == "in" and ref not in rt.fed and ref not in rt.bindings
                         and not rt.is_connected(ref))
            if newly_fed:
                rt.fed.add(ref)
        if newly_fed:
            rt.pending.add(BlockChanged(ref.block, port.block.name, f"input {port.name} fed from the host"))
        g = rt.graph
        if g is None or rt.pending.structure_pending or ref not in g.plan.port_buffers:
            # no buffer yet (or one about to change): upload right after the next successful build
            self.staged[ref] = arr.copy()
            return
        if rt.preparing:  # the graph being prepared gets it too, when it is swapped in
            self.staged[ref] = arr.copy()
        elif self.staged:
            self.staged.pop(ref, None)  # older data must not land over this after a later build
        bid = g.plan.port_buffers[ref]
        DeviceBuffer(g.pointers[bid], g.plan.buffers[bid].nbytes, api=rt.api).upload(arr, rt.stream)

    def upload_staged(self) -> None:
        rt = self.rt
        g = rt.graph
        if g is None:
            return
        for ref, arr in list(self.staged.items()):
            bid = g.plan.port_buffers.get(ref)
            if bid is not None:
                del self.staged[ref]
                try:
                    DeviceBuffer(g.pointers[bid], g.plan.buffers[bid].nbytes, api=rt.api).upload(arr, rt.stream)
                except ValueError as e:  # checked at write(); a buffer that changed size since then lands here
                    block = rt.blocks.get(ref.block)
                    rt.reporter.warn(f"{block.name if block else ref.block}.{ref.port}",
                                     f"data written before the rebuild was dropped: {e}", block)

    def forget(self, ref: PortRef) -> None:
        self.staged.pop(ref, None)

    def port_buffer(self, ref: PortRef, port) -> tuple[int, int]:
        g = self._ensure_built(ref)
        bid = g.plan.port_buffers.get(ref)
        if bid is None:
            raise RuntimeError(f"{port.block.name}.{port.name} is not in the running graph (its block failed to "
                               "build?); see engine.diagnostics")
        if bid in g.plan.storage and ref in self.rt.kept:  # the rebuild that un-shares it failed
            raise RuntimeError(f"{port.block.name}.{port.name} still shares its memory with other buffers: the "
                               "rebuild that gives it its own failed (see engine.diagnostics); fix that, or create "
                               "the engine with Engine(reuse_memory=False)")
        return bid, g.pointers[bid]

    def read(self, ref: PortRef, port, out: np.ndarray | None = None) -> np.ndarray:
        rt = self.rt
        if ref not in rt.kept:
            self.keep(ref, port, reading=True)
        bid, ptr = self.port_buffer(ref, port)
        spec = port.spec
        if isinstance(spec, CountSpec):  # an append port's count: read (and noted) like engine.count
            value = np.array([self.count(ref, port)], np.uint32)
            if out is None:
                return value
            _dtypes.check_out(out, value.shape, value.dtype)
            out[...] = value
            return out
        shape = _shapes_io.running_shape(rt.running(), ref, spec)
        if spec.counter is not None:
            shape = (min(self.count(ref, port), math.prod(shape)),)
        out, raw = _shapes_io.empty_for_read(spec, shape, out)  # vectors as (..., lanes), strided ports gathered
        if out.size:
            DeviceBuffer(ptr, raw.nbytes, api=rt.api).download(raw, rt.stream)
        else:
            rt.synchronize()
        return _shapes_io.gathered(out, raw, spec)

    def _counter(self, ref: PortRef, port) -> tuple[CompiledGraph, int]:
        g = self._ensure_built(ref)
        cid = g.plan.counters.get(ref)
        if cid is None and isinstance(port.spec, CountSpec):  # port.count: the counter itself
            cid = g.plan.port_buffers.get(ref)
        if cid is None:
            raise ValueError(f"{port.block.name}.{port.name} is not an append output")
        return g, cid

    def count(self, ref: PortRef, port) -> int:
        g, cid = self._counter(ref, port)
        out = np.empty(1, np.uint32)
        raw = int(DeviceBuffer(g.pointers[cid], 4, api=self.rt.api).download(out, self.rt.stream)[0])
        self.appends.note(ref, self.rt.frame, raw)
        return raw

    def array(self, ref: PortRef, port):
        if ref not in self.rt.kept:
            self.keep(ref, port, reading=True)
        bid, ptr = self.port_buffer(ref, port)
        spec = port.spec
        g = self.rt.running()
        dtype, shape = _shapes_io.device_view(spec, _shapes_io.running_shape(g, ref, spec))
        return as_cupy(ptr, g.plan.buffers[bid].nbytes, dtype, shape, self._owner, self.rt.device.ordinal)

    def counter_array(self, ref: PortRef, port):
        g, cid = self._counter(ref, port)
        return as_cupy(g.pointers[cid], 4, "u32", (1,), self._owner, self.rt.device.ordinal)

    # -- ordering after the user's work ----------------------------------------------------------------
    def wait(self, obj) -> None:
        """The engine's stream waits for a stream's work so far, or for an event (no host wait)."""
        rt = self.rt
        kind, handle = _stream_or_event(obj)
        if kind == "stream":
            wait_stream(rt.stream, handle, api=rt.api)
        else:
            wait_event(rt.stream, handle, api=rt.api)

    # -- feeds: an input from an Observable ---------------------------------------------------------
    def feed(self, ref: PortRef, port, source, warn) -> Disposable:
        rt = self.rt
        spec = port.spec
        if spec.direction != "in":
            raise ValidationError(f"{port.block.name}.{port.name} is an output; feed() takes an input port",
                                  subject=port.block.name)
        # a vector port streams its lanes as scalars: arrays shaped (..., lanes)
        dtype, count, _lanes = _shapes_io.stream_layout(spec, math.prod(_shapes_io.current_shape(rt, ref, spec)))
        feed = InputFeed(f"{port.block.name}.{port.name}", dtype, count, api=rt.api)
        with rt.lock:
            if ref in self.feeds:
                raise ValueError(f"{port.block.name}.{port.name} is already fed by a stream; dispose that first")
            if rt.is_connected(ref) or ref in rt.bindings:
                raise ValidationError(f"{port.block.name}.{port.name} is connected or bound; a fed input needs "
                                      "its own buffer", subject=port.block.name)
            self.feed_specs[ref] = spec  # (after the checks: a refused feed leaves a fed port's spec alone)
            newly = ref not in rt.fed
            rt.fed.add(ref)
            rt.kept.add(ref)

        def on_next(arr) -> None:
            try:
                feed.push(arr)
            except (TypeError, ValueError) as e:
                warn(feed.label, str(e), port.block)

        sub = source.subscribe(on_next, lambda e: warn(feed.label, f"input stream failed: {e}", port.block))
        self.feeds[ref] = (feed, sub)
        if newly:
            rt.pending.add(BlockChanged(ref.block, port.block.name, f"input {port.name} fed from a stream"))
        return sub

    def close_feed(self, ref: PortRef, gpu: Callable) -> None:
        entry = self.feeds.pop(ref, None)
        if entry is not None:
            feed, sub = entry
            sub.dispose()
            gpu(feed.close)

    def stage_feeds(self, g: CompiledGraph) -> None:
        stream = self.rt.stream
        if g.plan is not self.feed_plan:  # a rebuild or a resize: feeds take the ports' new element counts
            self.feed_plan = g.plan
            _shapes_io.retarget_feeds(g, self.feeds, self.feed_specs)
        for ref, (feed, _sub) in self.feeds.items():
            if feed.dirty:
                bid = g.plan.port_buffers.get(ref)
                if bid is not None:
                    feed.stage(g.pointers[bid], stream)

    # -- taps: a port as an Observable ---------------------------------------------------------------
    def observe(self, ref: PortRef, port, every: int, kind: str, gpu: Callable, closed: Callable[[], bool]
                ) -> Observable:
        if kind not in ("numpy", "cupy"):
            raise ValueError(f"'kind' must be 'numpy' or 'cupy' (got {kind!r})")
        if not isinstance(every, int) or isinstance(every, bool) or every <= 0:
            raise ValueError(f"'every' must be a positive int (got {every!r})")
        spec = port.spec
        api = self.rt.api
        if isinstance(spec, CountSpec):  # engine.observe(port.count): ints, one shared 4-byte copy per frame
            return self.appends.observe(ref, every, gpu, closed, self)
        on_count = None
        if spec.counter is not None:  # the data's counter comes back with it: it updates the port's state too

            def on_count(frame: int, raw: int) -> None:
                self.appends.note(ref, frame, raw)

        def subscribe(observer, scheduler=None):
            if closed():
                observer.on_completed()
                return Disposable()
            self.keep(ref, port)
            emit, dtype, count, cell = observer.on_next, spec.dtype, spec.count, None
            if spec.counter is None:  # arrays of the port's shape, vector lanes on a last axis; resizes follow
                g = self.rt.graph
                shape = spec.shape if g is None else _shapes_io.running_shape(g, ref, spec)
                dtype, count, lanes = _shapes_io.stream_layout(spec, math.prod(shape))
                cell = [shape + lanes]

                def emit(a, on_next=observer.on_next, cell=cell):
                    on_next(a.reshape(cell[0]))
            tap = OutputTap(emit, dtype=dtype, count=count, every=every,
                            as_numpy=kind == "numpy", append=spec.counter is not None, api=api,
                            on_count=on_count)
            if cell is not None:
                self.tap_shapes[tap] = (spec, cell)
            entry = (ref, tap, observer)
            self.taps = self.taps + [entry]

            def dispose() -> None:
                self.taps = [t for t in self.taps if t is not entry]
                tap.closed = True
                if not closed():
                    gpu(tap.close)

            return Disposable(dispose)

        return reactivex.create(subscribe)

    def enqueue_taps(self, g: CompiledGraph, frame: int) -> None:
        stream = self.rt.stream
        if g.plan is not self.tap_plan:  # a rebuild or a resize: taps follow the ports' shapes
            self.tap_plan = g.plan
            _shapes_io.retarget_taps(g, self.taps, self.tap_shapes)
        storage = g.plan.storage
        for ref, tap, _obs in self.taps:
            bid = g.plan.port_buffers.get(ref)
            if bid is None or bid in storage:  # sharing memory until the rebuild its subscription queued
                continue
            cid = g.plan.counters.get(ref)
            tap.enqueue(frame, g.pointers[bid], g.pointers[cid] if cid is not None else None, stream)

    def deliver_taps(self, synced: bool, warn) -> None:
        rt = self.rt
        for ref, tap, _obs in self.taps:
            try:
                tap.deliver(rt.stream, synced, self._owner, rt.device.ordinal)
            except Exception as e:  # a subscriber's error must not stop the frames
                block = rt.blocks.get(ref.block)
                warn(f"observe {block.name if block else ref.block}.{ref.port}", str(e), block)

    def close(self) -> None:
        """Stop every feed and tap; taps' observers complete (the caller waited for the GPU)."""
        for ref in list(self.feeds):
            feed, sub = self.feeds.pop(ref)
            sub.dispose()
            quietly(feed.close)
        taps, self.taps = self.taps, []
        for _ref, tap, observer in taps:
            quietly(tap.close)
            quietly(observer.on_completed)



def _stream_or_event(obj) -> tuple[str, int]:
    """('stream' | 'event', raw handle) for the stream and event objects of CUDA Python libraries."""
    if hasattr(obj, "__cuda_stream__"):
        _version, handle = obj.__cuda_stream__()
        return "stream", int(handle)
    name = type(obj).__name__.lower()
    if "event" in name:
        for attr in ("ptr", "cuda_event", "handle"):
            if hasattr(obj, attr):
                return "event", int(getattr(obj, attr))
    for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy.cuda.Stream, cuda.core Stream
        if hasattr(obj, attr):
            return "stream", int(getattr(obj, attr))
    if isinstance(obj, int) and not isinstance(obj, bool):
        return "stream", obj
    raise TypeError(f"engine.wait takes a CUDA stream or event (CuPy, PyTorch, cuda.core, or an object with "
                    f"__cuda_stream__); got {type(obj).__name__}")
