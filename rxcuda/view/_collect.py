"""What the live view sends, gathered from an engine's streams (``rxcuda/view/PROTOCOL.md`` says the format).

:class:`Collector` subscribes to ``engine.frames``, ``updates``, ``diagnostics``, ``parameter_changes``,
``structure_changes`` and ``file_changes``. Its subscribers run on whichever thread published (mostly the
engine thread) and only store: one append or one dict assignment under the collector's own lock (never the
engine's), and a wake-up call for the server's loop at most once per message interval. The server's loop
then :meth:`~Collector.drain`\\ s everything since the last message and turns it into JSON-ready messages.

The graph and status messages (:func:`graph_message`, :func:`status_message`) are built on the server's
thread when the structure changed or about once a second: they read the engine's description the way
``to_dot`` does (``_dot._engine_parts``), never per frame.

>>> import rxcuda
>>> with rxcuda.Engine(driver=rxcuda.cuda.NullDriver()) as engine:
...     mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=16, scale=2.0))
...     [b["name"] for b in graph_message(engine)["blocks"]], graph_message(engine)["layout"]
(['scalar_mul'], {'scalar_mul': [20, 20]})
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..blocks._composite import CompositeInstance
from ..engine._engine import Engine
from ..model._describe import PortRef
from ..model._events import Tier
from ._dot import _engine_parts, _Pipeline

MAX_FRAMES = 1000  # frames kept between two messages (a page that stalls loses the oldest)
MAX_DIAGNOSTICS = 50  # diagnostics sent per message interval; more are counted in one closing line
FPS_WINDOW_S = 2.0  # the frame rate is measured over the frames of the last this many seconds
# the layout of the graph picture, in px: layers by topological depth left to right
BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 180, 60, 60, 40, 20

_now = time.perf_counter


class Batch:
    """Everything the collector gathered since the last :meth:`Collector.drain`."""

    __slots__ = ("frames", "marks", "fps", "blocks", "params", "diagnostics", "dropped", "graph", "status")

    def __init__(self) -> None:
        self.frames: list[list] = []  # [index, host_us, gpu_us | None, when the server saw it (s)]
        self.marks: list[list] = []  # [index, tier or "reload"]
        self.fps = 0.0
        self.blocks: dict[str, float] = {}  # block name -> GPU us of the latest profiled frame
        self.params: dict[tuple[int, str], Any] = {}  # (block id, parameter) -> latest value
        self.diagnostics: list = []
        self.dropped = 0  # diagnostics beyond MAX_DIAGNOSTICS
        self.graph = False  # the structure (or a block's state) changed
        self.status = False  # a rebuild happened: send the status now


class Collector:
    """Stores what the engine's streams publish until the server's loop drains it (see the module docstring).

    ``wake`` is called (from the publishing thread, outside any lock) when something arrives and no wake-up
    is outstanding; :meth:`drain` makes the next arrival wake again. ``dispose()`` unsubscribes.
    """

    def __init__(self, engine: Any, wake: Callable[[], None]):  # an Engine, or the view's _source.Source
        self._engine = engine
        self._wake = wake
        self._lock = threading.Lock()
        self._woken = False
        self._frames: deque[tuple] = deque(maxlen=MAX_FRAMES)
        self._marks: deque[tuple] = deque(maxlen=MAX_FRAMES)
        self._stamps: deque[float] = deque(maxlen=512)  # when recent frames arrived
        self._blocks: Any = None  # the latest Frame.blocks (name -> UnitTime)
        self._params: dict[tuple[int, str], Any] = {}
        self._diagnostics: deque = deque(maxlen=MAX_DIAGNOSTICS)
        self._dropped = 0
        self._graph = True
        self._status = True
        self.closed = threading.Event()  # the engine closed (its frames completed)
        self._subs = [
            engine.frames.subscribe(self._on_frame, on_completed=self.closed.set),
            engine.updates.subscribe(self._on_update),
            engine.diagnostics.subscribe(self._on_diagnostic),
            engine.parameter_changes.subscribe(self._on_parameter),
            engine.structure_changes.subscribe(self._on_structure),
            engine.file_changes.subscribe(self._on_file),
        ]

    def dispose(self) -> None:
        for s in self._subs:
            s.dispose()
        self._subs = []

    def _poke(self) -> bool:
        """Under the lock: whether to call ``wake`` once it is released."""
        if self._woken:
            return False
        self._woken = True
        return True

    # -- subscribers (any thread; O(1)) -------------------------------------------------------------------
    def _on_frame(self, f) -> None:
        now = _now()
        with self._lock:
            self._frames.append((f.index, f.host_us, f.gpu_us, now))
            self._stamps.append(now)
            if f.tiers:
                self._marks.append((f.index, max(f.tiers, key=lambda t: Tier(t).rank)))
            if f.blocks:
                self._blocks = f.blocks
            wake = self._poke()
        if wake:
            self._wake()

    def _on_update(self, update) -> None:
        if update.tiers == (Tier.PARAMETERS,):
            return
        with self._lock:  # a rebuild, new code or a recapture: states and buffers may have changed
            self._graph = True
            self._status = self._status or Tier.STRUCTURE in update.tiers
            wake = self._poke()
        if wake:
            self._wake()

    def _on_diagnostic(self, d) -> None:
        with self._lock:
            if len(self._diagnostics) == self._diagnostics.maxlen:
                self._dropped += 1
            self._diagnostics.append(d)
            self._graph = True  # a block's state or message may have changed with it
            wake = self._poke()
        if wake:
            self._wake()

    def _on_parameter(self, event) -> None:
        with self._lock:
            self._params[(event.block, event.name)] = event.value
            wake = self._poke()
        if wake:
            self._wake()

    def _on_structure(self, _event) -> None:
        with self._lock:
            self._graph = True
            wake = self._poke()
        if wake:
            self._wake()

    def _on_file(self, _event) -> None:
        index = self._engine.frame + 1  # the frame the new code can first run in
        with self._lock:
            self._marks.append((index, "reload"))
            wake = self._poke()
        if wake:
            self._wake()

    # -- the server's side --------------------------------------------------------------------------------
    def drain(self) -> Batch:
        """Take everything gathered since the last drain (and allow the next wake-up)."""
        b = Batch()
        now = _now()
        with self._lock:
            self._woken = False
            b.frames = [[i, _round(h), _round(g), round(t, 6)] for i, h, g, t in self._frames]
            b.marks = [list(m) for m in self._marks]
            self._frames.clear()
            self._marks.clear()
            recent = [t for t in self._stamps if now - t <= FPS_WINDOW_S]
            blocks, self._blocks = self._blocks, None
            b.params, self._params = self._params, {}
            b.diagnostics = list(self._diagnostics)
            self._diagnostics.clear()
            b.dropped, self._dropped = self._dropped, 0
            b.graph, b.status = self._graph, self._status
            self._graph = self._status = False
        if len(recent) >= 2 and recent[-1] > recent[0]:
            b.fps = round((len(recent) - 1) / (recent[-1] - recent[0]), 1)
        if blocks:
            b.blocks = {str(name): _round(getattr(t, "gpu_us", t)) for name, t in blocks.items()}
        return b


def _round(v):
    return None if v is None else round(float(v), 2)


# -- whole-engine messages (the server's thread, on a change or about once a second) ------------------------
def graph_message(engine: Engine) -> dict:
    """The ``graph`` message: blocks (state, message, region, composite, device, ports, parameters), links, a
    layered layout and how many devices the engine has (see PROTOCOL.md)."""
    return pipeline_graph(_engine_parts(engine), engine.blocks, len(engine.devices.ordinals))


def pipeline_graph(parts: dict, blocks, devices: int) -> dict:
    """The ``graph`` message of a pipeline given as ``_dot._engine_parts`` gives it (``desc``, ``states``,
    ``messages``, ``composites``, ``plan``), the blocks whose parameters it lists (their declared ranges) and the
    engine's device positions."""
    desc = parts["desc"]
    pipe = _Pipeline(desc, states=parts["states"], messages=parts["messages"], composites=parts["composites"],
                     plan=parts["plan"])
    names = {e.id: e.desc.name for e in desc.blocks}
    params = {b.id: b.params for b in blocks}
    composite: dict[int, str] = {}

    def visit(inst) -> None:  # outer first: an inner instance's path overrides its parent's
        for b in inst.blocks:
            composite[b.id] = inst.name
        for m in inst.members.values():
            if isinstance(m, CompositeInstance):
                visit(m)

    for inst in parts["composites"]:
        visit(inst)
    blocks = []
    for e in desc.blocks:
        region = pipe.regions.get(e.id)
        ports = [{"name": p.name, "direction": p.direction, "dtype": p.dtype,
                  "shape": list(pipe.shape(PortRef(e.id, p.name), p))} for p in pipe.ports(e)]
        prm = params.get(e.id, {})
        blocks.append({
            "id": e.id, "name": e.desc.name, "state": pipe.state(e.id), "message": pipe.messages.get(e.id, ""),
            "kind": "region" if region is not None else "block",
            "region": None if region is None else {
                "kind": region.kind, "bodies": [[names[m] for m in body if m in names] for body in region.bodies]},
            "composite": composite.get(e.id),
            "device": desc.placement.get(e.id, 0),  # its position in Engine(devices=[...]); 0 on one device
            "ports": ports,
            "params": [{"name": s.name, "dtype": s.dtype, "value": _json_value(e.value(s.name)),
                        "min": _limit(prm, s, "min"), "max": _limit(prm, s, "max"), "step": _limit(prm, s, "step")}
                       for s in e.desc.scalars],
        })
    links = []
    for c in desc.connections:
        if c.src.block in names and c.dst.block in names:
            dtype, shape, nbytes = pipe.link_type(c)
            links.append({"src": [names[c.src.block], c.src.port], "dst": [names[c.dst.block], c.dst.port],
                          "dtype": dtype, "shape": list(shape), "bytes": nbytes, "delay": int(c.delay)})
    edges = [(names[c.src.block], names[c.dst.block]) for c in desc.connections
             if not c.delay and c.src.block in names and c.dst.block in names]
    layout, width, height = layered_layout([e.desc.name for e in desc.blocks], edges)
    return {"type": "graph", "blocks": blocks, "links": links, "layout": layout, "width": width, "height": height,
            "devices": devices}


def _limit(params, spec, key: str):
    """A parameter's declared min/max/step: the block's Parameter (what a set enforces), else the spec's."""
    prm = params.get(spec.name) if hasattr(params, "get") else None
    v = getattr(prm, key, None) if prm is not None else getattr(spec, key, None)
    return _json_value(v)


def _json_value(v):
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return int(v)
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def layered_layout(names: list[str], edges: list[tuple[str, str]]) -> tuple[dict[str, list[int]], int, int]:
    """Top-left corners in px of boxes for ``names``: the layer is the longest path from a source along
    ``edges`` (which must not form a cycle; the ones that would are ignored), the row is the order within the
    layer. Returns (positions, width, height).

    >>> layered_layout(["a", "b", "c"], [("a", "b"), ("a", "c"), ("b", "c")])
    ({'a': [20, 20], 'b': [260, 20], 'c': [500, 20]}, 700, 100)
    """
    depth = {n: 0 for n in names}
    succ: dict[str, list[str]] = {n: [] for n in names}
    indeg = dict.fromkeys(names, 0)
    for s, d in edges:
        if s in succ and d in indeg and s != d:
            succ[s].append(d)
            indeg[d] += 1
    ready = deque(n for n in names if indeg[n] == 0)
    while ready:  # Kahn's order; nodes left on a cycle keep depth 0 plus what reached them
        n = ready.popleft()
        for d in succ[n]:
            depth[d] = max(depth[d], depth[n] + 1)
            indeg[d] -= 1
            if indeg[d] == 0:
                ready.append(d)
    rows: dict[int, int] = {}
    pos: dict[str, list[int]] = {}
    for n in names:
        layer = depth[n]
        row = rows.get(layer, 0)
        rows[layer] = row + 1
        pos[n] = [MARGIN + layer * (BOX_W + GAP_X), MARGIN + row * (BOX_H + GAP_Y)]
    width = MARGIN * 2 + (max(depth.values(), default=0) + 1) * (BOX_W + GAP_X) - GAP_X
    height = MARGIN * 2 + max(rows.values(), default=1) * (BOX_H + GAP_Y) - GAP_Y
    return pos, width, height


def status_message(engine: Engine) -> dict:
    """The ``status`` message: rebuilds, memory by pool class, the graph's buffers and append counts."""
    pool = engine._rt.pool
    by_class: list[list[int]] = []
    for _ in range(3):  # the engine thread may change the pool while it is read: try again
        try:
            by_class = [[int(c), int(u), int(f)] for c, (u, f) in pool.by_class().items()]
            break
        except RuntimeError:
            continue
    appends: dict[str, dict] = {}
    for b in engine.blocks:
        for port, state in list(b._appends.items()):
            appends[f"{b.name}.{port}"] = {"count": state.last_count, "capacity": state.capacity,
                                           "overflowed": state.overflowed}
    return {"type": "status", "rebuilds": engine.rebuilds,
            "memory": {"bytes_reserved": int(engine.memory.bytes_reserved), "by_class": by_class},
            "stats": str(engine.stats), "appends": appends}


__all__ = ["Batch", "Collector", "graph_message", "layered_layout", "pipeline_graph", "status_message"]
