"""The tracer of composed kernels: it runs a Python function once over symbolic values (:class:`Value`),
type-checks every operation on the spot and appends it as an IR statement (``_ir.py``) to the innermost
open region (the kernel body, a ``with rx.if_(...)`` block, a ``for ... in rx.range(...)`` loop).

Type rules: operands of one operation must have the same type, except that an integer widens to a wider
integer of the same signedness, and a Python number adopts the other operand's type when it fits (an
``int`` fits any numeric type; a ``float`` only a float type). Anything else is a :class:`ComposeError`
naming the operation, the types and the line.
"""

from __future__ import annotations

import operator
import threading

from ._ir import (
    _BITS,
    BOOL,
    FLOAT_FUNCS,
    FLOAT_FUNCS2,
    FLOATS,
    INTS,
    ArrayRef,
    Assign,
    ComposeError,
    DeclVar,
    If,
    KernelIR,
    Let,
    Operand,
    Param,
    Reduction,
    SharedDecl,
    Store,
    _describe,
    fail,
    literal,
)

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


# NumPy ufuncs that stand for Python operators: NumPy calls them for ``np.float32(2) * x``.
_UFUNC_OPERATORS = {
    "add": operator.add, "subtract": operator.sub, "multiply": operator.mul, "true_divide": operator.truediv,
    "divide": operator.truediv, "floor_divide": operator.floordiv, "remainder": operator.mod,
    "power": operator.pow, "bitwise_and": operator.and_, "bitwise_or": operator.or_,
    "bitwise_xor": operator.xor, "left_shift": operator.lshift, "right_shift": operator.rshift,
    "less": operator.lt, "less_equal": operator.le, "greater": operator.gt, "greater_equal": operator.ge,
    "equal": operator.eq, "not_equal": operator.ne, "negative": operator.neg, "positive": operator.pos,
    "invert": operator.invert,
}
# NumPy names whose rx function is spelled differently
_NUMPY_TO_RX = {
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
    "arctanh": "atanh", "arctan2": "atan2", "absolute": "abs", "fabs": "abs", "minimum": "min", "fmin": "min",
    "maximum": "max", "fmax": "max", "rint": "round", "around": "round", "float_power": "pow", "clip": "clamp",
    "square": "pow", "select": "where",
}
_RX_NAMES = frozenset(
    [*FLOAT_FUNCS, *FLOAT_FUNCS2, "fma", "min", "max", "abs", "round", "where", "clamp", "isnan", "isinf",
     "isfinite"]
)


def _numpy_hint(name: str) -> str:
    rx_name = _NUMPY_TO_RX.get(name, name)
    if rx_name in _RX_NAMES:
        return f"use rx.{rx_name}(...) instead"
    return "use the rx functions (rx.sin, rx.exp, rx.where, ...) and operators on traced values instead"


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

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        op = _UFUNC_OPERATORS.get(ufunc.__name__)
        if op is not None and method == "__call__" and not kwargs:
            return op(*(_plain(x) for x in inputs))  # np.float32(2) * x: the Python operator
        raise fail(f"np.{ufunc.__name__}(...) cannot run on a traced value (NumPy computes on the host; the "
                   f"kernel runs on the GPU): {_numpy_hint(ufunc.__name__)}")

    def __array_function__(self, func, types, args, kwargs):
        raise fail(f"np.{func.__name__}(...) cannot run on a traced value (NumPy computes on the host; the "
                   f"kernel runs on the GPU): {_numpy_hint(func.__name__)}")

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


