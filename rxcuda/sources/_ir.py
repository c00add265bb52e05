"""The IR of composed kernels, and the tracer that records it while a Python function runs.

A composed kernel is a Python function run once over symbolic values (:class:`Value`). Every operation on
them is type-checked on the spot and appended as a statement to the innermost open region (the kernel
body, a ``with rx.if_(...)`` block, a ``for ... in rx.range(...)`` loop). The result is a
:class:`KernelIR`: parameters, shared arrays, reductions and a statement tree, all plain data, with a
:meth:`~KernelIR.fingerprint` that identifies it for the compile cache. ``_lower.py`` turns it into CUDA
C++.

Types: ``bool``, ``i32``, ``i64``, ``u32``, ``u64``, ``f32``, ``f64``. Operands of one operation must have
the same type, except that an integer widens to a wider integer of the same signedness, and a Python
number adopts the other operand's type when it fits (an ``int`` fits any numeric type; a ``float`` only a
float type). Anything else is a :class:`ComposeError` naming the operation, the types and the line.
"""

from __future__ import annotations

import hashlib
import linecache
import math
import os
import re
import sys
import threading
from typing import Any

import attrs

from ..model._errors import RxcudaError

BOOL = "bool"
INTS = ("i32", "i64", "u32", "u64")
FLOATS = ("f32", "f64")
NUMERIC = INTS + FLOATS
TYPES = (BOOL,) + NUMERIC
C_TYPES = {
    "bool": "bool", "i32": "int", "i64": "long long", "u32": "unsigned int", "u64": "unsigned long long",
    "f32": "float", "f64": "double",
}
_BITS = {"i32": 32, "i64": 64, "u32": 32, "u64": 64}
_HERE = os.path.dirname(os.path.abspath(__file__))


class ComposeError(RxcudaError, TypeError):
    """A composed kernel is ill-typed or uses an operation where it cannot work. The message names the
    operation, the types involved and the line of the user's code."""


def _user_location() -> str:
    """' (at file.py:12: out[i] = ...)' for the innermost frame outside rxcuda's sources package."""
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _HERE:
        f = f.f_back
    if f is None:
        return ""
    line = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
    return f" (at {os.path.basename(f.f_code.co_filename)}:{f.f_lineno}" + (f": {line})" if line else ")")


def fail(message: str) -> ComposeError:
    return ComposeError(message + _user_location())


# ---------------------------------------------------------------------------------------------------
# IR data
# ---------------------------------------------------------------------------------------------------
@attrs.frozen
class Operand:
    """A typed operand: ``kind`` is 'val' (a computed value), 'param', 'var', 'loop', 'lit', 'special'
    (the global index) or 'acc' (a reduction accumulator); ``ref`` is how C++ spells it."""

    kind: str
    type: str
    ref: str


@attrs.frozen
class ArrayRef:
    """A global array parameter ('param') or a shared-memory array ('shared')."""

    kind: str
    name: str
    dtype: str


@attrs.frozen
class Let:
    """``const T dst = op(args)``. ``op`` is one of: 'add' 'sub' 'mul' 'div' 'floordiv' 'mod' 'and' 'or'
    'xor' 'shl' 'shr' 'lt' 'le' 'gt' 'ge' 'eq' 'ne' 'neg' 'not' 'invert' 'call' (args[0] is the C
    function) 'cast' 'select' 'load' 'sreg' (args[0] is the register)."""

    dst: str
    type: str
    op: str
    args: tuple


@attrs.frozen
class Store:
    array: ArrayRef
    index: Operand
    value: Operand


@attrs.frozen
class Atomic:
    """``const T dst = atomic<op>(&array[index], value)``; ``op`` is 'add', 'min' or 'max'."""

    dst: str
    type: str
    op: str
    array: ArrayRef
    index: Operand
    value: Operand


@attrs.frozen
class DeclVar:
    name: str
    type: str
    init: Operand


@attrs.frozen
class Assign:
    name: str
    value: Operand


@attrs.frozen
class Barrier:
    pass


@attrs.frozen
class Accumulate:
    """Fold ``value`` into a reduction's per-thread accumulator."""

    acc: str
    op: str
    value: Operand


@attrs.define(eq=False)
class If:
    cond: Operand
    then: list = attrs.Factory(list)
    orelse: list = attrs.Factory(list)


@attrs.define(eq=False)
class For:
    var: str
    type: str
    start: Operand
    stop: Operand
    step: int
    body: list = attrs.Factory(list)
    unroll: int | None = None


@attrs.frozen
class Param:
    """A parameter of the kernel: an array ('in', 'out', 'inout') or a scalar (direction 'in')."""

    name: str
    kind: str  # 'array' | 'scalar'
    dtype: str
    direction: str = "in"
    default: float | int | str | None = None


@attrs.frozen
class SharedDecl:
    name: str
    dtype: str
    count: int


@attrs.frozen
class Reduction:
    """A block-level reduction into ``array[index]``, combined across blocks with one atomic each."""

    acc: str
    op: str  # 'add' | 'min' | 'max'
    dtype: str
    array: str
    index: int


def canon(node) -> Any:
    """A hashable, deterministic form of an IR node or statement list (for fingerprints and equality)."""
    if isinstance(node, list | tuple):
        return tuple(canon(n) for n in node)
    if isinstance(node, If):
        return ("If", canon(node.cond), canon(node.then), canon(node.orelse))
    if isinstance(node, For):
        return ("For", node.var, node.type, canon(node.start), canon(node.stop), node.step,
                canon(node.body), node.unroll)
    if attrs.has(type(node)):
        return (type(node).__name__,) + tuple(canon(getattr(node, f.name)) for f in attrs.fields(type(node)))
    return node


@attrs.define(eq=False)
class KernelIR:
    """A traced kernel. ``body`` runs per thread (inside ``if (i < size)`` when ``guard``)."""

    name: str
    params: tuple[Param, ...]
    size_param: str
    guard: bool
    shared: tuple[SharedDecl, ...]
    reductions: tuple[Reduction, ...]
    body: list
    block_size: int = 256
    items_per_thread: int = 1  # elements per thread the code handles (1: one element per thread)

    def canonical(self) -> tuple:
        return ("KernelIR", 1, self.name, canon(self.params), self.size_param, self.guard,
                canon(self.shared), canon(self.reductions), canon(self.body), self.items_per_thread)

    def elementwise(self) -> bool:
        """Nothing depends on which thread handles an element: guarded, no thread/block index, no shared
        memory. Such a kernel may handle several elements per thread."""
        return self.guard and not self.shared and not self.uses("sreg")

    def fingerprint(self) -> str:
        """SHA-256 of the canonical form: equal IR, equal fingerprint (block size excluded)."""
        return hashlib.sha256(repr(self.canonical()).encode()).hexdigest()

    def uses(self, *kinds: str) -> bool:
        """Whether any statement is of one of these class names, or a Let with one of these ops."""

        def walk(stmts) -> bool:
            for s in stmts:
                if type(s).__name__ in kinds or (isinstance(s, Let) and s.op in kinds):
                    return True
                if isinstance(s, If) and (walk(s.then) or walk(s.orelse)):
                    return True
                if isinstance(s, For) and walk(s.body):
                    return True
            return False

        return walk(self.body)


# ---------------------------------------------------------------------------------------------------
# the tracer
# ---------------------------------------------------------------------------------------------------
_current = threading.local()


def tracer() -> Tracer:
    t = getattr(_current, "tracer", None)
    if t is None:
        raise fail("this rxcuda operation only works inside a function traced by @rx.kernel / rx.compose")
    return t


class _Region:
    __slots__ = ("id", "stmts", "label")

    def __init__(self, id: int, stmts: list, label: str):
        self.id = id
        self.stmts = stmts
        self.label = label


class Tracer:
    """Records statements while a kernel function runs. Use as a context manager."""

    def __init__(self, name: str, guard: bool, size_param: str):
        self.name = name
        self.guard = guard
        self.size_param = size_param
        self._ids = 0
        self.body: list = []
        self.stack: list[_Region] = [_Region(0, self.body, "the kernel body")]
        self.labels: dict[int, str] = {0: "the kernel body"}
        self.counters: dict[str, int] = {}
        self.shared: list[SharedDecl] = []
        self.reductions: dict[tuple, Reduction] = {}
        self.last_if: tuple[_Region, If] | None = None
        self._prev = None

    def __enter__(self) -> Tracer:
        self._prev = getattr(_current, "tracer", None)
        _current.tracer = self
        return self

    def __exit__(self, *exc) -> None:
        _current.tracer = self._prev

    def fresh(self, prefix: str) -> str:
        n = self.counters.get(prefix, 0)
        self.counters[prefix] = n + 1
        return f"{prefix}{n}"

    @property
    def path(self) -> tuple[int, ...]:
        return tuple(r.id for r in self.stack)

    def emit(self, stmt) -> None:
        self.stack[-1].stmts.append(stmt)

    def push(self, stmts: list, label: str) -> _Region:
        self._ids += 1
        region = _Region(self._ids, stmts, label)
        self.labels[region.id] = label
        self.stack.append(region)
        return region

    def pop(self, region: _Region) -> None:
        if self.stack[-1] is not region:
            raise fail("rx.if_/rx.else_/rx.range blocks were closed out of order")
        self.stack.pop()

    def value(self, type_: str, op: str, args: tuple) -> Value:
        dst = self.fresh("v")
        self.emit(Let(dst, type_, op, args))
        return Value(self, Operand("val", type_, dst))

    def check_scope(self, v: Value) -> None:
        if v._tracer is not self:
            raise fail("a value from another composed kernel was used here; each kernel traces its own")
        n = len(v._scope)
        if self.path[:n] != v._scope:
            closed = next(i for i in v._scope if i not in self.path)
            raise fail(
                f"value {v._op.ref} ({v._op.type}) was computed inside {self.labels[closed]}, which has "
                f"ended; to carry a value out of a block or loop, declare acc = rx.var(...) before it and "
                f"update it inside (acc.set(x), acc += x)"
            )

    def finish(self, params: tuple[Param, ...], block_size: int) -> KernelIR:
        if len(self.stack) != 1:
            raise ComposeError(
                f"{self.name}: {self.stack[-1].label} was never closed: 'break', 'continue' and 'return' "
                f"inside rx.range loops are not supported (use rx.if_ instead)"
            )
        return KernelIR(self.name, params, self.size_param, self.guard, tuple(self.shared),
                        tuple(self.reductions.values()), self.body, block_size)


# ---------------------------------------------------------------------------------------------------
# values and type rules
# ---------------------------------------------------------------------------------------------------
def _describe(x) -> str:
    if isinstance(x, Value):
        return x._op.type
    if isinstance(x, bool):
        return "bool literal"
    if isinstance(x, int):
        return f"int literal {x}"
    if isinstance(x, float):
        return f"float literal {x!r}"
    return type(x).__name__


def _int_range(t: str) -> tuple[int, int]:
    bits = _BITS[t]
    return (0, 2**bits - 1) if t.startswith("u") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def literal(value, type_: str, op: str = "literal") -> Operand:
    """A Python number as an operand of ``type_``; raises :class:`ComposeError` if it does not fit."""
    if type_ == BOOL:
        if not isinstance(value, bool):
            raise fail(f"{op}: expected a bool, got {_describe(value)}")
        return Operand("lit", BOOL, "true" if value else "false")
    if isinstance(value, bool):
        raise fail(f"{op}: a bool literal cannot be a {type_}; write 1 or 0, or compare")
    if type_ in INTS:
        if isinstance(value, float):
            if not value.is_integer():
                raise fail(f"{op}: {_describe(value)} is not an integer but the other operand is {type_}; "
                           f"convert with rx.f32(...)/rx.f64(...) to compute in floating point")
            value = int(value)
        lo, hi = _int_range(type_)
        if not lo <= value <= hi:
            raise fail(f"{op}: {value} does not fit {type_} ({lo} to {hi})")
        if type_ == "i32":
            ref = str(value) if value != lo else "(-2147483647 - 1)"
        elif type_ == "i64":
            ref = f"{value}LL" if value != lo else "(-9223372036854775807LL - 1)"
        elif type_ == "u32":
            ref = f"{value}u"
        else:
            ref = f"{value}ull"
        return Operand("lit", type_, ref)
    # floats
    v = float(value)
    if math.isnan(v):
        ref = "__int_as_float(0x7fc00000)" if type_ == "f32" else "__longlong_as_double(0x7ff8000000000000LL)"
    elif math.isinf(v):
        if type_ == "f32":
            ref = "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
        else:
            ref = ("__longlong_as_double(0x7ff0000000000000LL)" if v > 0
                   else "__longlong_as_double(0xfff0000000000000LL)")
    else:
        if type_ == "f32" and abs(v) > 3.4028234663852886e38:
            raise fail(f"{op}: {value!r} overflows f32")
        text = repr(v)
        if "e" not in text and "." not in text:
            text += ".0"
        ref = text + ("f" if type_ == "f32" else "")
    return Operand("lit", type_, ref)


def _is_number(x) -> bool:
    return isinstance(x, bool | int | float) or _numpy_scalar(x) is not None


def _numpy_scalar(x):
    mod = type(x).__module__
    if mod == "numpy" and hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return x.item()
    return None


def _plain(x):
    v = _numpy_scalar(x)
    return x if v is None else v


def operand(x, type_: str, op: str) -> Operand:
    """``x`` (a Value or a Python number) as an operand of type ``type_``; no conversion between
    different symbolic types."""
    if isinstance(x, Value):
        tracer().check_scope(x)
        if x._op.type != type_:
            raise fail(f"{op}: expected {type_}, got {x._op.type}")
        return x._op
    x = _plain(x)
    if not isinstance(x, bool | int | float):
        raise fail(f"{op}: expected a {type_} value, got {_describe(x)}")
    return literal(x, type_, op)


def _widen(a: str, b: str) -> str | None:
    if a == b:
        return a
    if a in INTS and b in INTS and a[0] == b[0]:
        return a if _BITS[a] >= _BITS[b] else b
    return None


def unify(op: str, *xs) -> tuple[str, tuple[Operand, ...]]:
    """The common type of the operands of ``op`` and the operands converted to it."""
    t = tracer()
    types = []
    for x in xs:
        if isinstance(x, Value):
            t.check_scope(x)
            types.append(x._op.type)
        elif not _is_number(x):
            raise fail(f"{op}: cannot use {_describe(x)} in a composed kernel")
    if not types:
        raise fail(f"{op}: at least one operand must be a traced value")
    common = types[0]
    for other in types[1:]:
        w = _widen(common, other)
        if w is None:
            raise fail(f"{op}: operand types {' and '.join(_describe(x) for x in xs)} differ; convert one "
                       f"explicitly, e.g. rx.{other}(x) or rx.{common}(x)")
        common = w
    out = []
    for x in xs:
        if isinstance(x, Value):
            if x._op.type != common:  # integer widening
                out.append(t.value(common, "cast", (x._op,))._op)
            else:
                out.append(x._op)
        else:
            x = _plain(x)
            if isinstance(x, float) and common in INTS and not float(x).is_integer():
                raise fail(f"{op}: operand types {' and '.join(_describe(y) for y in xs)}: a fractional "
                           f"float literal cannot mix with {common}; convert with rx.f32(...)/rx.f64(...)")
            if isinstance(x, bool) != (common == BOOL):
                raise fail(f"{op}: operand types {' and '.join(_describe(y) for y in xs)} do not mix")
            out.append(literal(x, common, op))
    return common, tuple(out)


_SYMBOLS = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "and": "&", "or": "|",
    "xor": "^", "shl": "<<", "shr": ">>", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
    "pow": "**",
}


def binary(op: str, a, b) -> Value:
    name = f"{op} ({_SYMBOLS.get(op, op)})"
    if op in ("shl", "shr"):
        base = a if isinstance(a, Value) else None
        if base is None:
            raise fail(f"{name}: the shifted operand must be a traced integer, got {_describe(a)}")
        ta = base._op.type
        if ta not in INTS:
            raise fail(f"{name}: needs integers, got {_describe(a)} and {_describe(b)}")
        if isinstance(b, Value):
            tracer().check_scope(b)
            if b._op.type not in INTS:
                raise fail(f"{name}: needs integers, got {_describe(a)} and {_describe(b)}")
            ob = b._op
        else:
            ob = literal(_plain(b), ta, name)
        tracer().check_scope(base)
        return tracer().value(ta, op, (base._op, ob))
    if op == "pow":
        return power(a, b)
    common, ops = unify(name, a, b)
    if op in ("lt", "le", "gt", "ge") and common == BOOL:
        raise fail(f"{name}: cannot order bools")
    if op in ("lt", "le", "gt", "ge", "eq", "ne"):
        return tracer().value(BOOL, op, ops)
    if op in ("and", "or", "xor"):
        if common in FLOATS:
            raise fail(f"{name}: bitwise/logical operators need bools or integers, got "
                       f"{_describe(a)} and {_describe(b)}")
        return tracer().value(common, op, ops)
    if common == BOOL:
        raise fail(f"{name}: arithmetic on bools; convert with rx.i32(...) first")
    if op == "div" and common in INTS:
        raise fail(f"{name}: '/' on integers ({_describe(a)} and {_describe(b)}) is ambiguous; use '//' "
                   f"for integer division or convert with rx.f32(...)/rx.f64(...)")
    return tracer().value(common, op, ops)


def power(a, b) -> Value:
    name = "pow (**)"
    b = _plain(b)
    if isinstance(a, Value) and isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= 8:
        tracer().check_scope(a)
        if a._op.type == BOOL:
            raise fail(f"{name}: arithmetic on bools")
        if b == 0:
            return tracer().value(a._op.type, "cast", (literal(1, a._op.type, name),))
        result = a
        for _ in range(b - 1):
            result = binary("mul", result, a)
        return result
    common, ops = unify(name, a, b)
    if common not in FLOATS:
        raise fail(f"{name}: a symbolic or negative integer power needs floats, got {_describe(a)} and "
                   f"{_describe(b)}; convert with rx.f32(...)")
    return tracer().value(common, "call", ("powf" if common == "f32" else "pow",) + ops)


def unary(op: str, a) -> Value:
    t = tracer()
    t.check_scope(a)
    ty = a._op.type
    if op == "neg":
        if ty == BOOL:
            raise fail("neg (-): cannot negate a bool; use ~ for logical not")
        return t.value(ty, "neg", (a._op,))
    if op == "invert":
        if ty in FLOATS:
            raise fail(f"invert (~): needs a bool or an integer, got {ty}")
        return t.value(ty, "not" if ty == BOOL else "invert", (a._op,))
    raise AssertionError(op)


# C spellings of math functions: name -> (f32, f64)
FLOAT_FUNCS: dict[str, tuple[str, str]] = {
    name: (name + "f", name)
    for name in (
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
        "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "cbrt", "floor",
        "ceil", "trunc", "erf", "erfc", "rint",
    )
}
FLOAT_FUNCS2: dict[str, tuple[str, str]] = {
    "atan2": ("atan2f", "atan2"), "fmod": ("fmodf", "fmod"), "hypot": ("hypotf", "hypot"),
    "copysign": ("copysignf", "copysign"), "pow": ("powf", "pow"),
}


def math_call(fn: str, *args) -> Value:
    """A math function of floats (and, for min/max/abs, integers)."""
    t = tracer()
    if fn in FLOAT_FUNCS or fn in FLOAT_FUNCS2 or fn == "fma":
        common, ops = unify(fn, *args)
        if common not in FLOATS:
            types = ", ".join(_describe(a) for a in args)
            raise fail(f"{fn}: needs f32 or f64, got {types}; convert with rx.f32(...) or rx.f64(...)")
        table = FLOAT_FUNCS.get(fn) or FLOAT_FUNCS2.get(fn) or ("fmaf", "fma")
        return t.value(common, "call", (table[0] if common == "f32" else table[1],) + ops)
    if fn in ("min", "max"):
        common, ops = unify(fn, *args)
        if common == BOOL:
            raise fail(f"{fn}: needs numbers, got bools")
        c = {"f32": f"f{fn}f", "f64": f"f{fn}"}.get(common, fn)
        return t.value(common, "call", (c,) + ops)
    if fn == "abs":
        (a,) = args
        t.check_scope(a)
        ty = a._op.type
        if ty == BOOL:
            raise fail("abs: needs a number, got bool")
        if ty.startswith("u"):
            return a
        c = {"f32": "fabsf", "f64": "fabs", "i32": "abs", "i64": "llabs"}[ty]
        return t.value(ty, "call", (c, a._op))
    if fn in ("isnan", "isinf", "isfinite"):
        (a,) = args
        t.check_scope(a)
        if a._op.type not in FLOATS:
            raise fail(f"{fn}: needs f32 or f64, got {_describe(a)}")
        return t.value(BOOL, "call", (fn, a._op))
    raise AssertionError(fn)


def cast(x, type_: str) -> Value:
    """``x`` converted to ``type_`` (C conversion: floats truncate toward zero into integers)."""
    t = tracer()
    if not isinstance(x, Value):
        x = _plain(x)
        if not isinstance(x, bool | int | float):
            raise fail(f"rx.{type_}(...): cannot convert {_describe(x)}")
        if type_ == BOOL:
            return t.value(BOOL, "cast", (literal(bool(x), BOOL),))
        if type_ in INTS and isinstance(x, float):
            x = int(x)
        return t.value(type_, "cast", (literal(x, type_, f"rx.{type_}(...)"),))
    t.check_scope(x)
    if x._op.type == type_:
        return x
    if type_ == BOOL:
        zero = literal(False, BOOL) if x._op.type == BOOL else literal(0, x._op.type)
        return t.value(BOOL, "ne", (x._op, zero))
    return t.value(type_, "cast", (x._op,))


def select(cond, a, b) -> Value:
    t = tracer()
    if isinstance(cond, Value):
        t.check_scope(cond)
        if cond._op.type != BOOL:
            raise fail(f"where: the condition must be a bool (a comparison), got {cond._op.type}")
        c = cond._op
    elif isinstance(cond, bool):
        c = literal(cond, BOOL)
    else:
        raise fail(f"where: the condition must be a bool (a comparison), got {_describe(cond)}")
    if not isinstance(a, Value) and not isinstance(b, Value):
        raise fail("where: at least one of the two choices must be a traced value (or use rx.f32(1.0))")
    common, ops = unify("where", a, b)
    return t.value(common, "select", (c,) + ops)


def index_operand(i, what: str) -> Operand:
    if isinstance(i, Value):
        tracer().check_scope(i)
        if i._op.type not in INTS:
            raise fail(f"{what}: an index must be an integer, got {i._op.type}")
        return i._op
    i = _plain(i)
    if isinstance(i, int) and not isinstance(i, bool):
        return literal(i, "i64" if not -(2**31) <= i < 2**31 else "i32", what)
    if isinstance(i, slice):
        raise fail(f"{what}: slices are not supported; index one element, e.g. x[i]")
    raise fail(f"{what}: an index must be an integer, got {_describe(i)}")


_TRUTH_HINT = (
    "a traced value has no Python truth value: 'if', 'while', 'and', 'or', 'not', chained comparisons "
    "(a < b < c) and the builtins min/max need a concrete bool. Use 'with rx.if_(cond):' for a branch, "
    "rx.where(cond, a, b) to choose a value, '&', '|', '~' to combine conditions, rx.min/rx.max"
)


class Value:
    """A symbolic value of a composed kernel. Supports arithmetic (+ - * / // % **), comparisons
    (< <= > >= == !=, giving bool), bit and logic operators (& | ^ ~ << >>), unary -, abs(), round(),
    math.floor/ceil/trunc. Python ``if`` on a Value is an error: use ``rx.if_`` or ``rx.where``."""

    __slots__ = ("_tracer", "_op", "_scope")
    __hash__ = None  # == builds a comparison

    def __init__(self, tracer_: Tracer, op: Operand, scope: tuple[int, ...] | None = None):
        self._tracer = tracer_
        self._op = op
        self._scope = tracer_.path if scope is None else scope

    @property
    def dtype(self) -> str:
        return self._op.type

    def __repr__(self) -> str:
        return f"<rx value {self._op.ref}: {self._op.type}>"

    # arithmetic
    def __add__(self, o): return binary("add", self, o)
    def __radd__(self, o): return binary("add", o, self)
    def __sub__(self, o): return binary("sub", self, o)
    def __rsub__(self, o): return binary("sub", o, self)
    def __mul__(self, o): return binary("mul", self, o)
    def __rmul__(self, o): return binary("mul", o, self)
    def __truediv__(self, o): return binary("div", self, o)
    def __rtruediv__(self, o): return binary("div", o, self)
    def __floordiv__(self, o): return binary("floordiv", self, o)
    def __rfloordiv__(self, o): return binary("floordiv", o, self)
    def __mod__(self, o): return binary("mod", self, o)
    def __rmod__(self, o): return binary("mod", o, self)
    def __pow__(self, o): return power(self, o)
    def __rpow__(self, o): return power(o, self)
    def __and__(self, o): return binary("and", self, o)
    def __rand__(self, o): return binary("and", o, self)
    def __or__(self, o): return binary("or", self, o)
    def __ror__(self, o): return binary("or", o, self)
    def __xor__(self, o): return binary("xor", self, o)
    def __rxor__(self, o): return binary("xor", o, self)
    def __lshift__(self, o): return binary("shl", self, o)
    def __rshift__(self, o): return binary("shr", self, o)
    def __lt__(self, o): return binary("lt", self, o)
    def __le__(self, o): return binary("le", self, o)
    def __gt__(self, o): return binary("gt", self, o)
    def __ge__(self, o): return binary("ge", self, o)
    def __eq__(self, o): return binary("eq", self, o)  # noqa: PLE0307
    def __ne__(self, o): return binary("ne", self, o)
    def __neg__(self): return unary("neg", self)
    def __pos__(self): return self
    def __invert__(self): return unary("invert", self)
    def __abs__(self): return math_call("abs", self)
    def __round__(self, ndigits=None):
        if ndigits is not None:
            raise fail("round(x, ndigits) is not supported; use round(x) (half to even)")
        return math_call("rint", self)
    def __floor__(self): return math_call("floor", self)
    def __ceil__(self): return math_call("ceil", self)
    def __trunc__(self): return math_call("trunc", self)

    def __bool__(self):
        raise fail(_TRUTH_HINT)

    def __float__(self):
        raise fail("float(x) needs a concrete number; to convert a traced value use rx.f32(x) or rx.f64(x); "
                   "for math functions use rx.sin, rx.sqrt, ... instead of the math module")

    def __int__(self):
        raise fail("int(x) needs a concrete number; to convert a traced value use rx.i32(x) or rx.i64(x)")

    def __index__(self):
        raise fail("a traced value cannot index a Python list or range; it can index a kernel array")

    def __iter__(self):
        raise fail("a traced value is a scalar; it cannot be iterated")


class Var(Value):
    """A mutable local variable (``rx.var``): assign with ``.set(x)`` or ``+=``, ``-=``, ``*=``, ..."""

    __slots__ = ()

    def set(self, x) -> Var:
        t = tracer()
        t.check_scope(self)
        if isinstance(x, Value) and x._op.type != self._op.type:
            w = _widen(self._op.type, x._op.type)
            if w != self._op.type:
                raise fail(f"assign: the variable is {self._op.type} but the value is {x._op.type}; "
                           f"convert with rx.{self._op.type}(...)")
            x = cast(x, self._op.type)
        t.emit(Assign(self._op.ref, operand(x, self._op.type, "assign")))
        return self

    def _update(self, op: str, o) -> Var:
        return self.set(binary(op, self, o) if op != "pow" else power(self, o))

    def __iadd__(self, o): return self._update("add", o)
    def __isub__(self, o): return self._update("sub", o)
    def __imul__(self, o): return self._update("mul", o)
    def __itruediv__(self, o): return self._update("div", o)
    def __ifloordiv__(self, o): return self._update("floordiv", o)
    def __imod__(self, o): return self._update("mod", o)
    def __ipow__(self, o): return self._update("pow", o)
    def __iand__(self, o): return self._update("and", o)
    def __ior__(self, o): return self._update("or", o)
    def __ixor__(self, o): return self._update("xor", o)
    def __ilshift__(self, o): return self._update("shl", o)
    def __irshift__(self, o): return self._update("shr", o)

    def __repr__(self) -> str:
        return f"<rx var {self._op.ref}: {self._op.type}>"


def new_var(init, type_: str | None) -> Var:
    t = tracer()
    if type_ is None:
        if isinstance(init, Value):
            type_ = init._op.type
        else:
            init = _plain(init)
            if isinstance(init, bool):
                type_ = BOOL
            elif isinstance(init, int):
                type_ = "i32" if -(2**31) <= init < 2**31 else "i64"
            elif isinstance(init, float):
                type_ = "f32"
            else:
                raise fail(f"rx.var: the initial value must be a number or a traced value, got {_describe(init)}")
    if isinstance(init, Value) and init._op.type != type_:
        init = cast(init, type_)
    name = t.fresh("r")
    t.emit(DeclVar(name, type_, operand(init, type_, "rx.var")))
    return Var(t, Operand("var", type_, name))


class ArrayHandle:
    """A kernel array inside the trace: ``x[i]`` loads, ``x[i] = v`` stores."""

    __slots__ = ("_ref", "_direction", "_count", "__weakref__")

    def __init__(self, ref: ArrayRef, direction: str, count: int | None = None):
        self._ref = ref
        self._direction = direction
        self._count = count

    @property
    def dtype(self) -> str:
        return self._ref.dtype

    def _label(self) -> str:
        if self._ref.kind == "shared":
            return f"shared array {self._ref.name} ({self._ref.dtype}[{self._count}])"
        kind = {"in": "In", "out": "Out", "inout": "InOut"}[self._direction]
        return f"'{self._ref.name}' (rx.{kind}[{self._ref.dtype}])"

    def __getitem__(self, i) -> Value:
        if self._direction == "out":
            raise fail(f"load: {self._label()} is an output; declare it rx.InOut[...] to read it too")
        idx = index_operand(i, f"load from {self._label()}")
        return tracer().value(self._ref.dtype, "load", (self._ref, idx))

    def __setitem__(self, i, v) -> None:
        if self._direction == "in":
            raise fail(f"store: {self._label()} is an input; declare it rx.Out[...] or rx.InOut[...] to "
                       f"write it")
        idx = index_operand(i, f"store to {self._label()}")
        if isinstance(v, Value) and v._op.type != self._ref.dtype:
            w = _widen(self._ref.dtype, v._op.type)
            if w != self._ref.dtype:
                raise fail(f"store: {self._label()} holds {self._ref.dtype} but the value is {v._op.type}; "
                           f"convert with rx.{self._ref.dtype}(...)")
            v = cast(v, self._ref.dtype)
        tracer().emit(Store(self._ref, idx, operand(v, self._ref.dtype, f"store to {self._label()}")))

    def __len__(self) -> int:
        if self._count is None:
            raise fail(f"len({self._ref.name}): a kernel array's length is the block size; use rx.size()")
        return self._count

    def __iter__(self):
        raise fail(f"iterating over {self._label()} is not supported; loop with rx.range and index it")

    def __repr__(self) -> str:
        return f"<rx array {self._label()}>"


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GENERATED = re.compile(r"^(?:[vrj]\d+|rx_\w*)$")
CPP_KEYWORDS = frozenset({
    "alignas", "alignof", "and", "asm", "auto", "bool", "break", "case", "catch", "char", "class", "const",
    "constexpr", "const_cast", "continue", "decltype", "default", "delete", "do", "double", "dynamic_cast",
    "else", "enum", "explicit", "export", "extern", "false", "float", "for", "friend", "goto", "if",
    "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "nullptr", "operator", "or",
    "private", "protected", "public", "register", "reinterpret_cast", "return", "short", "signed", "sizeof",
    "static", "static_assert", "static_cast", "struct", "switch", "template", "this", "thread_local",
    "throw", "true", "try", "typedef", "typeid", "typename", "union", "unsigned", "using", "virtual",
    "void", "volatile", "wchar_t", "while", "xor", "size_t", "threadIdx", "blockIdx", "blockDim", "gridDim",
    "warpSize"
})


def check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ComposeError(f"{what} {name!r} is not a valid identifier")
    if name in CPP_KEYWORDS or _GENERATED.match(name) or name.startswith("__"):
        raise ComposeError(f"{what} {name!r} is reserved in generated CUDA C++ (C++ keywords, names like "
                           f"v0/r0/j0 and names starting with rx_ or __); rename it")
    return name
