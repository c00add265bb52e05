"""Profiling levels: what a frame's timings cost and where they come from.

==============  =============================================================  ==================================
level           what it measures                                               how (cost)
==============  =============================================================  ==================================
``none``        nothing                                                        the frame is one launch
``summary``     the frame's GPU time (``Frame.gpu_us``)                        two event records around the
                                                                               launch (host calls, no node)
``per_block``   + each block's GPU time (``Frame.blocks``)                     a stamp node per block, beside
                                                                               the frame's chain (a rebuild)
``per_kernel``  + each kernel's (``Frame.kernels``); occupancy per kernel      a stamp node per kernel
``deep``        + the host phases apply / launch / sync (``Frame.phases``)     perf counters on the host
``deep_sync``   each node timed alone, one after another, each waited for:     eager launches with events
                exact times, and a fault names its block (debugging only)      around each node (syncs)
==============  =============================================================  ==================================

Timings are read back without waiting: event pairs and stamp rows live in rings of ``SLOTS`` frames, and a
frame's timings are taken once its end event has completed (at once when the frame was waited for). With
``sync=False`` frames, ``Frame.gpu_us``/``blocks``/``kernels`` of a frame are None and its timings arrive
later on ``engine.timings``; no level but ``deep_sync`` adds a wait. A region, a captured library call and a
GPU-driven batch are timed as one unit (CUDA allows no event or timing nodes to be told apart inside a
conditional body, and a captured call is one child-graph node). Changing between ``none``, ``summary`` and
``deep_sync``, or between ``per_kernel`` and ``deep``, changes nothing in the graph; changing to or from
``per_block`` / ``per_kernel`` adds or removes the stamp nodes (a Structure-tier rebuild).
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Iterator, Mapping
from typing import NamedTuple

import numpy as np

from ..cuda._profile import SLOTS
from ..cuda._stream import destroy_event
from ..model._graphplan import StampLayout
from ._runtime import quietly

LEVELS = ("none", "summary", "per_block", "per_kernel", "deep", "deep_sync")
_STAMPS = {"per_block": "block", "per_kernel": "kernel", "deep": "kernel"}
LOW_OCCUPANCY = 0.25  # below this theoretical occupancy a kernel gets a warning


def stamps_for(level: str) -> str | None:
    """What the graph stamps at ``level``: "block", "kernel" or None."""
    return _STAMPS.get(level)


def check_level(level) -> str:
    if level not in LEVELS:
        raise ValueError(f"the profiling level is one of {', '.join(repr(x) for x in LEVELS)} (got {level!r})")
    return level


class UnitTime(NamedTuple):
    """One block's (or kernel's) timing in a frame: GPU microseconds, and start/end relative to the frame's
    start (over several devices: to the start of the frame on the unit's device, ``Timings.device``)."""

    gpu_us: float
    start_us: float
    end_us: float


class Timings(Mapping[str, UnitTime]):
    """Name -> :class:`UnitTime` for one frame (blocks, or kernels as ``block/kernel``). Built lazily from
    arrays, so recording a frame costs a few array operations whatever the number of blocks.

    ``devices``: each unit's device position (an engine over several devices), or None (all on position 0):
    :meth:`device` tells one unit's, :meth:`on_device` keeps one device's units.

    >>> t = Timings(("a", "b"), np.array([0.0, 2.0]), np.array([2.0, 5.0]), np.array([0, 1]))
    >>> t["b"].gpu_us, list(t), t.device("b"), list(t.on_device(1))
    (3.0, ['a', 'b'], 1, ['b'])
    """

    __slots__ = ("_names", "_start", "_end", "_index", "_devices")

    def __init__(self, names: tuple[str, ...], start_us: np.ndarray, end_us: np.ndarray,
                 devices: np.ndarray | None = None):
        self._names = names
        self._start = start_us
        self._end = end_us
        self._devices = devices
        self._index: dict[str, int] | None = None

    def __getitem__(self, name: str) -> UnitTime:
        if self._index is None:
            self._index = {n: i for i, n in enumerate(self._names)}
        i = self._index.get(name)
        if i is None:
            raise KeyError(f"no timing for {name!r} (timed: {', '.join(self._names) or 'nothing'})")
        s, e = float(self._start[i]), float(self._end[i])
        return UnitTime(max(e - s, 0.0), s, e)

    def device(self, name: str) -> int:
        """The position of the device ``name`` ran on (0 on an engine of one device)."""
        self[name]  # a KeyError naming what was timed
        assert self._index is not None
        return 0 if self._devices is None else int(self._devices[self._index[name]])

    def on_device(self, position: int) -> Timings:
        """The units that ran on the device at ``position`` (an engine over several devices)."""
        keep = [i for i in range(len(self._names))
                if (0 if self._devices is None else int(self._devices[i])) == position]
        return Timings(tuple(self._names[i] for i in keep), self._start[keep], self._end[keep],
                       None if self._devices is None else self._devices[keep])

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return "Timings(" + ", ".join(f"{n}={self[n].gpu_us:.2f}us" for n in self._names) + ")"


class FrameTimes(NamedTuple):
    """A frame's GPU timings, as ``engine.timings`` delivers them once the GPU is done with the frame."""

    frame: int
    gpu_us: float | None
    blocks: Timings | None
    kernels: Timings | None


@functools.lru_cache(maxsize=16)
def _pred_index(layout: StampLayout) -> np.ndarray:
    """Column -> its predecessor columns, padded by repeating the first: made once per plan, not per frame."""
    width = max(len(p) for p in layout.preds)
    preds = np.zeros((len(layout.preds), width), dtype=np.int64)
    for c, p in enumerate(layout.preds):
        preds[c, :len(p)] = p
        preds[c, len(p):] = p[0] if p else 0
    return preds


def timings_from_row(layout: StampLayout, row: np.ndarray, blocks: Mapping[int, str]) -> tuple:
    """(blocks, kernels) Timings from one ring row of stamps (ns); ``blocks`` (id -> name) is read only when
    the stamps are per kernel (to group kernels into their blocks)."""
    t0 = row[0]
    end = (row - t0) / 1e3
    start = end[_pred_index(layout)].max(axis=1)
    names = layout.names[1:]
    units = Timings(names, start[1:], end[1:])
    if layout.per == "block":
        return units, None
    # blocks from kernels: first start to last end of the block's units
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    order: list[int] = []
    for c in range(1, len(layout.names)):
        b = layout.blocks[c]
        if b is None:
            continue
        if b not in first:
            order.append(b)
            first[b], last[b] = start[c], end[c]
        else:
            first[b], last[b] = min(first[b], start[c]), max(last[b], end[c])
    by_block = Timings(tuple(blocks.get(b, str(b)) for b in order), np.array([first[b] for b in order]),
                       np.array([last[b] for b in order]))
    return by_block, units


def merged_timings(parts, blocks: Mapping[int, str]) -> tuple:
    """(blocks, kernels) Timings of a frame over several devices, from ``parts``: (device position, layout,
    ring row) for each device's stamps. Each unit is tagged with its device, and its start and end are
    relative to that device's start stamp (the GPUs' timers are not one clock). A copy from another device
    is a unit of no block: listed with the kernels, never with the blocks."""
    out: list[tuple[list, list, list, list]] = [([], [], [], []), ([], [], [], [])]
    per = "block"
    for d, layout, row in parts:
        per = layout.per
        by_block, kernels = timings_from_row(layout, row, blocks)
        units = [by_block] if per == "block" else [by_block, kernels]
        for which, t in enumerate(units):
            names, start, end, devs = out[which]
            for i, name in enumerate(t._names):
                if per == "block" and layout.blocks[i + 1] is None:
                    continue  # a copy in a per-block layout: it times the blocks after it, and is no block
                names.append(name)
                start.append(t._start[i])
                end.append(t._end[i])
                devs.append(d)

    def timings(names, start, end, devs) -> Timings:
        return Timings(tuple(names), np.array(start, dtype=np.float64), np.array(end, dtype=np.float64),
                       np.array(devs, dtype=np.int64))

    return timings(*out[0]), (timings(*out[1]) if per == "kernel" else None)


class Profiler:
    """The engine's profiling state: the level, the event ring, frames whose timings are still in flight."""

    def __init__(self, rt, fast, on_times):
        self.rt = rt
        self.fast = fast
        self.level = "none"
        self._emit = on_times  # FrameTimes -> None (the engine's timings stream)
        self._events: list = []  # SLOTS (start, end, start handle, end handle) event pairs, made on first use
        self._next = 0
        self._pending: collections.deque = collections.deque()  # (frame, slot, graph, launch) in flight
        self.last: FrameTimes | None = None

    # -- the event ring -----------------------------------------------------------------------------------
    def _ring(self):
        if not self._events:
            dev = self.rt.device
            pairs = []
            for _ in range(SLOTS):
                a, b = dev.create_event(), dev.create_event()
                pairs.append((a, b, int(a), int(b)))
            self._events = pairs
        return self._events

    def begin(self, stream: int) -> int:
        """Before a launch: the slot this frame uses; records its start event."""
        ring = self._ring()
        if len(self._pending) == SLOTS:  # every slot in flight: drop the oldest frame's timings, never wait
            self._pending.popleft()
        slot = self._next
        self._next = (slot + 1) % SLOTS
        self.fast.record(ring[slot][2], stream)
        return slot

    def end(self, stream: int, slot: int, frame: int, graph, frames: int = 1) -> None:
        """Right after a launch of ``frames`` frames (the last is ``frame``): records the end event and
        hands the frame to :meth:`finish`."""
        self.fast.record(self._events[slot][3], stream)
        self.finish(slot, frame, graph, frames)

    def finish(self, slot: int, frame: int, graph, frames: int = 1) -> None:
        """A launch whose end event is recorded: its stamp rows are the graph ring's next ``frames`` rows
        (a GPU-driven batch tells how many frames it ran once it is done)."""
        ring = graph.stamps
        launch = -1
        if ring is not None:
            ring.launches += frames
            launch = ring.launches - 1
        self._pending.append((frame, slot, graph, launch))

    def record_end(self, stream: int, slot: int) -> None:
        """The end event of ``slot``, recorded after a launch whose frame count is known only later."""
        self.fast.record(self._events[slot][3], stream)

    def collect(self, synced: bool) -> FrameTimes | None:
        """Timings of every frame in flight whose end event has completed (all of them after a wait), each
        published; returns the newest one collected."""
        newest = None
        while self._pending:
            frame, slot, graph, launch = self._pending[0]
            a, b, _, hb = self._events[slot]
            if not synced and not self.fast.done(hb):
                break
            self._pending.popleft()
            gpu_us = self.fast.elapsed_us(self._events[slot][2], hb)
            blocks = kernels = None
            layout, ring = graph.plan.stamps, graph.stamps
            if layout is not None and ring is not None and launch >= 0:
                names = {bid: blk.name for bid, blk in self.rt.blocks.items()} if layout.per == "kernel" else {}
                if hasattr(ring, "parts"):  # several devices: each device's ring (rxcuda.engine._devices)
                    blocks, kernels = merged_timings(ring.parts(launch), names)
                else:
                    blocks, kernels = timings_from_row(layout, ring.row(launch), names)
            newest = FrameTimes(frame, gpu_us, blocks, kernels)
            self._note(newest)
            self._emit(newest)
        return newest

    def _note(self, times: FrameTimes) -> None:
        """Keep the last timings (str(block) shows them)."""
        self.last = times

    # -- deep_sync: node by node -------------------------------------------------------------------------
    def run_eager(self, g, stream: int, frame: int) -> FrameTimes:
        """Run the frame node by node with an event pair around each top-level unit (a kernel, a call, a
        region) and a wait after each node: exact per-unit times, and a fault raised right after the node
        that caused it (the error names it)."""
        dev, fast, label = self.rt.device, self.fast, {bid: blk.name for bid, blk in self.rt.blocks.items()}
        names: list[str] = []
        owners: list[int] = []
        start: list[float] = []
        end: list[float] = []
        clock = [0.0]
        a, b = dev.create_event(), dev.create_event()
        ha, hb = int(a), int(b)

        def timed(plan, run) -> None:
            fast.record(ha, stream)
            run()
            fast.record(hb, stream)
            fast.wait(stream)
            us = fast.elapsed_us(ha, hb)
            names.append(label.get(plan.region, plan.label) if hasattr(plan, "region") else plan.label)
            owners.append(plan.region if hasattr(plan, "region") else plan.block)
            start.append(clock[0])
            clock[0] += us
            end.append(clock[0])

        try:
            g.run_eagerly(stream, check_each=True, around=timed)
        finally:
            quietly(lambda: destroy_event(a, api=self.rt.api))
            quietly(lambda: destroy_event(b, api=self.rt.api))
        kernels = Timings(tuple(names), np.array(start), np.array(end))
        order = list(dict.fromkeys(owners))
        first = {x: min(s for s, y in zip(start, owners, strict=True) if y == x) for x in order}
        last = {x: max(e for e, y in zip(end, owners, strict=True) if y == x) for x in order}
        blocks = Timings(tuple(label.get(x, str(x)) for x in order), np.array([first[x] for x in order]),
                         np.array([last[x] for x in order]))
        times = FrameTimes(frame, clock[0], blocks, kernels)
        self._note(times)
        self._emit(times)
        return times

    def close(self) -> None:
        api = self.rt.api
        for a, b, _, _ in self._events:
            quietly(lambda a=a: destroy_event(a, api=api))
            quietly(lambda b=b: destroy_event(b, api=api))
        self._events = []
        self._pending.clear()


class Phases:
    """Host phase timer for the ``deep`` level: ``mark(name)`` closes the phase running since the last mark."""

    __slots__ = ("t", "out")

    def __init__(self):
        self.t = time.perf_counter_ns()
        self.out: dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter_ns()
        self.out[name] = (now - self.t) / 1e3
        self.t = now


def occupancy(api, function, block_threads: int, shared_mem: int, max_threads_per_sm: int) -> float:
    """Theoretical occupancy of a kernel launch: resident threads per SM (cuOccupancyMaxActiveBlocksPerMultiprocessor
    times the block size) over the SM's maximum."""
    from ..cuda._modules import max_active_blocks

    blocks = max_active_blocks(function, block_threads, shared_mem, api=api)
    return min(1.0, blocks * block_threads / max(max_threads_per_sm, 1))
