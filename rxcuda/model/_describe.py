"""Descriptions: immutable, pure data. What a kernel takes, what a block declares, what a pipeline is.

Nothing here imports CUDA. The planner turns a :class:`PipelineDescription` into a graph plan; the CUDA
layer builds that plan. Equality is structural, so "did the structure change?" is a comparison.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from collections.abc import Mapping
from operator import attrgetter
from typing import Literal, NamedTuple

import attrs

from . import _dtypes, _shapes
from ._errors import UnknownPortError

ParamKind = Literal["pointer", "scalar"]
Direction = Literal["in", "out", "inout", "counter"]
CodeFormat = Literal["ptx", "cubin", "fatbin"]
DIRECTIONS: tuple[str, ...] = ("in", "out", "inout", "counter")


@attrs.frozen
class KernelParam:
    """One parameter of a kernel entry point, as the kernel sees it.

    ``dtype`` is the element type for a pointer and the value type for a scalar; it is ``None`` when only
    the PTX signature is known and nothing says what a pointer points to. ``default`` for a scalar is a
    number or the string ``"size"`` (the block's element count).
    """

    name: str
    kind: ParamKind
    size: int
    dtype: str | None = None
    direction: Direction = "in"
    default: float | int | str | None = None
    align: int = 0
    # a scalar's declared range and control step (sidecar keys 'min', 'max', 'step'); None: not declared
    min: float | int | None = None
    max: float | int | None = None
    step: float | int | None = None
    # the pointer parameters a count scalar counts (sidecar key 'counts', RX_COUNTS(...) in CUDA C++): the kernel
    # touches those buffers only below the scalar's value, so the value may not exceed their element counts
    counts: tuple[str, ...] = ()

    @property
    def is_pointer(self) -> bool:
        return self.kind == "pointer"

    def describe(self) -> str:
        if self.is_pointer:
            return f"{self.dtype or 'void'}* {self.name} ({self.direction})"
        return f"{self.dtype or f'{self.size}-byte'} {self.name}"


@attrs.frozen
class KernelSignature:
    """The ordered parameters of an entry point."""

    entry: str
    params: tuple[KernelParam, ...] = ()

    def layout(self) -> tuple[tuple[int, int], ...]:
        """(size, kind) per parameter: what must match for an in-place function swap."""
        return tuple((p.size, 0 if p.is_pointer else 1) for p in self.params)

    def same_layout(self, other: KernelSignature) -> bool:
        return self.layout() == other.layout()


@attrs.frozen
class Launch:
    """Launch geometry of one kernel: grid and block dimensions and dynamic shared memory."""

    grid: tuple[int, int, int] = attrs.field(converter=lambda v: _dim3(v, "grid"))
    block: tuple[int, int, int] = attrs.field(default=(256, 1, 1), converter=lambda v: _dim3(v, "block"))
    shared_mem: int = 0

    def __attrs_post_init__(self):
        if math.prod(self.block) > 1024:
            raise ValueError(f"'block' has {math.prod(self.block)} threads; a CUDA block holds at most 1024")
        if not isinstance(self.shared_mem, int) or self.shared_mem < 0:
            raise ValueError(f"'shared_mem' must be a non-negative int (got {self.shared_mem!r})")

    @classmethod
    def for_threads(cls, threads: int, block: int = 256, shared_mem: int = 0) -> Launch:
        """Enough blocks of ``block`` threads to cover ``threads`` (1-D)."""
        if not isinstance(threads, int) or isinstance(threads, bool) or threads <= 0:
            raise ValueError(f"'threads' must be a positive int (got {threads!r})")
        check_block_size(block, "block")
        return cls(grid=(-(-threads // block),), block=(block,), shared_mem=shared_mem)

    @property
    def threads(self) -> int:
        return math.prod(self.grid) * math.prod(self.block)


def check_block_size(value, name: str = "block_size") -> int:
    """``value`` if it is a valid number of threads per block (an int from 1 to 1024); else a ValueError
    naming the argument ``name`` as the caller spelled it."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1024:
        raise ValueError(f"'{name}' must be an int from 1 to 1024 threads per block (got {value!r})")
    return value


def _dim3(value, what: str) -> tuple[int, int, int]:
    if isinstance(value, int):
        value = (value,)
    value = tuple(value)
    if not 1 <= len(value) <= 3:
        raise ValueError(f"'{what}' must have 1 to 3 dimensions (got {value!r})")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"'{what}' must hold positive ints (got {value!r})")
    return value + (1,) * (3 - len(value))


@attrs.frozen
class KernelCode:
    """Loadable code for one entry point: a PTX/cubin/fatbin image plus its signature.

    ``key`` identifies the content (image and entry) for the module cache; ``origin`` names where it came
    from (a path, or a label for generated code) for messages. ``items_per_thread`` > 1 (composed
    elementwise kernels) means a launch for n elements needs only ceil(n / items_per_thread) threads.
    """

    entry: str
    image: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    format: CodeFormat
    signature: KernelSignature
    origin: str = "<memory>"
    block_size: int = 256
    shared_mem: int = 0
    key: str = attrs.field(default="")
    items_per_thread: int = 1  # elements each thread handles: launch ceil(n / items_per_thread) threads

    def __attrs_post_init__(self):
        if self.format not in ("ptx", "cubin", "fatbin"):
            raise ValueError(f"'format' must be 'ptx', 'cubin' or 'fatbin' (got {self.format!r})")
        if not self.key:
            digest = hashlib.sha256(self.image + b"\0" + self.entry.encode()).hexdigest()
            object.__setattr__(self, "key", digest)


@attrs.frozen
class CaptureArgs:
    """What a library call's ``record`` function gets while the engine captures it.

    ``stream``: the capturing stream as an int (CUstream handle value); issue every call on it.
    ``pointers``: device pointer (int) per pointer parameter name, and per device scalar name.
    ``values``: current value per host scalar parameter name.
    ``state``: what the call's ``setup`` returned (handles, plans, workspaces), created once per engine.
    """

    stream: int
    pointers: Mapping[str, int]
    values: Mapping[str, float | int]
    state: object = None


@attrs.frozen(eq=False)
class CallSpec:
    """A chain of library calls inside a block, captured into one child-graph node.

    ``params`` declare its buffers (pointers with dtype and direction) and scalars, like a kernel
    signature, so ports and connections work the same. ``key`` is its structural identity (operation,
    shapes, dtypes): when it changes, the graph is rebuilt. ``device_scalars`` name scalars that live in
    device memory (cuBLAS alpha/beta in device pointer mode): changing one is a small copy, no recapture;
    changing any other scalar recaptures. ``setup(device_ordinal)`` runs once per engine before any
    capture and returns the state handed to ``record`` (handles, plans, workspaces); ``teardown(state)``
    releases it when the engine closes.
    """

    name: str
    params: tuple[KernelParam, ...]
    record: object  # Callable[[CaptureArgs], None]
    key: tuple = ()
    device_scalars: tuple[str, ...] = ()
    setup: object = None  # Callable[[int], object] | None
    teardown: object = None  # Callable[[object], None] | None

    def index(self, name: str) -> int:
        for i, p in enumerate(self.params):
            if p.name == name:
                return i
        names = ", ".join(p.name for p in self.params) or "none"
        raise KeyError(f"call '{self.name}' has no parameter '{name}' (it has: {names})")


@attrs.frozen
class Pin:
    """A parameter of a kernel inside a block: (kernel name, parameter index)."""

    kernel: str
    param: int


@attrs.frozen
class PortSpec:
    """A buffer port of a block. ``count`` is the element count; ``pins`` the kernel parameters it feeds.

    An append port (``counter`` set) carries a u32 counter that the graph zeroes every frame before the
    kernels that append run; ``count`` is then the capacity. Several kernels may append to one port: then
    ``pins`` holds each one's data pointer and ``counter`` a tuple of their counter pointers, in the same
    order (``counter_pins`` is always a tuple). An append port of direction ``"in"`` is an in/out append port:
    its kernels continue the append buffer connected to it (no reset), or fill their own when none is.
    """

    name: str
    direction: Literal["in", "out"]
    dtype: str | None
    count: int
    pins: tuple[Pin, ...]
    required: bool = True
    counter: Pin | tuple[Pin, ...] | None = None
    # The port's N-D shape (default ``(count,)``; its product is ``count``), its strides in elements (None:
    # C-contiguous) and the rule that derives its shape from the block's other ports when the pipeline resizes
    # (rxcuda.model._shapes: Follow, Like, Reduce, Broadcast; None: fixed). Keyword-only, so subclasses keep
    # their positional fields.
    shape: tuple[int, ...] = attrs.field(default=(), kw_only=True)
    strides: tuple[int, ...] | None = attrs.field(default=None, kw_only=True)
    rule: object = attrs.field(default=None, kw_only=True)
    #: elements the buffer spans (``count`` unless ``strides`` leave gaps)
    extent: int = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self):
        if not self.shape:
            shape: tuple[int, ...] = (self.count,)
        else:
            shape = _shapes.check_shape(self.shape, f"{self.name}: shape")
            if math.prod(shape) != self.count:
                raise ValueError(f"port '{self.name}': shape {shape} holds {math.prod(shape)} elements, but 'count' "
                                 f"is {self.count}")
        object.__setattr__(self, "shape", shape)
        strides = _shapes.check_strides(self.strides, shape, f"{self.name}: strides")
        object.__setattr__(self, "strides", strides)
        _shapes.check_rule(self.rule, self.direction, self.name)
        object.__setattr__(self, "extent", _shapes.extent(shape, strides))

    @property
    def counter_pins(self) -> tuple[Pin, ...]:
        """The counter parameters of an append port (one per appending kernel); () for any other port."""
        c = self.counter
        return () if c is None else (c,) if isinstance(c, Pin) else c


#: ``"items.count"`` names the counter of append port ``items`` as a port of its own (see :class:`CountSpec`).
COUNT_SUFFIX = ".count"


@attrs.frozen
class CountSpec(PortSpec):
    """The counter of append port ``base`` seen as a port: a u32[1] output named ``base + ".count"``, which a
    block that takes the count on the device connects to (``engine.connect(emit["items"].count, draw["n"])``).
    ``BlockDescription.port`` makes one on demand; it is never among ``BlockDescription.ports``."""

    base: str = ""


@attrs.frozen
class ScalarSpec:
    """A scalar parameter of a block, feeding one or more kernel parameters."""

    name: str
    dtype: str
    default: float | int
    pins: tuple[Pin, ...]
    # derived from a shape: (port, None) takes the port's element count, (port, axis) the length of one axis,
    # whenever the planner resolves that port to a shape other than the declared one (a resize)
    size_of: tuple[str, int | None] | None = None
    # the declared range (None: unbounded on that side) and a step for controls such as the live view's
    # slider; min and max are enforced on every set, step only guides controls
    min: float | int | None = None
    max: float | int | None = None
    step: float | int | None = None
    # the ports and internal buffers this count parameter counts (declared or inferred, see
    # rxcuda.model._bounds): a value above the smallest one's element count, or below 0, is refused
    counts: tuple[str, ...] = ()


@attrs.frozen
class InternalBuffer:
    """A buffer between kernels of one block (an internal connection)."""

    name: str
    dtype: str | None
    count: int
    writer: Pin
    readers: tuple[Pin, ...]
    like: str | None = None  # a port whose resolved element count this buffer takes when the pipeline resizes


@attrs.frozen
class KernelSpec:
    """A kernel inside a block: its name there, its code, and its launch geometry."""

    name: str
    code: KernelCode
    launch: Launch
    grid_of: str | None = None  # a port whose resolved shape gives the grid when the pipeline resizes


Step = KernelSpec | CallSpec


def check_range(where: str, dtype: str | None, lo=None, hi=None, step=None, default=None):
    """Check a scalar parameter's declared range and control step; returns ``(min, max, step)`` as numbers
    of the parameter's kind (ints for integer types). Each may be None (not declared). Raises ValueError
    naming ``where`` when one is not a finite number, an integer type gets a fraction, ``min > max``,
    ``step <= 0``, or a numeric ``default`` lies outside ``[min, max]``.

    >>> check_range("mul.scale", "f32", 0, 10, 0.1, 1.0)
    (0.0, 10.0, 0.1)
    >>> check_range("mul.scale", "f32", 5, 1)
    Traceback (most recent call last):
    ...
    ValueError: mul.scale: 'min' 5.0 is above 'max' 1.0; give min <= max
    """
    is_int = dtype is not None and not _dtypes.is_float(dtype)
    out = []
    for key, v in (("min", lo), ("max", hi), ("step", step)):
        if v is None:
            out.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"{where}: '{key}' must be a finite number or None (got {v!r})")
        if is_int:
            if isinstance(v, float) and not v.is_integer():
                raise ValueError(f"{where}: '{key}' {v!r} is not an integer, but the parameter is {dtype}")
            v = int(v)
        else:
            v = float(v)
        out.append(v)
    lo, hi, step = out
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{where}: 'min' {lo!r} is above 'max' {hi!r}; give min <= max")
    if step is not None and step <= 0:
        raise ValueError(f"{where}: 'step' must be above 0 (got {step!r})")
    if isinstance(default, int | float) and not isinstance(default, bool) and (
            (lo is not None and default < lo) or (hi is not None and default > hi)):
        raise ValueError(f"{where}: the default {default!r} lies outside [{lo}, {hi}]; change the default or "
                         f"the range")
    return lo, hi, step


def step_params(step: Step) -> tuple[KernelParam, ...]:
    """The parameters of a kernel or a library call."""
    return step.code.signature.params if isinstance(step, KernelSpec) else step.params


@attrs.frozen
class BlockDescription:
    """Everything the engine needs to build a block's nodes. Steps (kernels and library calls) run in
    declaration order; ``kernels`` holds both kinds."""

    name: str
    kernels: tuple[Step, ...] = ()
    ports: tuple[PortSpec, ...] = ()
    scalars: tuple[ScalarSpec, ...] = ()
    internals: tuple[InternalBuffer, ...] = ()

    def port(self, name: str) -> PortSpec:
        """The port called ``name``; raises UnknownPortError (a ValidationError and a KeyError) naming the
        block's ports."""
        for p in self.ports:
            if p.name == name:
                return p
        if isinstance(name, str) and name.endswith(COUNT_SUFFIX):  # "items.count": an append port's counter
            base = name[: -len(COUNT_SUFFIX)]
            for p in self.ports:
                if p.name == base and p.counter is not None:
                    return CountSpec(name, "out", "u32", 1, (), True, None, base)
        names = [p.name for p in self.ports]
        msg = f"block '{self.name}' has no port '{name}' (ports: {', '.join(names) or 'none'})"
        close = difflib.get_close_matches(name, names, n=1) if isinstance(name, str) else []
        if close:
            msg += f"; did you mean '{close[0]}'?"
        raise UnknownPortError(msg, subject=self.name)

    def kernel(self, name: str) -> Step:
        for k in self.kernels:
            if k.name == name:
                return k
        names = ", ".join(k.name for k in self.kernels) or "none"
        raise KeyError(f"block '{self.name}' has no kernel '{name}' (kernels: {names})")


class PortRef(NamedTuple):
    """A port of a block in a pipeline (a named tuple: a dict key everywhere in the planner and the engine,
    hashed and compared in C)."""

    block: int
    port: str


def _check_delay(_self, _attribute, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value not in (0, 1):
        raise ValueError(f"'delay' must be 0 (the input reads this frame's value) or 1 (it reads the value the "
                         f"output had at the end of the previous frame), got {value!r}; for a longer delay chain "
                         "blocks that pass the value on, each through a delay=1 connection")


@attrs.frozen(repr=False)
class Connection:
    """An edge from an output port to an input port.

    ``delay=1`` makes it a delayed connection: the input reads the value the output had at the end of the
    previous frame (feedback across frames), so it orders no blocks and may close a cycle. Frame 0 reads
    ``initial``: None for zeros, else the previous-frame buffer's first contents (an array of the port's dtype
    and element count; ``engine.connect`` makes one from a scalar or a list). ``initial`` takes no part in
    equality: two connections are equal when their ports and delay are.

    >>> Connection(PortRef(1, "out"), PortRef(2, "x"), delay=1).delay
    1
    """

    src: PortRef
    dst: PortRef
    delay: int = attrs.field(default=0, validator=_check_delay)
    initial: object = attrs.field(default=None, eq=False)

    def __repr__(self) -> str:  # a plain connection prints as before delays existed
        delay = f", delay={self.delay}" if self.delay else ""
        initial = ", initial=<given>" if self.initial is not None else ""
        return f"Connection(src={self.src!r}, dst={self.dst!r}{delay}{initial})"


@attrs.frozen
class ExternalBinding:
    """A user array bound to a port: its dtype and element count, for validation."""

    dtype: str
    count: int


_new_object, _set = object.__new__, object.__setattr__  # (BlockEntry.of)
_ID = attrgetter("id")


@attrs.frozen
class BlockEntry:
    """A block in a pipeline with its current kernels, launches and scalar values."""

    id: int
    desc: BlockDescription
    values: Mapping[str, float | int] = attrs.field(factory=dict, converter=lambda m: dict(m))
    launches: Mapping[str, Launch] = attrs.field(factory=dict, converter=lambda m: dict(m))

    @classmethod
    def of(cls, id: int, desc: BlockDescription, values: dict, launches: dict) -> BlockEntry:
        """``BlockEntry(id, desc, values, launches)`` for two dicts made for it alone (a snapshot's): kept as
        they are instead of copied by the converters (1000 blocks: ~0.5 ms less per snapshot)."""
        entry = _new_object(cls)
        _set(entry, "id", id)
        _set(entry, "desc", desc)
        _set(entry, "values", values)
        _set(entry, "launches", launches)
        return entry

    def label(self) -> str:
        return self.desc.name

    def value(self, name: str):
        if name in self.values:
            return self.values[name]
        for s in self.desc.scalars:
            if s.name == name:
                return s.default
        raise KeyError(name)

    def launch(self, kernel: str) -> Launch:
        return self.launches.get(kernel) or self.desc.kernel(kernel).launch


@attrs.frozen
class PipelineDescription:
    """A whole pipeline: blocks in insertion order, connections, which ports hold user arrays (bindings),
    and which inputs the user fills from the host (``fed``: they get an engine-owned buffer)."""

    blocks: tuple[BlockEntry, ...] = ()
    connections: tuple[Connection, ...] = ()
    bindings: Mapping[PortRef, ExternalBinding] = attrs.field(factory=dict, converter=lambda m: dict(m))
    fed: frozenset[PortRef] = frozenset()
    # regions (rxcuda.model._regions.RegionSpec): which blocks run inside a conditional node, by region id
    regions: tuple = ()
    # ports the user reads, observes, writes, binds or feeds (the engine adds them): memory reuse never gives
    # their buffers to another buffer, so what is read there is the port's own value
    kept: frozenset[PortRef] = frozenset()
    # inputs the user resized (engine.resize, engine.write(..., resize=True)): port -> shape; what flows from
    # there downstream is resolved by the planner (rxcuda.plan._shapes)
    shapes: Mapping[PortRef, tuple[int, ...]] = attrs.field(factory=dict, converter=lambda m: dict(m))
    # several devices (Engine(devices=[...])): block id -> the position of its device in the engine's device
    # list; a block not named here runs on the first (position 0). rxcuda.plan._placement checks and splits it
    placement: Mapping[int, int] = attrs.field(factory=dict, converter=lambda m: dict(m))
    # id -> entry, built once: lookups by id stay O(1) however large the pipeline (the first entry wins
    # where a hand-built description repeats an id; the planner refuses that)
    _by_id: Mapping[int, BlockEntry] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self):
        # (made in C: the entries in reverse, so that the first of a repeated id is the one kept)
        backwards = self.blocks[::-1]
        object.__setattr__(self, "_by_id", dict(zip(map(_ID, backwards), backwards, strict=True)))

    def block(self, block_id: int) -> BlockEntry:
        """The entry of the block with this id; KeyError when there is none."""
        try:
            return self._by_id[block_id]
        except KeyError:
            raise KeyError(f"no block with id {block_id}") from None


def check_dtype(value: str | None) -> str | None:
    """Canonical dtype name, or None for 'any'."""
    return None if value is None else _dtypes.dtype_name(value)
