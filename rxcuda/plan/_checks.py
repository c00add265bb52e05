"""The planner's checks of a pipeline before it is planned: each block and name once, every connection (its
ends, directions, dtypes, shapes; an input fed once), every input fed; and what a re-plan of an edit at the
ends (blocks and connections added at the end or taken off it) checks and orders alone (``_tail_edit``).
Problems go to the planner's :class:`Report`; pure, imports nothing from CUDA.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import NamedTuple

from ..model import _dtypes
from ..model._describe import BlockDescription, BlockEntry, Connection, PipelineDescription, PortRef
from ..model._errors import UnknownPortError
from ..model._memo import by_identity
from . import _appends, _delays, _shapes
from ._order import Report, ordered


def _label(blocks: Mapping[int, BlockDescription], ref: PortRef) -> str:
    b = blocks.get(ref.block)
    return f"{b.name}.{ref.port}" if b is not None else f"<block {ref.block}>.{ref.port}"


def _validate_blocks(desc: PipelineDescription, report: Report, ids: set[int], names: dict[str, int],
                     start: int = 0) -> tuple[BlockEntry, ...]:
    """Each block once, each name once: names are how messages and plans tell blocks apart. Returns the
    blocks with each id once (``desc.blocks`` itself when none repeats). ``ids`` and ``names`` (name -> id)
    hold those of ``desc.blocks[:start]``, known to repeat none (a Replanner's last check, for an edit at the
    end: only the blocks after them are looked at); the others' are added."""
    repeated = False
    for b in desc.blocks[start:] if start else desc.blocks:
        if b.id in ids:
            report.error(f"block '{b.label()}' (id {b.id}) appears twice in the pipeline; a block is added once "
                         "(create another Block for a second copy)", b.label(), b.id)
            repeated = True
            continue
        ids.add(b.id)
        other = names.setdefault(b.desc.name, b.id)  # (b.label(), without the call: once per block and plan)
        if other != b.id:
            report.error(f"two blocks are named '{b.label()}' (ids {other} and {b.id}); give each block its own "
                         "name (Block.from_kernel(..., name=...)); an engine renames a repeated name itself",
                         b.label(), b.id)
    return tuple(desc.block(i) for i in dict.fromkeys(b.id for b in desc.blocks)) if repeated else desc.blocks


def check_connection(c: Connection, blocks: Mapping[int, BlockDescription], sources: Mapping[PortRef, PortRef],
                     bound: Container[PortRef]) -> None:
    """Raise ValidationError if connection ``c`` does not fit: both blocks present, the ports exist, an output
    to an input, equal dtypes and sizes, the input neither connected (``sources``: input -> its source) nor
    bound. Cycles are checked elsewhere (they depend on every connection). O(ports of the two blocks)."""
    report = Report()
    if not _check_connection(c, blocks, sources, bound, report):
        report.raise_errors()


def _check_connection(c: Connection, blocks: Mapping[int, BlockDescription], sources: Mapping[PortRef, PortRef],
                      bound: Container[PortRef], report: Report, reshaped: list | None = None) -> bool:
    """Report what is wrong with ``c`` (see check_connection); True when nothing is. ``reshaped`` collects the
    connections that join different (compatible) declared shapes: the planner then resolves shapes."""
    sb, db = blocks.get(c.src.block), blocks.get(c.dst.block)
    if (sb is not None and db is not None and _plain(sb.ports, c.src.port, db.ports, c.dst.port)
            and c.dst not in sources and c.dst not in bound):
        return True  # an output to an input of the same element type and layout, the input free: the common case
    ports = []
    for end, want in ((c.src, "out"), (c.dst, "in")):
        block = blocks.get(end.block)
        if block is None:
            report.error(f"connection {c.src.port} -> {c.dst.port} names a block that is not in the engine; "
                         "add the block first", end.port)
            continue
        try:
            port = block.port(end.port)
        except UnknownPortError as e:  # names the block's ports, with a did-you-mean
            report.error(str(e), e.subject or block.name, end.block, type(e))
            continue
        if port.direction != want and not (want == "out" and port.counter is not None):  # in/out append: a source
            side = "source" if want == "out" else "target"
            message = (_delays.direction_message(c, blocks) if c.delay and want == "out" else
                       f"{_label(blocks, end)} is an {port.direction}put port and cannot be a connection's "
                       f"{side}; connect an output port to an input port")
            report.error(message, block.name, end.block)
            continue
        ports.append(port)
    if len(ports) != 2:
        return False  # the ends themselves are wrong: nothing more to compare
    sp, dp = ports
    if _appends.involved(sp, dp):  # a count as a device value, or an in/out append port
        problem = _appends.connection_problem(c, sp, dp, blocks)
        if problem is not None:
            report.error(problem, _label(blocks, c.dst), c.dst.block)
            return False
    ok = True
    if sp.dtype != dp.dtype and sp.dtype and dp.dtype:  # element types, then shapes (rxcuda.plan._shapes)
        s, d = _label(blocks, c.src), _label(blocks, c.dst)
        problem = _shapes.dtype_problem(s, d, sp, dp)
        if problem is not None:
            report.error(problem + (_delays.MISMATCH_HINT if c.delay else ""), d, c.dst.block)
            ok = False
    if sp.shape != dp.shape or sp.strides != dp.strides:
        s, d = _label(blocks, c.src), _label(blocks, c.dst)
        problem = _shapes.layout_problem(s, d, sp, dp)
        if problem is not None:
            report.error(problem + (_delays.MISMATCH_HINT if c.delay else ""), d, c.dst.block)
            ok = False
        elif reshaped is not None:
            reshaped.append(c)
    if c.dst in sources:
        d = _label(blocks, c.dst)
        report.error(f"{d} is already connected from {_label(blocks, sources[c.dst])}; an input takes one "
                     "connection: disconnect the other first", d, c.dst.block)
        ok = False
    if c.dst in bound:
        d = _label(blocks, c.dst)
        report.error(f"{d} is both connected and bound to an array; unbind it or remove the connection", d,
                     c.dst.block)
        ok = False
    return ok


def _plain_pairs(src_ports: tuple, dst_ports: tuple) -> dict[tuple[str, str], bool]:
    return {}


# (src ports tuple, dst ports tuple) -> (src port, dst port) -> plain: a chain of one kernel's blocks asks the same
_pairs = by_identity(_plain_pairs, parts=2)


def _plain(src_ports: tuple, src: str, dst_ports: tuple, dst: str) -> bool:
    """Whether port ``src`` of ``src_ports`` to port ``dst`` of ``dst_ports`` is a connection nothing is wrong
    with whatever else holds (an output to an input, no append rules, the same element type, shape and strides),
    worked out once per pair of ports tuples and names."""
    known = _pairs(src_ports, dst_ports)
    plain = known.get((src, dst))
    if plain is None:
        sp = next((p for p in src_ports if p.name == src), None)
        dp = next((p for p in dst_ports if p.name == dst), None)
        plain = known[src, dst] = (sp is not None and dp is not None and sp.direction == "out"
                                   and dp.direction == "in" and not _appends.involved(sp, dp)
                                   and sp.dtype == dp.dtype and sp.shape == dp.shape and sp.strides == dp.strides)
    return plain


def _validate_connections(desc: PipelineDescription, report: Report, previous: _Checked | None = None,
                          tail: _Tail | None = None, keep: bool = True) -> tuple[bool, _Checked | None]:
    """Check every connection; True when one joins different (compatible) declared shapes. ``previous``: a
    Replanner's last check that found nothing wrong: its leading connections, between the same descriptions
    and bindings, are not checked again (``tail``: how ``desc`` differs from that check's when only at its
    ends; its blocks are then not compared one by one). Returns, with the flag, what a later check may take
    over (``keep``: wanted at all)."""
    bindings, conns = desc.bindings, desc.connections
    start, sources, first = 0, {}, {}
    if previous is not None and tail is not None:  # the blocks before the ends are the last check's
        blocks = previous.ends.copy()
        for b in tail.removed:
            del blocks[b.id]
        fresh = blocks.keys().isdisjoint(b.id for b in tail.added)  # (else a kept connection's block changed)
        blocks.update((b.id, b.desc) for b in tail.added)
        if fresh:
            start = len(conns) - len(tail.new)
    else:
        blocks = {b.id: b.desc for b in desc.blocks}
        if previous is not None and (bindings is previous.bindings or bindings == previous.bindings):
            was = previous.connections
            start = min(len(conns), len(was))
            ends = previous.ends
            if conns[:start] != was[:start] or any(ends.get(i, d) is not d for i, d in blocks.items()):
                start = 0  # (a block with a new description)
    if start:
        assert previous is not None
        was, first = previous.connections, previous.first.copy()
        for c in was[start:]:  # connections dropped at the end: a block they named first is named later or not
            for end in (c.src.block, c.dst.block):
                if first.get(end, -1) >= start:
                    del first[end]
        if any(first.get(i, start) < start for i in previous.ends.keys() - blocks.keys()):
            start, first = 0, {}  # a block gone that a kept connection names: check them all again
        else:
            sources = previous.sources.copy()
            for c in was[start:]:
                sources.pop(c.dst, None)
    problems = len(report.problems)
    reshaped: list = []
    for c in conns[start:]:
        if _check_connection(c, blocks, sources, bindings, report, reshaped):
            sources[c.dst] = c.src
    if reshaped or len(report.problems) != problems or not keep:
        return bool(reshaped), None
    for j in range(start, len(conns)):  # the first connection naming each block (see above)
        c = conns[j]
        first.setdefault(c.src.block, j)
        first.setdefault(c.dst.block, j)
    return False, _Checked(conns, bindings, blocks, sources, first)


class _Checked(NamedTuple):
    """Connections found in order (``_validate_connections``), for the next check."""

    connections: tuple
    bindings: Mapping
    ends: dict  # block id -> its description
    sources: dict  # connected input -> its source
    first: dict  # block id -> the position of the first connection naming it


class _Tail(NamedTuple):
    """How a description differs from the last one planned when only at its ends (``_tail_edit``)."""

    added: tuple[BlockEntry, ...]  # blocks added after the last one's
    removed: tuple[BlockEntry, ...]  # the last one's last blocks, taken off
    new: tuple[Connection, ...]  # connections added after the last one's
    gone: tuple[Connection, ...]  # the last one's last connections, taken off


def _tail_edit(was: PipelineDescription, now: PipelineDescription) -> _Tail | None:
    """How ``now`` differs from ``was`` when its blocks and its connections are each ``was``'s with some
    added at the end or taken off it (a block added at the end of a chain and connected, or removed again)
    and nothing else that the checks and the order read changed; None otherwise."""
    if (now.regions or was.regions or now.shapes != was.shapes or not (now.fed is was.fed or now.fed == was.fed)
            or not (now.bindings is was.bindings or now.bindings == was.bindings)):
        return None
    kb, kc = _shared_start(was.blocks, now.blocks), _shared_start(was.connections, now.connections)
    if kb is None or kc is None:
        return None
    return _Tail(now.blocks[kb:], was.blocks[kb:], now.connections[kc:], was.connections[kc:])


def _shared_start(was: tuple, now: tuple) -> int | None:
    """The shorter tuple's length when the longer begins with it (compared in C, by identity first)."""
    n = min(len(was), len(now))
    return n if was[:n] == now[:n] else None


def _validate_inputs(desc: PipelineDescription, blocks: tuple[BlockEntry, ...], report: Report,
                     connections: tuple[Connection, ...]) -> None:
    """Each input of ``blocks`` is fed somehow (``connections``: those that may lead into them)."""
    # (block, port) tuples: they hash several times faster than PortRefs, and this visits every port
    connected = {(c.dst.block, c.dst.port) for c in connections}
    fed = {(r.block, r.port) for r in desc.fed}
    bound = {(r.block, r.port): binding for r, binding in desc.bindings.items()}
    for b in blocks:
        for p in b.desc.ports:
            key = (b.id, p.name)
            binding = bound.get(key) if bound else None
            if binding is not None:
                if p.dtype and binding.dtype != p.dtype:
                    report.error(f"array bound to {b.label()}.{p.name} has dtype {binding.dtype}, the port takes "
                                 f"{p.dtype}; convert it (e.g. arr.astype('{_np_name(p.dtype)}'))",
                                 b.label(), b.id)
                need = p.count if not desc.shapes else _shapes.resized_count(desc, b.id, p)
                if binding.count < need:
                    report.error(f"array bound to {b.label()}.{p.name} has {binding.count} elements, the port "
                                 f"needs {need}; bind a larger array or give the block a smaller size",
                                 b.label(), b.id)
                continue
            if p.direction == "in" and key not in connected and key not in fed and p.counter is None:
                if p.required:
                    report.error(f"required input {b.label()}.{p.name} is neither connected nor bound; connect an "
                                 f"output to it (engine.connect(other['out'], {b.label()}['{p.name}'])), bind an array "
                                 f"(engine.bind({b.label()}['{p.name}'], array)) or write data to it "
                                 f"(engine.write({b.label()}['{p.name}'], array))", b.label(), b.id)
                else:
                    report.warning(f"optional input {b.label()}.{p.name} is neither connected, bound nor written: "
                                   f"{b.label()} reads zeros from it every frame; connect, bind or write it if "
                                   "that is not what you meant", f"{b.label()}.{p.name}", b.id)


def _inputs_kept(tail: _Tail) -> bool:
    """Whether every input of the blocks kept is connected as before: the connections added lead into the
    blocks added, and those taken off led into the blocks taken off."""
    added, removed = {b.id for b in tail.added}, {b.id for b in tail.removed}
    return all(c.dst.block in added for c in tail.new) and all(c.dst.block in removed for c in tail.gone)


def _order_after(order: tuple[BlockEntry, ...], tail: _Tail, desc: PipelineDescription
                 ) -> tuple[BlockEntry, ...] | None:
    """``ordered_blocks(desc)`` from the last order, ``order``, after an edit at the ends that moves no block
    kept: the blocks taken off were the last ones in it and only their connections went, the connections
    added lead into blocks added (new ids), and those order among themselves. None otherwise."""
    if tail.removed:
        removed = {b.id for b in tail.removed}
        k = len(order) - len(removed)
        if {b.id for b in order[k:]} != removed or any(
                not c.delay and c.src.block not in removed and c.dst.block not in removed for c in tail.gone):
            return None
        order = order[:k]
    elif tail.gone:
        return None
    if not tail.added and not tail.new:
        return order
    rank = {b.id: i for i, b in enumerate(tail.added)}
    succ: dict[int, set[int]] = {i: set() for i in rank}
    for c in tail.new:
        if c.delay:
            continue
        if c.dst.block not in rank:
            return None
        if c.src.block in rank:
            succ[c.src.block].add(c.dst.block)
    ids, stuck = ordered(succ, rank)
    return None if stuck else order + tuple(desc.block(i) for i in ids)


def _np_name(dtype: str) -> str:
    return str(_dtypes.to_numpy(dtype))
