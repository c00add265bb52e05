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
    COUNT_SUFFIX,
    BlockDescription,
    CallSpec,
    CountSpec,
    KernelCode,
    KernelSpec,
    Launch,
    PortRef,
    PortSpec,
    check_block_size,
)
from ..model._errors import ForeignBlockError, NotAPortError, ValidationError
from ..model._events import Tier
from ._append import AppendState

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

    # -- append ports ----------------------------------------------------------------------------------------
    @property
    def count(self) -> PortHandle:
        """The counter of this append port as a port of its own: a u32[1] output (``"<port>.count"``).

        Connect it to an input of one u32 element, and a kernel reads the count on the device (launch it over
        the capacity and guard ``i < *n``); ``engine.observe`` it for the raw count as Python ints, read back
        each frame without a sync; ``engine.read`` it for the count now.

        >>> emit = Block.from_kernel("kernels/append_above.ptx", size=1024)
        >>> emit["out"].count
        <port append_above.out.count>
        """
        spec = self.spec
        if spec.counter is None:
            raise ValidationError(f"{self.block.name}.{self.name} is not an append port, so it has no count; only "
                                  "ports declared with a counter (BlockBuilder.output(..., counter=...)) have one",
                                  subject=self.block.name)
        return PortHandle(self.block, self.name + COUNT_SUFFIX)

    @property
    def append_state(self) -> AppendState:
        """What the engine last read of this append port's counter (raw count, frame, capacity, peak,
        ``overflowed``). The engine reads it when someone observes the count or the data, or calls
        ``engine.count`` / ``engine.read``; nothing is read back otherwise."""
        spec = self.spec
        base = spec.base if isinstance(spec, CountSpec) else self.name
        if spec.counter is None and not isinstance(spec, CountSpec):
            raise ValidationError(f"{self.block.name}.{self.name} is not an append port; only append ports have a "
                                  "count and an overflow state", subject=self.block.name)
        return self.block._append_state(base)

    @property
    def overflowed(self) -> bool:
        """True while the last count read back exceeded the capacity (items were dropped in that frame)."""
        return self.append_state.overflowed

    @property
    def last_count(self) -> int | None:
        """The raw count last read back (may exceed the capacity), or None before any was read."""
        return self.append_state.last_count

    def __repr__(self) -> str:
        return f"<port {self.block.name}.{self.name}>"

    def __str__(self) -> str:
        """Type, shape, bytes, pool class, and whose memory the port's buffer is (read from the running plan)."""
        from ._tooltips import port_text

        return port_text(self)


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
        if _dtypes.vector_layout(dtype) or _dtypes.struct_type(dtype):  # a float4 or a struct passed by value
            raise TypeError(f"{where()}: a {_dtypes.describe(dtype)} passed by value is not a block parameter; pass "
                            "its components as separate scalar parameters, or the value through a pointer port")
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


def _in_range(param: Parameter, check, lo, hi):
    """``check`` followed by the parameter's declared range ``[lo, hi]`` (either may be None)."""
    def check_range(v):
        v = check(v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ValueError(f"{param._block.name}.{param.name} ({param.dtype}) must be within [{lo}, {hi}], its "
                             f"declared range (got {v!r})")
        return v

    return check_range


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
    that breaks the rule raises TypeError or ValueError and the parameter keeps its old value. A parameter
    declared with ``min``/``max`` (``Block.from_kernel(..., ranges=...)``, ``BlockBuilder.scalar``, a sidecar)
    refuses values outside them with ValueError; ``step`` only guides controls.

    >>> block = Block.from_kernel("kernels/scalar_mul.ptx", size=1024)
    >>> block.params["scale"].value = 0.5     # or block.set(scale=0.5)
    >>> block.params["scale"].value = "2.5"
    Traceback (most recent call last):
    ...
    TypeError: scalar_mul.scale (f32) takes a number: a Python or NumPy int or float (got '2.5', a str)
    """

    __slots__ = ("name", "dtype", "_value", "_block", "_check", "min", "max", "step")

    def __init__(self, block: Block, name: str, dtype: str, value, min=None, max=None, step=None):
        self.name = name
        self.dtype = dtype
        self._block = block
        self.min, self.max, self.step = min, max, step  # the declared range (None: unbounded) and control step
        check = _value_check(self, dtype)
        self._check = check if min is None and max is None else _in_range(self, check, min, max)
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

        >>> from reactivex.subject import Subject
        >>> knob = Subject()
        >>> block = Block.from_kernel("kernels/scalar_mul.ptx", size=1024)
        >>> sub = block.params["scale"].bind(knob)
        >>> knob.on_next(64); block.params["scale"].value
        64.0
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
    (<port vector_add.out>, 1048576)
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
        self.state = "not built"  # "ok", "warning", "error", "removed"
        self.message = ""
        self._warnings: dict[str, str] = {}  # what keeps the block in "warning" (source -> message)
        self._appends: dict[str, AppendState] = {}  # append port -> what the engine last read of its counter
        self.params = Parameters({s.name: Parameter(self, s.name, s.dtype, s.default, s.min, s.max, s.step)
                                  for s in description.scalars})

    @classmethod
    def from_kernel(cls, source, *, size: int | None = None, name: str | None = None, threads: int | None = None,
                    block_size: int | tuple | None = None, counts: Mapping[str, int] | None = None,
                    shape=None, ranges: Mapping[str, tuple] | None = None, **defaults) -> Block:
        """A one-kernel block: pointer parameters become ports, scalars become parameters.

        ``source`` is a KernelCode or a kernel file path. ``size`` is the element count of every port and
        the default thread count; ``counts`` gives some ports another element count (``counts={"n": 1}`` for
        an input that takes an append port's device count). Scalars whose default is "size" get ``size``;
        keyword arguments set other defaults (``scale=3.0``). A pointer followed by a counter parameter is an
        append port: an output, or, when the pointer is 'inout', an in/out append port (see
        ``BlockBuilder.append_to``).

        ``shape`` instead of ``size`` gives every port an N-D shape, e.g. ``shape=(480, 640)``; with a 2-D
        ``block_size`` such as ``(16, 16)`` the grid is 2-D, x over the last axis. The first input follows
        whatever feeds it and the other ports are like it: a resize upstream flows through the block (its
        "size" scalars and its grid follow).

        ``ranges`` bounds scalars: name -> ``(min, max)`` or ``(min, max, step)`` (None for an open side); a
        set outside the range raises ValueError, and the live view's slider spans it. It overrides the
        sidecar's ``min``/``max``/``step``.

        >>> mul = Block.from_kernel("kernels/scalar_mul.ptx", size=16, scale=1.0, ranges={"scale": (0, 10, 0.1)})
        >>> mul.params["scale"].max, mul.params["scale"].step
        (10.0, 0.1)
        """
        if block_size is not None and not isinstance(block_size, tuple):
            check_block_size(block_size, "block_size")
        if size is None and shape is None:
            raise TypeError("Block.from_kernel needs 'size' (the element count of its ports) or 'shape'")
        from ._builder import BlockBuilder, append_pairs

        code = _load_code(source)
        b = BlockBuilder(name or code.entry, size=size, shape=shape)
        k = b.add_kernel(code, threads=threads, block=block_size)
        counters = {p.name for p in code.signature.params if p.direction == "counter"}
        appends = append_pairs(code)
        counts = dict(counts or {})
        ranges = dict(ranges or {})
        for key, r in ranges.items():
            if not isinstance(r, tuple | list) or len(r) not in (2, 3):
                raise TypeError(f"{b.name}: ranges['{key}'] must be (min, max) or (min, max, step) (got {r!r})")
        for i, p in enumerate(code.signature.params):
            if p.is_pointer:
                if p.name in counters:
                    continue
                n = counts.pop(p.name, None)
                if p.direction == "in":
                    b.input(p.name, k[i], count=n)
                elif p.name in appends and p.direction == "inout":  # continues an upstream append buffer
                    b.append_to(p.name, k[i], counter=k[appends[p.name]], count=n)
                elif p.name in appends:
                    b.output(p.name, k[i], counter=k[appends[p.name]], count=n)
                else:  # out, and inout: state the block owns, which others may read
                    b.output(p.name, k[i], count=n)
            else:
                lo, hi, step = (*ranges.pop(p.name, (None, None)), None)[:3]
                b.scalar(p.name, k[i], default=defaults.pop(p.name, None), min=lo, max=hi, step=step)
        if defaults or ranges:
            raise TypeError(f"{b.name}: unknown parameter(s) {', '.join({**defaults, **ranges})}; the kernel's "
                            "scalars are "
                            f"{', '.join(p.name for p in code.signature.params if not p.is_pointer) or 'none'}")
        if counts:
            ports = [p.name for p in code.signature.params if p.is_pointer and p.name not in counters]
            raise TypeError(f"{b.name}: 'counts' names {', '.join(counts)}, which are not ports; the kernel's "
                            f"ports are {', '.join(ports) or 'none'}")
        return b.build()

    @classmethod
    def from_cuda(cls, source, entry: str | None = None, *, size: int | None = None, shape=None,
                  name: str | None = None, threads: int | None = None, block_size: int | tuple | None = None,
                  defines=None, options=None, counts: Mapping[str, int] | None = None,
                  ranges: Mapping[str, tuple] | None = None, **defaults) -> Block:
        """A one-kernel block from CUDA C++: source text or a ``.cu`` path, compiled with NVRTC (cached; see
        ``rxcuda.compile_cuda`` for ``defines`` and ``options``), then as :meth:`from_kernel`. Pointers to CUDA
        vector types (``float4*``) and to structs the source declares are ports of those element types.

        >>> src = ('extern "C" __global__ void drift(const float4* pos, const float4* vel, float4* out, '
        ...        'float dt, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) { '
        ...        'float4 p = pos[i], v = vel[i]; out[i] = make_float4(p.x + dt * v.x, p.y + dt * v.y, '
        ...        'p.z + dt * v.z, p.w); } }')
        >>> drift = Block.from_cuda(src, size=1000, dt=0.01)
        >>> drift["pos"].spec.dtype, drift["out"].spec.shape
        ('float4', (1000,))
        """
        from ..sources._nvrtc import compile_cuda

        bs = block_size if isinstance(block_size, int) else None
        code = compile_cuda(source, entry, defines=defines, options=options, block_size=bs)
        return cls.from_kernel(code, size=size, shape=shape, name=name, threads=threads, block_size=block_size,
                               counts=counts, ranges=ranges, **defaults)

    @classmethod
    def from_call(cls, spec: CallSpec, *, name: str | None = None, **defaults) -> Block:
        """A one-call block from a library call (see ``rxcuda.libraries``): its input buffers become input
        ports, written buffers output ports, scalars parameters (``alpha=2.0`` sets a default).

        >>> from rxcuda import libraries as lib
        >>> mm = Block.from_call(lib.gemm(256, 256, 256), alpha=1.0)
        >>> [p.name for p in mm.inputs], mm.params["alpha"].value
        (['a', 'b'], 1.0)
        """
        from ._builder import BlockBuilder

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
        return {n: p._value for n, p in self.params._p.items()}  # the mapping ABC's items() is slow

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

    def set_code(self, kernel: str | None, code) -> Tier:
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
        return Tier.CODE if same else Tier.STRUCTURE

    def reload(self) -> list[Tier]:
        """Re-read (or recompile) every file kernel of this block; returns the tiers of those that changed.
        The same path as a saved file under ``engine.watch()`` (``reload_kernel``), raising where a watcher
        reports."""
        changed = []
        for k in self._desc.kernels:
            if isinstance(k, KernelSpec) and os.path.isfile(k.code.origin):
                tier = self.reload_kernel(k.name)
                if tier is not None:
                    changed.append(tier)
        return changed

    def reload_kernel(self, kernel: str | None = None) -> Tier | None:
        """Load kernel ``kernel``'s file (and sidecar) again and give it the code (:meth:`set_code`) when it
        changed; None when it did not. Load and compile errors propagate, and the old code stays.

        >>> Block.from_kernel("kernels/vector_add.ptx", size=8).reload_kernel() is None  # unchanged
        True
        """
        from ..sources._load import load_source

        spec = self._desc.kernel(self._kernel_name(kernel))
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"{self.name}.{spec.name} is a library call, not a kernel: it has no file to reload")
        code = load_source(spec.code.origin, entry=spec.code.entry)
        if code.key == spec.code.key and code.signature == spec.code.signature:
            return None
        return self.set_code(spec.name, code)

    def _append_state(self, port: str) -> AppendState:
        state = self._appends.get(port)
        if state is None:
            state = self._appends[port] = AppendState(self._desc.port(port).count)
        return state

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
            kind = ("in/out append " if p.direction == "in" else "append ") if p.counter else ""
            direction = "" if kind.startswith("in/out") else f"{p.direction:>3} "
            state = self._appends.get(p.name) if p.counter else None
            counted = f" — {state.describe()}" if state is not None and state.last_count is not None else ""
            extent = p.count if len(p.shape) == 1 else ", ".join(map(str, p.shape))  # [480, 640] for 2-D
            lines.append(f"  {direction}{kind}port {p.name}: {p.dtype or 'any'}[{extent}]{counted}")
        for n, prm in self.params.items():
            lines.append(f"  parameter {n}: {prm.dtype} = {prm.value!r}")
        lines.extend(self._profile_lines())
        return "\n".join(lines)

    def _profile_lines(self) -> list[str]:
        """What the engine's profiling last measured of this block (nothing is read from the GPU here)."""
        engine = self._engine
        if engine is None:
            return []
        out = []
        last = engine._profiler.last
        if last is not None and last.blocks is not None and self.name in last.blocks:
            out.append(f"  last GPU time: {last.blocks[self.name].gpu_us:.2f} us (frame {last.frame}, "
                       f"profile {engine.profile})")
            if last.kernels is not None:
                for k in self._desc.kernels:
                    label = f"{self.name}/{k.name}"
                    if label in last.kernels:
                        out.append(f"    {label}: {last.kernels[label].gpu_us:.2f} us")
        for (bid, kernel), occ in engine._rt.occupancy.items():
            if bid == self.id:
                out.append(f"  occupancy of {kernel}: {occ:.0%} (theoretical)")
        return out


def _as_tuple(v):
    return (v,) if isinstance(v, int) else tuple(v)
