"""The vector-Jacobian rules of reverse-mode autograd (``_autograd`` walks the graph and applies them): one rule
per op, written with the same lazy tensor operations as the forward program, so gradients are graphs that go
through the same passes, kernels and caches. A rule takes the node, the gradient of its output, its inputs and
output as tensors and which inputs want a gradient, and returns one gradient (or None) per input; ``_fit`` then
unbroadcasts each to its input's shape and dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from . import _ops

# --- helpers built from lazy ops --------------------------------------------------------------------------------


class _Api:
    """The few tensor constructors the rules need, on top of the ``Tensor`` of ``rxcuda.tensor`` (``_tensor``
    hands them in through :func:`use_tensors` when it is imported: this module is below it, so it does not
    import it)."""

    def __init__(self, tensor: type, cos: Callable, log: Callable, sin: Callable, where: Callable) -> None:
        self.Tensor, self.wrap, self.log, self.sin, self.cos, self.where = tensor, tensor, log, sin, cos, where
        self._ops = _ops

    def full(self, shape: tuple[int, ...], value: float, like: Any) -> Any:
        """A fill of ``like``'s dtype and device (``like``: a Node or a Tensor)."""
        return self.Tensor(self._ops.full(tuple(shape), value, like.dtype, like.device))

    def const(self, array: np.ndarray, like: Any) -> Any:
        node = self._ops.const(np.asarray(array, dtype=like.dtype), True, "cpu")
        return self.Tensor(self._ops.copy(node, like.device))

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.broadcast_to(shape)

    @staticmethod
    def reduce_axes(node: Any) -> tuple[tuple[int, ...], bool]:
        return node.attrs[0], node.attrs[1]

    @staticmethod
    def transpose_axes(node: Any) -> tuple[int, ...]:
        return node.attrs[0]


_api: _Api | None = None


def use_tensors(tensor: type, *, cos: Callable, log: Callable, sin: Callable, where: Callable) -> None:
    """The ``Tensor`` class and the functions the rules build gradients with (called once, by ``_tensor``)."""
    global _api
    _api = _Api(tensor, cos=cos, log=log, sin=sin, where=where)


def _tensor_type() -> _Api:
    if _api is None:  # pragma: no cover - importing any module of rxcuda.tensor imports _tensor first
        raise RuntimeError("rxcuda.tensor._tensor has not called use_tensors(): import rxcuda.tensor")
    return _api


def _as_tensor(value: Any, like: Any) -> Any:
    t = _tensor_type()
    if isinstance(value, t.Tensor):
        return value
    return t.const(np.asarray(value, dtype=like.dtype), like)


def _fit(g: Any, node: Any) -> Any:
    """The gradient ``g`` in the shape and dtype of ``node`` (unbroadcast, cast when a rule mixed dtypes)."""
    if tuple(g.shape) != tuple(node.shape):
        g = unbroadcast(g, node.shape)
    if g.dtype != node.dtype:
        g = g.astype(node.dtype)
    return g


def unbroadcast(g: Any, shape: Sequence[int]) -> Any:
    """Sum ``g`` over the axes that broadcasting added or stretched, so it has ``shape``.

    Example: a ``(3,)`` bias added to a ``(4, 3)`` batch gets ``unbroadcast(g, (3,)) == g.sum(axis=0)``.
    """
    shape = tuple(shape)
    gshape = tuple(g.shape)
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    if lead < 0:
        raise ValueError(f"cannot unbroadcast a gradient of shape {gshape} to the larger rank of {shape}")
    axes = tuple(range(lead)) + tuple(
        lead + k for k, n in enumerate(shape) if n == 1 and gshape[lead + k] != 1
    )
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g.reshape(shape)


def _keepdims_shape(shape: Sequence[int], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if k in axes else n for k, n in enumerate(shape))


def _float(mask: Any, dtype: np.dtype) -> Any:
    return mask.astype(dtype)


# --- vector-Jacobian rules --------------------------------------------------------------------------------------
#
# A rule gets the node, its output gradient g, its inputs and output as tensors, and which inputs want a gradient;
# it returns one gradient (or None) per input, in any broadcastable shape: _fit sums it back to the input's shape.

Rule = Callable[[Any, Any, list, Any, tuple], Iterable[Any]]


def _rule_add(n, g, ins, out, want):
    return g, g


def _rule_sub(n, g, ins, out, want):
    return g, (-g if want[1] else None)


def _rule_mul(n, g, ins, out, want):
    a, b = ins
    return (g * b if want[0] else None), (g * a if want[1] else None)


def _rule_div(n, g, ins, out, want):
    a, b = ins
    return (g / b if want[0] else None), (-(g * out) / b if want[1] else None)


def _rule_neg(n, g, ins, out, want):
    return (-g,)


def _rule_pow(n, g, ins, out, want):
    t = _tensor_type()
    a, b = ins
    ga = g * b * a ** (b - 1.0) if want[0] else None
    gb = None
    if want[1]:
        zero = a.dtype.type(0)
        # log(0) is -inf and 0 * -inf is nan: the limit of a**b * log(a) at a == 0 (b > 0) is 0
        safe = t.where(a == zero, t.full((), 1.0, a), a)
        gb = t.where(a == zero, t.full((), 0.0, g), g * out * t.log(safe))
    return ga, gb


def _rule_exp(n, g, ins, out, want):
    return (g * out,)


def _rule_log(n, g, ins, out, want):
    return (g / ins[0],)


def _rule_sqrt(n, g, ins, out, want):
    return (g / (out * 2.0),)


def _rule_sin(n, g, ins, out, want):
    return (g * _tensor_type().cos(ins[0]),)


def _rule_cos(n, g, ins, out, want):
    return (-(g * _tensor_type().sin(ins[0])),)


def _rule_tanh(n, g, ins, out, want):
    return (g * (1.0 - out * out),)


def _rule_abs(n, g, ins, out, want):
    (a,) = ins
    zero = a.dtype.type(0)
    sign = _float(a > zero, a.dtype) - _float(a < zero, a.dtype)
    return (g * sign,)


def _rule_maximum(n, g, ins, out, want):
    a, b = ins
    dt = out.dtype
    # ties split equally: where a == b each side gets half
    share_a = _float(a > b, dt) + _float(a == b, dt) * 0.5
    return (g * share_a if want[0] else None), (g * (1.0 - share_a) if want[1] else None)


def _rule_minimum(n, g, ins, out, want):
    a, b = ins
    dt = out.dtype
    share_a = _float(a < b, dt) + _float(a == b, dt) * 0.5
    return (g * share_a if want[0] else None), (g * (1.0 - share_a) if want[1] else None)


def _rule_where(n, g, ins, out, want):
    t = _tensor_type()
    c, a, b = ins
    zero = t.full((), 0.0, g)
    return None, (t.where(c, g, zero) if want[1] else None), (t.where(c, zero, g) if want[2] else None)


def _rule_none(n, g, ins, out, want):
    return tuple(None for _ in ins)


def _rule_cast(n, g, ins, out, want):
    (a,) = ins
    if not np.issubdtype(a.dtype, np.floating):
        return (None,)
    return (g.astype(a.dtype),)


def _rule_copy(n, g, ins, out, want):
    return (g.to(ins[0].device),)  # a device transfer: the gradient travels back


def _expand(g: Any, n: Any, in_shape: tuple[int, ...]) -> Any:
    """The reduction gradient ``g`` (shape of the output) broadcast back to the reduced input's shape."""
    t = _tensor_type()
    axes, keepdims = t.reduce_axes(n)
    if not keepdims:
        g = g.reshape(_keepdims_shape(in_shape, axes))
    return t.broadcast_to(g, in_shape)


def _rule_sum(n, g, ins, out, want):
    return (_expand(g, n, tuple(ins[0].shape)),)


def _rule_mean(n, g, ins, out, want):
    t = _tensor_type()
    shape = tuple(ins[0].shape)
    axes, _ = t.reduce_axes(n)
    count = int(np.prod([shape[k] for k in axes])) if axes else 1
    return (_expand(g, n, shape) / float(max(count, 1)),)


def _rule_extreme(n, g, ins, out, want):
    t = _tensor_type()
    (a,) = ins
    shape = tuple(a.shape)
    axes, _ = t.reduce_axes(n)
    hit = _float(a == _expand(out, n, shape), a.dtype)
    # ties split equally among the extreme elements
    count = hit.sum(axis=axes, keepdims=True)
    return (_expand(g, n, shape) * hit / count,)


def _rule_reshape(n, g, ins, out, want):
    return (g.reshape(tuple(ins[0].shape)),)


def _rule_transpose(n, g, ins, out, want):
    t = _tensor_type()
    perm = t.transpose_axes(n)
    return (g.transpose(tuple(int(k) for k in np.argsort(perm))),)


def _rule_broadcast_to(n, g, ins, out, want):
    return (unbroadcast(g, tuple(ins[0].shape)),)


def _rule_getitem(n, g, ins, out, want):
    return (_scatter(g, n.attrs[0], tuple(ins[0].shape)),)


def _scatter(g: Any, parts: tuple, shape: tuple[int, ...]) -> Any:
    """The transpose of ``x[index]``: ``g`` placed into zeros of ``shape`` at ``index``.

    ``parts`` is the getitem node's normalized index (``("int", i)``, ``("slice", start, stop, step)``,
    ``("new",)``, one per axis of ``x`` plus the new axes). Built from agreed ops only: each sliced or indexed
    axis multiplies by a 0/1 selection matrix (a ``const`` of ``m * n`` elements for ``m`` of ``n`` picked), so
    the gradient stays a lazy graph of matmuls; a dedicated scatter kernel would be cheaper.
    """
    t = _tensor_type()
    # g's axes lined up with x's: an int index removed an axis (put it back as size 1), None added one (drop it)
    lined: list[int] = []
    pos = 0
    for p in parts:
        if p[0] == "int":
            lined.append(1)
        elif p[0] == "slice":
            lined.append(g.shape[pos])
        pos += p[0] != "int"
    g = g.reshape(tuple(lined))
    nd = len(shape)
    for k, p in enumerate(q for q in parts if q[0] != "new"):
        n = shape[k]
        rows = np.array([p[1]]) if p[0] == "int" else np.arange(p[1], p[2], p[3])
        if rows.size == n and np.array_equal(rows, np.arange(n)):
            continue
        select = np.zeros((rows.size, n), dtype=g.dtype)
        select[np.arange(rows.size), rows] = 1  # basic indexing picks each element at most once
        # move axis k last, (.., m) @ (m, n) -> (.., n), move it back
        perm = tuple(a for a in range(nd) if a != k) + (k,)
        back = tuple(int(a) for a in np.argsort(perm))
        g = (g.transpose(perm) @ t.const(select, g)).transpose(back)
    return g


def _rule_matmul(n, g, ins, out, want):
    a, b = ins
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)
    if len(a_shape) == 1 and len(b_shape) == 1:  # inner product: a scalar
        return (g * b if want[0] else None), (g * a if want[1] else None)
    # lift 1-D operands to matrices as NumPy does, and the output gradient with them
    a2 = a.reshape((1, a_shape[0])) if len(a_shape) == 1 else a
    b2 = b.reshape((b_shape[0], 1)) if len(b_shape) == 1 else b
    g2 = g
    if len(a_shape) == 1:
        g2 = g2.reshape(tuple(g2.shape[:-1]) + (1, g2.shape[-1]))
    if len(b_shape) == 1:
        g2 = g2.reshape(tuple(g2.shape) + (1,))
    ga = gb = None
    if want[0]:
        ga = unbroadcast(g2 @ _swap_last(b2), tuple(a2.shape)).reshape(a_shape)
    if want[1]:
        gb = unbroadcast(_swap_last(a2) @ g2, tuple(b2.shape)).reshape(b_shape)
    return ga, gb


def _swap_last(x: Any) -> Any:
    nd = len(x.shape)
    return x.transpose(tuple(range(nd - 2)) + (nd - 1, nd - 2))


_NO_GRAD_OPS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})

_RULES: dict[str, Rule] = {
    "add": _rule_add,
    "sub": _rule_sub,
    "mul": _rule_mul,
    "div": _rule_div,
    "neg": _rule_neg,
    "pow": _rule_pow,
    "exp": _rule_exp,
    "log": _rule_log,
    "sqrt": _rule_sqrt,
    "sin": _rule_sin,
    "cos": _rule_cos,
    "tanh": _rule_tanh,
    "abs": _rule_abs,
    "maximum": _rule_maximum,
    "minimum": _rule_minimum,
    "where": _rule_where,
    "cast": _rule_cast,
    "copy": _rule_copy,
    "sum": _rule_sum,
    "mean": _rule_mean,
    "max": _rule_extreme,
    "min": _rule_extreme,
    "reshape": _rule_reshape,
    "transpose": _rule_transpose,
    "broadcast_to": _rule_broadcast_to,
    "getitem": _rule_getitem,
    "matmul": _rule_matmul,
    **{op: _rule_none for op in _NO_GRAD_OPS},
}
