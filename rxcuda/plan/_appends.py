"""Append ports, for the planner: shared counters, the once-per-frame reset, counts as device values.

An append port's kernels write items at ``atomicAdd(counter, 1)``. The planner gives each append buffer one
u32 counter (kind ``"counter"``, key ``("counter", block, port)`` of the port that owns it) and one memset
node that zeroes it before the first kernel that appends:

- several kernels of one block may append to one port (``PortSpec.counter_pins``): one buffer, one counter,
  one reset; the buffer hazards order the appenders after the reset (and one after another);
- an in/out append port (direction ``"in"`` with a counter, ``BlockBuilder.append_to``) connected from an
  upstream append port continues that buffer and counter (no reset): blocks append in turn, in the
  connections' order, and downstream blocks connect from the last port of the chain. Unconnected, it owns a
  buffer and a counter like an append output. A chain is one line: an append port that another continues
  is read by no other block (it would see the buffer before the continuing block's items are in);
- ``"items.count"`` (``CountSpec``) names the counter as a u32[1] output: ``port_buffers`` maps it to the
  counter buffer, so an input connected to it reads the count on the device, after every appender (a
  read-after-write hazard on the counter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..model._describe import COUNT_SUFFIX, BlockDescription, Connection, CountSpec, PortRef, PortSpec
from ..model._graphplan import MemsetNodePlan


def _where(blocks: Mapping[int, BlockDescription], ref: PortRef) -> str:
    b = blocks.get(ref.block)
    return f"{b.name if b is not None else f'<block {ref.block}>'}.{ref.port}"


def involved(sp: PortSpec, dp: PortSpec) -> bool:
    """Whether a connection from ``sp`` to ``dp`` needs the append rules (a count source, an in/out target)."""
    return isinstance(sp, CountSpec) or (dp.counter is not None and dp.direction == "in")


def connection_problem(c: Connection, sp: PortSpec, dp: PortSpec, blocks: Mapping[int, BlockDescription]
                       ) -> str | None:
    """What is wrong with connection ``c`` from ``sp`` to ``dp`` under the append rules; None when nothing is.

    A count (``port.count``) connects to an input of one u32 element (or of no declared type) that is not
    itself an append port; an in/out append port takes an append port (one with a counter), undelayed."""
    s, d = _where(blocks, c.src), _where(blocks, c.dst)
    if isinstance(sp, CountSpec):
        owner = _where(blocks, PortRef(c.src.block, sp.base))
        if dp.counter is not None:
            return (f"{d} continues an append buffer, and {s} is a count: connect the append port {owner} itself "
                    f"to it (engine.connect(...['{sp.base}'], ...))")
        if dp.dtype not in (None, "u32") or dp.count != 1:
            return (f"{s} is the count of append port {owner}, one u32 on the device: it connects to an input of "
                    f"one u32 element, and {d} is {dp.dtype or 'untyped'}[{dp.count}]; declare the kernel "
                    "parameter 'const unsigned int*' and the port with one element (BlockBuilder.input(..., "
                    "count=1), or Block.from_kernel(..., counts={'<port>': 1}))")
        return None
    if dp.counter is not None and dp.direction == "in":
        if sp.counter is None:
            return (f"{d} is an in/out append port: it continues the append buffer connected to it, so its source "
                    f"must be an append port (one with a counter), and {s} is a plain output; connect an append "
                    f"port, or leave {d} unconnected to append to a buffer of its own")
        if getattr(c, "delay", 0):
            return (f"{d} continues the append buffer of {s} in the same frame; a delayed connection cannot feed it: "
                    "connect it without delay")
    return None


def emit_counter(planner: Any, bid: int, label: str, p: PortSpec, ref: PortRef, src: PortRef | None,
                 pin_buffer: dict[tuple[str, int], int]) -> None:
    """The counter of append port ``p`` of block ``bid`` (``ref``): continue the counter of the append port
    ``src`` connected to it (an in/out append port), or make one with its reset node; then point every
    counter pin of ``p`` at it and name it ``"<port>.count"`` in ``planner.port_buffers``."""
    cid = planner.counters.get(src) if src is not None else None
    if cid is None:
        cid = planner.buffer(("counter", bid, p.name), f"{label}.{p.name}.count", "u32", 1, "counter")
        nodes = planner.nodes
        nodes.append(MemsetNodePlan(len(nodes), cid, 0, 1, f"reset {label}.{p.name}"))
    else:  # an in/out append port continuing ``src``
        assert src is not None
        _check_chain(planner, src)
    planner.counters[ref] = cid
    planner.port_buffers[PortRef(bid, p.name + COUNT_SUFFIX)] = cid
    for pin in p.counter_pins:
        pin_buffer[pin.kernel, pin.param] = cid


def _check_chain(planner: Any, src: PortRef) -> None:
    """An append port that another block continues (``src``) feeds that block alone: report every other
    reader of it or of its count, and a second block continuing it (once per ``src``)."""
    users = planner.append_users
    if users is None:
        users = planner.append_users = _users(planner.desc)
    readers = users.pop((src.block, src.port), None)
    if readers is None:  # reported already (a second continuation of the same port)
        return
    blocks = {b.id: b.desc for b in planner.desc.blocks}
    s = _where(blocks, src)
    continuing = [d for d, via_count in readers if not via_count and _continues(blocks, d)]
    first = _where(blocks, continuing[0])
    for d in continuing[1:]:
        planner.report.error(f"{s} is continued by {first} and by {_where(blocks, d)}; an append buffer is "
                             f"continued by one block at a time: chain them ({s} -> {first} -> "
                             f"{_where(blocks, d)})", _where(blocks, d), d.block)
    for d, via_count in readers:
        if d in continuing:
            continue
        what = f"{s}.count" if via_count else s
        to = f"{first}.count" if via_count else first
        planner.report.error(f"{_where(blocks, d)} reads {what}, which {first} continues: it could run before "
                             f"{first}'s items are in. Connect it to {to} instead, which holds every block's "
                             "items", _where(blocks, d), d.block)


def _continues(blocks: Mapping[int, BlockDescription], ref: PortRef) -> bool:
    b = blocks.get(ref.block)
    if b is None:
        return False
    for p in b.ports:
        if p.name == ref.port:
            return p.counter is not None and p.direction == "in"
    return False


def _users(desc) -> dict[tuple[int, str], list[tuple[PortRef, bool]]]:
    """(block, port) -> the inputs reading it in the same frame, each with whether it reads the port's count."""
    users: dict[tuple[int, str], list[tuple[PortRef, bool]]] = {}
    for c in desc.connections:
        if getattr(c, "delay", 0):  # reads the previous frame's copy, taken after every appender
            continue
        port = c.src.port
        via_count = port.endswith(COUNT_SUFFIX)
        if via_count:
            port = port[: -len(COUNT_SUFFIX)]
        users.setdefault((c.src.block, port), []).append((c.dst, via_count))
    return users
