"""Delayed connections on the engine's side: what a previous-frame buffer holds across rebuilds.

The planner (``plan/_delays.py``) gives each delayed output a previous-frame buffer and a copy node. Here:

- ``engine.connect(..., delay=1, initial=...)`` turns the user's initial value into an array of the output
  port's dtype and element count (:func:`initial_connection`);
- after a successful build, a previous-frame buffer that is new, or whose delayed connections were all
  replaced since the last build (disconnected and connected again), gets its frame-0 value: zeros (a new
  buffer is zeroed already) or the initial value. A rebuild that does not touch it keeps its contents: the
  builder keeps buffers by key, and this keeps their state;
- ``engine.reset_delays()`` gives every previous-frame buffer its frame-0 value again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from ..cuda._memory import DeviceBuffer, set_bytes_async
from ..model import _dtypes
from ..model._describe import Connection, PipelineDescription, PortRef
from ..model._errors import ValidationError
from ..model._graphplan import BufferPlan, GraphPlan
from ..plan._delays import initial_array, same_initial
from ._runtime import Runtime


def initial_connection(conn: Connection, src, dst, initial) -> Connection:
    """``conn`` with its initial value as an array of the source port's dtype and element count; raises
    ValidationError naming the connection and the fix when the value does not fit. A source that is not an
    output is left to the connection checks (their message says what to connect instead)."""
    spec = src.spec
    if spec.direction != "out":
        return conn
    where = f"the delayed connection {src.block.name}.{src.name} -> {dst.block.name}.{dst.name}"
    try:
        arr = initial_array(initial, spec, where)
    except ValueError as e:
        raise ValidationError(str(e), subject=dst.block.name) from None
    return Connection(conn.src, conn.dst, conn.delay, arr)


def check_shared_initial(conn: Connection, connections: Iterable[Connection], labels: Mapping[int, object]) -> None:
    """Refuse a delayed connection whose initial value differs from the one another delayed connection from
    the same output gave (they share one previous-frame buffer)."""
    if not conn.delay or conn.initial is None:
        return
    for c in connections:
        if c.delay and c.src == conn.src and c.initial is not None and not same_initial(c.initial, conn.initial):
            def name(r: PortRef) -> str:
                return f"{getattr(labels.get(r.block), 'name', r.block)}.{r.port}"

            raise ValidationError(
                f"{name(conn.src)} already feeds {name(c.dst)} through a delayed connection with another initial "
                f"value; one output has one previous-frame buffer, shared by every delayed input it feeds: give "
                f"the same initial value, or none (it then keeps the one given)", subject=name(conn.dst))


class DelayState:
    """Gives previous-frame buffers their frame-0 values: when they are made or reconnected (``built``) and
    when the user asks (``reset``). Runs on the engine's thread; every copy goes on the engine's stream."""

    def __init__(self, rt: Runtime):
        self.rt = rt
        # delay buffer key -> the delayed connections (the objects themselves) it was last built for
        self.links: dict[tuple, tuple[Connection, ...]] = {}

    def built(self, gp: GraphPlan, desc: PipelineDescription, pointers: Mapping[int, int],
              new_keys: Iterable[tuple]) -> None:
        """After a successful build: initialize the previous-frame buffers that are new (``new_keys``: their
        buffer keys; the pool zeroed them) or whose every delayed connection is new since the last build."""
        if not gp.delays and not self.links:
            return
        new = set(new_keys)
        by_src = _delayed_by_source(desc.connections)
        links: dict[tuple, tuple[Connection, ...]] = {}
        for prev in gp.delays.values():
            b = gp.buffers[prev]
            conns = by_src.get(PortRef(b.key[1], b.key[2]), ())
            links[b.key] = conns
            old = self.links.get(b.key, ())
            fresh = b.key in new
            if fresh or not any(c is o for c in conns for o in old):  # made now, or every connection replaced
                self._initialize(b, pointers[prev], _initial(conns), zeroed=fresh)
        self.links = links

    def reset(self) -> int:
        """Give every previous-frame buffer of the running graph its frame-0 value; returns how many."""
        rt = self.rt
        g = rt.graph
        if g is None:
            return 0
        with rt.lock:
            by_src = _delayed_by_source(rt.connections.values())
        for prev in g.plan.delays.values():
            b = g.plan.buffers[prev]
            self._initialize(b, g.pointers[prev], _initial(by_src.get(PortRef(b.key[1], b.key[2]), ())),
                             zeroed=False)
        refresh = getattr(g, "refresh_replicas", None)  # several devices: their copies of those buffers too
        if refresh is not None:
            refresh(rt.stream)
        return len(g.plan.delays)

    def _initialize(self, b: BufferPlan, ptr: int, initial, zeroed: bool) -> None:
        rt = self.rt
        if initial is not None:
            host = np.ascontiguousarray(initial, dtype=_dtypes.to_numpy(b.dtype) if b.dtype else np.uint8)
            DeviceBuffer(ptr, b.nbytes, api=rt.api).upload(host, rt.stream)  # ordered after the frames in flight
        elif not zeroed:
            set_bytes_async(ptr, 0, b.nbytes, rt.stream, api=rt.api)


def _delayed_by_source(connections: Iterable[Connection]) -> dict[PortRef, tuple[Connection, ...]]:
    out: dict[PortRef, list[Connection]] = {}
    for c in connections:
        if c.delay:
            out.setdefault(c.src, []).append(c)
    return {k: tuple(v) for k, v in out.items()}


def _initial(conns: Iterable[Connection]):
    """The first initial value given among a delayed output's connections (the planner refuses two that
    differ), or None: zeros."""
    for c in conns:
        if c.initial is not None:
            return c.initial
    return None
