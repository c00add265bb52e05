"""The operations NumPy users reach for, beyond the core ones of ``_tensor``: ``// % & | ^ ~``, ``float(t)``,
``t.item()``, ``t.tolist()``, ``argmax``/``argmin``, ``concatenate``/``stack``, ``clip``, ``squeeze``/
``expand_dims``, ``std``/``var``, ``prod``, ``cumsum``, ``take`` (integer-array indexing), and NumPy's own
functions on tensors (``np.exp(t)``, ``np.sum(t)``: ``__array_ufunc__`` / ``__array_function__``).

The new elementwise and scan ops are groups of their own (``_graph.OPAQUE``): NumPy runs them on ``cpu``, CuPy on
``cuda`` (no fused kernel yet); the rest are compositions of the core ops, so they fuse and have gradients.
Their methods are attached to :class:`~._tensor.Tensor` here, keeping ``_tensor.py`` to the core.

>>> import numpy as np, rxcuda.tensor as rt
>>> t = rt.tensor([[3, 1], [2, 5]])
>>> (t // 2).numpy().tolist(), (t % 2).tolist(), float(t.max()), rt.argmax(t, axis=1).tolist()
([[1, 0], [1, 2]], [[1, 1], [0, 1]], 5.0, [0, 1])
>>> np.exp(rt.tensor([0.0])).numpy()       # NumPy's ufuncs build tensor ops
array([1.])
>>> print(rt.tensor([1.5, 2.0]))
Tensor([1.5, 2. ], dtype=float64, device='cpu')
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from ..model._shapes import ShapeError, fmt
from . import _autograd, _ops, _run, _vjp
from ._cpu import EXTRA
from ._graph import Node
from ._tensor import Tensor, _as_tensor, _elementwise, _nodes, matmul, maximum, minimum, sqrt, tensor, where  # noqa: F401 - tensor: the doctests

__all__ = ["argmax", "argmin", "clip", "concatenate", "cumsum", "expand_dims", "prod", "squeeze", "stack", "std",
           "take", "var"]

_ops.UFUNCS.update({"floordiv": np.floor_divide, "mod": np.remainder, "bitand": np.bitwise_and,
                    "bitor": np.bitwise_or, "bitxor": np.bitwise_xor, "invert": np.invert})


def _binary(op: str):
    def f(self, o):
        return _elementwise(op, self, o)

    def r(self, o):
        return _elementwise(op, o, self)

    return f, r


# -- host reads: the value of a tensor on the host (refused inside a traced function) --------------------------
def _scalar(t: Tensor, what: str):
    if t.size != 1:
        raise TypeError(f"{what} needs a tensor of one element (this one has shape {fmt(t.shape)}); reduce it "
                        "first (t.sum(), t.max()) or read t.numpy()")
    return t.numpy().reshape(()).item()


def item(self):
    """The value of a one-element tensor as a Python number (evaluates it), like ``ndarray.item()``."""
    return _scalar(self, "item()")


def tolist(self):
    """The value as nested Python lists (evaluates it), like ``ndarray.tolist()``."""
    return self.numpy().tolist()


def _float(self) -> float:
    return float(_scalar(self, "float(t)"))


def _int(self) -> int:
    if self.dtype.kind not in "iub":
        return int(_float(self))
    return int(_scalar(self, "int(t)"))


def _bool(self):
    tr = _run.TRACING.stack[-1] if _run.TRACING.stack else None
    if tr is not None:
        raise tr.refusal("a Python branch on a tensor (if t:, while t:, and/or, bool(t))")
    raise TypeError("the truth value of a lazy tensor is not known until it runs: use bool(t.numpy()), or "
                    "rxcuda.tensor.where(cond, a, b) to choose inside the program")


def _str(self) -> str:
    if _run.TRACING.stack:
        return f"Tensor(traced {self.node.op}, shape={self.shape}, dtype={self.dtype}, device={self.device!r})"
    body = np.array2string(self.numpy(), separator=", ", prefix="Tensor(")
    return f"Tensor({body}, dtype={self.dtype}, device={self.device!r})"


_SETITEM = Tensor.__setitem__
_BACKWARD = Tensor.backward


def _setitem(self, index, value) -> None:
    from ._function import write

    if not write(self, index, value):
        _SETITEM(self, index, value)


_setitem.__doc__ = _SETITEM.__doc__


def _backward(self, gradient=None) -> None:
    tr = _run.TRACING.stack[-1] if _run.TRACING.stack else None
    if tr is not None:
        raise TypeError(f"loss.backward() inside rxcuda.tensor.function '{tr.name}' would accumulate into .grad "
                        "across calls; use grads = rt.grad(loss, [w, b]) and pass them on (opt.step(grads))")
    _BACKWARD(self, gradient)


_backward.__doc__ = _BACKWARD.__doc__


def _getitem(self, index):
    parts = index if isinstance(index, tuple) else (index,)
    arrays = [k for k, p in enumerate(parts) if _is_index_array(p)]
    if not arrays:
        return Tensor(_ops.getitem(self.node, index))
    p = parts[arrays[0]]
    kind = p.dtype if hasattr(p, "dtype") else np.asarray(p).dtype
    if np.dtype(str(kind)).kind == "b":
        raise IndexError("boolean-mask indexing (t[mask]) gives a shape known only from the mask's values, which a "
                         "lazy program does not know before it runs: keep the shape with rt.where(mask, t, 0) (and "
                         "t.sum() over it), or index the host value t.numpy()[mask.numpy()]")
    if arrays != [0] or any(q is not Ellipsis and q != slice(None) for q in parts[1:]):
        raise IndexError("integer-array indexing is supported on the first axis (t[idx], t[idx, ...]); for another "
                         "axis use rt.take(t, idx, axis=k)")
    return take(self, p, axis=0)


def _is_index_array(p) -> bool:
    if isinstance(p, Tensor):
        return True
    if isinstance(p, list | np.ndarray):
        return True
    return hasattr(p, "__cuda_array_interface__")


# -- new ops ----------------------------------------------------------------------------------------------------
def _opaque(op: str, inputs: tuple[Node, ...], attrs: tuple, shape, dtype) -> Tensor:
    return Tensor(_ops.op_node(op, inputs, attrs, shape, dtype))


def _one_axis(axis, ndim: int, op: str) -> int:
    return _ops.normalize_axes(axis, ndim, op)[0]


def _arg(op: str, x, axis, keepdims: bool) -> Tensor:
    x = _as_tensor(x)
    if x.size == 0:
        raise ValueError(f"{op} of an empty tensor (shape {fmt(x.shape)}): there is no position to give")
    if axis is None:
        shape = (1,) * x.ndim if keepdims else ()
    else:
        a = _one_axis(axis, x.ndim, op)
        axis = a
        shape = tuple(1 if i == a else d for i, d in enumerate(x.shape)) if keepdims else \
            tuple(d for i, d in enumerate(x.shape) if i != a)
    return _opaque(op, (x.node,), (axis, bool(keepdims)), shape, np.dtype(np.intp))


def argmax(x, axis=None, keepdims: bool = False) -> Tensor:
    """Position of the maximum over ``axis`` (None: of the flattened tensor), int64 (``numpy.argmax``; the
    first one among ties; no gradient).

    >>> argmax(tensor([[1, 9], [7, 2]]), axis=0).numpy()
    array([1, 0])
    """
    return _arg("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims: bool = False) -> Tensor:
    """Position of the minimum over ``axis`` (``numpy.argmin``; see :func:`argmax`)."""
    return _arg("argmin", x, axis, keepdims)


def prod(x, axis=None, keepdims: bool = False) -> Tensor:
    """Product over ``axis`` (``numpy.prod``: ints widen as NumPy's do). Its gradient is ``g * prod / x``, so an
    element that is exactly 0 gets NaN gradient; use ``exp(log(x).sum())`` for positive inputs instead."""
    x = _as_tensor(x)
    axes = _ops.normalize_axes(axis, x.ndim, "prod")
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keepdims else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    dtype = np.prod(np.ones(1, x.dtype)).dtype
    return _opaque("prod", (x.node,), (axes, bool(keepdims)), shape, dtype)


def cumsum(x, axis=None) -> Tensor:
    """Running sum along ``axis`` (None: of the flattened tensor), as ``numpy.cumsum``.

    >>> cumsum(tensor([1, 2, 3])).numpy()
    array([1, 3, 6])
    """
    x = _as_tensor(x)
    if axis is None:
        x, axis = x.reshape(-1), 0
    a = _one_axis(axis, x.ndim, "cumsum")
    dtype = np.cumsum(np.ones(1, x.dtype)).dtype
    return _opaque("cumsum", (x.node,), (a,), x.shape, dtype)


def concatenate(tensors, axis: int = 0) -> Tensor:
    """Join ``tensors`` along an existing ``axis`` (``numpy.concatenate``; dtypes promote as NumPy's).

    >>> concatenate([tensor([1, 2]), tensor([3])]).numpy()
    array([1, 2, 3])
    """
    xs = [_as_tensor(t) for t in tensors]
    if not xs:
        raise ValueError("concatenate needs at least one tensor")
    if any(not x.shape for x in xs):
        raise ShapeError("concatenate: zero-dimensional tensors cannot be joined; use rt.stack(...)")
    nd = xs[0].ndim
    if any(x.ndim != nd for x in xs):
        raise ShapeError(f"concatenate: all tensors need the same number of axes (got shapes "
                         f"{', '.join(fmt(x.shape) for x in xs)})")
    a = _one_axis(axis, nd, "concatenate")
    for x in xs[1:]:
        if any(d != e for i, (d, e) in enumerate(zip(x.shape, xs[0].shape, strict=True)) if i != a):
            raise ShapeError(f"concatenate along axis {a}: shapes {fmt(xs[0].shape)} and {fmt(x.shape)} differ on "
                             "another axis (every axis but the joined one must match)")
    dtype = np.result_type(*(x.dtype for x in xs))
    nodes = tuple(_ops.cast(x.node, dtype) for x in xs)
    shape = tuple(builtins.sum(x.shape[a] for x in xs) if i == a else d for i, d in enumerate(xs[0].shape))
    return _opaque("concat", nodes, (a,), shape, dtype)


def stack(tensors, axis: int = 0) -> Tensor:
    """Join ``tensors`` of one shape along a new ``axis`` (``numpy.stack``)."""
    xs = [_as_tensor(t) for t in tensors]
    if not xs:
        raise ValueError("stack needs at least one tensor")
    if any(x.shape != xs[0].shape for x in xs):
        raise ShapeError(f"stack: all tensors need one shape (got {', '.join(fmt(x.shape) for x in xs)})")
    return concatenate([expand_dims(x, axis) for x in xs], axis=axis)


def take(x, indices, axis: int = 0) -> Tensor:
    """Elements of ``x`` at integer ``indices`` along ``axis`` (``numpy.take``; ``t[idx]`` is ``take(t, idx)``).
    Negative indices count from the end; no gradient flows through it yet.

    >>> take(tensor([10, 20, 30]), [2, 0]).numpy()
    array([30, 10])
    """
    x = _as_tensor(x)
    idx = indices if isinstance(indices, Tensor) else Tensor(_nodes(np.asarray(indices))[0])
    if idx.device != x.device:
        idx = idx.to(x.device)
    if idx.dtype.kind not in "iu":
        raise IndexError(f"take: indices must be integers (got {idx.dtype})")
    a = _one_axis(axis, x.ndim, "take")
    shape = x.shape[:a] + idx.shape + x.shape[a + 1:]
    return _opaque("take", (x.node, idx.node), (a,), shape, x.dtype)


def clip(x, a_min=None, a_max=None) -> Tensor:
    """``x`` limited to ``[a_min, a_max]`` (``numpy.clip``: ``minimum(maximum(x, a_min), a_max)``; either bound
    may be None; tensors broadcast)."""
    if a_min is None and a_max is None:
        raise ValueError("clip needs a_min, a_max or both")
    out = _as_tensor(x)
    if a_min is not None:
        out = maximum(out, a_min)
    if a_max is not None:
        out = minimum(out, a_max)
    return out


def squeeze(x, axis=None) -> Tensor:
    """``x`` without its length-1 axes (or only ``axis``, which must have length 1): a view."""
    x = _as_tensor(x)
    axes = tuple(i for i, d in enumerate(x.shape) if d == 1) if axis is None else \
        _ops.normalize_axes(axis, x.ndim, "squeeze")
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} has length {x.shape[a]} (shape {fmt(x.shape)}); only axes of "
                             "length 1 can be removed")
    return x.reshape(tuple(d for i, d in enumerate(x.shape) if i not in axes))


def expand_dims(x, axis) -> Tensor:
    """``x`` with a new axis of length 1 at ``axis`` (an int or a tuple): a view (``numpy.expand_dims``)."""
    x = _as_tensor(x)
    axes = (axis,) if isinstance(axis, int | np.integer) else tuple(axis)
    nd = x.ndim + len(axes)
    at = _ops.normalize_axes(axes, nd, "expand_dims")
    dims = iter(x.shape)
    return x.reshape(tuple(1 if i in at else next(dims) for i in range(nd)))


def var(x, axis=None, ddof: int = 0, keepdims: bool = False) -> Tensor:
    """Variance over ``axis`` (``numpy.var``: ``mean(abs(x - x.mean())**2)``, divided by ``n - ddof``)."""
    x = _as_tensor(x)
    axes = _ops.normalize_axes(axis, x.ndim, "var")
    n = math.prod(x.shape[a] for a in axes)
    d = x - x.mean(axes, keepdims=True)
    out = (d * d).mean(axes, keepdims=keepdims)
    if not ddof:
        return out
    return out * (n / (n - ddof) if n > ddof else np.inf)  # NumPy's inf (nan for 0/0) where n <= ddof


def std(x, axis=None, ddof: int = 0, keepdims: bool = False) -> Tensor:
    """Standard deviation over ``axis`` (``numpy.std``: the square root of :func:`var`)."""
    return sqrt(var(x, axis, ddof, keepdims))


# -- how each op runs (NumPy on cpu, CuPy on cuda: xp) ----------------------------------------------------------
def _run_arg(node, args, xp):
    axis, keepdims = node.attrs
    f = xp.argmax if node.op == "argmax" else xp.argmin
    out = f(args[0], axis=axis)
    if keepdims:
        out = xp.reshape(out, node.shape)
    return out


def _run_concat(node, args, xp):
    return xp.concatenate(args, axis=node.attrs[0])


def _run_take(node, args, xp):
    return xp.take(args[0], args[1], axis=node.attrs[0])


EXTRA.update({
    "argmax": _run_arg, "argmin": _run_arg, "concat": _run_concat, "take": _run_take,
    "prod": lambda node, args, xp: xp.prod(args[0], axis=node.attrs[0], keepdims=node.attrs[1]),
    "cumsum": lambda node, args, xp: xp.cumsum(args[0], axis=node.attrs[0]),
})


# -- gradients ----------------------------------------------------------------------------------------------------
def _rule_prod(n, g, ins, out, want):
    (x,) = ins
    axes, keepdims = n.attrs
    if not keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        g, out = g.reshape(shape), out.reshape(shape)
    return (g * out / x,)


def _rule_cumsum(n, g, ins, out, want):
    a = n.attrs[0]
    flip = tuple(slice(None, None, -1) if i == a else slice(None) for i in range(len(n.shape)))
    return (cumsum(g[flip], axis=a)[flip],)


def _rule_concat(n, g, ins, out, want):
    a = n.attrs[0]
    outs, at = [], 0
    for x in ins:
        k = x.shape[a]
        outs.append(g[tuple(slice(at, at + k) if i == a else slice(None) for i in range(len(n.shape)))])
        at += k
    return tuple(outs)


def _rule_take(n, g, ins, out, want):
    raise _autograd.GradientError("no gradient flows through take / integer-array indexing yet; gather with a "
                                  "one-hot matmul (onehot @ table) where the gradient is needed")


_vjp._RULES.update({"prod": _rule_prod, "cumsum": _rule_cumsum, "concat": _rule_concat, "take": _rule_take})
_vjp._NO_GRAD_OPS = _vjp._NO_GRAD_OPS | {"floordiv", "mod", "bitand", "bitor", "bitxor", "invert", "argmax",
                                         "argmin"}
_autograd._NO_GRAD_OPS = _vjp._NO_GRAD_OPS


# -- NumPy's functions on tensors ------------------------------------------------------------------------------
_UFUNC_OPS = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div", np.power: "pow",
              np.negative: "neg", np.exp: "exp", np.log: "log", np.sqrt: "sqrt", np.sin: "sin", np.cos: "cos",
              np.tanh: "tanh", np.absolute: "abs", np.maximum: "maximum", np.minimum: "minimum", np.equal: "eq",
              np.not_equal: "ne", np.less: "lt", np.less_equal: "le", np.greater: "gt", np.greater_equal: "ge",
              np.floor_divide: "floordiv", np.remainder: "mod", np.bitwise_and: "bitand", np.bitwise_or: "bitor",
              np.bitwise_xor: "bitxor", np.invert: "invert"}


def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    op = _UFUNC_OPS.get(ufunc)
    if op is None or method != "__call__" or kwargs:
        what = f"numpy.{ufunc.__name__}" + (f".{method}" if method != "__call__" else "")
        extra = f" with {', '.join(kwargs)}" if kwargs else ""
        raise TypeError(f"{what}{extra} has no tensor op: use an rxcuda.tensor function (rt.exp, rt.sum, "
                        "rt.where...), or call it on the host value np.asarray(t) / t.numpy()")
    return _elementwise(op, *inputs)


def _var_fn(x, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    return var(x, axis, ddof, keepdims)


def _std_fn(x, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    return std(x, axis, ddof, keepdims)


def _functions() -> dict:
    from . import _tensor as T

    return {np.sum: T.sum, np.mean: T.mean, np.max: T.max, np.min: T.min, np.amax: T.max, np.amin: T.min,
            np.prod: prod, np.var: _var_fn, np.std: _std_fn, np.argmax: argmax, np.argmin: argmin, np.cumsum: cumsum,
            np.concatenate: concatenate, np.stack: stack, np.clip: clip, np.squeeze: squeeze,
            np.expand_dims: expand_dims, np.where: where, np.matmul: matmul, np.take: take,
            np.reshape: lambda a, shape: _as_tensor(a).reshape(shape),
            np.transpose: lambda a, axes=None: _as_tensor(a).transpose(*(axes or ())),
            np.broadcast_to: lambda a, shape: _as_tensor(a).broadcast_to(shape)}


_FUNCTIONS: dict = {}


def _array_function(self, func, types, args, kwargs):
    if not _FUNCTIONS:
        _FUNCTIONS.update(_functions())
    f = _FUNCTIONS.get(func)
    if f is not None:
        return f(*args, **kwargs)
    # NumPy functions without a tensor op run on the host values (refused inside a traced function)
    return func(*_host(args), **_host(kwargs))


def _host(obj):
    if isinstance(obj, Tensor):
        return obj.numpy()
    if isinstance(obj, tuple | list):
        return type(obj)(_host(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _host(v) for k, v in obj.items()}
    return obj


_METHODS = {
    "__floordiv__": _binary("floordiv")[0], "__rfloordiv__": _binary("floordiv")[1],
    "__mod__": _binary("mod")[0], "__rmod__": _binary("mod")[1],
    "__and__": _binary("bitand")[0], "__rand__": _binary("bitand")[1],
    "__or__": _binary("bitor")[0], "__ror__": _binary("bitor")[1],
    "__xor__": _binary("bitxor")[0], "__rxor__": _binary("bitxor")[1],
    "__invert__": lambda self: _elementwise("invert", self),
    "__float__": _float, "__int__": _int, "__bool__": _bool, "__str__": _str, "item": item, "tolist": tolist,
    "__setitem__": _setitem, "backward": _backward, "__getitem__": _getitem,
    "__array_ufunc__": _array_ufunc, "__array_function__": _array_function,
    "argmax": lambda self, axis=None, keepdims=False: argmax(self, axis, keepdims),
    "argmin": lambda self, axis=None, keepdims=False: argmin(self, axis, keepdims),
    "prod": lambda self, axis=None, keepdims=False: prod(self, axis, keepdims),
    "cumsum": lambda self, axis=None: cumsum(self, axis),
    "var": lambda self, axis=None, ddof=0, keepdims=False: var(self, axis, ddof, keepdims),
    "std": lambda self, axis=None, ddof=0, keepdims=False: std(self, axis, ddof, keepdims),
    "clip": lambda self, a_min=None, a_max=None: clip(self, a_min, a_max),
    "squeeze": lambda self, axis=None: squeeze(self, axis),
    "flatten": lambda self: self.reshape(-1),
}
for _name, _method in _METHODS.items():  # attached here so _tensor.py keeps the core (see the module docstring)
    if _name in __all__:
        _method.__name__ = _method.__qualname__ = _name
        _method.__doc__ = f"``rt.{_name}(t, ...)`` as a method. " + (globals()[_name].__doc__ or "")
    setattr(Tensor, _name, _method)
