"""Shapes of ports: N-D extents, optional strides, and the rules that derive a port's shape from the other
ports of its block. Pure data and pure functions; the planner resolves them (``rxcuda.plan._shapes``).

A port declares a shape (C-contiguous unless it gives ``strides``, counted in elements). A rule says how the
shape follows the pipeline when an input upstream changes size:

- an output: explicit (no rule: its declared shape), :class:`Like` another port of its block, :class:`Reduce`
  a port over an axis, or :class:`Broadcast` of several ports (NumPy's broadcasting rules);
- an input: fixed (no rule: what feeds it must have its shape, or for a 1-D input its element count),
  :class:`Follow` (it takes whatever shape feeds it), or :class:`Like` another input (the two must agree).

``Block.from_kernel(..., size=n)`` makes its first input follow, its other inputs and its outputs like it,
so a resize of the first input flows through the block and on downstream.

>>> Reduce("x", axis=1).apply({"x": (4, 8)}, "s")
(4,)
>>> Broadcast("a", "b").apply({"a": (4, 1), "b": (8,)}, "out")
(4, 8)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from ._errors import ValidationError

Shape = tuple[int, ...]


class ShapeError(ValidationError):
    """A shape that does not fit: a mismatch between two ports (the message names both ports and both shapes),
    a rule that cannot apply, or a resize a port refuses. A ValidationError."""


def check_shape(value, what: str = "shape") -> Shape:
    """``value`` as a shape: a tuple of positive ints (an int is a 1-D shape). Raises ValueError naming
    ``what`` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    try:
        shape = tuple(value)
    except TypeError:
        raise ValueError(f"'{what}' must be a tuple of positive ints such as (480, 640) (got {value!r})") from None
    if not shape or any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in shape):
        raise ValueError(f"'{what}' must be a tuple of positive ints such as (480, 640) (got {value!r})")
    return tuple(int(d) for d in shape)


def check_strides(strides, shape: Shape, what: str = "strides") -> Shape | None:
    """Strides in elements, one per axis of ``shape``; ``None`` (C-contiguous) stays ``None``, and so do
    strides equal to C order's. Overlapping layouts (two indices at one element) are refused."""
    if strides is None:
        return None
    try:
        out = tuple(strides)
    except TypeError:
        raise ValueError(f"'{what}' must be a tuple of ints, one per axis of {shape} (got {strides!r})") from None
    if len(out) != len(shape) or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in out):
        raise ValueError(f"'{what}' must be {len(shape)} positive ints (elements per step along each axis of "
                         f"{shape}), got {strides!r}")
    if out == c_strides(shape):
        return None
    # no overlap: sorted by stride, each axis must step past the whole extent of the smaller ones
    span = 1
    for s, d in sorted(zip(out, shape, strict=True)):
        if d > 1 and s < span:
            raise ValueError(f"'{what}' {out} make elements of shape {shape} overlap; each axis must step past "
                             "the axes with smaller strides")
        span = max(span, s * (d - 1) + 1) if d > 1 else span
    return tuple(int(s) for s in out)


def c_strides(shape: Shape) -> Shape:
    """C-order strides of ``shape``, in elements."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def extent(shape: Shape, strides: Shape | None) -> int:
    """Elements a buffer of this layout spans (the element count when C-contiguous)."""
    if strides is None:
        return math.prod(shape)
    return 1 + sum(s * (d - 1) for s, d in zip(strides, shape, strict=True))


def fmt(shape: Shape) -> str:
    """A shape for messages: ``(1024,)``, ``(480, 640)``."""
    return str(tuple(shape))


# -- rules --------------------------------------------------------------------------------------------
@attrs.frozen
class Follow:
    """An input that takes whatever shape feeds it (its declared shape is what it has until something does).

    >>> Follow()
    Follow()
    """

    def refs(self) -> tuple[str, ...]:
        return ()


@attrs.frozen
class Like:
    """The shape of another port of the block (an input, or an output declared before).

    >>> Like("x").apply({"x": (3, 5)}, "out")
    (3, 5)
    """

    port: str

    def refs(self) -> tuple[str, ...]:
        return (self.port,)

    def apply(self, shapes: Mapping[str, Shape], name: str) -> Shape:
        return shapes[self.port]


def _axes(axis, ndim: int) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise IndexError(a)
        out.append(a % ndim)
    return tuple(sorted(set(out)))


@attrs.frozen
class Reduce:
    """The shape of ``port`` reduced over ``axis`` (an int or a tuple of them; negative counts from the end):
    those axes are dropped, or kept with length 1 (``keepdims``). Reducing every axis leaves ``(1,)``.

    >>> Reduce("x", axis=-1, keepdims=True).apply({"x": (4, 8)}, "s")
    (4, 1)
    """

    port: str
    axis: int | tuple[int, ...] = attrs.field(converter=lambda a: a if isinstance(a, int) else tuple(a))
    keepdims: bool = False

    def __attrs_post_init__(self):
        axes = (self.axis,) if isinstance(self.axis, int) else self.axis
        if not axes or any(not isinstance(a, int) or isinstance(a, bool) for a in axes):
            raise ValueError(f"Reduce: 'axis' must be an int or a tuple of ints (got {self.axis!r})")

    def refs(self) -> tuple[str, ...]:
        return (self.port,)

    def apply(self, shapes: Mapping[str, Shape], name: str) -> Shape:
        src = shapes[self.port]
        try:
            axes = _axes(self.axis, len(src))
        except IndexError:
            raise ShapeError(f"'{name}' reduces '{self.port}' over axis {self.axis}, but '{self.port}' has shape "
                             f"{fmt(src)} ({len(src)} axes); use an axis from {-len(src)} to {len(src) - 1}"
                             ) from None
        if self.keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(src))
        return tuple(d for i, d in enumerate(src) if i not in axes) or (1,)


@attrs.frozen(init=False)
class Broadcast:
    """The broadcast of the shapes of ``ports`` (NumPy's rules: axes aligned at the end, a length 1
    stretches).

    >>> Broadcast("a", "b").apply({"a": (3,), "b": (2, 1)}, "out")
    (2, 3)
    """

    ports: tuple[str, ...]

    def __init__(self, *ports: str):
        if len(ports) == 1 and not isinstance(ports[0], str):
            ports = tuple(ports[0])
        if not ports or any(not isinstance(p, str) for p in ports):
            raise ValueError(f"Broadcast takes the names of the ports to broadcast (got {ports!r})")
        object.__setattr__(self, "ports", tuple(ports))

    def refs(self) -> tuple[str, ...]:
        return self.ports

    def apply(self, shapes: Mapping[str, Shape], name: str) -> Shape:
        out: list[int] = []
        owner: list[str] = []
        for port in self.ports:
            shape = shapes[port]
            pad = len(shape) - len(out)
            if pad > 0:
                out[:0] = [1] * pad
                owner[:0] = [port] * pad
            for i, d in enumerate(shape, start=len(out) - len(shape)):
                if d == out[i] or d == 1:
                    continue
                if out[i] == 1:
                    out[i], owner[i] = d, port
                    continue
                raise ShapeError(f"'{name}' broadcasts {', '.join(repr(p) for p in self.ports)}, but '{owner[i]}' "
                                 f"has shape {fmt(shapes[owner[i]])} and '{port}' has shape {fmt(shape)}: axis "
                                 f"{i - len(out)} is {out[i]} in one and {d} in the other (they must be equal, or "
                                 "one of them 1)")
        return tuple(out)


ShapeRule = Follow | Like | Reduce | Broadcast
RULES = (Follow, Like, Reduce, Broadcast)


def check_rule(rule, direction: str, name: str) -> ShapeRule | None:
    """``rule`` if a port of ``direction`` may have it; ValueError naming the port otherwise."""
    if rule is None:
        return None
    if not isinstance(rule, RULES):
        raise ValueError(f"port '{name}': a shape rule is Follow(), Like(port), Reduce(port, axis) or "
                         f"Broadcast(port, ...) (got {rule!r})")
    if direction == "in" and isinstance(rule, Reduce | Broadcast):
        raise ValueError(f"input '{name}' cannot be a {type(rule).__name__}: an input takes its shape from what "
                         "feeds it; use Follow() or Like(other input)")
    if direction == "out" and isinstance(rule, Follow):
        raise ValueError(f"output '{name}' cannot Follow: an output's shape is explicit, Like(port), "
                         "Reduce(port, axis) or Broadcast(port, ...)")
    return rule


def accepts(declared: Shape, got: Shape) -> bool:
    """Whether a fixed input of shape ``declared`` takes ``got``: the same shape, or the same element count
    where the input is 1-D (a flat kernel reads elements, whatever their shape upstream)."""
    return got == declared or (len(declared) == 1 and math.prod(got) == declared[0])


def launch_geometry(shape: Shape, block: tuple[int, int, int], items_per_thread: int = 1
                    ) -> tuple[int, int, int]:
    """The grid that covers ``shape`` with blocks of ``block`` threads: a 1-D grid over the elements for a 1-D
    block (``items_per_thread`` elements per thread); for a 2-D block, x over the last axis and y over the
    others (a 1-D shape is one row); for a 3-D block, x, y and z over the last, second last and the rest."""
    bx, by, bz = block
    if by == 1 and bz == 1:
        threads = -(-math.prod(shape) // max(items_per_thread, 1))
        return (-(-threads // bx), 1, 1)
    x = shape[-1]
    if bz == 1:
        y = math.prod(shape[:-1]) if len(shape) > 1 else 1
        return (-(-x // bx), -(-y // by), 1)
    y = shape[-2] if len(shape) > 1 else 1
    z = math.prod(shape[:-2]) if len(shape) > 2 else 1
    return (-(-x // bx), -(-y // by), -(-z // bz))
