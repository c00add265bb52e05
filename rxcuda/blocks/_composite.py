"""Composite blocks: a block made of blocks, nested to any depth, used like one block.

A :class:`Composite` is a definition: member blocks (templates) and nested composites, the connections
between them, and the ports and parameters it exposes under its own names. ``engine.add(composite)``
flattens it into ordinary blocks named by their path (``"smooth/blur"``, ``"outer/inner/gain"``), so the
planner and the CUDA layer see nothing new, and returns a :class:`CompositeInstance`: its ports are the inner
blocks' port handles (``engine.connect``, ``bind``, ``write``, ``observe`` take them unchanged) and its
parameters set every inner parameter they stand for (each a hot, Parameters-tier update). Adding the same
composite twice makes two independent instances. The engine keeps its instances (``engine.composites``;
adding and removing them: ``rxcuda.engine._composites``); ``engine.remove(instance)`` removes every block inside.

A composite is a description: ``describe()`` returns it as data (``rxcuda.lowlevel.CompositeDescription``)
and ``Composite.from_description`` rebuilds an equal composite from that data.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

import attrs
from reactivex.disposable import CompositeDisposable

from ..model._composite import (
    CompositeDescription,
    ExposedParameter,
    ExposedPort,
    InnerConnection,
    MemberDescription,
    MemberParameter,
    MemberPort,
)
from ..model._describe import BlockDescription, Connection, PortRef, PortSpec
from ..model._errors import ForeignBlockError, NotAPortError, ValidationError
from ..plan._index import PipelineIndex
from ._blocks import Block, Parameter, PortHandle
from ._engineside import side_of

T = TypeVar("T")

# the order of block states from worst to best, for an instance's overall state
_STATES = ("error", "warning", "not built", "ok")


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"{what} must be a non-empty str without '/' (got {name!r}); '/' joins the names of "
                         "nested members")
    return name


class _Lookup(Mapping[str, T], Generic[T]):
    """A read-only mapping name -> item whose KeyError names what there is."""

    __slots__ = ("_items", "_what")

    def __init__(self, items: dict[str, T], what: str):
        self._items = items
        self._what = what

    def __getitem__(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"{self._what} has no parameter '{name}' "
                           f"(parameters: {', '.join(self._items) or 'none'})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


# -- the definition --------------------------------------------------------------------------------------
@attrs.frozen
class CompositePort:
    """A port a composite exposes, as used inside an enclosing composite (``outer.connect(inner["y"], ...)``)."""

    composite: Composite
    name: str

    def __repr__(self) -> str:
        return f"<port {self.composite.name}.{self.name}>"


class CompositeParameterRef:
    """A parameter a composite exposes, as used inside an enclosing composite
    (``outer.expose_parameter("gain", inner.params["gain"])``). Setting ``value`` sets the value instances
    made from now on start with."""

    __slots__ = ("_composite", "name")

    def __init__(self, composite: Composite, name: str):
        self._composite = composite
        self.name = name

    @property
    def dtype(self) -> str:
        return self._composite._params[self.name].dtype

    @property
    def value(self):
        """The value instances start with: the one set on the composite, else the first target's."""
        exposed = self._composite._params[self.name]
        if exposed.value is not None:
            return exposed.value
        return self._composite._first_target(self.name).value

    @value.setter
    def value(self, v) -> None:
        c = self._composite
        c._params[self.name] = attrs.evolve(c._params[self.name], value=c._first_target(self.name)._check(v))

    def __repr__(self) -> str:
        return f"<parameter {self._composite.name}.{self.name}: {self.dtype} = {self.value!r}>"


class Composite:
    """A block made of blocks: members, their connections, and the ports and parameters it exposes.

    Members are templates: ``engine.add(composite)`` gives each instance fresh blocks made from the
    members' descriptions, parameter values and launches as they are then. Every step is checked as it is
    made (a port that is not there, two exposures with one name, connections that do not fit or form a
    cycle), and the whole again when an instance is added.

    >>> import rxcuda
    >>> smooth = rxcuda.Composite("smooth")
    >>> first = smooth.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, name="first"))
    >>> second = smooth.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, name="second"))
    >>> smooth.connect(first["out"], second["x"])
    >>> smooth.expose("x", first["x"]); smooth.expose("y", second["out"])
    >>> smooth.expose_parameter("gain", first.params["scale"], second.params["scale"], value=0.5)
    >>> print(smooth)
    composite smooth: 2 members, 1 connection
      block first: kernel scalar_mul
      block second: kernel scalar_mul
      first.out -> second.x
      input x: first.x (f32[1024])
      output y: second.out (f32[1024])
      parameter gain: first.scale, second.scale (f32 = 0.5)
    >>> engine = rxcuda.Engine(driver=rxcuda.cuda.NullDriver())
    >>> a, b = engine.add(smooth), engine.add(smooth)          # two independent instances
    >>> a["y"], b["y"], [blk.name for blk in b.blocks]
    (<port smooth/second.out>, <port smooth_2/second.out>, ['smooth_2/first', 'smooth_2/second'])
    >>> engine.connect(a["y"], b["x"])
    >>> a.params["gain"].value = 2.0                            # sets smooth/first.scale and smooth/second.scale
    >>> engine.close()
    """

    def __init__(self, name: str):
        self._name = _check_name(name, "a composite's name")
        self._members: dict[str, Block | Composite] = {}
        self._names: dict[Block | Composite, str] = {}  # member -> its name here (by identity)
        self._connections: list[InnerConnection] = []
        self._ports: dict[str, ExposedPort] = {}
        self._params: dict[str, ExposedParameter] = {}
        self._flat: tuple[tuple, PipelineIndex, dict[tuple[str, ...], int]] | None = None

    # -- reading ---------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def members(self) -> Mapping[str, Block | Composite]:
        """Member name -> the block or composite added under it (read-only)."""
        return types.MappingProxyType(self._members)

    @property
    def params(self) -> Mapping[str, CompositeParameterRef]:
        """The exposed parameters, for an enclosing composite's ``expose_parameter``."""
        return _Lookup({n: CompositeParameterRef(self, n) for n in self._params}, f"composite '{self._name}'")

    def __getitem__(self, port: str) -> CompositePort:
        """An exposed port, for an enclosing composite's ``connect`` and ``expose``."""
        if port not in self._ports:
            self.describe().port(port)  # UnknownPortError naming the exposed ports
        return CompositePort(self, port)

    # -- declaring ---------------------------------------------------------------------------------------
    def add(self, member: Block | Composite, name: str | None = None):
        """Add a member -- a block that is in no engine, or another composite -- under ``name`` (default:
        its own name; a taken default becomes ``name_2``, ``name_3``, ...). Returns the member, for its ports
        and parameters: ``blur = smooth.add(Block.from_kernel(...))``."""
        if isinstance(member, Block):
            if getattr(member, "bodies", None) is not None:
                raise ValidationError(f"{member.name} is a region (If, While, ...), which a composite cannot hold; "
                                      "add the region to the engine beside the composite's instances",
                                      subject=self._name)
            if member._engine is not None:
                raise ValidationError(f"{member.name} is in an engine, so it cannot be a member of composite "
                                      f"'{self._name}': members are templates each instance copies; pass a block "
                                      "that is in no engine (create another, e.g. with Block.from_kernel)",
                                      subject=self._name)
        elif isinstance(member, Composite):
            if member is self or member._contains(self):
                raise ValidationError(f"composite '{self._name}' cannot contain itself (through '{member.name}')",
                                      subject=self._name)
        else:
            raise TypeError(f"{self._name}.add takes a Block or a Composite (got {type(member).__name__})")
        if member in self._names:
            raise ValidationError(f"{member.name} is already a member of composite '{self._name}' (as "
                                  f"'{self._names[member]}'); create another one for a second copy",
                                  subject=self._name)
        if name is None:
            name = base = _check_name(member.name, f"the member name of {member.name!r} (pass name=...)")
            i = 2
            while name in self._members:
                name, i = f"{base}_{i}", i + 1
        else:
            _check_name(name, "a member's name")
            if name in self._members:
                raise ValidationError(f"composite '{self._name}' already has a member named '{name}'; choose "
                                      "another name", subject=self._name)
        flat = self._index() if isinstance(member, Block) else None
        self._members[name] = member
        self._names[member] = name
        if flat is not None and isinstance(member, Block):  # keep the flat index up to date, not rebuilt
            index, ids = flat
            ids[(name,)] = len(ids) + 1
            index.add_block(len(ids), attrs.evolve(member.description, name=name))
            self._remember(index, ids)
        return member

    def connect(self, src: PortHandle | CompositePort, dst: PortHandle | CompositePort, *, delay: int = 0,
                initial=None) -> None:
        """Connect a member's output to a member's input, checked like ``engine.connect`` (direction, type,
        size, one source per input, no cycle); ``delay=1`` and ``initial`` as there (feedback across
        frames: the input reads the previous frame's value)."""
        s, d = self._member_port(src), self._member_port(dst)
        index, ids = self._index()
        leaf = self._resolve(d)
        for p in self._ports.values():
            if p.direction == "in" and self._resolve(p.inner) == leaf:
                raise ValidationError(f"{d} is exposed as input '{p.name}' of composite '{self._name}', so it is "
                                      "connected from outside; connect inside to an input that is not exposed",
                                      subject=self._name)
        sl = self._resolve(s)
        try:
            index.add_connection(Connection(PortRef(ids[sl[0]], sl[1]), PortRef(ids[leaf[0]], leaf[1]), delay))
        except ValidationError as e:
            raise ValidationError(f"composite '{self._name}': {e}", subject=self._name, problems=e.problems) from None
        except ValueError as e:  # a delay other than 0 or 1
            raise ValidationError(f"composite '{self._name}': {s} -> {d}: {e}", subject=self._name) from None
        self._connections.append(InnerConnection(s, d, delay, initial))
        self._remember(index, ids)

    def expose(self, name: str, port: PortHandle | CompositePort) -> None:
        """Expose a member's port as this composite's port ``name`` (an input or an output, as the member's
        port is). An input that is connected inside cannot be exposed."""
        _check_name(name, "an exposed port's name")
        if name in self._ports:
            raise ValidationError(f"composite '{self._name}' already exposes a port named '{name}' "
                                  f"({self._ports[name].inner}); choose another name", subject=self._name)
        ref = self._member_port(port)
        spec = self._spec(ref)
        if spec.direction == "in":
            leaf = self._resolve(ref)
            index, ids = self._index()
            source = index.source(PortRef(ids[leaf[0]], leaf[1]))
            if source is not None:
                raise ValidationError(f"{ref} is connected inside composite '{self._name}', so it cannot be "
                                      "exposed; expose an input that nothing inside feeds", subject=self._name)
            for p in self._ports.values():
                if p.direction == "in" and self._resolve(p.inner) == leaf:
                    raise ValidationError(f"{ref} is already exposed as input '{p.name}' of composite "
                                          f"'{self._name}'; an input takes one connection", subject=self._name)
        self._ports[name] = ExposedPort(name, spec.direction, ref)

    def expose_parameter(self, name: str, *params: Parameter | CompositeParameterRef, value=None) -> None:
        """Expose one or more member parameters (all of one type) as this composite's parameter ``name``:
        setting it on an instance sets each of them. ``value``: the value instances start with (default:
        each keeps its own)."""
        _check_name(name, "an exposed parameter's name")
        if name in self._params:
            raise ValidationError(f"composite '{self._name}' already exposes a parameter named '{name}' "
                                  f"({', '.join(map(str, self._params[name].targets))}); choose another name",
                                  subject=self._name)
        if not params:
            raise TypeError(f"expose_parameter('{name}') takes at least one parameter, e.g. blur.params['scale']")
        targets: list[MemberParameter] = []
        dtypes: list[str] = []
        for prm in params:
            if isinstance(prm, Parameter):
                owner: Block | Composite = prm._block
            elif isinstance(prm, CompositeParameterRef):
                owner = prm._composite
            else:
                raise TypeError(f"expose_parameter takes parameters of members, e.g. blur.params['scale'] "
                                f"(got {prm!r})")
            member = self._names.get(owner)
            if member is None:
                raise ForeignBlockError(f"{owner.name} is not a member of composite '{self._name}'; add it first: "
                                        f"{self._name}.add(...)", subject=self._name)
            t = MemberParameter(member, prm.name)
            if t in targets:
                raise ValidationError(f"expose_parameter('{name}') names {t} twice", subject=self._name)
            targets.append(t)
            dtypes.append(prm.dtype)
        if len(set(dtypes)) > 1:
            listed = ", ".join(f"{t} ({d})" for t, d in zip(targets, dtypes, strict=True))
            raise ValidationError(f"composite '{self._name}': parameter '{name}' would set {listed}; a composite "
                                  "parameter has one type: expose parameters of one type together",
                                  subject=self._name)
        leaves = {leaf for t in targets for leaf in self._param_leaves(t)}
        for other in self._params.values():
            shared = leaves & {leaf for t in other.targets for leaf in self._param_leaves(t)}
            if shared:
                path, p = sorted(shared)[0]
                raise ValidationError(f"{'/'.join(path)}.{p} is already exposed as parameter '{other.name}' of "
                                      f"composite '{self._name}'; a parameter is exposed once",
                                      subject=self._name)
        exposed = ExposedParameter(name, dtypes[0], tuple(targets))
        if value is not None:
            self._params[name] = exposed
            try:
                value = self._first_target(name)._check(value)
            finally:
                del self._params[name]
            exposed = attrs.evolve(exposed, value=value)
        self._params[name] = exposed

    # -- as data -------------------------------------------------------------------------------------------
    def describe(self) -> CompositeDescription:
        """This composite as pure data: members (block descriptions named as the members, with their values
        and launches; nested composites' descriptions), connections, exposed ports and parameters."""
        members = []
        for name, m in self._members.items():
            if isinstance(m, Block):
                members.append(MemberDescription(name, attrs.evolve(m.description, name=name), m.values(),
                                                 m.launches()))
            else:
                members.append(MemberDescription(name, m.describe()))
        return CompositeDescription(self._name, tuple(members), tuple(self._connections), tuple(self._ports.values()),
                                    tuple(self._params.values()))

    @classmethod
    def from_description(cls, desc: CompositeDescription) -> Composite:
        """A composite rebuilt from ``describe()``'s data, checked step by step as if declared by hand:
        ``Composite.from_description(c.describe()).describe() == c.describe()``."""
        if not isinstance(desc, CompositeDescription):
            raise TypeError(f"from_description takes a CompositeDescription (got {type(desc).__name__})")
        c = cls(desc.name)
        for m in desc.members:
            if isinstance(m.desc, CompositeDescription):
                c.add(cls.from_description(m.desc), name=m.name)
                continue
            if not isinstance(m.desc, BlockDescription):
                raise TypeError(f"member '{m.name}' of '{desc.name}': a member is a BlockDescription or a "
                                f"CompositeDescription (got {type(m.desc).__name__})")
            block = Block(m.desc)
            for n, v in m.values.items():
                block.params[n].value = v
            block._launches = dict(m.launches)
            c.add(block, name=m.name)

        def handle(ref: MemberPort):
            member = c._members.get(ref.member)
            if member is None:
                desc.member(ref.member)  # KeyError naming the members
            return member[ref.port]  # type: ignore[index]

        for x in desc.connections:
            c.connect(handle(x.src), handle(x.dst), delay=x.delay, initial=x.initial)
        for p in desc.ports:
            c.expose(p.name, handle(p.inner))
            if c._ports[p.name].direction != p.direction:
                raise ValidationError(f"{desc.name}: exposed port '{p.name}' says '{p.direction}' but {p.inner} is "
                                      f"an {c._ports[p.name].direction}put", subject=desc.name)
        for q in desc.parameters:
            c.expose_parameter(q.name, *(c._members[t.member].params[t.name] for t in q.targets), value=q.value)
        return c

    def __str__(self) -> str:
        return str(self.describe())

    def __repr__(self) -> str:
        return f"<Composite {self._name}: {len(self._members)} members>"

    # -- inside --------------------------------------------------------------------------------------------
    def _contains(self, other: Composite) -> bool:
        return any(m is other or m._contains(other) for m in self._members.values() if isinstance(m, Composite))

    def _member_port(self, port: object) -> MemberPort:
        if isinstance(port, PortHandle):
            owner: Block | Composite = port.block
        elif isinstance(port, CompositePort):
            owner = port.composite
        else:
            hint = "; name one of its ports, e.g. member['out']" if isinstance(port, (Block, Composite)) else ""
            raise NotAPortError(f"expected a port of a member of composite '{self._name}' such as member['out'] "
                                f"(got {port!r}){hint}", subject=self._name)
        name = self._names.get(owner)
        if name is None:
            raise ForeignBlockError(f"{owner.name} is not a member of composite '{self._name}'; add it first: "
                                    f"{self._name}.add({owner.name})", subject=self._name)
        ref = MemberPort(name, port.name)
        self._spec(ref)  # UnknownPortError naming the ports
        return ref

    def _spec(self, ref: MemberPort) -> PortSpec:
        m = self._members[ref.member]
        if isinstance(m, Block):
            return m.description.port(ref.port)
        if ref.port not in m._ports:
            m.describe().port(ref.port)
        return m._spec(m._ports[ref.port].inner)

    def _resolve(self, ref: MemberPort) -> tuple[tuple[str, ...], str]:
        """(member path, port) of the block port a member port stands for."""
        m = self._members[ref.member]
        if isinstance(m, Block):
            return (ref.member,), ref.port
        path, port = m._resolve(m._ports[ref.port].inner)
        return (ref.member, *path), port

    def _param_leaves(self, t: MemberParameter) -> list[tuple[tuple[str, ...], str]]:
        m = self._members[t.member]
        if isinstance(m, Block):
            return [((t.member,), t.name)]
        return [((t.member, *path), p) for u in m._params[t.name].targets for path, p in m._param_leaves(u)]

    def _first_target(self, name: str) -> Parameter:
        t = self._params[name].targets[0]
        m = self._members[t.member]
        return m.params[t.name] if isinstance(m, Block) else m._first_target(t.name)

    def _signature(self) -> tuple:
        """Changes when a member changed in a way the flat index must see (a nested composite's members or
        connections, a template block's description)."""
        return tuple((n, id(m._desc)) if isinstance(m, Block) else (n, m._signature())
                     for n, m in self._members.items()) + (len(self._connections),)

    def _remember(self, index: PipelineIndex, ids: dict[tuple[str, ...], int]) -> None:
        self._flat = (self._signature(), index, ids)

    def _index(self) -> tuple[PipelineIndex, dict[tuple[str, ...], int]]:
        """Every block inside (by member path) and every connection, resolved: what connect checks against.
        Rebuilt only when a nested composite or a template block changed since."""
        if self._flat is None or self._flat[0] != self._signature():
            index, ids = flat_index(self.describe())
            self._remember(index, ids)
        assert self._flat is not None
        return self._flat[1], self._flat[2]


def flat_index(desc: CompositeDescription) -> tuple[PipelineIndex, dict[tuple[str, ...], int]]:
    """A PipelineIndex of every block inside ``desc`` (named by path, ids from 1) with every connection,
    each checked as ``engine.connect`` would; returns it with path -> id. Raises ValidationError (the
    planner's messages, naming the composite) when they do not fit together."""
    index = PipelineIndex()
    ids: dict[tuple[str, ...], int] = {}
    try:
        for path, m in desc.leaves():
            ids[path] = len(ids) + 1
            assert isinstance(m.desc, BlockDescription)
            index.add_block(ids[path], attrs.evolve(m.desc, name="/".join(path)))
        for (sp, s), (dp, d), c in desc.flat_connections():
            index.add_connection(Connection(PortRef(ids[sp], s), PortRef(ids[dp], d), c.delay))
    except ValidationError as e:
        raise ValidationError(f"composite '{desc.name}': {e}", subject=desc.name, problems=e.problems) from None
    return index, ids


# -- instances in an engine ------------------------------------------------------------------------------
class CompositeParameter:
    """A parameter of a composite instance: setting ``value`` sets every inner parameter it stands for
    (each a hot, Parameters-tier update; the values of one frame are applied together). ``bind`` takes
    values from an Observable, like a block parameter's."""

    __slots__ = ("_instance", "name", "dtype", "_targets")

    def __init__(self, instance: CompositeInstance, exposed: ExposedParameter):
        self._instance = instance
        self.name = exposed.name
        self.dtype = exposed.dtype
        self._targets: tuple[Parameter, ...] | None = None

    @property
    def targets(self) -> tuple[Parameter, ...]:
        """The block parameters this one sets (resolved through nested instances)."""
        ts = self._targets
        if ts is None:
            ts = self._targets = self._instance._param_targets(self.name)
        return ts

    @property
    def value(self):
        """The value of the first inner parameter (all hold it once this one was set)."""
        return self.targets[0].value

    @value.setter
    def value(self, v) -> None:
        ts = self.targets
        v = ts[0]._check(v)  # one type for all: a value the first takes, every one takes
        for t in ts[1:]:
            t._check(v)  # a count checks its own buffers (BoundsError): refused by one, set on none
        for t in ts:
            t.value = v

    def bind(self, source):
        """Take values from an Observable, on whatever thread it emits; returns a disposable. A bad value is
        reported as a diagnostic and the binding stays alive; removing the instance ends it."""
        from ..streams._bind import bind_parameter

        def setter(v) -> None:
            self.value = v

        def failed(err: Exception) -> None:
            side = side_of(self._instance._engine)
            if side is not None:
                side.binding_failed(f"{self._instance.name}.{self.name}", err, self.value, None)

        d = bind_parameter(source, setter, failed)
        self._instance._subscriptions.add(d)
        return d

    def __repr__(self) -> str:
        return f"<parameter {self._instance.name}.{self.name}: {self.dtype} = {self.value!r}>"


class CompositeInstance:
    """A composite added to an engine: its blocks are in the engine, named by path (``"smooth_2/blur"``).

    ``instance["x"]`` is the inner block's port handle (for ``engine.connect``, ``bind``, ``write``,
    ``read``, ``observe``); ``instance.params["gain"]`` sets every inner parameter it stands for;
    ``members`` maps member names to blocks and nested instances; ``blocks`` lists every block inside.
    """

    def __init__(self, name: str, description: CompositeDescription, members: dict[str, Block | CompositeInstance]):
        self.name = name
        self.description = description
        self._members = members
        self._parent: CompositeInstance | None = None
        self._engine: Any = None
        self._subscriptions = CompositeDisposable()  # composite parameter bindings, disposed on removal
        self._params = {p.name: CompositeParameter(self, p) for p in description.parameters}
        for m in members.values():
            if isinstance(m, CompositeInstance):
                m._parent = self

    @property
    def members(self) -> Mapping[str, Block | CompositeInstance]:
        """Member name -> its block or nested instance (read-only)."""
        return types.MappingProxyType(self._members)

    @property
    def blocks(self) -> tuple[Block, ...]:
        """Every block inside, nested ones included, depth first in member order."""
        out: list[Block] = []
        for m in self._members.values():
            out += m.blocks if isinstance(m, CompositeInstance) else [m]
        return tuple(out)

    @property
    def params(self) -> Mapping[str, CompositeParameter]:
        return _Lookup(self._params, f"composite instance '{self.name}'")

    @property
    def root(self) -> CompositeInstance:
        """The outermost instance this one is part of (itself when it is not nested)."""
        return self if self._parent is None else self._parent.root

    @property
    def state(self) -> str:
        """'removed' once out of the engine; else the worst state of the blocks inside."""
        if self._engine is None:
            return "removed"
        states = {b.state for b in self.blocks}
        return next((s for s in _STATES if s in states), "ok")

    def __getitem__(self, port: str) -> PortHandle:
        """The inner block's handle of the exposed port ``port``; UnknownPortError names the exposed ports."""
        ref = self.description.port(port).inner
        m = self._members[ref.member]
        return m[ref.port]

    @property
    def ports(self) -> dict[str, PortHandle]:
        """Exposed port name -> the inner block's port handle."""
        return {p.name: self[p.name] for p in self.description.ports}

    def set(self, **values) -> None:
        """Set several exposed parameters: ``instance.set(gain=0.5)``."""
        for name, v in values.items():
            self.params[name].value = v

    def _param_targets(self, name: str) -> tuple[Parameter, ...]:
        out: list[Parameter] = []
        for t in self.description.parameter(name).targets:
            m = self._members[t.member]
            out += m.params[t.name].targets if isinstance(m, CompositeInstance) else [m.params[t.name]]
        return tuple(out)

    def _walk(self) -> Iterator[CompositeInstance]:
        yield self
        for m in self._members.values():
            if isinstance(m, CompositeInstance):
                yield from m._walk()

    def __repr__(self) -> str:
        return f"<CompositeInstance {self.name} ({len(self.blocks)} blocks) {self.state}>"

    def __str__(self) -> str:
        return "\n".join(self._lines(""))

    def _lines(self, indent: str) -> list[str]:
        d = self.description
        of = f" (of {d.name})" if self.name.rsplit("/", 1)[-1] != d.name else ""
        out = [f"{indent}composite {self.name}{of}: {self.state}"]
        inner = indent + "  "
        for m in self._members.values():
            if isinstance(m, CompositeInstance):
                out += m._lines(inner)
            else:
                out.append(f"{inner}block {m.name}: {m.state}" + (f" — {m.message}" if m.message else ""))
        out += [f"{inner}{x}" for x in d.connections]
        for p in d.ports:
            out.append(f"{inner}{'input' if p.direction == 'in' else 'output'} {p.name}: {self[p.name]!r}")
        for q in self._params.values():
            out.append(f"{inner}parameter {q.name}: {q.dtype} = {q.value!r}")
        return out


def instantiate(name: str, desc: CompositeDescription) -> CompositeInstance:
    """Fresh blocks for every member of ``desc``, named ``name/member/...``, with the members' values and
    launches, then each exposed parameter's starting value (outer composites' last, so theirs win)."""
    members: dict[str, Block | CompositeInstance] = {}
    for m in desc.members:
        full = f"{name}/{m.name}"
        if isinstance(m.desc, CompositeDescription):
            members[m.name] = instantiate(full, m.desc)
            continue
        block = Block(attrs.evolve(m.desc, name=full))
        for n, v in m.values.items():
            block.params[n].value = v  # checked; no engine yet, so no event
        block._launches = dict(m.launches)
        members[m.name] = block
    inst = CompositeInstance(name, desc, members)
    for q in desc.parameters:
        if q.value is not None:
            inst.params[q.name].value = q.value
    return inst
