"""Kernels composed in Python: a function traced over symbolic arrays and scalars, lowered to CUDA C++.

::

    import rxcuda as rx
    from rxcuda import f32

    @rx.kernel
    def saxpy(x: rx.In[f32], y: rx.In[f32], out: rx.Out[f32], a: f32 = 2.0):
        i = rx.thread_index()            # global 1-D index; the kernel runs only where i < size
        out[i] = a * x[i] + y[i]

    saxpy.source                         # the generated CUDA C++, readable
    saxpy.signature                      # x, y (in), out (out), a, size (the element count)
    code = saxpy.kernel_code()           # compiled (cached), a KernelCode for Block.from_kernel

The function runs once, at decoration, over symbolic values; every operation is type-checked as it is
recorded, so a type error is raised there, naming the operation, the types and your line. Everything the
function does becomes ONE kernel: a chain of elementwise operations, helper Python functions it calls,
loops over Python ``range`` (unrolled while tracing) - all fused.

Parameters are declared by annotations: ``rx.In[T]`` (read), ``rx.Out[T]`` (written), ``rx.InOut[T]``
(both) for arrays, a type (``f32``, ``f64``, ``i32``, ``i64``, ``u32``, ``u64``) for scalars, whose Python
default becomes the block parameter's default. Each kernel also takes the element count as a last
parameter (``size``, an ``i64`` defaulting to the block size); with ``guard=True`` (the default) the body
runs only for ``rx.thread_index() < size``.

Control flow: Python ``if`` cannot branch on a traced value; use ``with rx.if_(cond):`` /
``with rx.else_():`` or ``rx.where(cond, a, b)``. Loops: ``for j in rx.range(n):`` (a real loop; no
``break``/``continue``) or Python's ``range`` (unrolled). A value computed inside a block or loop stays
there; carry results out with ``acc = rx.var(0.0)`` and ``acc += ...``.

Memory and threads: ``rx.shared(f32, 256)`` (a shared array), ``rx.barrier()`` (needs ``guard=False``, so
that every thread reaches it), ``rx.thread_idx()``, ``rx.block_idx()``, ``rx.block_dim()``,
``rx.grid_dim()``, ``rx.atomic_add/min/max(arr, i, v)``. Reductions: ``rx.reduce_add(out, v)`` folds ``v``
of every thread into ``out[0]`` (block reduction, then one atomic per block; ``out`` must start at the
identity, e.g. zero, before the launch).
"""

from __future__ import annotations

import builtins
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs

from ..model import _dtypes
from ..model._describe import KernelCode, KernelParam, KernelSignature
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
    KernelIR,
    Operand,
    Param,
    Reduction,
    SharedDecl,
    fail,
)
from ._lower import lower
from ._trace import ArrayHandle, Tracer, Value, Var, tracer

__all__ = [
    "ArrayType", "ComposeError", "ComposedKernel", "DType", "In", "InOut", "Out", "Value", "Var",
    "f32", "f64", "i32", "i64", "u32", "u64",
    "kernel", "compose", "elementwise",
    "thread_index", "thread_idx", "block_idx", "block_dim", "grid_dim", "size",
    "shared", "barrier", "atomic_add", "atomic_min", "atomic_max", "reduce_add", "reduce_min", "reduce_max",
    "if_", "else_", "range", "where", "select", "cast", "var",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "cbrt",
    "floor", "ceil", "trunc", "round", "erf", "erfc", "pow", "atan2", "fmod", "hypot", "copysign", "fma",
    "min", "max", "abs", "clamp", "isnan", "isinf", "isfinite",
]

_SHARED_LIMIT = 48 * 1024  # static shared memory per block
#: Elements per thread a chunked (purely elementwise) kernel should be launched for: enough loads in
#: flight per thread to approach the copy bandwidth (measured on an H200, see bench/generated.py).
DEFAULT_ITEMS_PER_THREAD = 4


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
# the composed kernel
# ---------------------------------------------------------------------------------------------------
_memo_lock = threading.Lock()
_CODE_MEMO: dict[tuple, KernelCode] = {}
_memo_stats = {"hits": 0, "misses": 0}


class ComposedKernel:
    """A traced kernel: its IR, generated source, signature, and compiled code on request.

    Give it to ``rxcuda.Block.from_kernel(k, size=n)``, ``BlockBuilder.add_kernel(k)`` or
    ``block.set_code(name, k)`` (a kernel with the same parameters swaps in place: Code tier).
    """

    def __init__(self, ir: KernelIR, fn: Callable | None = None):
        self.ir = ir
        self.fn = fn
        self.fingerprint = ir.fingerprint()
        self._source: str | None = None
        self._signature: KernelSignature | None = None

    @property
    def name(self) -> str:
        return self.ir.name

    @property
    def items_per_thread(self) -> int:
        """Elements one thread handles when the kernel is launched for ``launch_threads(size)`` threads.
        Any launch of ``launch_threads(size)`` to ``size`` threads is correct (fewer leave elements out);
        1 for kernels whose elements are tied to threads (thread/block indices, shared memory,
        guard=False)."""
        return self.ir.items_per_thread

    def launch_threads(self, size: int) -> int:
        """Threads to launch for ``size`` elements: ``ceil(size / items_per_thread)``."""
        return builtins.max(1, -(-size // self.items_per_thread))

    @property
    def source(self) -> str:
        """The generated CUDA C++ (deterministic: equal IR, equal text)."""
        if self._source is None:
            self._source = lower(self.ir)
        return self._source

    @property
    def signature(self) -> KernelSignature:
        """Parameters in order: the function's, then the element count (``size``)."""
        if self._signature is None:
            params = []
            for p in self.ir.params:
                if p.kind == "array":
                    params.append(KernelParam(p.name, "pointer", 8, p.dtype, p.direction, None, 8))
                else:
                    n = _dtypes.itemsize(p.dtype)
                    params.append(KernelParam(p.name, "scalar", n, p.dtype, "in", p.default, n))
            params.append(KernelParam(self.ir.size_param, "scalar", 8, "i64", "in", "size", 8))
            self._signature = KernelSignature(entry=self.name, params=tuple(params))
        return self._signature

    def kernel_code(self, arch: str | None = None, target: str = "cubin",
                    options: Mapping[str, object] | None = None) -> KernelCode:
        """Compile (once per IR, architecture and target in a process; the disk cache across processes)
        and return the :class:`KernelCode`. ``arch`` defaults to the current device's, else ``sm_90``;
        ``options`` adds :class:`cuda.core.ProgramOptions` fields."""
        from ._nvrtc import default_arch, default_compiler

        arch = arch or default_arch()
        options = dict(options or {})
        key = (self.fingerprint, arch, target, self.ir.block_size, tuple(sorted(options.items())))
        with _memo_lock:
            code = _CODE_MEMO.get(key)
            _memo_stats["hits" if code is not None else "misses"] += 1
        if code is not None:
            return code
        module = default_compiler().compile_module(self.source, arch=arch, target=target,
                                                   name=f"{self.name}.cu", options=options)
        compiled = module.kernels.get(self.name)
        if compiled is None or not compiled.same_layout(self.signature):
            raise ComposeError(f"{self.name}: the compiled kernel's parameters do not match the composition "
                               f"(an rxcuda bug); generated source:\n{self.source}")
        code = KernelCode(entry=self.name, image=module.image, format=module.format, signature=self.signature,
                          origin=f"<composed {self.name}>", block_size=self.ir.block_size,
                          items_per_thread=self.items_per_thread)
        with _memo_lock:
            _CODE_MEMO[key] = code
        return code

    compile = kernel_code

    def __call__(self, *args, **kwargs):
        raise TypeError(f"composed kernel '{self.name}' runs in a pipeline, not as a Python call: "
                        f"rxcuda.Block.from_kernel({self.name}, size=n)")

    def __repr__(self) -> str:
        parts = []
        for p in self.ir.params:
            t = f"{_KIND[p.direction]}[{p.dtype}]" if p.kind == "array" else p.dtype
            parts.append(f"{p.name}: {t}")
        parts.append(self.ir.size_param)
        return f"<ComposedKernel {self.name}({', '.join(parts)}) ir {self.fingerprint[:12]}>"


def code_cache_info() -> dict[str, int]:
    """Hits and misses of the in-process IR -> code memo, and how many codes it holds."""
    with _memo_lock:
        return {**_memo_stats, "entries": len(_CODE_MEMO)}


def _clear_code_memo() -> None:
    with _memo_lock:
        _CODE_MEMO.clear()
        _memo_stats.update(hits=0, misses=0)


def _kernel_name(name: str | None, fn, fallback: str) -> str:
    if name is None:
        name = getattr(fn, "__name__", fallback)
        if not name.isidentifier():
            name = fallback
    return _ir.check_name(name, "kernel name")


def _param_types(fn, params: Mapping[str, Any] | None) -> list[tuple[str, Any, Any]]:
    """[(name, type spec, default)] from the function's signature and annotations (or ``params``)."""
    sig = inspect.signature(fn)
    try:
        notes = inspect.get_annotations(fn, eval_str=True)
    except Exception as e:
        notes = {}
        if params is None:
            raise ComposeError(f"{getattr(fn, '__name__', fn)}: cannot evaluate its annotations ({e}); "
                               f"pass params={{...}} instead") from None
    out = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ComposeError(f"{fn.__name__}: *args/**kwargs cannot be kernel parameters")
        spec = (params or {}).get(p.name, notes.get(p.name))
        if spec is None:
            raise ComposeError(f"{fn.__name__}: parameter '{p.name}' has no type; annotate it, e.g. "
                               f"'{p.name}: rx.In[f32]' for an array or '{p.name}: f32' for a scalar")
        out.append((p.name, spec, None if p.default is p.empty else p.default))
    for extra in set(params or {}) - set(sig.parameters):
        raise ComposeError(f"{fn.__name__}: params names '{extra}', which the function does not take")
    return out


def _declare(t: Tracer, name: str, spec, default) -> tuple[Param, object]:
    _ir.check_name(name, "parameter")
    if isinstance(spec, ArrayType):
        if default is not None:
            raise ComposeError(f"array parameter '{name}' cannot have a default; bind or connect a buffer")
        handle = ArrayHandle(ArrayRef("param", name, spec.dtype), spec.direction)
        return Param(name, "array", spec.dtype, spec.direction), handle
    if isinstance(spec, type) and issubclass(spec, _Array):
        raise ComposeError(f"parameter '{name}': write {spec.__name__}[f32] (with an element type)")
    dtype = _type_name(spec, f"parameter '{name}'")
    if default is not None:
        if isinstance(default, bool) or not isinstance(default, int | float):
            raise ComposeError(f"scalar '{name}': default must be a number, got {default!r}")
        _ir.literal(default, dtype, f"default of '{name}'")  # raises if it does not fit
        if dtype in INTS:
            default = int(default)
    return Param(name, "scalar", dtype, "in", default), Value(t, Operand("param", dtype, name), (0,))


def compose(
    fn: Callable,
    *,
    name: str | None = None,
    params: Mapping[str, Any] | None = None,
    guard: bool = True,
    size_param: str = "size",
    block_size: int = 256,
    items_per_thread: int | None = None,
) -> ComposedKernel:
    """Trace ``fn`` into a :class:`ComposedKernel`. ``params`` gives parameter types instead of
    annotations (``{"x": rx.In[f32], "a": f32}``). ``guard``: run the body only where
    ``rx.thread_index() < size`` (turn off to use ``rx.barrier()``; then guard memory accesses yourself).
    ``block_size``: threads per block the engine launches it with. ``items_per_thread``: elements per
    thread to launch an elementwise kernel for (default :data:`DEFAULT_ITEMS_PER_THREAD`)."""
    kname = _kernel_name(name, fn, "composed")
    _ir.check_name(size_param, "size_param")
    if not isinstance(block_size, int) or not 1 <= block_size <= 1024:
        raise ComposeError(f"block_size must be 1 to 1024 (got {block_size!r})")
    t = Tracer(kname, guard, size_param)
    decls, handles = [], {}
    for pname, spec, default in _param_types(fn, params):
        if pname == size_param:
            raise ComposeError(f"{kname}: parameter '{pname}' clashes with the element-count parameter; "
                               f"rename it or pass size_param='...'")
        p, h = _declare(t, pname, spec, default)
        decls.append(p)
        handles[pname] = h
    with t:
        result = fn(**handles)
    if result is not None:
        raise ComposeError(f"{kname}: a composed kernel returns nothing; store results into an rx.Out "
                           f"array (out[i] = ...), or use rx.elementwise for a function that returns a value")
    return ComposedKernel(_items(t.finish(tuple(decls), block_size), items_per_thread), fn)


def _items(ir: KernelIR, items_per_thread: int | None) -> KernelIR:
    if items_per_thread is None:
        ir.items_per_thread = DEFAULT_ITEMS_PER_THREAD if ir.elementwise() else 1
        return ir
    if isinstance(items_per_thread, bool) or not isinstance(items_per_thread, int) or not 1 <= items_per_thread <= 16:
        raise ComposeError(f"items_per_thread must be an int from 1 to 16 (got {items_per_thread!r})")
    if items_per_thread > 1 and not ir.elementwise():
        raise ComposeError(f"{ir.name}: items_per_thread={items_per_thread} needs an elementwise kernel (guard=True, "
                           f"no thread/block index, no shared memory); each thread here is one element")
    ir.items_per_thread = items_per_thread
    return ir


def kernel(fn: Callable | None = None, /, *, name: str | None = None, guard: bool = True,
           size_param: str = "size", block_size: int = 256, items_per_thread: int | None = None):
    """Decorator form of :func:`compose`: ``@rx.kernel`` or ``@rx.kernel(guard=False, block_size=128)``."""
    kw = dict(name=name, guard=guard, size_param=size_param, block_size=block_size,
              items_per_thread=items_per_thread)
    if fn is None:
        return lambda f: compose(f, **kw)
    return compose(fn, **kw)


def elementwise(
    fn: Callable,
    /,
    *,
    name: str | None = None,
    out: str | tuple[str, ...] = "out",
    out_dtype=None,
    block_size: int = 256,
    items_per_thread: int | None = None,
    **params,
) -> ComposedKernel:
    """A kernel from a function of elements: ``out[i] = fn(x[i], ..., scalars...)``.

    ``params`` name the inputs in the order ``fn`` takes them: ``rx.In[T]`` arrays (``fn`` gets the element)
    and scalar types. The output's type is the result's (or ``out_dtype``); return a tuple and name as
    many outputs in ``out``.

    >>> softplus = elementwise(lambda x, beta: log(1.0 + exp(beta * x)) / beta, x=In[f32], beta=f32)
    """
    kname = _kernel_name(name, fn, "elementwise")
    outs = (out,) if isinstance(out, str) else tuple(out)
    t = Tracer(kname, True, "size")
    decls, args = [], []
    with t:
        i = thread_index()
        for pname, spec in params.items():
            p, h = _declare(t, pname, spec, None)
            if p.kind == "array" and p.direction != "in":
                raise ComposeError(f"{kname}: '{pname}' must be rx.In[...] (outputs are named by out=)")
            decls.append(p)
            args.append(h[i] if p.kind == "array" else h)
        result = fn(*args)
        results = result if isinstance(result, tuple) else (result,)
        if len(results) != len(outs):
            raise ComposeError(f"{kname}: the function returns {len(results)} value(s) but out names "
                               f"{len(outs)} ({', '.join(outs)})")
        for oname, value in zip(outs, results, strict=True):
            if oname in params:
                raise ComposeError(f"{kname}: output '{oname}' has the name of an input")
            if not isinstance(value, Value):
                raise ComposeError(f"{kname}: output '{oname}' is the constant {value!r}; return a traced value "
                                   f"(e.g. rx.f32({value!r}))")
            dtype = _type_name(out_dtype, "out_dtype") if out_dtype is not None else value.dtype
            if dtype == BOOL:
                raise ComposeError(f"{kname}: output '{oname}' is a bool; convert it, e.g. rx.u32(cond)")
            p, h = _declare(t, oname, ArrayType("out", dtype), None)
            decls.append(p)
            h[i] = _trace.cast(value, dtype) if value.dtype != dtype else value
    return ComposedKernel(_items(t.finish(tuple(decls), block_size), items_per_thread), fn)


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


