"""Tooltips: what a port or a link holds, in one line, read from the plan the engine runs (never the GPU);
and ``str(engine)``, the engine on a few lines.

``str(port)`` and ``str(link)`` give the element type and shape, the bytes, the pool class of its buffer, and
whose memory it is (engine-owned, shared by memory reuse, bound to a user array, fed from the host, zeros).
"""

from __future__ import annotations

from ..blocks._blocks import port_head
from ..cuda._memory import size_class
from ..model import _dtypes
from ..model._describe import PortRef
from ..model._words import counted


def port_text(port) -> str:
    """One line about ``port`` (a PortHandle): type, shape, bytes, and its buffer in the running graph."""
    block = port.block
    engine = block._engine
    rt = engine._rt if engine is not None else None
    g = rt.graph if rt is not None else None
    ref = PortRef(block.id, port.name)
    head = port_head(port, g.plan.shapes.get(ref) if g is not None else None)
    if rt is None:
        return head + " (not in an engine)"
    if ref in rt.bindings:
        return head + ", bound to a user array (its memory, zero-copy)"
    if g is None or ref not in g.plan.port_buffers:
        return head + " (no graph yet)"
    bid = g.plan.port_buffers[ref]
    b = g.plan.buffers[bid]
    where = {"external": "a user array", "zeros": "engine-owned, zeros (nothing feeds it)",
             "delay": "engine-owned, the previous frame's value", "counter": "engine-owned counter",
             "device_scalar": "engine-owned device scalar"}.get(b.kind, "engine-owned")
    if ref in rt.fed:
        where += ", written from the host"
    source = rt.connections.get(ref)
    if source is not None:
        src_block = rt.blocks.get(source.src.block)
        where += f", from {src_block.name if src_block else source.src.block}.{source.src.port}"
        if getattr(source, "delay", 0):
            where += " (delayed: last frame's value)"
    group = next((grp for grp in g.plan.shared if bid in grp), None)
    if group is not None:
        where += f", memory shared with {len(group) - 1} other buffer{'s' if len(group) > 2 else ''} (reuse)"
    return f"{head}, pool class {_dtypes.format_bytes(size_class(max(b.nbytes, 1)))}, {where}"


class Link(tuple):
    """A connection as ``engine.connections`` lists it: a pair ``(src, dst)`` of port handles (it unpacks like
    one) with ``src``, ``dst`` and ``delay`` attributes. ``str(link)`` says what travels on it.

    >>> src, dst = engine.connections[0]   # doctest: +SKIP
    """

    delay: int

    def __new__(cls, src, dst, delay: int = 0):
        link = super().__new__(cls, (src, dst))
        link.delay = delay
        return link

    @property
    def src(self):
        return self[0]

    @property
    def dst(self):
        return self[1]

    def __str__(self) -> str:
        src, dst = self
        text = port_text(src)
        arrow = " -(delay 1)-> " if self.delay else " -> "
        return f"{src.block.name}.{src.name}{arrow}{dst.block.name}.{dst.name}" + text[text.index(":"):]

    def __repr__(self) -> str:
        src, dst = self
        return f"<link {src.block.name}.{src.name} -> {dst.block.name}.{dst.name}>"


def engine_text(engine) -> str:
    """``str(engine)``: device, frame, blocks, graph, rebuilds, the last frame, memory and each block's state."""
    rt = engine._rt
    g = rt.graph
    last_ms = engine._builder.last_build_ms
    lines = [f"engine on {engine.device.name} ({engine.device.arch}): frame {rt.frame}, "
             f"{counted(len(rt.blocks), 'block')}, {counted(len(rt.connections), 'connection')}, "
             f"{counted(len(g.plan.nodes) if g else 0, 'graph node')}, {counted(engine.rebuilds, 'rebuild')}"
             + (f" (the last took {last_ms:.1f} ms)" if last_ms is not None else "")
             + f", profile {engine.profile}"]
    f = engine.last_frame
    if f:
        gpu = f", {f.gpu_us:.1f} us GPU" if f.gpu_us is not None else ""
        lines.append(f"  last frame: {f.host_us:.1f} us host{gpu}, tiers {f.tiers or '-'}")
    s = rt.pool.stats
    lines.append(f"  memory: {s.in_use} buffers in use, {s.bytes_reserved / 2**20:.1f} MiB reserved")
    classes = rt.pool.by_class()
    if classes:
        size = _dtypes.format_bytes
        lines.append("    by pool class: " + ", ".join(f"{size(c)} x{u}" + (f" (+{n} free)" if n else "")
                                                   for c, (u, n) in classes.items()))
    if g is not None:
        lines.append(f"    graph buffers: {engine.stats}")
    for b in rt.blocks.values():
        lines.append(f"  {b.name}: {b.state}" + (f" — {b.message}" if b.message else ""))
    return "\n".join(lines)
