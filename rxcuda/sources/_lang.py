"""The kernel language's vocabulary: the scalar type tokens (``f32`` ...), the array annotations
(``In`` / ``Out`` / ``InOut``) and every operation a traced function calls (``thread_index``, ``shared``,
``atomic_add``, ``reduce_add``, ``if_`` / ``else_``, ``range``, ``where``, ``cast``, ``var`` and the math
functions). Each records into the current tracer (``_trace``); :mod:`._compose` turns a traced function
into a kernel. The language as a whole is described in :mod:`._compose` and re-exported by ``rxcuda.lang``.
"""

from __future__ import annotations

import builtins
from typing import ClassVar

import attrs

from ..model import _dtypes
from . import _ir, _trace
from ._ir import (
    BOOL,
    INTS,
    NUMERIC,
    ArrayRef,
    Atomic,
    Barrier,
    ComposeError,
    For,
    If,
    Operand,
    Reduction,
    SharedDecl,
    fail,
)
from ._trace import ArrayHandle, Value, Var, tracer

__all__ = [
    "ArrayType", "DType", "In", "InOut", "Out", "Value", "Var",
    "f32", "f64", "i32", "i64", "u32", "u64",
    "thread_index", "thread_idx", "block_idx", "block_dim", "grid_dim", "size",
    "shared", "barrier", "atomic_add", "atomic_min", "atomic_max", "reduce_add", "reduce_min", "reduce_max",
    "if_", "else_", "range", "where", "select", "cast", "var",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "cbrt",
    "floor", "ceil", "trunc", "round", "erf", "erfc", "pow", "atan2", "fmod", "hypot", "copysign", "fma",
    "min", "max", "abs", "clamp", "isnan", "isinf", "isfinite",
]

_SHARED_LIMIT = 48 * 1024  # static shared memory per block


# ---------------------------------------------------------------------------------------------------
# types
# ---------------------------------------------------------------------------------------------------
class DType:
    """A scalar type token: annotate a scalar parameter with it (``a: f32``), put it in ``rx.In[f32]``,
    or call it to convert a traced value (``rx.f64(x)``)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, x) -> Value:
        return _trace.cast(x, self.name)

    def __repr__(self) -> str:
        return f"rx.{self.name}"

    def __eq__(self, other) -> bool:
        return isinstance(other, DType) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("DType", self.name))


f32 = DType("f32")
f64 = DType("f64")
i32 = DType("i32")
i64 = DType("i64")
u32 = DType("u32")
u64 = DType("u64")


def _type_name(x, what: str) -> str:
    if isinstance(x, DType):
        return x.name
    try:
        name = _dtypes.dtype_name(x)
    except (ValueError, TypeError):
        raise ComposeError(f"{what}: {x!r} is not a type; use one of f32, f64, i32, i64, u32, u64") from None
    if name not in NUMERIC:
        raise ComposeError(f"{what}: {name} is not supported in composed kernels; use one of "
                           f"{', '.join(NUMERIC)}")
    return name


@attrs.frozen
class ArrayType:
    """What ``rx.In[f32]`` makes: an array parameter's direction and element type."""

    direction: str
    dtype: str

    def __repr__(self) -> str:
        return f"rx.{_KIND[self.direction]}[{self.dtype}]"


_KIND = {"in": "In", "out": "Out", "inout": "InOut"}


class _Array:
    direction: ClassVar[str] = "in"

    def __class_getitem__(cls, dtype) -> ArrayType:
        return ArrayType(cls.direction, _type_name(dtype, f"rx.{cls.__name__}[...]"))

    def __init__(self, *a, **k):
        raise TypeError(f"rx.{type(self).__name__} is an annotation: write rx.{type(self).__name__}[f32]")


class In(_Array):
    """``x: rx.In[f32]``: an array the kernel reads."""

    direction = "in"


class Out(_Array):
    """``out: rx.Out[f32]``: an array the kernel writes (reading it is an error: use InOut)."""

    direction = "out"


class InOut(_Array):
    """``acc: rx.InOut[f32]``: an array the kernel reads and writes."""

    direction = "inout"


# ---------------------------------------------------------------------------------------------------
# operations used inside a traced function
# ---------------------------------------------------------------------------------------------------
def thread_index() -> Value:
    """The global 1-D thread index ``blockIdx.x * blockDim.x + threadIdx.x`` (i64)."""
    return Value(tracer(), Operand("special", "i64", "rx_i"), (0,))


def size() -> Value:
    """The element count the kernel was launched for (its ``size`` parameter, i64)."""
    t = tracer()
    return Value(t, Operand("param", "i64", t.size_param), (0,))


def _sreg(reg: str, axis: str) -> Value:
    if axis not in ("x", "y", "z"):
        raise fail(f"axis must be 'x', 'y' or 'z' (got {axis!r})")
    return tracer().value("i32", "sreg", (f"{reg}.{axis}",))


def thread_idx(axis: str = "x") -> Value:
    """``threadIdx.<axis>``: the thread's index in its block (i32)."""
    return _sreg("threadIdx", axis)


def block_idx(axis: str = "x") -> Value:
    """``blockIdx.<axis>``: the block's index in the grid (i32)."""
    return _sreg("blockIdx", axis)


def block_dim(axis: str = "x") -> Value:
    """``blockDim.<axis>``: threads per block (i32)."""
    return _sreg("blockDim", axis)


def grid_dim(axis: str = "x") -> Value:
    """``gridDim.<axis>``: blocks in the grid (i32)."""
    return _sreg("gridDim", axis)


def shared(dtype, count: int) -> ArrayHandle:
    """A shared-memory array of ``count`` elements, one per block: ``tile = rx.shared(f32, 256)``."""
    t = tracer()
    name = _type_name(dtype, "rx.shared")
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        raise fail(f"rx.shared: the element count must be a positive Python int (got {count!r})")
    used = sum(s.count * _dtypes.itemsize(s.dtype) for s in t.shared) + count * _dtypes.itemsize(name)
    if used > _SHARED_LIMIT:
        raise fail(f"rx.shared: {used} bytes of shared arrays exceed the {_SHARED_LIMIT} bytes a block may "
                   f"declare statically")
    decl = SharedDecl(t.fresh("rx_s"), name, count)
    t.shared.append(decl)
    return ArrayHandle(ArrayRef("shared", decl.name, name), "inout", count)


def barrier() -> None:
    """``__syncthreads()``: wait until every thread of the block gets here. Needs ``guard=False``
    (threads past the end must reach it too), and must not sit in a branch some threads skip."""
    t = tracer()
    if t.guard:
        raise fail("rx.barrier() in a guarded kernel: threads past the element count skip the body and would "
                   "never reach it; compose with guard=False and guard loads/stores with rx.if_(i < rx.size())")
    t.emit(Barrier())


def _atomic(op: str, array, index, value) -> Value:
    if not isinstance(array, ArrayHandle):
        raise fail(f"atomic_{op}: the first argument must be a kernel or shared array, got {type(array).__name__}")
    if array._direction == "in":
        raise fail(f"atomic_{op}: {array._label()} is an input; declare it rx.Out or rx.InOut")
    dtype = array.dtype
    idx = _trace.index_operand(index, f"atomic_{op} on {array._label()}")
    if isinstance(value, Value) and value.dtype != dtype:
        raise fail(f"atomic_{op}: {array._label()} holds {dtype} but the value is {value.dtype}; "
                   f"convert with rx.{dtype}(...)")
    val = _trace.operand(value, dtype, f"atomic_{op}")
    t = tracer()
    dst = t.fresh("v")
    t.emit(Atomic(dst, dtype, op, array._ref, idx, val))
    return Value(t, Operand("val", dtype, dst))


def atomic_add(array, index, value) -> Value:
    """``array[index] += value`` atomically; returns the old value."""
    return _atomic("add", array, index, value)


def atomic_min(array, index, value) -> Value:
    """``array[index] = min(array[index], value)`` atomically; returns the old value."""
    return _atomic("min", array, index, value)


def atomic_max(array, index, value) -> Value:
    """``array[index] = max(array[index], value)`` atomically; returns the old value."""
    return _atomic("max", array, index, value)


def _reduce(op: str, array, value, index: int) -> None:
    t = tracer()
    if not isinstance(array, ArrayHandle) or array._ref.kind != "param":
        raise fail(f"reduce_{op}: the target must be a kernel array parameter (rx.Out/rx.InOut)")
    if array._direction == "in":
        raise fail(f"reduce_{op}: {array._label()} is an input; declare it rx.Out or rx.InOut")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise fail(f"reduce_{op}: index must be a non-negative Python int (every thread folds into the "
                   f"same element); got {index!r}")
    dtype = array.dtype
    if isinstance(value, Value) and value.dtype != dtype:
        raise fail(f"reduce_{op}: {array._label()} holds {dtype} but the value is {value.dtype}; "
                   f"convert with rx.{dtype}(...)")
    val = _trace.operand(value, dtype, f"reduce_{op}")
    key = (op, array._ref.name, index)
    red = t.reductions.get(key)
    if red is None:
        red = Reduction(t.fresh("rx_r"), op, dtype, array._ref.name, index)
        t.reductions[key] = red
    t.emit(_ir.Accumulate(red.acc, op, val))


def reduce_add(array, value, index: int = 0) -> None:
    """Add ``value`` of every thread into ``array[index]`` (block reduction + one atomic per block).
    ``array[index]`` must hold 0 (or the value to add to) before the launch."""
    _reduce("add", array, value, index)


def reduce_min(array, value, index: int = 0) -> None:
    """``array[index] = min(array[index], value of every thread)``."""
    _reduce("min", array, value, index)


def reduce_max(array, value, index: int = 0) -> None:
    """``array[index] = max(array[index], value of every thread)``."""
    _reduce("max", array, value, index)


def _cond(cond, what: str) -> Operand:
    if isinstance(cond, Value):
        tracer().check_scope(cond)
        if cond.dtype != BOOL:
            raise fail(f"{what}: the condition must be a bool (a comparison), got {cond.dtype}")
        return cond._op
    if isinstance(cond, bool):
        return _ir.literal(cond, BOOL)
    raise fail(f"{what}: the condition must be a bool (a comparison), got {type(cond).__name__}")


class if_:  # noqa: N801 - reads like the keyword it stands for
    """``with rx.if_(cond):`` - the indented statements run only where ``cond`` holds. May be followed
    directly by ``with rx.else_():``."""

    def __init__(self, cond):
        self._t = tracer()
        self._node = If(_cond(cond, "rx.if_"))
        self._region = None

    def __enter__(self) -> None:
        t = self._t
        t.emit(self._node)
        self._region = t.push(self._node.then, "a 'with rx.if_(...)' block")

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self._t.pop(self._region)
            self._t.last_if = (self._t.stack[-1], self._node)
        return False


class else_:  # noqa: N801
    """``with rx.else_():`` directly after a ``with rx.if_(...)`` block: runs where its condition fails."""

    def __init__(self):
        self._t = tracer()
        self._region = None

    def __enter__(self) -> None:
        t = self._t
        last = t.last_if
        region = t.stack[-1]
        if last is None or last[0] is not region or not region.stmts or region.stmts[-1] is not last[1] \
                or last[1].orelse:
            raise fail("rx.else_() must directly follow a 'with rx.if_(...)' block (nothing in between)")
        t.last_if = None
        self._region = t.push(last[1].orelse, "a 'with rx.else_()' block")

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self._t.pop(self._region)
        return False


class range:  # noqa: N801 - mirrors Python's range
    """``for j in rx.range(n):`` / ``rx.range(start, stop, step)`` - a loop in the kernel. The bounds may
    be traced integers; ``step`` is a nonzero Python int. ``unroll=True`` (or a count) asks the compiler to
    unroll it. No ``break``/``continue``: branch with ``rx.if_`` inside."""

    def __init__(self, start, stop=None, step: int = 1, *, unroll: bool | int | None = None):
        if stop is None:
            start, stop = 0, start
        if isinstance(step, bool) or not isinstance(step, int) or step == 0:
            raise fail(f"rx.range: step must be a nonzero Python int (got {step!r})")
        if unroll is True:
            unroll = 0
        elif unroll is False:
            unroll = None
        elif unroll is not None and (not isinstance(unroll, int) or unroll <= 0):
            raise fail(f"rx.range: unroll must be True or a positive int (got {unroll!r})")
        self._bounds = (start, stop)
        self._step = step
        self._unroll = unroll

    def __iter__(self):
        t = tracer()
        start, stop = self._bounds
        if not isinstance(start, Value) and not isinstance(stop, Value):
            for b in (start, stop):
                if isinstance(b, bool) or not isinstance(b, int):
                    raise fail(f"rx.range: bounds must be integers, got {b!r}")
            typ = "i32" if builtins.max(builtins.abs(start), builtins.abs(stop)) < 2**31 else "i64"
            ops = (_ir.literal(start, typ), _ir.literal(stop, typ))
        else:
            typ, ops = _trace.unify("rx.range", start, stop)
            if typ not in INTS:
                raise fail(f"rx.range: bounds must be integers, got {typ}")
        node = For(t.fresh("j"), typ, ops[0], ops[1], self._step, [], self._unroll)
        t.emit(node)
        region = t.push(node.body, "an 'rx.range' loop")
        yield Value(t, Operand("loop", typ, node.var))
        t.pop(region)


def where(cond, a, b) -> Value:
    """``a`` where ``cond`` holds, else ``b`` (both evaluated; no branch)."""
    return _trace.select(cond, a, b)


select = where


def cast(x, dtype) -> Value:
    """``x`` converted to ``dtype`` (same as ``rx.f32(x)`` etc.)."""
    return _trace.cast(x, _type_name(dtype, "rx.cast") if dtype != "bool" else BOOL)


def var(init, dtype=None) -> Var:
    """A mutable variable: ``acc = rx.var(0.0)`` (f32; ``rx.var(0, i64)``), then ``acc += x`` or
    ``acc.set(x)``. Use it to carry values out of ``rx.if_`` blocks and ``rx.range`` loops."""
    return _trace.new_var(init, None if dtype is None else _type_name(dtype, "rx.var"))


def _unary(fn: str):
    def op(x) -> Value:
        return _trace.math_call(fn, x)

    op.__name__ = fn
    op.__doc__ = f"``{fn}(x)`` of a float (f32 or f64)."
    return op


def _binary(fn: str):
    def op(x, y) -> Value:
        return _trace.math_call(fn, x, y)

    op.__name__ = fn
    op.__doc__ = f"``{fn}(x, y)`` of floats."
    return op


sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
asin = _unary("asin")
acos = _unary("acos")
atan = _unary("atan")
sinh = _unary("sinh")
cosh = _unary("cosh")
tanh = _unary("tanh")
asinh = _unary("asinh")
acosh = _unary("acosh")
atanh = _unary("atanh")
exp = _unary("exp")
exp2 = _unary("exp2")
exp10 = _unary("exp10")
expm1 = _unary("expm1")
log = _unary("log")
log2 = _unary("log2")
log10 = _unary("log10")
log1p = _unary("log1p")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
cbrt = _unary("cbrt")
floor = _unary("floor")
ceil = _unary("ceil")
trunc = _unary("trunc")
erf = _unary("erf")
erfc = _unary("erfc")
atan2 = _binary("atan2")
fmod = _binary("fmod")
hypot = _binary("hypot")
copysign = _binary("copysign")
isnan = _unary("isnan")
isinf = _unary("isinf")
isfinite = _unary("isfinite")


def round(x) -> Value:  # noqa: A001
    """Round to the nearest integer value, halves to even (like Python's ``round``); stays a float."""
    return _trace.math_call("rint", x)


def pow(x, y) -> Value:  # noqa: A001
    """``x ** y`` (floats; a small literal integer power of any number is repeated multiplication)."""
    return _trace.power(x, y)


def fma(x, y, z) -> Value:
    """``x * y + z`` with one rounding."""
    return _trace.math_call("fma", x, y, z)


def min(x, y) -> Value:  # noqa: A001
    """The smaller of two numbers (floats: ``fminf``, NaN-ignoring)."""
    return _trace.math_call("min", x, y)


def max(x, y) -> Value:  # noqa: A001
    """The larger of two numbers (floats: ``fmaxf``, NaN-ignoring)."""
    return _trace.math_call("max", x, y)


def abs(x) -> Value:  # noqa: A001
    """Absolute value (same as the builtin ``abs`` on a traced value)."""
    return _trace.math_call("abs", x)


def clamp(x, lo, hi) -> Value:
    """``min(max(x, lo), hi)``."""
    return min(max(x, lo), hi)
