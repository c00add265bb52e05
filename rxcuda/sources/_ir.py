"""The IR of composed kernels: plain data that the tracer (``_trace.py``) records and ``_lower.py`` turns
into CUDA C++.

A :class:`KernelIR` holds parameters, shared arrays, reductions and a statement tree, with a
:meth:`~KernelIR.fingerprint` that identifies it for the compile cache. Constants are spelled by
:func:`literal`, names checked by :func:`check_name`.

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
from typing import Any

import attrs

from ..model import _dtypes
from ..model._errors import RxcudaError

BOOL = "bool"
INTS = ("i32", "i64", "u32", "u64")
FLOATS = ("f32", "f64")
NUMERIC = INTS + FLOATS
TYPES = (BOOL,) + NUMERIC
#: C++ spelling of each type (from the one dtype table)
C_TYPES = {t: "bool" if t == BOOL else _dtypes.c_name(t) for t in TYPES}
_BITS = {t: 8 * _dtypes.itemsize(t) for t in INTS}
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



def _describe(x) -> str:
    op = getattr(x, "_op", None)  # a traced value
    if isinstance(op, Operand):
        return op.type
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
