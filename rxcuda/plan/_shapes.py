"""Shape planning: the shape of every port, resolved in topological order from what feeds it.

A port declares a shape and a rule (``rxcuda.model._shapes``). The planner resolves, block by block in
topological order:

- an input takes the shape of the output connected to it (a delayed input: that of its source, found by
  iterating until the loop agrees), the shape the user resized it to (``PipelineDescription.shapes``), or
  its declared shape; a fixed input must accept it (the same shape, or the same element count where it is
  1-D), a ``Follow`` input takes it whatever it is, a ``Like`` input must agree with the input it names;
- an output is its declared shape, or ``Like`` / ``Reduce`` / ``Broadcast`` of the block's resolved ports.

What is resolved sizes the buffers, and where a block's ports resolve to shapes other than the declared ones,
its derived scalars (``ScalarSpec.size_of``: element counts, axis lengths), its internal buffers
(``InternalBuffer.like``) and its launch geometry (``KernelSpec.grid_of``) follow. Errors name both ports and
both shapes. A pipeline where nothing was resized and every connection joins equal declared shapes resolves to
its declared shapes without visiting a port (the common case costs nothing).

>>> from rxcuda.lowlevel import BlockDescription, BlockEntry, Connection, Pin, PipelineDescription, PortRef, PortSpec
>>> from rxcuda.model._shapes import Follow, Like, Reduce
>>> src = BlockDescription("src", ports=(PortSpec("out", "out", "f32", 12, (Pin("k", 0),), shape=(3, 4)),))
>>> red = BlockDescription("sum", ports=(PortSpec("x", "in", "f32", 12, (Pin("k", 0),), shape=(3, 4), rule=Follow()),
...                                      PortSpec("s", "out", "f32", 3, (Pin("k", 1),), rule=Reduce("x", 1))))
>>> desc = PipelineDescription((BlockEntry(1, src), BlockEntry(2, red)),
...                            (Connection(PortRef(1, "out"), PortRef(2, "x")),),
...                            shapes={})
>>> resolve_all(desc).shape_of(PortRef(2, "s"), (3,))
(3,)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from ..model import _dtypes
from ..model._describe import BlockEntry, KernelSpec, Launch, PipelineDescription, PortRef, PortSpec
from ..model._shapes import Broadcast, Follow, Like, Reduce, Shape, ShapeError, accepts, fmt, launch_geometry
from ._order import Report, ordered_blocks

_ROUNDS = 4  # delayed loops: resolve again while a delayed input's guess differs from its source (rarely > 1)


# -- connection checks (declared shapes) ---------------------------------------------------------------
def dtype_problem(s: str, d: str, sp: PortSpec, dp: PortSpec) -> str | None:
    """Why output ``sp`` (labelled ``s``) cannot feed input ``dp`` (``d``) for their element types, or None."""
    if _dtypes.compatible(sp.dtype, dp.dtype):
        return None
    if _dtypes.vector_layout(sp.dtype) or _dtypes.vector_layout(dp.dtype) or _dtypes.struct_type(sp.dtype) or \
            _dtypes.struct_type(dp.dtype):
        return (f"cannot connect {s} ({_dtypes.describe(sp.dtype)}) to {d} ({_dtypes.describe(dp.dtype)}): element "
                f"types differ; a {sp.dtype} output feeds only a {sp.dtype} input: declare the kernel parameter "
                f"as {_dtypes.c_name(sp.dtype)}*, or insert a conversion block")
    return (f"cannot connect {s} ({sp.dtype}) to {d} ({dp.dtype}): element types differ; "
            f"insert a conversion block or declare both ports as {sp.dtype}")


def layout_problem(s: str, d: str, sp: PortSpec, dp: PortSpec) -> str | None:
    """Why the declared shapes of ``sp`` and ``dp`` do not fit, or None: the element counts must be equal, an
    N-D fixed input must have the output's shape, and strided layouts must match. A ``Follow`` input takes
    whatever shape feeds it (the shape pass resolves it, and what it sizes follows), so only layouts matter."""
    if sp.count != dp.count and not isinstance(dp.rule, Follow):
        if len(sp.shape) == 1 and len(dp.shape) == 1:
            return (f"cannot connect {s} ({sp.count} elements) to {d} ({dp.count} elements): sizes differ; give "
                    "both blocks the same size")
        return (f"cannot connect {s} (shape {fmt(sp.shape)}, {sp.count} elements) to {d} (shape {fmt(dp.shape)}, "
                f"{dp.count} elements): sizes differ; give both ports the same shape")
    if dp.rule is None and not accepts(dp.shape, sp.shape):
        return (f"cannot connect {s} (shape {fmt(sp.shape)}) to {d} (shape {fmt(dp.shape)}): shapes differ and "
                f"{d} has a fixed shape; give both ports the same shape, or declare the input 1-D or "
                "with rule=Follow()")
    if sp.strides != dp.strides:
        return (f"cannot connect {s} ({_layout(sp)}) to {d} ({_layout(dp)}): the buffer is laid out one way and "
                "read another; give both ports the same strides")
    return None


def _layout(p: PortSpec) -> str:
    return f"shape {fmt(p.shape)}, " + ("C-contiguous" if p.strides is None else f"strides {p.strides}")


def differs(sp: PortSpec, dp: PortSpec) -> bool:
    """True when a connection joins different (if compatible) declared shapes: the planner then resolves
    shapes port by port."""
    return sp.shape != dp.shape


def resized_count(desc: PipelineDescription, block: int, p: PortSpec) -> int:
    """The element count of port ``p`` as the user resized it (its declared count if not)."""
    shape = desc.shapes.get(PortRef(block, p.name))
    return p.count if shape is None else math.prod(shape)


# -- resolution --------------------------------------------------------------------------------------------
@attrs.define
class BlockShapes:
    """What changes in one block's nodes where its ports resolve to other shapes than declared: element
    counts of ports and internal buffers, derived scalar values and launches (by kernel)."""

    counts: dict[str, int] = attrs.Factory(dict)
    internals: dict[str, int] = attrs.Factory(dict)
    values: dict[str, int] = attrs.Factory(dict)
    launches: dict[str, Launch] = attrs.Factory(dict)


@attrs.define
class Resolved:
    """Resolved shapes that differ from the declared ones (``shapes``) and what follows per block."""

    shapes: dict[PortRef, Shape] = attrs.Factory(dict)
    blocks: dict[int, BlockShapes] = attrs.Factory(dict)

    def shape_of(self, ref: PortRef, declared: Shape) -> Shape:
        return self.shapes.get(ref, declared)

    def count_of(self, ref: PortRef, declared: int) -> int:
        shape = self.shapes.get(ref)
        return declared if shape is None else math.prod(shape)


NOTHING = Resolved()


def resolve(desc: PipelineDescription, blocks: tuple[BlockEntry, ...], sources: Mapping[PortRef, PortRef],
            delayed: Mapping[PortRef, PortRef], reshaped: bool, report) -> Resolved:
    """Resolve every port's shape (``blocks`` in topological order; ``sources``: input -> output for the
    connections within a frame, ``delayed``: for the delayed ones). ``reshaped``: some connection joins
    different declared shapes. Errors go to ``report`` (the planner's: ``report.error(message, subject,
    block, ShapeError)``)."""
    if not desc.shapes and not reshaped:
        return NOTHING
    guesses: dict[PortRef, Shape] = {}
    for _ in range(_ROUNDS):
        problems: list[tuple[str, str, int]] = []
        resolved = _Pass(desc, sources, delayed, guesses, problems).run(blocks)
        wrong = {ref: resolved.shapes_all[src] for ref, src in delayed.items()
                 if src in resolved.shapes_all and resolved.shapes_all[src] != _guess(ref, src, guesses, desc)}
        if not wrong:
            break
        guesses.update(wrong)
    else:
        ref = next(iter(wrong))
        problems.append((f"the shapes around the delayed connection into {_label(desc, ref)} do not settle: each "
                         f"pass through the loop changes them; give a port on the loop a fixed shape",
                         _label(desc, ref), ref.block))
    for message, subject, block in problems:
        report.error(message, subject, block, ShapeError)
    return resolved.result


def resolve_all(desc: PipelineDescription) -> Resolved:
    """Resolve a pipeline's shapes on their own, raising the first shape error (for tools and tests; the
    planner calls :func:`resolve`)."""
    report = Report()
    order = ordered_blocks(desc, report)
    delayed = {c.dst: c.src for c in desc.connections if getattr(c, "delay", 0)}
    sources = {c.dst: c.src for c in desc.connections if not getattr(c, "delay", 0)}
    out = resolve(desc, order, sources, delayed, True, report)
    report.raise_errors()
    return out


def _label(desc: PipelineDescription, ref: PortRef) -> str:
    try:
        return f"{desc.block(ref.block).label()}.{ref.port}"
    except KeyError:
        return f"<block {ref.block}>.{ref.port}"


def _spec(desc: PipelineDescription, ref: PortRef) -> PortSpec | None:
    try:
        return desc.block(ref.block).desc.port(ref.port)
    except (KeyError, ValueError):
        return None


def _guess(ref: PortRef, src: PortRef, guesses: Mapping[PortRef, Shape], desc: PipelineDescription) -> Shape | None:
    if ref in guesses:
        return guesses[ref]
    spec = _spec(desc, src)
    return spec.shape if spec is not None else None


class _Pass:
    """One pass over the blocks in topological order."""

    def __init__(self, desc, sources, delayed, guesses, problems):
        self.desc = desc
        self.sources = sources
        self.delayed = delayed
        self.guesses = guesses
        self.problems = problems
        self.shapes_all: dict[PortRef, Shape] = {}
        self.result = Resolved()

    def error(self, message: str, b: BlockEntry) -> None:
        self.problems.append((message, b.label(), b.id))

    def run(self, blocks) -> _Pass:
        for b in blocks:
            self.block(b)
        return self

    def block(self, b: BlockEntry) -> None:
        desc, bid, label = self.desc, b.id, b.label()
        ports = b.desc.ports
        res: dict[str, Shape] = {}
        came: dict[str, str] = {}  # input -> where its shape came from, for messages
        inputs = [p for p in ports if p.direction == "in"]
        for p in sorted(inputs, key=lambda p: isinstance(p.rule, Like)):  # Like inputs after what they name
            ref = PortRef(bid, p.name)
            got, origin = self.arriving(ref)
            shape = p.shape
            if got is not None and got != p.shape:
                if isinstance(p.rule, Follow | Like):
                    shape = got
                elif not accepts(p.shape, got):
                    self.error(f"{origin} has shape {fmt(got)} but {label}.{p.name} takes shape {fmt(p.shape)}, a "
                               f"fixed shape: resize upstream to {fmt(p.shape)}, or give {label} an input that "
                               "follows (rule=Follow(); Block.from_kernel's first input does)", b)
            res[p.name] = shape
            came[p.name] = ("as declared" if got is None else "resized" if origin.startswith("the resize")
                            else f"from {origin}")
        for p in inputs:
            if isinstance(p.rule, Like) and p.rule.port in res:
                a, q = res[p.name], res[p.rule.port]
                if a != q and not (math.prod(a) == math.prod(q) and (len(a) == 1 or len(q) == 1)):
                    self.error(f"{label}.{p.name} must have the shape of {label}.{p.rule.port}, but "
                               f"{label}.{p.rule.port} has shape {fmt(q)} ({came[p.rule.port]}) and {label}.{p.name} "
                               f"has shape {fmt(a)} ({came[p.name]}); resize them together", b)
        outputs = {p.name: p for p in ports if p.direction == "out"}
        busy: set[str] = set()

        def output(p: PortSpec) -> Shape:
            if p.name in res:
                return res[p.name]
            rule = p.rule
            if not isinstance(rule, Like | Reduce | Broadcast) or p.counter is not None:
                res[p.name] = p.shape
                return p.shape
            busy.add(p.name)
            refs: dict[str, Shape] = {}
            for r in rule.refs():
                if r in res:
                    refs[r] = res[r]
                elif r in outputs and r not in busy:
                    refs[r] = output(outputs[r])
                else:  # a port the block lacks, or rules naming each other (the builder refuses both)
                    spec = next((q for q in ports if q.name == r), None)
                    refs[r] = spec.shape if spec is not None else p.shape
            busy.discard(p.name)
            try:
                shape = rule.apply(refs, p.name)
            except ShapeError as e:
                self.error(f"{label}: {e}", b)
                shape = p.shape
            res[p.name] = shape
            return shape

        for p in outputs.values():
            output(p)
        changed = None
        all_shapes = self.shapes_all
        for p in ports:
            ref = PortRef(bid, p.name)
            shape = res.get(p.name, p.shape)
            all_shapes[ref] = shape
            if shape != p.shape:
                self.result.shapes[ref] = shape
                if changed is None:
                    changed = BlockShapes()
                changed.counts[p.name] = math.prod(shape)
            binding = desc.bindings.get(ref) if desc.bindings else None
            if binding is not None and binding.count < math.prod(shape) and shape != p.shape:
                self.error(f"array bound to {label}.{p.name} has {binding.count} elements, but the port now has "
                           f"shape {fmt(shape)} ({math.prod(shape)} elements); bind a larger array", b)
        if changed is not None:
            self.follow(b, res, changed)
            self.result.blocks[bid] = changed

    def arriving(self, ref: PortRef) -> tuple[Shape | None, str]:
        """The shape arriving at input ``ref`` and where it comes from (None: nothing imposes one)."""
        src = self.sources.get(ref)
        if src is not None:
            return self.shapes_all.get(src), _label(self.desc, src)
        src = self.delayed.get(ref)
        if src is not None:
            shape = self.shapes_all.get(src) or _guess(ref, src, self.guesses, self.desc)
            return shape, f"{_label(self.desc, src)} (delayed)"
        shape = self.desc.shapes.get(ref)
        if shape is not None:
            return shape, f"the resize of {_label(self.desc, ref)}"
        return None, ""

    def follow(self, b: BlockEntry, res: Mapping[str, Shape], changed: BlockShapes) -> None:
        """Scalars, internal buffers and launches of a block whose ports changed shape."""
        d = b.desc
        declared = {p.name: p.shape for p in d.ports}
        for s in d.scalars:
            if s.size_of is None:
                continue
            port, axis = s.size_of
            if port not in res:
                continue
            new, old = res[port], declared[port]
            if new == old:
                continue
            if axis is not None and not -len(new) <= axis < len(new):
                self.error(f"{b.label()}.{s.name} is the length of axis {axis} of {b.label()}.{port}, which now "
                           f"has shape {fmt(new)}", b)
                continue
            value = math.prod(new) if axis is None else new[axis]
            if value != (math.prod(old) if axis is None else old[axis] if -len(old) <= axis < len(old) else None):
                changed.values[s.name] = value
        for ib in d.internals:
            if ib.like is not None and ib.like in res and res[ib.like] != declared[ib.like]:
                changed.internals[ib.name] = math.prod(res[ib.like])
        for step in d.kernels:
            if not isinstance(step, KernelSpec) or step.grid_of is None or step.grid_of not in res:
                continue
            new = res[step.grid_of]
            if new == declared[step.grid_of]:
                continue
            base = b.launches.get(step.name) or step.launch
            grid = launch_geometry(new, base.block, step.code.items_per_thread)
            changed.launches[step.name] = attrs.evolve(base, grid=grid)


# -- a resize in place ---------------------------------------------------------------------------------------
@attrs.frozen
class InPlace:
    """How a new plan differs from the running one when only shapes changed: per kernel node, its new launch
    (or None) and its scalar arguments that changed ((argument index, value), ...); the buffers whose size
    changed. Everything else is equal, so the running graph can take it by exec-node updates."""

    nodes: Mapping[int, tuple[Launch | None, tuple[tuple[int, float | int], ...]]]
    buffers: tuple[int, ...]
    copies: Mapping[int, int] = attrs.field(factory=dict)  # copy node (a delayed connection's) -> its new bytes


_SAME_FIELDS = ("deps", "port_buffers", "counters", "slots", "device_scalars", "recapture", "kernel_nodes")


def in_place(old, new) -> InPlace | None:
    """The difference of ``new`` from ``old`` (two GraphPlans) if it is only launches, scalar values and
    buffer sizes of the same nodes and buffers, else None. Pure; O(nodes + buffers), and O(1) when the node or
    buffer counts differ. (A value the Parameters tier wrote since ``old`` was built differs from its copy in
    ``old``: the caller compares those with what the graph holds.)"""
    if len(old.nodes) != len(new.nodes) or len(old.buffers) != len(new.buffers):
        return None
    for f in attrs.fields(type(new)):
        if f.name in ("nodes", "buffers", "warnings", "shapes"):
            continue
        if getattr(old, f.name) != getattr(new, f.name):
            return None
    nodes: dict[int, tuple[Launch | None, tuple[tuple[int, float | int], ...]]] = {}
    copies: dict[int, int] = {}
    for o, n in zip(old.nodes, new.nodes, strict=True):
        if o == n:
            continue
        if type(o) is type(n) and type(n).__name__ == "CopyNodePlan" and o._replace(nbytes=0) == n._replace(nbytes=0):
            copies[n.id] = n.nbytes  # a delayed connection's copy of a resized buffer
            continue
        if type(o) is not type(n) or type(n).__name__ != "KernelNodePlan":
            return None
        if (o.id, o.block, o.kernel, o.label, o.reads, o.writes) != (n.id, n.block, n.kernel, n.label, n.reads,
                                                                     n.writes):
            return None
        if o.code_key != n.code_key or len(o.args) != len(n.args):
            return None
        values = []
        for i, (a, b) in enumerate(zip(o.args, n.args, strict=True)):
            if a == b:
                continue
            if type(a).__name__ != "ScalarArg" or type(b) is not type(a) or a[:4] != b[:4]:
                return None
            values.append((i, b.value))
        nodes[n.id] = (n.launch if n.launch != o.launch else None, tuple(values))
    changed = []
    for o, n in zip(old.buffers, new.buffers, strict=True):
        if o != n:
            if o._replace(count=0) != n._replace(count=0):
                return None
            changed.append(n.id)
    return InPlace(nodes, tuple(changed), copies)
