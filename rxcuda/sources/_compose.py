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

This module traces and compiles (``compose``, ``kernel``, ``elementwise``, :class:`ComposedKernel`); the
types and operations live in ``_lang`` and are re-exported here, so this module (like ``rxcuda.lang``) is
the language's whole namespace.
"""

from __future__ import annotations

import builtins
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..model import _dtypes
from ..model._describe import KernelCode, KernelParam, KernelSignature
from . import _ir, _lang, _trace
from ._ir import BOOL, INTS, ArrayRef, ComposeError, KernelIR, Operand, Param
from ._lang import *  # noqa: F403 - the language's names, so this module is the whole namespace (rxcuda.lang)
from ._lang import _KIND, ArrayType, _Array, _type_name, thread_index
from ._lower import lower
from ._trace import ArrayHandle, Tracer, Value

__all__ = ["ComposeError", "ComposedKernel", "kernel", "compose", "elementwise", *_lang.__all__]

#: Elements per thread a chunked (purely elementwise) kernel should be launched for: enough loads in
#: flight per thread to approach the copy bandwidth (measured on an H200, see bench/generated.py).
DEFAULT_ITEMS_PER_THREAD = 4


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

    def kernel_code(self, arch: str | None = None, target: str | None = None,
                    options: Mapping[str, object] | None = None) -> KernelCode:
        """Compile (once per IR, architecture and target in a process; the disk cache across processes)
        and return the :class:`KernelCode`. ``arch`` defaults to the current device's, else ``sm_90``;
        ``options`` adds :class:`cuda.core.ProgramOptions` fields."""
        from ._nvrtc import default_arch, default_compiler, default_target

        arch = arch or default_arch()
        target = target or default_target()
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
