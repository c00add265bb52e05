"""Regions: blocks that run other blocks on the GPU's decision, with no host round trip.

``If``, ``IfElse``, ``While`` and ``For`` are blocks like any other (a condition is an input port, a count is
a parameter) whose bodies hold other blocks. The engine builds each as one CUDA conditional node: a tiny
kernel shipped with rxcuda (``rxcuda/cuda/_conditions.cu``, linked against the device runtime when rxcuda was
built, so no toolkit is needed) reads the condition on the device and sets the node's handle.

>>> import rxcuda as rx
>>> step = rx.Block.from_kernel("scalar_mul", size=1024, name="step")
>>> loop = rx.For(3, [step])
>>> loop.params["n"].value = 5      # a hot update: the next frame runs the body 5 times
>>> print(loop)
For 'for': 5 passes of [step]
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib import resources

from ..model._describe import (
    BlockDescription,
    InternalBuffer,
    KernelCode,
    KernelParam,
    KernelSignature,
    KernelSpec,
    Launch,
    Pin,
    PortSpec,
    ScalarSpec,
)
from ..model._regions import MAX_UNROLL, RegionSpec
from ._blocks import Block, PortHandle

CONDITION = "condition"


@cache
def _fatbin() -> bytes:
    return (resources.files("rxcuda.cuda") / "_conditions.fatbin").read_bytes()


def _code(entry: str, params: tuple[KernelParam, ...]) -> KernelCode:
    return KernelCode(entry=entry, image=_fatbin(), format="fatbin", signature=KernelSignature(entry, params),
                      origin="rxcuda/cuda/_conditions.cu", block_size=1)


def stamp_code() -> KernelCode:
    """The profiling timestamp kernel (rx_stamp in the same fatbin; see rxcuda.cuda._profile)."""
    ptr = KernelParam("ring", "pointer", 8, "u64", "out")
    return _code("rx_stamp", (ptr, KernelParam("counters", "pointer", 8, "u32", "inout"),
                              *(KernelParam(n, "scalar", 4, "u32") for n in ("slots", "width", "column"))))


_ONE = Launch(grid=(1,), block=(1,))
_HANDLE = KernelParam("handle", "scalar", 8, "u64", default=0)
_SIZE = KernelParam("size", "scalar", 4, "u32", default=4)
_INVERT = KernelParam("invert", "scalar", 4, "u32", default=0)
_NO_FLAG = KernelParam("flag", "scalar", 8, "u64", default=0)  # a null pointer: no condition to read


def condition_kernels(kind: str, unroll: int = 1) -> tuple[tuple[KernelSpec, ...], tuple[PortSpec, ...],
                                                           tuple[ScalarSpec, ...], tuple[InternalBuffer, ...]]:
    """The kernels, ports, parameters and internal buffers of a region block of ``kind`` (a loop whose body is
    unrolled, ``unroll`` > 1, also has a ``clear`` kernel: see rxcuda.plan._regions)."""
    flag_in = KernelParam("flag", "pointer", 8, None, "in")
    if kind in ("if", "ifelse"):
        k = KernelSpec("set", _code("rx_cond_set", (_HANDLE, flag_in, _SIZE, _INVERT)), _ONE)
        port = PortSpec(CONDITION, "in", None, 1, (Pin("set", 1),))
        return (k,), (port,), (), ()
    flag = flag_in if kind == "while" else _NO_FLAG
    init = KernelSpec("init", _code("rx_loop_init", (_HANDLE, KernelParam("counter", "pointer", 8, "u32", "out"),
                                                     KernelParam("n", "scalar", 4, "u32"), flag, _SIZE, _INVERT)),
                      _ONE)
    step = KernelSpec("step", _code("rx_loop_step", (_HANDLE, KernelParam("counter", "pointer", 8, "u32", "inout"),
                                                     flag, _SIZE, _INVERT)), _ONE)
    counter = InternalBuffer("counter", "u32", 1, Pin("init", 1), (Pin("step", 1),))
    kernels: tuple[KernelSpec, ...] = (init, step)
    if unroll > 1:  # rx_cond_set(loop, counter, 4, invert): the loop's handle to 0 (the counter is > 0 in a pass)
        clear = KernelSpec("clear", _code("rx_cond_set", (_HANDLE, KernelParam("counter", "pointer", 8, "u32", "in"),
                                                          _SIZE, KernelParam("invert", "scalar", 4, "u32", default=1))),
                           _ONE)
        kernels += (clear,)
        counter = InternalBuffer("counter", "u32", 1, Pin("init", 1), (Pin("step", 1), Pin("clear", 1)))
    ports: tuple[PortSpec, ...] = ()
    if kind == "while":
        ports = (PortSpec(CONDITION, "in", None, 1, (Pin("init", 3), Pin("step", 2))),)
        scalars = (ScalarSpec("max_iterations", "u32", 1_000_000, (Pin("init", 2),)),)
    else:
        scalars = (ScalarSpec("n", "u32", 1, (Pin("init", 2),)),)
    return kernels, ports, scalars, (counter,)


class Region(Block):
    """A block whose body blocks run inside one CUDA conditional node. Use :class:`If`, :class:`IfElse`,
    :class:`While` or :class:`For`; add the region to the engine (its body blocks come with it)."""

    kind = ""

    def __init__(self, name: str, bodies: Sequence[Sequence[Block]], condition: PortHandle | None,
                 unroll: int = 1):
        if type(unroll) is not int or not 1 <= unroll <= MAX_UNROLL:
            raise ValueError(f"{name}: 'unroll' must be an int from 1 to {MAX_UNROLL} (got {unroll!r})")
        self.unroll = unroll
        kernels, ports, scalars, internals = condition_kernels(self.kind, unroll)
        super().__init__(BlockDescription(name, kernels, ports, scalars, internals))
        self.bodies: tuple[tuple[Block, ...], ...] = tuple(_blocks(body, name) for body in bodies)
        if condition is not None and not isinstance(condition, PortHandle):
            raise TypeError(f"the condition of {name} is a port that holds a flag, such as block['done'] "
                            f"(got {condition!r})")
        self.condition = condition

    @property
    def members(self) -> tuple[Block, ...]:
        """The blocks directly in the region's bodies."""
        return tuple(b for body in self.bodies for b in body)

    def spec(self) -> RegionSpec:
        """The region as data (block ids of each body)."""
        return RegionSpec(self.id, self.kind, tuple(tuple(b.id for b in body) for body in self.bodies),  # type: ignore[arg-type]
                          self.unroll)

    def _names(self, body) -> str:
        return "[" + ", ".join(b.name for b in body) + "]"

    def __str__(self) -> str:
        cond = f"{self.condition.block.name}.{self.condition.name}" if self.condition is not None else ""
        head = f"{type(self).__name__} '{self.name}'"
        unrolled = f", {self.unroll} copies per relaunch" if self.unroll > 1 else ""
        if self.kind == "for":
            return f"{head}: {self.params['n'].value} passes of {self._names(self.bodies[0])}{unrolled}"
        if self.kind == "while":
            return (f"{head}: {self._names(self.bodies[0])} again while {cond} is nonzero "
                    f"(at most {self.params['max_iterations'].value} passes{unrolled})")
        if self.kind == "ifelse":
            return f"{head}: {self._names(self.bodies[0])} if {cond} is nonzero, else {self._names(self.bodies[1])}"
        return f"{head}: {self._names(self.bodies[0])} if {cond} is nonzero"


def _blocks(body, region: str) -> tuple[Block, ...]:
    if isinstance(body, Block):
        body = (body,)
    out = tuple(body)
    for b in out:
        if not isinstance(b, Block):
            raise TypeError(f"the body of {region} holds blocks (or regions); got {b!r}")
    if len({b.id for b in out}) != len(out):
        raise ValueError(f"the body of {region} names a block twice")
    return out


class If(Region):
    """Run ``body`` in a frame only when the flag at ``condition`` (a u32 or bool port of size 1, written by a
    block that runs before the region) is nonzero. Decided on the device; outputs of the body's blocks are
    zeroed before the region, so in a frame where the body does not run its consumers read zeros.

    >>> gate = If(detector["hit"], [refine])        # doctest: +SKIP
    >>> engine.add(gate)                            # doctest: +SKIP
    """

    kind = "if"

    def __init__(self, condition: PortHandle, body: Sequence[Block], *, name: str = "if"):
        super().__init__(name, (body,), condition)


class IfElse(Region):
    """Run ``then`` when the flag at ``condition`` is nonzero, ``otherwise`` when it is zero (one conditional
    node with two bodies). Outputs of both bodies' blocks are zeroed before the region.

    >>> branch = IfElse(check["big"], [coarse], [fine])   # doctest: +SKIP
    """

    kind = "ifelse"

    def __init__(self, condition: PortHandle, then: Sequence[Block], otherwise: Sequence[Block], *,
                 name: str = "ifelse"):
        super().__init__(name, (then, otherwise), condition)


class While(Region):
    """Run ``body`` again and again while the flag at ``condition`` is nonzero, at most ``max_iterations``
    passes (a hot parameter). The flag is read on the device after each pass. When a block inside the body
    makes the flag, the body runs at least once (a do-while: the flag is made by the pass); when the flag
    comes from before the region it is also read before the first pass.

    >>> loop = While(residual["above_tol"], [step, residual], max_iterations=500)   # doctest: +SKIP

    ``unroll=k`` (1 to 16; default 1) copies the body k times into each relaunch of the loop's conditional node,
    each copy after the first under one more nested IF, so the loop still stops after any pass: fewer
    relaunches for the driver (``bench/region_passes.py`` measures whether that pays on a card). A change of
    code or launch geometry of a block in an unrolled body rebuilds the graph; its parameters stay hot updates.
    """

    kind = "while"

    def __init__(self, condition: PortHandle, body: Sequence[Block], *, max_iterations: int = 1_000_000,
                 name: str = "while", unroll: int = 1):
        super().__init__(name, (body,), condition, unroll)
        self.params["max_iterations"].value = max_iterations


class For(Region):
    """Run ``body`` ``n`` times per frame (``n`` is a parameter: changing it is a hot update; 0 skips the body).

    >>> loop = For(10, [relax])          # doctest: +SKIP
    >>> loop.params["n"].value = 20      # doctest: +SKIP

    ``unroll=k`` copies the body k times per relaunch of the loop's node, as for :class:`While`.
    """

    kind = "for"

    def __init__(self, n: int, body: Sequence[Block], *, name: str = "for", unroll: int = 1):
        super().__init__(name, (body,), None, unroll)
        self.params["n"].value = n
