"""Replacing a block in place (``engine.replace(old, new)``): the hot-swap.

The new block takes the old one's place: its name, its id (so every connection, binding, host-fed or
stream-fed input, observed port and port buffer keyed by it stays where it is), and the parameter values and
launch geometry that were running. When the new block's description equals the old one's (its name aside),
the running graph is kept: nothing is rebuilt, and values or launches that differ are ordinary hot updates
(parameter defaults take no part in the comparison: the graph holds values).
Otherwise the block is marked changed and the next tick rebuilds (Structure tier).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..blocks._blocks import Block, PortHandle
from ..model import _dtypes
from ..model._describe import KernelSpec, PortRef
from ..model._errors import ForeignBlockError, UnknownPortError, ValidationError
from ..model._events import BlockChanged, LaunchChanged
from ..plan._checks import check_connection
from ._io import DataIO
from ._runtime import Runtime


def replace_block(rt: Runtime, io: DataIO, engine, old: Block, new: Block,
                  replaced: Callable[[int, Block, Block], None]) -> bool:
    """Put ``new`` where ``old`` is (see ``Engine.replace``). Returns True when the running graph is kept
    (equal descriptions), False when the next tick rebuilds. A refusal raises and changes nothing."""
    for what, b in (("old", old), ("new", new)):
        if not isinstance(b, Block):
            raise TypeError(f"engine.replace(old, new) takes two blocks; '{what}' is a {type(b).__name__}"
                            + (" (a composite instance is replaced block by block, through its members)"
                               if type(b).__name__ == "CompositeInstance" else ""))
    regions = getattr(rt, "regions", None) or {}
    with rt.lock:
        if rt.blocks.get(old.id) is not old:
            raise ForeignBlockError(f"{old.name} is not in this engine: engine.replace(old, new) swaps a block the "
                                    "engine holds", subject=old.name)
        if new is old:
            return True
        for b in (old, new):
            if b.id in regions or hasattr(b, "bodies"):
                raise ValidationError(f"cannot replace {old.name} with {new.name}: {b.name} is a region; remove the "
                                      "region and add another", subject=old.name)
        if new._engine is not None:
            where = "this engine" if new._engine is engine else "another engine"
            raise ValidationError(f"cannot replace {old.name} with {new.name}: {new.name} is already in {where}; "
                                  "pass a block that is in no engine (remove it there first)", subject=new.name)
        desc = attrs.evolve(new.description, name=old.name)
        _check_fit(rt, io, old, new, desc)
        same = _structure(desc) == _structure(old.description)
        oid = old.id
        state, message = old.state, old.message
        # the old block lets go: no late value of its bindings reaches the engine from here on
        old._sink = None
        old.dispose_bindings()
        _carry_over(old, new)
        if not same:
            removed = rt.index.remove_block(oid)
            rt.index.add_block(oid, desc)
            for c in removed:
                rt.index.add_connection(c)  # checked above: the same ends, ports that fit
            for ref in rt.bindings:
                if ref.block == oid:
                    rt.index.bind(ref)
        old.id, new.id = new.id, oid
        rt.blocks[oid] = new  # same key: the insertion order stays
        rt.forget(oid)
        new._desc = desc
        new._engine = engine
        new._sink = rt.pending
        old._engine = None
        old.state, old.message = "removed", f"replaced by another block in the engine (now {desc.name})"
        replaced(oid, old, new)
        for region in regions.values():  # a region's bodies and condition name blocks by object
            if any(b is old for body in region.bodies for b in body):
                region.bodies = tuple(tuple(new if b is old else b for b in body) for body in region.bodies)
            cond = getattr(region, "condition", None)
            if cond is not None and cond.block is old:
                region.condition = PortHandle(new, cond.name)
        kept = getattr(rt, "kept", None)
        if kept:  # ports read or observed: those new lacks are no longer anybody's
            kept.difference_update([r for r in kept if r.block == oid and not _has_port(desc, r.port)])
        if same:
            new.state, new.message = state, message  # the same nodes, as they run now
            _hot_differences(rt, old, new)
        else:
            new.state, new.message = "not built", ""
            rt.pending.add(BlockChanged(oid, desc.name, "replaced by a block with another description"))
    return same


def _check_fit(rt: Runtime, io: DataIO, old: Block, new: Block, desc) -> None:
    """Every port of ``old`` in use (connected, bound, written, fed, observed) must be a port of ``new`` that
    fits; else a ValidationError naming the port and what uses it."""
    oid = old.id
    uses: dict[str, list[str]] = {}

    def label(ref: PortRef) -> str:
        return f"{rt.blocks[ref.block].name}.{ref.port}"

    conns = [c for c in rt.connections.values() if oid in (c.src.block, c.dst.block)]
    for c in conns:
        if c.dst.block == oid:
            uses.setdefault(c.dst.port, []).append(f"connected from {label(c.src)}")
        if c.src.block == oid:
            uses.setdefault(c.src.port, []).append(f"connected to {label(c.dst)}")
    sized: dict[str, str] = {}  # ports whose stream was sized for the old port
    for refs, why in ((rt.bindings, "bound to an array"), (rt.fed, "written from the host"),
                      (io.feeds, "fed by a stream"), ([t[0] for t in io.taps], "observed")):
        for ref in refs:
            if ref.block == oid:
                uses.setdefault(ref.port, []).append(why)
                if why in ("fed by a stream", "observed"):
                    sized[ref.port] = why
    head = f"cannot replace {old.name} with {new.name}"
    order = {p.name: i for i, p in enumerate(old.description.ports)}
    for port in sorted(uses, key=lambda name: (order.get(name, len(order)), name)):  # as old declares them
        why = " and ".join(uses[port])
        try:
            spec = desc.port(port)
        except UnknownPortError:
            ports = ", ".join(p.name for p in desc.ports) or "none"
            raise ValidationError(f"{head}: {new.name} has no port '{port}', which is {why} "
                                  f"(its ports: {ports}); give it that port, or first stop using the old one's "
                                  "(disconnect, unbind, dispose the stream)",
                                  subject=old.name) from None
        was = old.description.port(port)
        if spec.direction != was.direction:
            raise ValidationError(f"{head}: '{port}' is an {spec.direction}put of {new.name} but an "
                                  f"{was.direction}put of {old.name}, which is {why}",
                                  subject=old.name)
        if port in sized and (spec.dtype, spec.count, spec.counter is None) != (was.dtype, was.count,
                                                                               was.counter is None):
            raise ValidationError(f"{head}: '{port}' is {sized[port]}, which expects {was.dtype}[{was.count}], but "
                                  f"{new.name} has {spec.dtype}[{spec.count}]; dispose that stream first",
                                  subject=old.name)
        if PortRef(oid, port) in rt.fed and not _dtypes.compatible(was.dtype, spec.dtype):
            # the written bytes are the old element type's: read as another type they would be garbage
            raise ValidationError(f"{head}: '{port}' holds data written from the host as {was.dtype}, but "
                                  f"{new.name}.{port} is {spec.dtype}; the bytes would be read as another type. "
                                  f"Give {new.name} a {was.dtype} port, or replace first and then write the data "
                                  f"again as {spec.dtype} (engine.write({new.name}['{port}'], "
                                  f"array.astype(...)))", subject=old.name)
        ext = rt.bindings.get(PortRef(oid, port))
        if ext is not None and ((spec.dtype and ext.dtype != spec.dtype) or ext.count < spec.count):
            raise ValidationError(f"{head}: the {ext.dtype} array of {ext.count} elements bound to '{port}' does "
                                  f"not fit {new.name}.{port} ({spec.dtype}[{spec.count}]); unbind it first",
                                  subject=old.name)
    for c in conns:
        blocks = {b: desc if b == oid else rt.blocks[b].description for b in (c.src.block, c.dst.block)}
        try:
            check_connection(c, blocks, {}, ())
        except ValidationError as e:
            raise ValidationError(f"{head}: {e}", subject=old.name, problems=e.problems) from None


def _carry_over(old: Block, new: Block) -> None:
    """Parameters of ``new`` whose name and type match one of ``old``'s take its value, unless changed on
    ``new`` after it was made (a value other than its default); likewise a launch set on ``old`` for a kernel
    of the same name, unless ``new`` has its own."""
    defaults = {s.name: s.default for s in new.description.scalars}
    for name, p in new.params.items():
        q = old.params.get(name)
        if q is not None and q.dtype == p.dtype and p._value == defaults[name]:
            p._value = q._value
    for k in new.description.kernels:
        if isinstance(k, KernelSpec) and k.name not in new._launches and k.name in old._launches:
            try:
                old_spec = old.description.kernel(k.name)
            except KeyError:
                continue
            if isinstance(old_spec, KernelSpec):
                new._launches[k.name] = old._launches[k.name]


def _hot_differences(rt: Runtime, old: Block, new: Block) -> None:
    """With the running graph kept, what ``new`` holds that the graph does not yet: values and launches."""
    for name, p in new.params.items():
        if p._value != old.params[name]._value:
            rt.pending.set_parameter(new.id, name, p._value)
    for k in new.description.kernels:
        if isinstance(k, KernelSpec) and new.launch(k.name) != old.launch(k.name):
            rt.pending.add(LaunchChanged(new.id, k.name, new.launch(k.name)))


def _has_port(desc, name: str) -> bool:
    try:
        desc.port(name)
    except UnknownPortError:
        return False
    return True


def _structure(desc):
    """What the running graph depends on: the description without its parameters' defaults (the graph holds
    values, which carry over or become hot updates)."""
    return attrs.evolve(desc, scalars=tuple(attrs.evolve(s, default=0) for s in desc.scalars))
