"""The planner: a pure function from a pipeline description to a graph plan.

validate -> order blocks -> assign buffers to ports -> emit nodes in order -> derive dependencies from
buffer hazards -> map parameters to argument slots. Imports nothing from CUDA; every error is a
:class:`ValidationError` that names the block and port and says how to fix it.
"""

from __future__ import annotations

import heapq

from ...model import _dtypes
from ...model._describe import (
    BlockEntry,
    CallSpec,
    KernelSpec,
    Pin,
    PipelineDescription,
    PortRef,
    step_params,
)
from ...model._errors import ValidationError
from ...model._graphplan import (
    Arg,
    BufferArg,
    BufferKind,
    BufferPlan,
    CallNodePlan,
    GraphPlan,
    KernelNodePlan,
    MemsetNodePlan,
    NodePlan,
    ScalarArg,
)


def _fail(msg: str, subject: str) -> None:
    raise ValidationError(msg, subject=subject)


def _port_label(desc: PipelineDescription, ref: PortRef) -> str:
    try:
        return f"{desc.block(ref.block).label()}.{ref.port}"
    except KeyError:
        return f"<block {ref.block}>.{ref.port}"


def validate(desc: PipelineDescription) -> None:
    """Raise ValidationError for the first thing wrong with the pipeline."""
    _validate_connections(desc)
    order_blocks(desc)
    _validate_inputs(desc)


def _validate_connections(desc: PipelineDescription) -> None:
    ids = {b.id for b in desc.blocks}
    seen_dst: dict[PortRef, PortRef] = {}
    for c in desc.connections:
        for end, want in ((c.src, "out"), (c.dst, "in")):
            if end.block not in ids:
                _fail(f"connection {c.src.port} -> {c.dst.port} names a block that is not in the engine; "
                      "add the block first", subject=end.port)
            block = desc.block(end.block)
            try:
                port = block.desc.port(end.port)
            except KeyError as e:
                _fail(str(e.args[0]), subject=block.label())
            if port.direction != want:
                side = "source" if want == "out" else "target"
                _fail(f"{_port_label(desc, end)} is an {port.direction}put port and cannot be a connection's "
                      f"{side}; connect an output port to an input port", subject=block.label())
        sp = desc.block(c.src.block).desc.port(c.src.port)
        dp = desc.block(c.dst.block).desc.port(c.dst.port)
        s, d = _port_label(desc, c.src), _port_label(desc, c.dst)
        if sp.dtype and dp.dtype and sp.dtype != dp.dtype:
            _fail(f"cannot connect {s} ({sp.dtype}) to {d} ({dp.dtype}): element types differ; "
                  f"insert a conversion block or declare both ports as {sp.dtype}", subject=d)
        if sp.count != dp.count:
            _fail(f"cannot connect {s} ({sp.count} elements) to {d} ({dp.count} elements): sizes differ; "
                  "give both blocks the same size", subject=d)
        if c.dst in seen_dst:
            _fail(f"{d} is already connected from {_port_label(desc, seen_dst[c.dst])}; an input takes one "
                  "connection: disconnect the other first", subject=d)
        seen_dst[c.dst] = c.src
        if c.dst in desc.bindings:
            _fail(f"{d} is both connected and bound to an array; unbind it or remove the connection",
                  subject=d)


def _validate_inputs(desc: PipelineDescription) -> None:
    connected = {c.dst for c in desc.connections}
    for b in desc.blocks:
        for p in b.desc.ports:
            ref = PortRef(b.id, p.name)
            binding = desc.bindings.get(ref)
            if binding is not None:
                if p.dtype and binding.dtype != p.dtype:
                    _fail(f"array bound to {b.label()}.{p.name} has dtype {binding.dtype}, the port takes "
                          f"{p.dtype}; convert it (e.g. arr.astype('{_np_name(p.dtype)}'))",
                          subject=b.label())
                if binding.count < p.count:
                    _fail(f"array bound to {b.label()}.{p.name} has {binding.count} elements, the port needs "
                          f"{p.count}; bind a larger array or give the block a smaller size",
                          subject=b.label())
            fed = ref in desc.bindings or ref in desc.fed
            if p.direction == "in" and p.required and ref not in connected and not fed:
                _fail(f"required input {b.label()}.{p.name} is neither connected nor bound; connect an "
                      f"output to it (engine.connect(src, {b.label()}['{p.name}'])) or bind an array "
                      f"(engine.bind({b.label()}['{p.name}'], array)) or write data to it (engine.write(...))",
                      subject=b.label())


def _np_name(dtype: str) -> str:
    return str(_dtypes.to_numpy(dtype))


def order_blocks(desc: PipelineDescription) -> tuple[BlockEntry, ...]:
    """Topological order of blocks by connections; ties keep insertion order. Raises on a cycle."""
    index = {b.id: i for i, b in enumerate(desc.blocks)}
    succ: dict[int, set[int]] = {b.id: set() for b in desc.blocks}
    indeg = {b.id: 0 for b in desc.blocks}
    for c in desc.connections:
        if c.src.block in succ and c.dst.block not in succ[c.src.block]:
            succ[c.src.block].add(c.dst.block)
            indeg[c.dst.block] += 1
    ready = [(index[b], b) for b, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, bid = heapq.heappop(ready)
        out.append(desc.block(bid))
        for nxt in succ[bid]:
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                heapq.heappush(ready, (index[nxt], nxt))
    if len(out) != len(desc.blocks):
        # blocks downstream of a cycle are stuck too: peel off those that feed no stuck block
        stuck = {b for b, d in indeg.items() if d > 0}
        while leaves := {b for b in stuck if not succ[b] & stuck}:
            stuck -= leaves
        names = sorted(desc.block(b).label() for b in stuck)
        _fail(f"the connections form a cycle through blocks {', '.join(names)}; a frame must be "
              "a DAG: remove one of the connections (feed state back through a buffer the block owns)",
              subject=names[0])
    return tuple(out)


class _Planner:
    def __init__(self, desc: PipelineDescription):
        self.desc = desc
        self.buffers: list[BufferPlan] = []
        self.by_key: dict[tuple, int] = {}
        self.nodes: list[NodePlan] = []
        self.port_buffers: dict[PortRef, int] = {}
        self.counters: dict[PortRef, int] = {}
        self.slots: dict[tuple[int, str], list[tuple[int, int]]] = {}
        self.device_scalars: dict[tuple[int, str], int] = {}
        self.recapture: dict[tuple[int, str], list[int]] = {}
        self.kernel_nodes: dict[tuple[int, str], int] = {}

    def buffer(self, key: tuple, label: str, dtype, count: int, kind: BufferKind) -> int:
        if key in self.by_key:
            return self.by_key[key]
        bid = len(self.buffers)
        self.buffers.append(BufferPlan(bid, key, label, dtype, count, kind))
        self.by_key[key] = bid
        return bid

    def run(self) -> GraphPlan:
        validate(self.desc)
        blocks = order_blocks(self.desc)
        sources = {c.dst: c.src for c in self.desc.connections}
        # Output ports first, so connected inputs find their source's buffer whatever the order.
        for b in blocks:
            for p in b.desc.ports:
                if p.direction == "out":
                    ref = PortRef(b.id, p.name)
                    kind = "external" if ref in self.desc.bindings else "port"
                    self.port_buffers[ref] = self.buffer(("port", b.id, p.name), f"{b.label()}.{p.name}",
                                                         p.dtype, p.count, kind)
        for b in blocks:
            for p in b.desc.ports:
                if p.direction != "in":
                    continue
                ref = PortRef(b.id, p.name)
                if ref in sources:
                    self.port_buffers[ref] = self.port_buffers[sources[ref]]
                else:
                    kind = ("external" if ref in self.desc.bindings
                            else "port" if ref in self.desc.fed else "zeros")
                    self.port_buffers[ref] = self.buffer(("port", b.id, p.name), f"{b.label()}.{p.name}",
                                                         p.dtype, p.count, kind)
        for b in blocks:
            self.emit_block(b)
        deps = _hazard_deps(self.nodes)
        return GraphPlan(
            nodes=tuple(self.nodes),
            deps=deps,
            buffers=tuple(self.buffers),
            port_buffers=self.port_buffers,
            counters=self.counters,
            slots={k: tuple(v) for k, v in self.slots.items()},
            device_scalars=self.device_scalars,
            recapture={k: tuple(v) for k, v in self.recapture.items()},
            kernel_nodes=self.kernel_nodes,
        )

    def emit_block(self, b: BlockEntry) -> None:
        d = b.desc
        pin_buffer: dict[Pin, int] = {}
        for p in d.ports:
            ref = PortRef(b.id, p.name)
            for pin in p.pins:
                pin_buffer[pin] = self.port_buffers[ref]
            if p.counter is not None:
                cid = self.buffer(("counter", b.id, p.name), f"{b.label()}.{p.name}.count", "u32", 1, "counter")
                self.counters[ref] = cid
                pin_buffer[p.counter] = cid
                self.nodes.append(MemsetNodePlan(len(self.nodes), cid, 0, 1, f"reset {b.label()}.{p.name}"))
        for ib in d.internals:
            iid = self.buffer(("internal", b.id, ib.name), f"{b.label()}/{ib.name}", ib.dtype, ib.count,
                              "internal")
            for pin in (ib.writer, *ib.readers):
                pin_buffer[pin] = iid
        scalar_of: dict[Pin, str] = {}
        for s in d.scalars:
            for pin in s.pins:
                scalar_of[pin] = s.name
        for step in d.kernels:
            params = step_params(step)
            args: list[Arg] = []
            reads: set[int] = set()
            writes: set[int] = set()
            nid = len(self.nodes)
            for i, prm in enumerate(params):
                pin = Pin(step.name, i)
                if prm.is_pointer:
                    if pin not in pin_buffer:
                        _fail(f"{b.label()}: parameter {i} ('{prm.name}') of '{step.name}' is a pointer that no "
                              "port or internal connection feeds; declare it as a port or connect it",
                              subject=b.label())
                    buf = pin_buffer[pin]
                    args.append(BufferArg(buf))
                    if prm.direction in ("in", "inout", "counter"):
                        reads.add(buf)
                    if prm.direction in ("out", "inout", "counter"):
                        writes.add(buf)
                    continue
                name = scalar_of.get(pin)
                if name is None and prm.default is None:
                    _fail(f"{b.label()}: scalar parameter {i} ('{prm.name}') of '{step.name}' has no value; "
                          "declare it as a block parameter or give it a default", subject=b.label())
                value = b.value(name) if name is not None else prm.default
                args.append(ScalarArg(b.id, name, prm.dtype, prm.size, value))
                if name is None:
                    continue
                if isinstance(step, CallSpec):
                    if prm.name in step.device_scalars:
                        sid = self.buffer(("device_scalar", b.id, name), f"{b.label()}.{name}", prm.dtype, 1,
                                          "device_scalar")
                        self.device_scalars[(b.id, name)] = sid
                        args[-1] = BufferArg(sid)
                        reads.add(sid)
                    else:
                        self.recapture.setdefault((b.id, name), []).append(nid)
                else:
                    self.slots.setdefault((b.id, name), []).append((nid, i))
            label = f"{b.label()}/{step.name}"
            if isinstance(step, KernelSpec):
                node = KernelNodePlan(nid, b.id, step.name, step.code.key, b.launch(step.name), tuple(args),
                                      frozenset(reads), frozenset(writes), label)
            else:
                node = CallNodePlan(nid, b.id, step.name, tuple(args), frozenset(reads), frozenset(writes),
                                    label)
            self.kernel_nodes[(b.id, step.name)] = nid
            self.nodes.append(node)


def _hazard_deps(nodes: list[NodePlan]) -> tuple[tuple[int, ...], ...]:
    """Dependencies from buffer hazards in node order: read-after-write, write-after-write, write-after-read.

    Edges implied by others are kept (the driver prunes nothing, but a few extra edges cost nothing
    measurable and keep the rule obviously right).
    """
    last_writer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    deps: list[tuple[int, ...]] = []
    for n in nodes:
        d: set[int] = set()
        for buf in n.reads:
            if buf in last_writer:
                d.add(last_writer[buf])
        for buf in n.writes:
            if buf in last_writer:
                d.add(last_writer[buf])
            d.update(readers.get(buf, ()))
        d.discard(n.id)
        deps.append(tuple(sorted(d)))
        for buf in n.reads:
            readers.setdefault(buf, []).append(n.id)
        for buf in n.writes:
            last_writer[buf] = n.id
            readers[buf] = []
    return tuple(deps)


def plan(desc: PipelineDescription) -> GraphPlan:
    """Validate a pipeline and plan its graph. Pure; raises ValidationError."""
    return _Planner(desc).run()
