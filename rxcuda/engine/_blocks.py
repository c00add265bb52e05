"""Blocks: passive descriptions with ports and parameters, declared through a builder.

A block never touches the GPU. Setting a parameter records the value and tells the engine the block
belongs to (an O(1) fold into its pending plan); the engine applies it before the next frame.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np

from ..model import _dtypes
from ..model._describe import (
    BlockDescription,
    CallSpec,
    InternalBuffer,
    KernelCode,
    KernelParam,
    KernelSpec,
    Launch,
    Pin,
    PortRef,
    PortSpec,
    ScalarSpec,
    check_block_size,
    check_dtype,
    step_params,
)
from ..model._errors import ForeignBlockError, NotAPortError, ValidationError

_ids = itertools.count(1)


def _load_code(source) -> KernelCode:
    from ..sources._load import load_source

    return load_source(source)


@attrs.frozen
class PortHandle:
    """A port of a block, as used in ``engine.connect`` / ``engine.bind`` / ``engine.read``."""

    block: Block
    name: str

    @property
    def spec(self) -> PortSpec:
        return self.block.description.port(self.name)

    def __repr__(self) -> str:
        return f"<port {self.block.name}.{self.name}>"


# Largest finite value of each float type a parameter may hold (bf16 travels as 16-bit words).
_FLOAT_MAX = {"f16": 65504.0, "f32": float(np.finfo(np.float32).max), "f64": sys.float_info.max,
              "bf16": 3.3895313892515355e38}


def _value_check(param: Parameter, dtype: str):
    """The function that checks and converts a value for a parameter of ``dtype``, built once per parameter
    so the setter (the hottest call a user makes) pays one call and, for the usual Python number, two
    comparisons. The rule, for every type:

    - integer types take Python and NumPy integers within their range (not bool, float or str);
    - float types take Python and NumPy ints and floats that are finite and within their range
      (f16 ±65504, f32 ±3.4028235e38, f64 finite; not bool or str).

    Anything else raises TypeError (the wrong kind of value) or ValueError (out of range), naming the
    parameter, its type and the value.
    """
    def where() -> str:  # read when raising: an engine may rename the block after the check was made
        return f"{param._block.name}.{param.name}"

    kind = "f" if dtype == "bf16" else _dtypes.to_numpy(dtype).kind
    if kind == "f":
        hi = _FLOAT_MAX[dtype]
        lo = -hi

        def check_float(v):
            if type(v) is float and lo <= v <= hi:  # NaN and inf fail the comparison
                return v
            if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)):
                try:
                    f = float(v)
                except OverflowError:  # an int beyond any float
                    f = math.inf
                if lo <= f <= hi:
                    return f
                raise ValueError(f"{where()} ({dtype}) takes a finite number within [{lo:.8g}, {hi:.8g}] "
                                 f"(got {v!r})")
            raise TypeError(f"{where()} ({dtype}) takes a number: a Python or NumPy int or float "
                            f"(got {v!r}, a {type(v).__name__})")

        return check_float
    if kind not in "iu":
        raise TypeError(f"{where()}: a parameter of type {dtype} is not supported; use an integer or float type")
    info = np.iinfo(_dtypes.to_numpy(dtype))
    ilo, ihi = int(info.min), int(info.max)

    def check_int(v):
        if type(v) is int and ilo <= v <= ihi:
            return v
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            i = int(v)
            if ilo <= i <= ihi:
                return i
            raise ValueError(f"{where()} ({dtype}) must be within [{ilo}, {ihi}] (got {i})")
        raise TypeError(f"{where()} ({dtype}) takes an integer: a Python or NumPy int "
                        f"(got {v!r}, a {type(v).__name__})")

    return check_int


def resolve_port(port, blocks: Mapping[int, Block]) -> PortRef:
    """The PortRef of ``port``, a port handle (``block["out"]``) of a block in ``blocks`` (id -> Block, an
    engine's registry). Every failure is a ValidationError that is also the builtin it refines:
    NotAPortError (a TypeError) for anything but a port, ForeignBlockError for a block not in ``blocks``,
    UnknownPortError (a KeyError) for a port name the block does not declare."""
    if not isinstance(port, PortHandle):
        hint = "; name one of its ports, e.g. block['out']" if isinstance(port, Block) else ""
        raise NotAPortError(f"expected a port such as block['out'] (got {port!r}){hint}")
    block = port.block
    if blocks.get(block.id) is not block:
        raise ForeignBlockError(f"{block.name} is not in this engine; engine.add(block) first", subject=block.name)
    block.description.port(port.name)  # UnknownPortError naming the ports
    return PortRef(block.id, port.name)


class Parameter:
    """A typed scalar of a block. Setting ``value`` schedules a hot update of the next frame.

    Integer types take Python and NumPy integers within their range (not bool, float or str); float types
    take Python and NumPy ints and floats that are finite and within their range (not bool or str). A value
    that breaks the rule raises TypeError or ValueError and the parameter keeps its old value.

    >>> block.params["scale"].value = 0.5     # or block.set(scale=0.5)
    """

    __slots__ = ("name", "dtype", "_value", "_block", "_check")

    def __init__(self, block: Block, name: str, dtype: str, value):
        self.name = name
        self.dtype = dtype
        self._block = block
        self._check = _value_check(self, dtype)
        self._value = self._check(value)

    @property
    def value(self):
        return self._value

    @value.setter
    def value(self, v) -> None:
        v = self._check(v)
        self._value = v
        sink = self._block._sink
        if sink is not None:
            sink.set_parameter(self._block.id, self.name, v)

    def bind(self, source):
        """Take values from an Observable, on whatever thread it emits; returns a disposable.

        Values are coalesced: the latest before a frame wins. A bad value is reported as a diagnostic
        (when the block is in an engine) and the binding stays alive; disposing ends it.

        >>> sub = block.params["gravity"].bind(midi_knob.pipe(ops.map(lambda v: v / 127 * 9.81)))
        >>> sub.dispose()
        """
        from ..streams._bind import bind_parameter

        def setter(v):
            self.value = v

        d = bind_parameter(source, setter, lambda e: self._block._binding_error(self.name, e))
        self._block._subscriptions.add(d)
        return d

    def __repr__(self) -> str:
        return f"<parameter {self._block.name}.{self.name}: {self.dtype} = {self._value!r}>"


class Parameters(Mapping[str, Parameter]):
    """Read-only mapping name -> Parameter."""

    def __init__(self, params: dict[str, Parameter]):
        self._p = params

    def __getitem__(self, name: str) -> Parameter:
        try:
            return self._p[name]
        except KeyError:
            raise KeyError(f"no parameter '{name}' (parameters: {', '.join(self._p) or 'none'})") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._p)

    def __len__(self) -> int:
        return len(self._p)


class Block:
    """A node of the pipeline: kernels and library calls with ports and parameters.

    Create one with :meth:`from_kernel` for a single kernel, or with :class:`BlockBuilder`.

    >>> add = Block.from_kernel("kernels/vector_add.ptx", size=1 << 20)
    >>> add["out"], add.params["n"].value
    """

    def __init__(self, description: BlockDescription):
        self.id = next(_ids)
        self._desc = description
        self._lock = threading.Lock()
        self._launches: dict[str, Launch] = {}
        self._sink: Any = None  # the engine's pending plan, set while the block is in an engine
        self._engine: Any = None
        from reactivex.disposable import CompositeDisposable

        self._subscriptions = CompositeDisposable()  # parameter bindings, disposed on removal
        self.state = "not built"
        self.message = ""
        self.params = Parameters({s.name: Parameter(self, s.name, s.dtype, s.default) for s in description.scalars})

    @classmethod
    def from_kernel(cls, source, *, size: int, name: str | None = None, threads: int | None = None,
                    block_size: int | None = None, **defaults) -> Block:
        """A one-kernel block: pointer parameters become ports, scalars become parameters.

        ``source`` is a KernelCode or a kernel file path. ``size`` is the element count of every port and
        the default thread count. Scalars whose default is "size" get ``size``; keyword arguments set
        other defaults (``scale=3.0``).
        """
        if block_size is not None:
            check_block_size(block_size, "block_size")
        code = _load_code(source)
        b = BlockBuilder(name or code.entry, size=size)
        k = b.add_kernel(code, threads=threads, block=block_size)
        counters = {p.name for p in code.signature.params if p.direction == "counter"}
        appends = _append_pairs(code)
        for i, p in enumerate(code.signature.params):
            if p.is_pointer:
                if p.name in counters:
                    continue
                if p.direction == "in":
                    b.input(p.name, k[i])
                elif p.name in appends:
                    b.output(p.name, k[i], counter=k[appends[p.name]])
                else:  # out, and inout: state the block owns, which others may read
                    b.output(p.name, k[i])
            else:
                b.scalar(p.name, k[i], default=defaults.pop(p.name, None))
        if defaults:
            raise TypeError(f"{b.name}: unknown parameter(s) {', '.join(defaults)}; the kernel's scalars are "
                            f"{', '.join(p.name for p in code.signature.params if not p.is_pointer) or 'none'}")
        return b.build()

    @classmethod
    def from_call(cls, spec: CallSpec, *, name: str | None = None, **defaults) -> Block:
        """A one-call block from a library call (see ``rxcuda.libraries``): its input buffers become input
        ports, written buffers output ports, scalars parameters (``alpha=2.0`` sets a default).

        >>> mm = Block.from_call(rxcuda.libraries.gemm(256, 256, 256), alpha=1.0)
        """
        b = BlockBuilder(name or spec.name)
        k = b.add_call(spec)
        for i, p in enumerate(spec.params):
            if p.is_pointer:
                b.input(p.name, k[i]) if p.direction == "in" else b.output(p.name, k[i])
            else:
                b.scalar(p.name, k[i], default=defaults.pop(p.name, None))
        if defaults:
            raise TypeError(f"{b.name}: unknown parameter(s) {', '.join(defaults)}; the call's scalars are "
                            f"{', '.join(p.name for p in spec.params if not p.is_pointer) or 'none'}")
        return b.build()

    # -- description ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._desc.name

    @property
    def description(self) -> BlockDescription:
        return self._desc

    @property
    def inputs(self) -> tuple[PortHandle, ...]:
        return tuple(PortHandle(self, p.name) for p in self._desc.ports if p.direction == "in")

    @property
    def outputs(self) -> tuple[PortHandle, ...]:
        return tuple(PortHandle(self, p.name) for p in self._desc.ports if p.direction == "out")

    def __getitem__(self, port: str) -> PortHandle:
        """The port called ``port``; UnknownPortError (a ValidationError and a KeyError) names the ports."""
        self._desc.port(port)
        return PortHandle(self, port)

    def launch(self, kernel: str | None = None) -> Launch:
        kernel = self._kernel_name(kernel)
        spec = self._desc.kernel(kernel)
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"{self.name}.{kernel} is a library call: it has no launch geometry")
        return self._launches.get(kernel) or spec.launch

    def values(self) -> dict[str, Any]:
        return {n: p.value for n, p in self.params.items()}

    def launches(self) -> dict[str, Launch]:
        return dict(self._launches)

    # -- changes ---------------------------------------------------------------------------------------
    def set(self, **values) -> None:
        """Set several parameters at once: ``block.set(scale=0.5, n=128)``."""
        for name, v in values.items():
            self.params[name].value = v

    def set_launch(self, kernel: str | None = None, *, threads: int | None = None, grid=None, block=None,
                   shared_mem: int | None = None) -> Launch:
        """Change a kernel's launch geometry (warm update, no rebuild). Returns the new Launch."""
        from ..model._events import LaunchChanged

        kernel = self._kernel_name(kernel)
        old = self.launch(kernel)
        bs = block if block is not None else old.block
        sm = shared_mem if shared_mem is not None else old.shared_mem
        if threads is not None:
            if grid is not None:
                raise ValueError("give 'threads' or 'grid', not both")
            new = Launch.for_threads(threads, block=math.prod(_as_tuple(bs)), shared_mem=sm)
        else:
            new = Launch(grid=grid if grid is not None else old.grid, block=bs, shared_mem=sm)
        self._launches[kernel] = new
        if self._sink is not None:
            self._sink.add(LaunchChanged(self.id, kernel, new))
        return new

    def set_code(self, kernel: str | None, code) -> str:
        """Give a kernel new code. Same parameter layout: swapped in place (Code tier); otherwise the block
        is rebuilt (Structure tier) — its ports must still fit. Returns the tier name."""
        from ..model._events import BlockChanged, CodeChanged

        kernel = self._kernel_name(kernel)
        code = _load_code(code)
        spec = self._desc.kernel(kernel)
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"{self.name}.{kernel} is a library call, not a kernel")
        same = spec.code.signature.same_layout(code.signature)
        new_spec = attrs.evolve(spec, code=code)
        self._desc = attrs.evolve(self._desc, kernels=tuple(new_spec if k.name == kernel else k
                                                            for k in self._desc.kernels))
        if self._sink is not None:
            if same:
                self._sink.add(CodeChanged(self.id, kernel, code))
            else:
                self._sink.add(BlockChanged(self.id, self.name, f"kernel '{kernel}' changed its signature"))
        return "code" if same else "structure"

    def reload(self) -> list[str]:
        """Re-read (or recompile) every file kernel of this block; returns the tiers of those that changed."""
        from ..sources._load import load_source

        changed = []
        for k in self._desc.kernels:
            if isinstance(k, KernelSpec) and os.path.isfile(k.code.origin):
                code = load_source(k.code.origin, entry=k.code.entry)
                if code.key != k.code.key:
                    changed.append(self.set_code(k.name, code))
        return changed

    def _binding_error(self, name: str, err: Exception) -> None:
        engine = self._engine
        if engine is not None:
            engine._warn(f"{self.name}.{name}", f"parameter binding: {err}", self)

    def dispose_bindings(self) -> None:
        """End every parameter binding of this block."""
        from reactivex.disposable import CompositeDisposable

        subs, self._subscriptions = self._subscriptions, CompositeDisposable()
        subs.dispose()

    def _kernel_name(self, kernel: str | None) -> str:
        if kernel is None:
            if len(self._desc.kernels) != 1:
                names = ", ".join(k.name for k in self._desc.kernels)
                raise ValueError(f"{self.name} has several kernels ({names}); name the one you mean")
            return self._desc.kernels[0].name
        self._desc.kernel(kernel)
        return kernel

    def __repr__(self) -> str:
        return f"<Block {self.name} #{self.id} {self.state}>"

    def __str__(self) -> str:
        lines = [f"block {self.name} (#{self.id}): {self.state}" + (f" — {self.message}" if self.message else "")]
        for k in self._desc.kernels:
            if isinstance(k, KernelSpec):
                la = self.launch(k.name)
                lines.append(f"  kernel {k.name}: {k.code.entry} from {k.code.origin}, grid {la.grid[0]}x"
                             f"{la.block[0]} ({la.threads} threads)")
            else:
                lines.append(f"  call {k.name}")
        for p in self._desc.ports:
            kind = "append " if p.counter else ""
            lines.append(f"  {p.direction:>3} {kind}port {p.name}: {p.dtype or 'any'}[{p.count}]")
        for n, prm in self.params.items():
            lines.append(f"  parameter {n}: {prm.dtype} = {prm.value!r}")
        return "\n".join(lines)


def _as_tuple(v):
    return (v,) if isinstance(v, int) else tuple(v)


def _append_pairs(code: KernelCode) -> dict[str, int]:
    """data pointer name -> counter parameter index, for kernels with a counter parameter.

    The data pointer is the output declared right before the counter (the sidecar's 'append' names the
    pair explicitly; the loader folds that into directions)."""
    pairs = {}
    params = code.signature.params
    for i, p in enumerate(params):
        if p.direction == "counter":
            for j in range(i - 1, -1, -1):
                if params[j].is_pointer and params[j].direction == "out":
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


class BlockBuilder:
    """Declare a block: kernels, ports, parameters and internal connections; then ``build()``.

    >>> b = BlockBuilder("scaled_sum", size=n)
    >>> add = b.add_kernel("kernels/vector_add.ptx")
    >>> mul = b.add_kernel("kernels/scalar_mul.ptx")
    >>> b.input("a", add["a"]); b.input("b", add["b"])
    >>> b.connect(add["out"], mul["x"])          # an internal buffer of n elements
    >>> b.output("out", mul["out"])
    >>> b.scalar("scale", mul["scale"], default=3.0)
    >>> b.scalar("n", [add["n"], mul["n"]])      # one parameter feeding two kernels
    >>> block = b.build()
    """

    def __init__(self, name: str, *, size: int | None = None):
        if not name or not isinstance(name, str):
            raise ValueError(f"'name' must be a non-empty str (got {name!r})")
        if size is not None and (not isinstance(size, int) or size <= 0):
            raise ValueError(f"'size' must be a positive int (got {size!r})")
        self.name = name
        self.size = size
        self._steps: list = []
        self._ports: list[PortSpec] = []
        self._scalars: list[ScalarSpec] = []
        self._internals: list[InternalBuffer] = []
        self._used: dict[Pin, str] = {}

    # -- steps ---------------------------------------------------------------------------------------
    def add_kernel(self, source, *, name: str | None = None, threads: int | None = None, grid=None,
                   block: int | tuple | None = None, shared_mem: int | None = None) -> KernelHandle:
        """Add a kernel (KernelCode or file path). Launch: ``grid`` x ``block``, or enough blocks to cover
        ``threads`` (default: the builder's size). Block size and shared memory default to the sidecar's."""
        if isinstance(block, int):  # a tuple is checked by Launch
            check_block_size(block, "block")
        code = _load_code(source)
        name = self._unique(name or code.entry)
        bs = block if block is not None else code.block_size
        sm = shared_mem if shared_mem is not None else code.shared_mem
        if grid is not None:
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
    def input(self, name: str, pins, *, dtype=None, count: int | None = None, required: bool = True) -> None:
        """Declare an input port feeding one or more pointer parameters."""
        self._port(name, "in", pins, dtype, count, required, None)

    def output(self, name: str, pin: Pin, *, dtype=None, count: int | None = None,
               counter: Pin | None = None) -> None:
        """Declare an output port. With ``counter`` (a u32* parameter) it is an append output: the counter
        is zeroed every frame before the kernel runs, and ``count`` is the capacity."""
        self._port(name, "out", pin, dtype, count, True, counter)

    def _port(self, name, direction, pins, dtype, count, required, counter) -> None:
        self._check_name(name)
        pins = _pins(pins)
        if direction == "out" and len(pins) != 1:
            raise ValueError(f"{self.name}: output '{name}' must come from exactly one kernel parameter")
        inferred = None
        for pin in pins:
            prm = self._param(pin)
            if not prm.is_pointer:
                raise ValidationError(f"{self.name}: port '{name}' maps to '{prm.name}' of '{pin.kernel}', which "
                                      f"is a scalar; declare it with scalar() instead", subject=self.name)
            if direction == "in" and prm.direction == "out":
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
        count = count if count is not None else (self._call_count(pins[0]) or self.size)
        if not isinstance(count, int) or count <= 0:
            raise ValueError(f"{self.name}: port '{name}' needs a positive element 'count' (or a builder size)")
        if counter is not None:
            cp = self._param(counter)
            if not cp.is_pointer or (cp.dtype not in (None, "u32", "i32")):
                raise ValidationError(f"{self.name}: the counter of append output '{name}' must be a u32* "
                                      f"parameter (got {cp.describe()})", subject=self.name)
            self._check_free(counter)
        # claim only once every check passed: a refused declaration leaves the builder as it was
        for pin in pins:
            self._claim(pin, name)
        if counter is not None:
            self._claim(counter, f"{name} counter")
        self._ports.append(PortSpec(name, direction, dtype, count, pins, required, counter))

    def scalar(self, name: str, pins, *, default=None, dtype=None) -> None:
        """Declare a scalar parameter feeding one or more scalar kernel parameters."""
        self._check_name(name)
        pins = _pins(pins)
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
        if default == "size":
            if self.size is None:
                raise ValueError(f"{self.name}: parameter '{name}' defaults to the block size; give the builder "
                                 "a size")
            default = self.size
        if default is None:
            default = 0
        for pin in pins:
            self._claim(pin, name)
        self._scalars.append(ScalarSpec(name, dtype, default, pins))

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

    def build(self) -> Block:
        """Check that every parameter is fed and return the Block."""
        if not self._steps:
            raise ValidationError(f"{self.name}: a block needs at least one kernel or call", subject=self.name)
        for s in self._steps:
            for i, prm in enumerate(step_params(s)):
                if Pin(s.name, i) not in self._used and (prm.is_pointer or prm.default is None):
                    what = "port or internal connection" if prm.is_pointer else "scalar parameter"
                    raise ValidationError(f"{self.name}: parameter {i} ('{prm.name}') of '{s.name}' is not fed; "
                                          f"declare a {what} for it", subject=self.name)
        desc = BlockDescription(self.name, tuple(self._steps), tuple(self._ports), tuple(self._scalars),
                                tuple(self._internals))
        return Block(desc)

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


def _pins(pins) -> tuple[Pin, ...]:
    if isinstance(pins, Pin):
        return (pins,)
    pins = tuple(pins)
    if not pins:
        raise ValueError("give at least one kernel parameter")
    if len(set(pins)) != len(pins):
        raise ValueError(f"a kernel parameter is listed twice ({pins!r})")
    return pins
