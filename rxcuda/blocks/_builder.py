"""Declaring blocks: kernels and library calls, their ports, parameters and internal connections.

``DescriptionBuilder`` checks each declaration as it is made (a parameter nothing feeds, a port on a scalar, a
type that disagrees with the kernel) and ``describe()`` returns the immutable BlockDescription. It knows
nothing of ``Block``: the public ``BlockBuilder`` (``rxcuda.blocks._blocks``) is this builder plus ``build()``,
which wraps the description in a Block, so the two modules do not import each other.
"""

from __future__ import annotations

import itertools
import math

import attrs

from ..model import _bounds, _dtypes
from ..model._describe import (
    BlockDescription,
    CallSpec,
    InternalBuffer,
    KernelCode,
    KernelParam,
    KernelSpec,
    Launch,
    Pin,
    PortSpec,
    ScalarSpec,
    check_block_size,
    check_dtype,
    check_range,
    step_params,
)
from ..model._errors import BoundsError, ValidationError
from ._builder_shapes import Shaping, builder_shape


def _load_code(source) -> KernelCode:
    from ..sources._load import load_source

    return load_source(source)


def _as_tuple(v):
    return (v,) if isinstance(v, int) else tuple(v)


def append_pairs(code: KernelCode) -> dict[str, int]:
    """data pointer name -> counter parameter index, for kernels with a counter parameter.

    The data pointer is the output (or inout) pointer declared last before the counter (the sidecar's
    'append' names the pair explicitly; the loader folds that into directions). An 'inout' data pointer
    makes an in/out append port (``BlockBuilder.append_to``): the kernel continues an upstream append buffer."""
    pairs = {}
    params = code.signature.params
    for i, p in enumerate(params):
        if p.direction == "counter":
            for j in range(i - 1, -1, -1):
                if params[j].is_pointer and params[j].direction in ("out", "inout"):
                    pairs[params[j].name] = i
                    break
    return pairs


@attrs.frozen
class KernelHandle:
    """A kernel or call added to a builder; index it by parameter name or position to get a Pin."""

    name: str
    params: tuple[KernelParam, ...]

    def __getitem__(self, key: str | int) -> Pin:
        if isinstance(key, int):
            if not 0 <= key < len(self.params):
                raise IndexError(f"'{self.name}' has {len(self.params)} parameters (got index {key})")
            return Pin(self.name, key)
        for i, p in enumerate(self.params):
            if p.name == key:
                return Pin(self.name, i)
        raise KeyError(f"'{self.name}' has no parameter '{key}' "
                       f"(it has: {', '.join(p.name for p in self.params) or 'none'})")


class DescriptionBuilder:
    """Declare a block's kernels, ports, parameters and internal connections; ``describe()`` checks that every
    kernel parameter is fed and returns the BlockDescription. Use :class:`rxcuda.BlockBuilder`, whose
    ``build()`` returns the Block.

    >>> b = DescriptionBuilder("doubled", size=1024)
    >>> mul = b.add_kernel("scalar_mul")
    >>> b.input("x", mul["x"]); b.output("out", mul["out"])
    >>> b.scalar("scale", mul["scale"], default=2.0); b.scalar("n", mul["n"])
    >>> desc = b.describe()
    >>> [p.name for p in desc.ports], desc.scalars[0].default
    (['x', 'out'], 2.0)
    """

    def __init__(self, name: str, *, size: int | None = None, shape=None):
        if not name or not isinstance(name, str):
            raise ValueError(f"'name' must be a non-empty str (got {name!r})")
        # ``shape`` (an N-D size): ports without a count or shape of their own get it (see _builder_shapes)
        self.size, self.shape = builder_shape(size, shape)
        self.name = name
        self._shaping = Shaping(name, self.shape)
        self._steps: list = []
        self._ports: list[PortSpec] = []
        self._scalars: list[ScalarSpec] = []
        self._internals: list[InternalBuffer] = []
        self._used: dict[Pin, str] = {}

    # -- steps ---------------------------------------------------------------------------------------
    def add_kernel(self, source, *, name: str | None = None, threads: int | None = None, grid=None,
                   block: int | tuple | None = None, shared_mem: int | None = None,
                   over: str | None = None) -> KernelHandle:
        """Add a kernel (KernelCode or file path). Launch: ``grid`` x ``block``, or enough blocks to cover
        ``threads``, or (the default) enough to cover a shape: the builder's, or that of the port named
        ``over`` (a reduction runs over its output, say). Over a shape the grid follows a resize; a 1-D block
        makes a 1-D grid over the elements, a 2-D block (``block=(16, 16)``) a 2-D grid, x over the last
        axis. Block size and shared memory default to the sidecar's."""
        if isinstance(block, int):  # a tuple is checked by Launch
            check_block_size(block, "block")
        code = _load_code(source)
        name = self._unique(name or code.entry)
        bs = block if block is not None else code.block_size
        sm = shared_mem if shared_mem is not None else code.shared_mem
        derived = None
        if grid is None and threads is None and (over is not None or self.shape is not None):
            derived = self._shaping.launch(name, over, bs, sm, code.items_per_thread)
        if derived is not None:
            launch = derived
        elif grid is not None:
            launch = Launch(grid=grid, block=bs, shared_mem=sm)
        else:
            n = threads if threads is not None else self.size
            if n is None:
                raise ValueError(f"{self.name}: give 'threads' or 'grid' for kernel '{name}', or a builder size")
            if threads is None:  # a size counts elements; a kernel may handle several per thread
                n = -(-n // code.items_per_thread)
            launch = Launch.for_threads(n, block=math.prod(_as_tuple(bs)), shared_mem=sm)
        self._steps.append(KernelSpec(name, code, launch))
        return KernelHandle(name, code.signature.params)

    def add_call(self, spec: CallSpec, *, name: str | None = None) -> KernelHandle:
        """Add a captured library call (see rxcuda.libraries)."""
        if not isinstance(spec, CallSpec):
            raise TypeError(f"add_call takes a CallSpec (got {type(spec).__name__})")
        name = self._unique(name or spec.name)
        spec = attrs.evolve(spec, name=name)
        self._steps.append(spec)
        return KernelHandle(name, spec.params)

    def _unique(self, name: str) -> str:
        taken = {s.name for s in self._steps}
        if name not in taken:
            return name
        for i in itertools.count(2):
            if f"{name}_{i}" not in taken:
                return f"{name}_{i}"
        raise AssertionError

    # -- ports and parameters --------------------------------------------------------------------------
    def input(self, name: str, pins, *, dtype=None, count: int | None = None, required: bool = True,
              shape=None, strides=None, rule=None) -> None:
        """Declare an input port feeding one or more pointer parameters.

        ``shape`` (a tuple; default ``(count,)`` or the builder's shape) with optional ``strides`` (in
        elements), and ``rule``: ``Follow()`` takes whatever shape feeds it, ``Like("other input")`` must
        agree with that input; without a rule a port with its own count or shape is fixed."""
        self._port(name, "in", pins, dtype, count, required, None, shape=shape, strides=strides, rule=rule)

    def output(self, name: str, pin, *, dtype=None, count: int | None = None, counter=None, shape=None,
               strides=None) -> None:
        """Declare an output port. With ``counter`` (a u32* parameter) it is an append output: the counter
        is zeroed every frame before the kernel runs, and ``count`` is the capacity.

        ``shape``: a tuple, or a rule deriving it from the block's ports, resolved again whenever the
        pipeline resizes: ``Like("x")``, ``Reduce("x", axis=1)``, ``Broadcast("a", "b")``.

        Several kernels may append to one output: give their data pointers and their counters as two lists
        in the same order. They share one buffer and one counter, zeroed once per frame before the first.

        >>> b = BlockBuilder("hits", size=4096)                                          # doctest: +SKIP
        >>> lo, hi = b.add_kernel(below, name="lo"), b.add_kernel(above, name="hi")      # doctest: +SKIP
        >>> b.output("hits", [lo["out"], hi["out"]], counter=[lo["count"], hi["count"]], count=1024)  # doctest: +SKIP
        """
        self._port(name, "out", pin, dtype, count, True, counter, shape=shape, strides=strides)

    def append_to(self, name: str, pins, *, counter, dtype=None, count: int | None = None) -> None:
        """Declare an in/out append port: this block's kernels append to the buffer connected here from an
        upstream append port, continuing its counter (no reset in between), or, when nothing is connected,
        to a buffer and counter of their own (zeroed every frame). Downstream blocks connect *from* this port
        (or its ``.count``) to see every block's items; ``count`` is the capacity, equal to the upstream one.

        >>> b = BlockBuilder("more", size=4096)                                          # doctest: +SKIP
        >>> k = b.add_kernel(append_more)                                                # doctest: +SKIP
        >>> b.append_to("items", k["out"], counter=k["count"], count=1024)               # doctest: +SKIP
        >>> engine.connect(first["items"], more["items"])                                # doctest: +SKIP
        >>> engine.connect(more["items"], draw["items"])                                 # doctest: +SKIP
        """
        self._port(name, "in", pins, dtype, count, False, counter)

    def _port(self, name, direction, pins, dtype, count, required, counter, *, shape=None, strides=None,
              rule=None) -> None:
        self._check_name(name)
        pins = _pins(pins)
        counters = _pins(counter) if counter is not None else ()
        if counter is not None and len(counters) != len(pins):
            raise ValueError(f"{self.name}: append port '{name}' has {len(pins)} data parameter(s) and "
                             f"{len(counters)} counter(s); give one counter per appending kernel, in the same "
                             "order as the data parameters")
        if direction == "out" and len(pins) != 1 and counter is None:
            raise ValueError(f"{self.name}: output '{name}' must come from exactly one kernel parameter "
                             "(several kernels may fill one output only as an append output: give counter=[...])")
        inferred = None
        for pin in pins:
            prm = self._param(pin)
            if not prm.is_pointer:
                raise ValidationError(f"{self.name}: port '{name}' maps to '{prm.name}' of '{pin.kernel}', which "
                                      f"is a scalar; declare it with scalar() instead", subject=self.name)
            if direction == "in" and prm.direction == "out" and counter is None:
                raise ValidationError(f"{self.name}: input '{name}' maps to '{prm.name}' of '{pin.kernel}', "
                                      "which the kernel writes (direction 'out'); declare an output",
                                      subject=self.name)
            if prm.dtype and inferred and prm.dtype != inferred:
                raise ValidationError(f"{self.name}: port '{name}' feeds parameters of different types "
                                      f"({inferred}, {prm.dtype})", subject=self.name)
            inferred = inferred or prm.dtype
            self._check_free(pin)
        dtype = check_dtype(dtype) or inferred
        if inferred and dtype != inferred:
            raise ValidationError(f"{self.name}: port '{name}' is declared {dtype} but the kernel parameter is "
                                  f"{inferred}", subject=self.name)
        count, shaped = self._shaping.declare(name, direction, count, shape, strides, rule, self._call_count(pins[0]))
        count = count if count is not None else (self._call_count(pins[0]) or self.size)
        if not isinstance(count, int) or count <= 0:
            raise ValueError(f"{self.name}: port '{name}' needs a positive element 'count' (or a builder size)")
        for pin, cpin in zip(pins, counters, strict=False):  # () for a port without a counter
            cp = self._param(cpin)
            if not cp.is_pointer or (cp.dtype not in (None, "u32", "i32")):
                raise ValidationError(f"{self.name}: the counter of append output '{name}' must be a u32* "
                                      f"parameter (got {cp.describe()})", subject=self.name)
            if cpin.kernel != pin.kernel:
                raise ValidationError(f"{self.name}: append port '{name}' pairs data parameter "
                                      f"'{self._param(pin).name}' of '{pin.kernel}' with counter '{cp.name}' of "
                                      f"'{cpin.kernel}'; each kernel's counter goes with its own data pointer, in "
                                      "the same order", subject=self.name)
            self._check_free(cpin)
        # claim only once every check passed: a refused declaration leaves the builder as it was
        for pin in pins:
            self._claim(pin, name)
        for cpin in counters:
            self._claim(cpin, f"{name} counter")
        stored = None if not counters else counters[0] if len(counters) == 1 else counters
        self._ports.append(PortSpec(name, direction, dtype, count, pins, required, stored, **shaped))

    def scalar(self, name: str, pins, *, default=None, dtype=None, size_of=None, min=None, max=None,
               step=None, counts=None) -> None:
        """Declare a scalar parameter feeding one or more scalar kernel parameters.

        ``min`` and ``max`` bound its value (a set outside them raises ValueError); ``step`` is the
        granularity a control such as the live view's slider offers. Without them, the kernel's sidecar's
        ``min``/``max``/``step`` apply: ``b.scalar("scale", k["scale"], min=0.0, max=10.0, step=0.1)``.

        ``size_of`` derives its value from a port's shape, again whenever the pipeline resizes: a port name
        (its element count) or ``(port, axis)`` (the length of one axis): ``b.scalar("cols", k["cols"],
        size_of=("x", 1))``. A scalar that defaults to ``"size"`` takes the builder's element count, and
        follows the block's first input when that resizes.

        ``counts`` names the ports (or internal buffers) an integer scalar is the element count of: a value
        above the smallest one's element count, or below 0, is refused with BoundsError wherever it is set
        (``counts=["a", "out"]``). Without it, the kernels' own declarations apply (a sidecar's ``"counts"``,
        ``RX_COUNTS(...)``), else a scalar named like a count whose default equals some of its kernel's buffers'
        element counts counts those (see ``rxcuda.model._bounds``)."""
        self._check_name(name)
        pins = _pins(pins)
        if counts is not None:
            counts = (counts,) if isinstance(counts, str) else tuple(counts)
            if not counts or not all(isinstance(c, str) for c in counts):
                raise ValueError(f"{self.name}: 'counts' of parameter '{name}' names ports, e.g. counts=['a', 'out'] "
                                 f"(got {counts!r})")
        params = [self._param(p) for p in pins]
        for pin, prm in zip(pins, params, strict=True):
            if prm.is_pointer:
                raise ValidationError(f"{self.name}: parameter '{name}' maps to '{prm.name}' of '{pin.kernel}', "
                                      "which is a pointer; declare a port instead", subject=self.name)
            self._check_free(pin)
        dtype = check_dtype(dtype) or params[0].dtype
        if dtype is None:
            raise ValidationError(f"{self.name}: the type of parameter '{name}' is unknown (no sidecar); "
                                  "pass dtype=", subject=self.name)
        if default is None:
            default = params[0].default
        if size_of is not None:
            port, axis = (size_of, None) if isinstance(size_of, str) else tuple(size_of)
            if not isinstance(port, str) or not (axis is None or isinstance(axis, int)):
                raise ValueError(f"{self.name}: 'size_of' of parameter '{name}' is a port name or (port, axis) "
                                 f"(got {size_of!r})")
            self._shaping.size_scalars[name] = (port, axis)
            default = 0  # build() computes it from the port's shape
        elif default == "size":
            self._shaping.size_scalars[name] = (None, None)
            if self.size is None:
                raise ValueError(f"{self.name}: parameter '{name}' defaults to the block size; give the builder "
                                 "a size")
            default = self.size
        if default is None:
            default = 0
        declared = (params[0].min, params[0].max, params[0].step)
        lo, hi, step = (d if v is None else v for v, d in zip((min, max, step), declared, strict=True))
        lo, hi, step = check_range(f"{self.name}.{name}", dtype, lo, hi, step, default)
        if counts is not None and _dtypes.is_float(dtype):
            raise ValidationError(f"{self.name}: parameter '{name}' is {dtype}; only an integer parameter can count "
                                  "elements (counts=...)", subject=self.name)
        for pin in pins:
            self._claim(pin, name)
        self._scalars.append(ScalarSpec(name, dtype, default, pins, min=lo, max=hi, step=step,
                                        counts=tuple(dict.fromkeys(counts or ()))))

    def connect(self, src: Pin, dst, *, count: int | None = None, name: str | None = None) -> None:
        """Connect a kernel's output parameter to later kernels' inputs through an internal buffer."""
        dsts = _pins(dst)
        sp = self._param(src)
        order = [s.name for s in self._steps]
        for d in dsts:
            dp = self._param(d)
            if not (sp.is_pointer and dp.is_pointer):
                raise ValidationError(f"{self.name}: internal connections join pointer parameters "
                                      f"({sp.describe()} -> {dp.describe()})", subject=self.name)
            if sp.dtype and dp.dtype and sp.dtype != dp.dtype:
                raise ValidationError(f"{self.name}: cannot connect {src.kernel}.{sp.name} ({sp.dtype}) to "
                                      f"{d.kernel}.{dp.name} ({dp.dtype})", subject=self.name)
            if order.index(d.kernel) <= order.index(src.kernel):
                raise ValidationError(f"{self.name}: {d.kernel} runs before or with {src.kernel}; internal "
                                      "connections go from an earlier kernel to a later one", subject=self.name)
        if count is None and self.size is not None:
            self._shaping.sized_internals.add(name or f"{src.kernel}.{sp.name}")  # follows a resize
        count = count if count is not None else self.size
        if count is None:
            raise ValueError(f"{self.name}: give the internal buffer a 'count' (or the builder a size)")
        name = name or f"{src.kernel}.{sp.name}"
        for pin in (src, *dsts):
            self._check_free(pin)
        self._claim(src, name)
        for d in dsts:
            self._claim(d, name)
        self._internals.append(InternalBuffer(name, sp.dtype or self._param(dsts[0]).dtype, count, src, dsts))

    def describe(self) -> BlockDescription:
        """Check that every parameter is fed and return the block's description."""
        if not self._steps:
            raise ValidationError(f"{self.name}: a block needs at least one kernel or call", subject=self.name)
        for s in self._steps:
            for i, prm in enumerate(step_params(s)):
                if Pin(s.name, i) not in self._used and (prm.is_pointer or prm.default is None):
                    what = "port or internal connection" if prm.is_pointer else "scalar parameter"
                    raise ValidationError(f"{self.name}: parameter {i} ('{prm.name}') of '{s.name}' is not fed; "
                                          f"declare a {what} for it", subject=self.name)
        ports, scalars, internals, steps = self._shaping.finish(self._ports, self._scalars, self._internals,
                                                                self._steps)
        scalars = _tie_counts(self.name, ports, scalars, internals, steps)
        return BlockDescription(self.name, tuple(steps), tuple(ports), tuple(scalars), tuple(internals))

    # -- helpers ---------------------------------------------------------------------------------------
    def _call_count(self, pin: Pin) -> int | None:
        """Element count a library call declares for one of its buffers (LibraryCall.counts)."""
        for st in self._steps:
            if st.name == pin.kernel and isinstance(st, CallSpec):
                counts = getattr(st, "counts", None) or {}
                return counts.get(step_params(st)[pin.param].name)
        return None

    def _param(self, pin: Pin) -> KernelParam:
        if not isinstance(pin, Pin):
            raise TypeError(f"expected a kernel parameter such as kernel['name'] (got {pin!r})")
        for s in self._steps:
            if s.name == pin.kernel:
                return step_params(s)[pin.param]
        raise KeyError(f"{self.name}: no kernel '{pin.kernel}' in this builder")

    def _check_free(self, pin: Pin) -> None:
        if pin in self._used:
            raise ValidationError(f"{self.name}: parameter {pin.param} of '{pin.kernel}' is already used by "
                                  f"'{self._used[pin]}'", subject=self.name)

    def _claim(self, pin: Pin, what: str) -> None:
        self._check_free(pin)
        self._used[pin] = what

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"port and parameter names must be non-empty str (got {name!r})")
        taken = {p.name for p in self._ports} | {s.name for s in self._scalars}
        if name in taken:
            raise ValidationError(f"{self.name}: '{name}' is declared twice", subject=self.name)


def _tie_counts(block: str, ports, scalars, internals, steps) -> list[ScalarSpec]:
    """Each scalar with the ports and internal buffers it counts (``ScalarSpec.counts``): declared on the block
    (checked here), else declared by its kernels or inferred (``rxcuda.model._bounds.tie``)."""
    params = {st.name: step_params(st) for st in steps}
    buffers: dict[tuple[str, str], tuple[str, int]] = {}
    appends = []
    for p in ports:
        for pin in p.pins:
            key = (pin.kernel, params[pin.kernel][pin.param].name)
            buffers[key] = (p.name, p.count)
            if p.counter is not None:
                appends.append(key)
    for ib in internals:
        for pin in (ib.writer, *ib.readers):
            buffers[pin.kernel, params[pin.kernel][pin.param].name] = (ib.name, ib.count)
    declared = {(st, prm.name): prm.counts for st, ps in params.items() for prm in ps if prm.counts}
    names = [p.name for p in ports] + [ib.name for ib in internals]
    out = []
    for s in scalars:
        if s.counts:
            for c in s.counts:
                if c not in names:
                    raise ValidationError(f"{block}: parameter '{s.name}' counts '{c}', which is not a port or "
                                          f"internal buffer of the block ({', '.join(names) or 'none'})",
                                          subject=block)
        else:
            pins = [(pin.kernel, params[pin.kernel][pin.param].name) for pin in s.pins]
            tied = _bounds.tie(s.name, s.dtype, s.default, pins, declared, buffers, appends)
            if tied:
                s = attrs.evolve(s, counts=tied)
        sizes = {p.name: p.count for p in ports} | {ib.name: ib.count for ib in internals}
        inputs = [p.name for p in ports if p.direction == "in" and p.counter is None]
        found = _bounds.count_problem(block, s.name, s.default, {c: sizes[c] for c in s.counts}, inputs)
        if found is not None:
            raise BoundsError(f"{found[0]} (this is its default: give the block '{s.name}' a value that fits, "
                              f"e.g. {s.name}={found[2]})", block=block, parameter=s.name, port=found[1],
                              capacity=found[2], value=s.default)
        out.append(s)
    return out


def _pins(pins) -> tuple[Pin, ...]:
    if isinstance(pins, Pin):
        return (pins,)
    pins = tuple(pins)
    if not pins:
        raise ValueError("give at least one kernel parameter")
    if len(set(pins)) != len(pins):
        raise ValueError(f"a kernel parameter is listed twice ({pins!r})")
    return pins
