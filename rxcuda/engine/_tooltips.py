"""Tooltips: what a port or a link holds, in one line, read from the plan the engine runs (never the GPU).

``str(port)`` and ``str(link)`` give the element type and shape, the bytes, the pool class of its buffer, and
whose memory it is (engine-owned, shared by memory reuse, bound to a user array, fed from the host, zeros).
"""

from __future__ import annotations

from ..blocks._blocks import port_head
from ..cuda._memory import size_class
from ..model import _dtypes
from ..model._describe import PortRef


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
