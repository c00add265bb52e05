"""Blocks: passive descriptions with ports and parameters, declared through a builder.

A block never touches the GPU. Setting a parameter records the value and tells the engine the block
belongs to (an O(1) fold into its pending plan); the engine applies it before the next frame.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import attrs
from reactivex.disposable import CompositeDisposable

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
from ._appendstate import AppendState
from ._builder import DescriptionBuilder, _as_tuple, _load_code, append_pairs
from ._engineside import side_of
from ._params import Parameter, Parameters

_ids = itertools.count(1)


def _missing_sidecar(code: KernelCode) -> str:
    """' (...)' when ``code`` is a kernel file whose sidecar, which names its parameters, is missing."""
    stem, suffix = os.path.splitext(code.origin or "")
    if suffix not in (".ptx", ".cubin", ".fatbin") or not os.path.isfile(code.origin) or os.path.isfile(stem + ".json"):
        return ""
    return f" (parameter names come from a sidecar, and {stem}.json is missing)"


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

        >>> emit = Block.from_kernel("append_above", size=1024)
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
        side = side_of(self.block._engine)
        return port_head(self) + " (not in an engine)" if side is None else side.port_text(self)


def port_head(port: PortHandle, shape: tuple[int, ...] | None = None) -> str:
    """The start of ``str(port)``: its type, ``shape`` (default: the declared one) and bytes.

    >>> port_head(Block.from_kernel("kernels/scalar_mul.ptx", size=1024)["out"])
    'scalar_mul.out: output f32[1024], 4 KiB'
    """
    spec = port.spec
    if shape is None:
        shape = getattr(spec, "shape", None) or (spec.count,)
    nbytes = (_dtypes.itemsize(spec.dtype) if spec.dtype else 1) * math.prod(shape)
    return (f"{port.block.name}.{port.name}: {spec.direction}put {spec.dtype or 'untyped'}"
            f"[{'x'.join(str(d) for d in shape)}], {_dtypes.format_bytes(nbytes)}")


# Largest finite value of each float type a parameter may hold (bf16 travels as 16-bit words).
def _port_hint(thing) -> str:
    """For a block or a composite instance given where a port belongs: the ports it has, by name."""
    ports = getattr(thing, "ports", None)  # Block and CompositeInstance both have ``ports``
    if isinstance(thing, Block):
        names = [p.name for p in thing.description.ports]
    elif isinstance(ports, Mapping) or callable(ports):
        names = list(ports() if callable(ports) else ports)
    else:
        return ""
    name = getattr(thing, "name", "block")
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    return f"; name one of its ports, e.g. {name}[{names[0]!r}] (ports: {shown})" if names else ""


def resolve_port(port, blocks: Mapping[int, Block]) -> PortRef:
    """The PortRef of ``port``, a port handle (``block["out"]``) of a block in ``blocks`` (id -> Block, an
    engine's registry). Every failure is a ValidationError that is also the builtin it refines:
    NotAPortError (a TypeError) for anything but a port, ForeignBlockError for a block not in ``blocks``,
    UnknownPortError (a KeyError) for a port name the block does not declare."""
    if not isinstance(port, PortHandle):
        raise NotAPortError(f"expected a port such as block['out'] (got {port!r}){_port_hint(port)}")
    block = port.block
    if blocks.get(block.id) is not block:
        raise ForeignBlockError(f"{block.name} is not in this engine; engine.add(block) first", subject=block.name)
    block.description.port(port.name)  # UnknownPortError naming the ports
    return PortRef(block.id, port.name)


_PLAIN = frozenset({int, float, str, bool, tuple})


class _Declared:
    """Descriptions ``Block.from_kernel`` made, by the KernelCode object and the other arguments (the name
    aside): declaring many blocks of one kernel builds its description once (blocks are passive and their
    descriptions immutable, so they may share one). Holds the ``limit`` most recently used."""

    def __init__(self, limit: int = 256):
        self.limit = limit
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, tuple[KernelCode, BlockDescription]] = OrderedDict()

    @staticmethod
    def key(code: KernelCode, *args) -> tuple | None:
        """The arguments as a key (values with their types: 1, 1.0 and True differ), or None when one of them
        cannot be a key (an unhashable value): then the block is built the long way."""
        parts: list = [id(code)]
        for a in args:
            if a is None or type(a) in _PLAIN:  # (the usual arguments: no ABC check, ~0.2 us each)
                parts.append((type(a), a))
            elif isinstance(a, Mapping):
                parts.append(tuple(sorted((k, type(v), v) for k, v in a.items())) if a else None)
            else:
                parts.append((type(a), a))
        key = tuple(parts)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def get(self, key: tuple, code: KernelCode) -> BlockDescription | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None or found[0] is not code:  # (an id of a KernelCode since collected: not ours)
                return None
            self._entries.move_to_end(key)
            return found[1]

    def put(self, key: tuple, code: KernelCode, desc: BlockDescription) -> None:
        with self._lock:
            self._entries[key] = (code, desc)  # holds the code, so its id is not reused while it is here
            self._entries.move_to_end(key)
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_declared = _Declared()


class Block:
    """A node of the pipeline: kernels and library calls with ports and parameters.

    Create one with :meth:`from_kernel` for a single kernel, or with :class:`BlockBuilder`.

    >>> add = Block.from_kernel("vector_add", size=1 << 20)
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
        self._subscriptions = CompositeDisposable()  # parameter bindings, disposed on removal
        self.state = "not built"  # "ok", "warning", "error", "removed"
        self.message = ""
        self._warnings: dict[str, str] = {}  # what keeps the block in "warning" (source -> message)
        # parameters that read what the running graph derives from a shape: name -> (own value, running value)
        # (rxcuda.engine._shapes_io.follow_shapes)
        self._derived: dict[str, tuple[Any, Any]] = {}
        self._appends: dict[str, AppendState] = {}  # append port -> what the engine last read of its counter
        self.params = Parameters({s.name: Parameter(self, s.name, s.dtype, s.default, s.min, s.max, s.step,
                                                    s.counts)
                                  for s in description.scalars})

    @classmethod
    def from_kernel(cls, source, *, size: int | None = None, name: str | None = None, threads: int | None = None,
                    block_size: int | tuple | None = None, counts: Mapping[str, int] | None = None,
                    shape=None, ranges: Mapping[str, tuple] | None = None, **defaults) -> Block:
        """A one-kernel block: pointer parameters become ports, scalars become parameters.

        ``source`` is a KernelCode, a kernel file path, or the name of a kernel shipped with rxcuda
        (``"vector_add"``, see ``rxcuda.kernels``). ``size`` is the element count of every port and
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

        >>> mul = Block.from_kernel("scalar_mul", size=16, scale=1.0, ranges={"scale": (0, 10, 0.1)})
        >>> mul.params["scale"].max, mul.params["scale"].step
        (10.0, 0.1)
        """
        if block_size is not None and not isinstance(block_size, tuple):
            check_block_size(block_size, "block_size")
        if size is None and shape is None:
            raise TypeError("Block.from_kernel needs 'size' (the element count of its ports) or 'shape'")
        code = _load_code(source)
        key = _declared.key(code, size, shape, threads, block_size, counts, ranges, defaults)
        desc = _declared.get(key, code) if key is not None else None
        if desc is not None:  # declared before with these arguments: the same description under this name
            if name is not None and (not name or not isinstance(name, str)):
                raise ValueError(f"'name' must be a non-empty str (got {name!r})")
            return cls(desc if desc.name == (name or code.entry) else attrs.evolve(desc, name=name or code.entry))
        block = cls._from_kernel(code, size, name, threads, block_size, counts, shape, ranges, defaults)
        if key is not None:
            _declared.put(key, code, block.description)
        return block

    @classmethod
    def _from_kernel(cls, code: KernelCode, size, name, threads, block_size, counts, shape, ranges,
                     defaults) -> Block:
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
                            f"{', '.join(p.name for p in code.signature.params if not p.is_pointer) or 'none'}"
                            f"{_missing_sidecar(code)}")
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
        """A one-kernel block from CUDA C++: source text, a ``.cu`` path or the name of a shipped kernel (its
        ``.cu``, see ``rxcuda.kernels``), compiled with NVRTC (cached; see
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
        from ..sources._paths import shipped_kernel

        source = shipped_kernel(source, ".cu") or source
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
        """Every parameter's value, by name (as ``params[name].value`` reads it)."""
        return {n: p._value for n, p in self.params._p.items()}  # the mapping ABC's items() is slow

    def _planned_values(self) -> dict[str, Any]:
        """The values the planner reads: :meth:`values`, except that a parameter reading what the running graph
        derives from a shape (:attr:`Parameter.follows`) gives its own value, unless it was set since."""
        out = self.values()
        for name, (own, running) in list(self._derived.items()):  # (a copy: the frame thread may change it)
            if out[name] == running:
                out[name] = own
        return out

    def launches(self) -> dict[str, Launch]:
        return dict(self._launches)

    # -- changes ---------------------------------------------------------------------------------------
    def set(self, **values) -> None:
        """Set several parameters at once: ``block.set(scale=0.5, n=128)``. Every value is checked first: one
        that is refused (TypeError, ValueError, BoundsError for a count past its buffers) raises and none of
        them changes."""
        params = [(self.params[name], v) for name, v in values.items()]
        for prm, v in params:
            prm._check(v)
        for prm, v in params:
            prm.value = v

    def set_launch(self, kernel: str | None = None, *, threads: int | None = None, grid=None, block=None,
                   shared_mem: int | None = None) -> Launch:
        """Change a kernel's launch geometry (warm update, no rebuild). Returns the new Launch.

        A kernel none of whose count parameters is tied to its buffers may get at most the threads that cover
        its smallest buffer (BoundsError otherwise, nothing changes); one with a tied count stops at the count,
        so any thread count is safe (see ``rxcuda.engine._bounds``)."""
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
        from ._bounds import check_launch

        check_launch(self, kernel, new)  # more threads than an unguarded kernel's buffers: BoundsError
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
        side = side_of(self._engine)
        if side is not None:
            side.binding_failed(f"{self.name}.{name}", err, self.params[name].value, self)

    def dispose_bindings(self) -> None:
        """End every parameter binding of this block."""
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

    @property
    def occupancy(self) -> dict[str, float]:
        """Theoretical occupancy of each of the block's kernels in the running graph, kernel name -> fraction
        of the SM's thread slots its launch can fill (0..1), from ``cuOccupancyMaxActiveBlocksPerMultiprocessor``.
        Measured at build time while the engine profiles per kernel (``engine.profile = "per_kernel"``); empty
        otherwise, or before the first build. A kernel below 25 % also gets a warning diagnostic.

        >>> engine.profile = "per_kernel"; engine.tick()                                # doctest: +SKIP
        >>> mul.occupancy                                                               # doctest: +SKIP
        {'scalar_mul': 1.0}
        """
        side = side_of(self._engine)
        return {} if side is None else side.occupancy(self.id)

    def _profile_lines(self) -> list[str]:
        """What the engine's profiling last measured of this block (nothing is read from the GPU here)."""
        side = side_of(self._engine)
        if side is None:
            return []
        out = []
        last = side.last_profile()
        if last is not None and last.blocks is not None and self.name in last.blocks:
            out.append(f"  last GPU time: {last.blocks[self.name].gpu_us:.2f} us (frame {last.frame}, "
                       f"profile {side.profile})")
            if last.kernels is not None:
                for k in self._desc.kernels:
                    label = f"{self.name}/{k.name}"
                    if label in last.kernels:
                        out.append(f"    {label}: {last.kernels[label].gpu_us:.2f} us")
        for kernel, occ in self.occupancy.items():
            out.append(f"  occupancy of {kernel}: {occ:.0%} (theoretical)")
        return out


class BlockBuilder(DescriptionBuilder):
    """Declare a block: kernels, ports, parameters and internal connections; then ``build()``.

    >>> n = 1 << 16
    >>> b = BlockBuilder("scaled_sum", size=n)
    >>> add = b.add_kernel("vector_add")
    >>> mul = b.add_kernel("scalar_mul")
    >>> b.input("a", add["a"]); b.input("b", add["b"])
    >>> b.connect(add["out"], mul["x"])          # an internal buffer of n elements
    >>> b.output("out", mul["out"])
    >>> b.scalar("scale", mul["scale"], default=3.0)
    >>> b.scalar("n", [add["n"], mul["n"]])      # one parameter feeding two kernels
    >>> block = b.build()
    >>> [p.name for p in block.inputs], block.params["scale"].value
    (['a', 'b'], 3.0)
    """

    def build(self) -> Block:
        """Check that every parameter is fed and return the Block (a new one each call)."""
        return Block(self.describe())
