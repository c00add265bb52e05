"""Shapes while a block is declared: what ``BlockBuilder`` records per port, scalar, internal buffer and kernel,
and how ``build()`` turns it into declared shapes and rules (``rxcuda.model._shapes``).

The rule a builder gives the ports that take its own shape (``BlockBuilder(size=n)`` or ``shape=(h, w)``, no
``count`` or ``shape`` of their own): its first such input *follows* whatever feeds it, its other such inputs
and its outputs are *like* that input, scalars that default to ``"size"`` take its element count, internal
buffers its element count, and kernels launched over the builder's shape take their grid from it. So a resize
upstream flows through the block. A port with an explicit ``count`` or ``shape`` is fixed unless given a rule.
"""

from __future__ import annotations

import math

import attrs

from ..model._describe import InternalBuffer, KernelSpec, Launch, PortSpec, ScalarSpec
from ..model._errors import ValidationError
from ..model._shapes import (
    RULES,
    Broadcast,
    Follow,
    Like,
    Reduce,
    Shape,
    ShapeError,
    check_rule,
    check_shape,
    check_strides,
    fmt,
    launch_geometry,
)


def builder_shape(size, shape) -> tuple[int | None, Shape | None]:
    """(size, shape) of a builder from its arguments: either, or both when they agree."""
    if shape is None:
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
            raise ValueError(f"'size' must be a positive int (got {size!r})")
        return size, (size,) if size is not None else None
    shape = check_shape(shape)
    if size is not None and size != math.prod(shape):
        raise ValueError(f"'size' {size!r} disagrees with 'shape' {shape} ({math.prod(shape)} elements); give one")
    return math.prod(shape), shape


@attrs.define
class _PortDecl:
    shape: Shape | None  # explicit
    strides: tuple | None
    rule: object
    sized: bool  # took the builder's shape
    derived: bool = False  # its shape comes from its rule (finish() computes it)


class Shaping:
    """What a builder recorded about shapes; :meth:`finish` applies it when the block is built."""

    def __init__(self, block: str, shape: Shape | None):
        self.block = block
        self.shape = shape
        self.ports: dict[str, _PortDecl] = {}
        self.size_scalars: dict[str, tuple[str | None, int | None]] = {}  # scalar -> (port, axis); None: primary
        self.sized_internals: set[str] = set()
        self.launches: dict[str, tuple[str | None, int]] = {}  # kernel -> (port it runs over; None: primary, ipt)

    # -- while declaring --------------------------------------------------------------------------------
    def declare(self, name: str, direction: str, count, shape, strides, rule, call_count) -> tuple[int | None, dict]:
        """Record a port; returns (its element count, or None to take the builder's; PortSpec keywords)."""
        if shape is not None and isinstance(shape, RULES):
            if rule is not None:
                raise ValueError(f"{self.block}: port '{name}' gives a rule twice (shape= and rule=); give one")
            shape, rule = None, shape
        try:
            rule = check_rule(rule, direction, name)
            if shape is not None:
                shape = check_shape(shape, f"shape of port '{name}'")
                if count is not None and count != math.prod(shape):
                    raise ValueError(f"port '{name}': 'count' {count} disagrees with 'shape' {shape}; give one")
                count = math.prod(shape)
            if strides is not None:
                if shape is None:
                    raise ValueError(f"port '{name}': 'strides' need an explicit 'shape'")
                strides = check_strides(strides, shape, f"strides of port '{name}'")
        except ValueError as e:
            raise ValueError(f"{self.block}: {e}") from None
        derived = isinstance(rule, Like | Reduce | Broadcast) and shape is None and count is None
        sized = shape is None and count is None and call_count is None and not derived
        self.ports[name] = _PortDecl(shape, strides, rule, sized, derived)
        if derived:
            return 1, {"rule": rule}  # its shape comes from the ports it names, in finish()
        kwargs: dict = {"rule": rule}
        if shape is not None:
            kwargs.update(shape=shape, strides=strides)
        elif sized and count is None and call_count is None and self.shape is not None and len(self.shape) > 1:
            kwargs["shape"] = self.shape
        return count, kwargs

    def launch(self, kernel: str, over: str | None, block, shared_mem: int, items_per_thread: int
               ) -> Launch | None:
        """The launch of a kernel that runs over a shape (``over``: a port; None: the builder's shape), or None
        when there is none to run over yet (``over`` names a port declared later: finish() sets it)."""
        self.launches[kernel] = (over, items_per_thread)
        if over is not None or self.shape is None:
            return Launch(grid=(1,), block=block, shared_mem=shared_mem) if over is not None else None
        la = Launch(grid=(1,), block=block, shared_mem=shared_mem)
        return attrs.evolve(la, grid=launch_geometry(self.shape, la.block, items_per_thread))

    # -- at build() -----------------------------------------------------------------------------------------
    def finish(self, ports: list[PortSpec], scalars: list[ScalarSpec], internals: list[InternalBuffer],
               steps: list) -> tuple[list[PortSpec], list[ScalarSpec], list[InternalBuffer], list]:
        by_name = {p.name: p for p in ports}
        sized = [p for p in ports if self.ports.get(p.name, _PortDecl(None, None, None, False)).sized
                 and p.counter is None]
        primary = next((p.name for p in sized if p.direction == "in"), None)
        size_port = primary or (sized[0].name if sized else None)
        out: dict[str, PortSpec] = {}
        for p in ports:
            decl = self.ports.get(p.name)
            if decl is not None and decl.sized and p.counter is None and primary is not None and decl.rule is None:
                p = attrs.evolve(p, rule=Follow() if p.name == primary else Like(primary))
            out[p.name] = p
        # shapes of ports whose rule derives them (in dependency order)
        resolving: set[str] = set()
        done: set[str] = set()

        def resolve(name: str, user: str) -> Shape:
            p = out.get(name)
            if p is None:
                raise ValidationError(f"{self.block}: port '{user}' takes its shape from '{name}', which is not a "
                                      f"port of the block (ports: {', '.join(by_name) or 'none'})", subject=self.block)
            decl = self.ports.get(name)
            if decl is None or not decl.derived or name in done:
                return p.shape
            if name in resolving:
                raise ValidationError(f"{self.block}: the shape rules of ports {', '.join(sorted(resolving))} "
                                      "refer to each other; one of them needs an explicit shape", subject=self.block)
            rule = p.rule
            assert isinstance(rule, Like | Reduce | Broadcast)  # what makes a port derived
            resolving.add(name)
            refs = {r: resolve(r, name) for r in rule.refs()}
            resolving.discard(name)
            try:
                shape = rule.apply(refs, name)
            except ShapeError as e:
                raise ShapeError(f"{self.block}: {e}", subject=self.block) from None
            out[name] = attrs.evolve(p, count=math.prod(shape), shape=shape)
            done.add(name)
            return shape

        for p in list(out.values()):
            decl = self.ports.get(p.name)
            if decl is None or not isinstance(p.rule, Like | Reduce | Broadcast):
                continue
            for r in p.rule.refs():
                resolve(r, p.name)  # a rule naming a port the block lacks: say so
            if decl.derived:
                resolve(p.name, p.name)
            elif isinstance(p.rule, Like) and not decl.sized:
                other = out[p.rule.port].shape
                if not _agree(p.shape, other):
                    raise ShapeError(f"{self.block}: port '{p.name}' has shape {fmt(p.shape)} but is declared "
                                     f"like '{p.rule.port}', which has shape {fmt(other)}; give them one shape",
                                     subject=self.block)
        new_scalars = []
        for s in scalars:
            how = self.size_scalars.get(s.name)
            if how is not None:
                port, axis = how
                port = port or size_port
                if port is not None:
                    shape = resolve(port, s.name)
                    if axis is not None and not -len(shape) <= axis < len(shape):
                        raise ValidationError(f"{self.block}: parameter '{s.name}' takes axis {axis} of '{port}', "
                                              f"which has shape {fmt(shape)}", subject=self.block)
                    value = math.prod(shape) if axis is None else shape[axis]
                    s = attrs.evolve(s, default=value, size_of=(port, axis))
            new_scalars.append(s)
        new_internals = [attrs.evolve(ib, like=size_port) if ib.name in self.sized_internals and size_port else ib
                         for ib in internals]
        new_steps = []
        for st in steps:
            how = self.launches.get(st.name) if isinstance(st, KernelSpec) else None
            if how is not None:
                over, ipt = how
                port = over or size_port
                if port is not None:
                    shape = resolve(port, st.name)
                    la = attrs.evolve(st.launch, grid=launch_geometry(shape, st.launch.block, ipt))
                    st = attrs.evolve(st, launch=la, grid_of=port)
            new_steps.append(st)
        return list(out.values()), new_scalars, new_internals, new_steps


def _agree(a: Shape, b: Shape) -> bool:
    return a == b or (math.prod(a) == math.prod(b) and (len(a) == 1 or len(b) == 1))
