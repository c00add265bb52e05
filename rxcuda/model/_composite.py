"""Composite descriptions: a block made of blocks, as pure data.

A :class:`CompositeDescription` holds its members (each a block description with the values and launches
it starts with, or a nested composite description), the connections between them, and what it exposes
under its own names: ports (each one inner port) and parameters (each one or more inner parameters).
Inner references name a member and, inside it, a port or parameter: a block member's own, or the name a
nested composite exposes. Nothing here checks that the references fit; ``rxcuda.Composite`` checks each
step as a composite is declared, and ``Composite.from_description`` rebuilds (and so checks) a composite
from this data. Equality is structural: ``Composite.from_description(d).describe() == d``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Literal

import attrs

from ._describe import BlockDescription, KernelSpec, Launch, PortSpec
from ._errors import UnknownPortError


@attrs.frozen
class MemberPort:
    """A port of a member: the member's name and, inside it, the port (a block's own port, or a nested
    composite's exposed port)."""

    member: str
    port: str

    def __str__(self) -> str:
        return f"{self.member}.{self.port}"


@attrs.frozen
class MemberParameter:
    """A parameter of a member: the member's name and the parameter's (a block's own, or a nested
    composite's exposed parameter)."""

    member: str
    name: str

    def __str__(self) -> str:
        return f"{self.member}.{self.name}"


@attrs.frozen
class InnerConnection:
    """A connection between two members of one composite (an output to an input). ``delay`` and ``initial``
    as in ``engine.connect`` (``delay=1``: the input reads the previous frame's value); ``initial`` takes no
    part in equality."""

    src: MemberPort
    dst: MemberPort
    delay: int = 0
    initial: object = attrs.field(default=None, eq=False)

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst}" + (f" (delay {self.delay})" if self.delay else "")


@attrs.frozen
class ExposedPort:
    """A port of the composite: its name outside, its direction, and the member port it stands for."""

    name: str
    direction: Literal["in", "out"]
    inner: MemberPort


@attrs.frozen
class ExposedParameter:
    """A parameter of the composite: its name outside, its type, the member parameters it sets (all of
    that type), and the value instances start with (``None``: each member parameter keeps its own)."""

    name: str
    dtype: str
    targets: tuple[MemberParameter, ...]
    value: float | int | None = None


@attrs.frozen
class MemberDescription:
    """A member of a composite: its name there and its description -- a block's (with the parameter values
    and launch overrides each instance starts with) or a nested composite's."""

    name: str
    desc: BlockDescription | CompositeDescription
    values: Mapping[str, float | int] = attrs.field(factory=dict, converter=lambda m: dict(m))
    launches: Mapping[str, Launch] = attrs.field(factory=dict, converter=lambda m: dict(m))

    @property
    def is_composite(self) -> bool:
        return isinstance(self.desc, CompositeDescription)


@attrs.frozen
class CompositeDescription:
    """A composite block as data: members, inner connections, exposed ports and parameters.

    >>> from rxcuda.lowlevel import BlockDescription, Pin, PortSpec
    >>> scale = BlockDescription("scale", ports=(PortSpec("x", "in", "f32", 16, (Pin("k", 0),)),
    ...                                          PortSpec("out", "out", "f32", 16, (Pin("k", 1),))))
    >>> d = CompositeDescription("twice", members=(MemberDescription("a", scale), MemberDescription("b", scale)),
    ...                          connections=(InnerConnection(MemberPort("a", "out"), MemberPort("b", "x")),),
    ...                          ports=(ExposedPort("x", "in", MemberPort("a", "x")),
    ...                                 ExposedPort("y", "out", MemberPort("b", "out"))))
    >>> d.resolve_port("y"), d.port_spec("x").dtype
    ((('b',), 'out'), 'f32')
    >>> print(d)
    composite twice: 2 members, 1 connection
      block a: no kernels
      block b: no kernels
      a.out -> b.x
      input x: a.x (f32[16])
      output y: b.out (f32[16])
    """

    name: str
    members: tuple[MemberDescription, ...] = ()
    connections: tuple[InnerConnection, ...] = ()
    ports: tuple[ExposedPort, ...] = ()
    parameters: tuple[ExposedParameter, ...] = ()

    # -- lookups -----------------------------------------------------------------------------------------
    def member(self, name: str) -> MemberDescription:
        """The member called ``name``; KeyError naming the members."""
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(f"composite '{self.name}' has no member '{name}' "
                       f"(members: {', '.join(m.name for m in self.members) or 'none'})")

    def port(self, name: str) -> ExposedPort:
        """The exposed port called ``name``; UnknownPortError (a ValidationError and a KeyError) naming the
        exposed ports."""
        for p in self.ports:
            if p.name == name:
                return p
        names = [p.name for p in self.ports]
        msg = f"composite '{self.name}' exposes no port '{name}' (ports: {', '.join(names) or 'none'})"
        close = difflib.get_close_matches(name, names, n=1) if isinstance(name, str) else []
        if close:
            msg += f"; did you mean '{close[0]}'?"
        raise UnknownPortError(msg, subject=self.name)

    def parameter(self, name: str) -> ExposedParameter:
        """The exposed parameter called ``name``; KeyError naming the exposed parameters."""
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(f"composite '{self.name}' exposes no parameter '{name}' "
                       f"(parameters: {', '.join(p.name for p in self.parameters) or 'none'})")

    # -- resolved to the blocks inside -------------------------------------------------------------------
    def resolve(self, ref: MemberPort) -> tuple[tuple[str, ...], str]:
        """The block port a member port stands for: (member path from this composite, port name)."""
        m = self.member(ref.member)
        if isinstance(m.desc, CompositeDescription):
            path, port = m.desc.resolve_port(ref.port)
            return (m.name, *path), port
        return (m.name,), ref.port

    def resolve_port(self, name: str) -> tuple[tuple[str, ...], str]:
        """The block port an exposed port stands for: (member path, port name)."""
        return self.resolve(self.port(name).inner)

    def resolve_parameter(self, name: str) -> tuple[tuple[tuple[str, ...], str], ...]:
        """The block parameters an exposed parameter sets: (member path, parameter name) each."""
        out: list[tuple[tuple[str, ...], str]] = []
        for t in self.parameter(name).targets:
            m = self.member(t.member)
            if isinstance(m.desc, CompositeDescription):
                out += [((m.name, *path), p) for path, p in m.desc.resolve_parameter(t.name)]
            else:
                out.append(((m.name,), t.name))
        return tuple(out)

    def port_spec(self, name: str) -> PortSpec:
        """The spec of the block port an exposed port stands for (direction, dtype, count)."""
        return self.member_port_spec(self.port(name).inner)

    def member_port_spec(self, ref: MemberPort) -> PortSpec:
        m = self.member(ref.member)
        return m.desc.port_spec(ref.port) if isinstance(m.desc, CompositeDescription) else m.desc.port(ref.port)

    def leaves(self) -> Iterator[tuple[tuple[str, ...], MemberDescription]]:
        """Every block member, nested ones included, depth first in member order: (path, member)."""
        for m in self.members:
            if isinstance(m.desc, CompositeDescription):
                for path, leaf in m.desc.leaves():
                    yield (m.name, *path), leaf
            else:
                yield (m.name,), m

    def flat_connections(self) -> Iterator[tuple[tuple[tuple[str, ...], str], tuple[tuple[str, ...], str],
                                                  InnerConnection]]:
        """Every inner connection at every depth, resolved to block ports: ((path, port), (path, port),
        the connection as declared)."""
        for m in self.members:
            if isinstance(m.desc, CompositeDescription):
                for (sp, s), (dp, d), c in m.desc.flat_connections():
                    yield ((m.name, *sp), s), ((m.name, *dp), d), c
        for c in self.connections:
            yield self.resolve(c.src), self.resolve(c.dst), c

    # -- text ----------------------------------------------------------------------------------------------
    def lines(self, indent: str = "") -> list[str]:
        """What ``str()`` shows, line by line: members (nested composites indented), connections, exposed
        ports and parameters."""
        n, c = len(self.members), len(self.connections)
        out = [f"{indent}composite {self.name}: {n} member{'s' * (n != 1)}, {c} connection{'s' * (c != 1)}"]
        inner = indent + "  "
        for m in self.members:
            if isinstance(m.desc, CompositeDescription):
                sub = m.desc.lines(inner)
                out.append(f"{inner}{m.name}: " + sub[0].lstrip())
                out += sub[1:]
            else:
                steps = ", ".join(f"kernel {k.name}" if isinstance(k, KernelSpec) else f"call {k.name}"
                                  for k in m.desc.kernels) or "no kernels"
                out.append(f"{inner}block {m.name}: {steps}")
        out += [f"{inner}{x}" for x in self.connections]
        for p in self.ports:
            try:
                spec = self.port_spec(p.name)
                shape = f" ({spec.dtype or 'any'}[{spec.count}])"
            except (KeyError, UnknownPortError):  # hand-made data that does not resolve
                shape = " (unresolved)"
            out.append(f"{inner}{'input' if p.direction == 'in' else 'output'} {p.name}: {p.inner}{shape}")
        for q in self.parameters:
            value = "" if q.value is None else f" = {q.value!r}"
            out.append(f"{inner}parameter {q.name}: {', '.join(map(str, q.targets))} ({q.dtype}{value})")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())
