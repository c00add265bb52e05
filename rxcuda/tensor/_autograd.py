"""Reverse-mode autograd over the lazy tensor graph.

Every :class:`Tensor` wraps a :class:`Node` that remembers the operation that produced it (``op``, ``inputs``,
``attrs``). :func:`backward` walks those nodes from the loss in reverse topological order and applies, per op, a
vector-Jacobian rule written with the same lazy tensor operations as the forward program: gradients are graphs
too, so they go through the same passes, kernel factory and caches (and, later, the same CUDA kernels).

Example::

    import numpy as np
    import rxcuda.tensor as rt

    x = rt.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    loss = (x * x).sum()
    loss.backward()
    x.grad.numpy()                      # array([2., 4., 6.])
    (gx,) = rt.grad(loss, [x])          # the same, without storing it on x

Conventions, chosen once and documented here:

- ``max``/``min`` (reductions) and ``maximum``/``minimum`` (elementwise) split the gradient **equally among
  ties**, as ``torch.amax`` does: ``x.max()`` of ``[3, 1, 3]`` sends half of the gradient to each 3.
- ``abs`` has gradient 0 at 0 (the sign); ``sqrt`` at 0 is ``inf`` (as NumPy's limit); ``pow(a, b)``'s gradient
  with respect to ``b`` is 0 where ``a == 0`` (the limit of ``a ** b * log(a)`` for ``b > 0``).
- Comparisons, ``cast`` to an integer or bool dtype and integer tensors carry no gradient.
- A loss that does not depend on a tensor gives that tensor a zero gradient (not ``None``), so
  ``x.grad`` is always a tensor of ``x``'s shape after ``backward``.
- ``backward`` accumulates into ``.grad`` (set ``x.grad = None`` to start again); :func:`grad` stores nothing.
- Inside ``with no_grad():`` every node made carries no gradient (an optimiser step ``w - lr * w.grad`` does
  not chain steps together); ``x.detach()`` is ``x``'s value as a new node that carries none.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from . import _backcache, _ops
from ._graph import topo

__all__ = ["GradientError", "backward", "detach", "grad", "grad_of", "no_grad", "set_grad", "unbroadcast"]


class GradientError(ValueError):
    """A gradient was asked for in a way that has no answer; the message says how to ask instead."""


# --- which tensors want gradients -------------------------------------------------------------------------------
#
# Nodes are frozen and shared by the caches, so the wish for a gradient lives beside them: a leaf node that some
# Tensor marked ``requires_grad`` maps (weakly) to that Tensor, which receives ``.grad`` on ``backward``.

_leaves: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
# Tensor -> its .grad, by identity: Tensor.__eq__ builds a node, so a WeakKeyDictionary cannot hold tensors
_grads: dict[int, tuple[weakref.ref, Any]] = {}


def _store(tensor: Any, value: Any) -> None:
    key = id(tensor)
    _grads[key] = (weakref.ref(tensor, lambda _, key=key: _grads.pop(key, None)), value)


def mark_requires_grad(tensor: Any, flag: bool = True) -> None:
    """Record (or forget) that ``tensor`` wants a gradient (the ``requires_grad`` setter of ``Tensor`` calls this)."""
    node = tensor.node
    if flag:
        if not np.issubdtype(node.dtype, np.floating):
            raise GradientError(
                f"only floating-point tensors can require gradients (got dtype {node.dtype}); "
                f"cast first, e.g. x.astype(np.float64)"
            )
        _leaves[node] = weakref.ref(tensor)
    else:
        _leaves.pop(node, None)


# --- where gradients stop ---------------------------------------------------------------------------------------
#
# A stopped node passes no gradient to its inputs: nodes made inside ``no_grad()`` and the nodes ``detach()`` makes.
# Like the wish for a gradient, this lives beside the frozen nodes.

_stopped: weakref.WeakSet[Any] = weakref.WeakSet()
_state = threading.local()


def _on_node(node: Any) -> None:
    if getattr(_state, "depth", 0):
        _stopped.add(node)


def _pinned(node: Any) -> bool:
    return node in _leaves or node in _stopped


_ops.MADE.append(_on_node)  # sees every node an op makes
_ops.PINNED.append(_pinned)  # a device pull copies a requires_grad tensor instead of rebuilding it


class no_grad(contextlib.ContextDecorator):
    """Inside ``with no_grad():`` (or a function decorated ``@no_grad()``) the nodes made carry no gradient:
    their results do not require grad, and ``backward`` does not walk through them. Per thread; nests.

    Example::

        with rt.no_grad():
            w = w - 0.1 * w.grad        # a plain update: the next step's graph does not reach the old w
        w.requires_grad = True
    """

    def __enter__(self) -> no_grad:
        _state.depth = getattr(_state, "depth", 0) + 1
        return self

    def __exit__(self, *exc: Any) -> None:
        _state.depth -= 1


def is_grad_enabled() -> bool:
    """False inside :class:`no_grad`."""
    return not getattr(_state, "depth", 0)


def detach(node: Any) -> Any:
    """A new node with ``node``'s value through which no gradient flows (``Tensor.detach()``)."""
    out = _ops.alias(node)
    _stopped.add(out)
    return out


def grad_of(tensor: Any) -> Any:
    """``tensor.grad``: the gradient :func:`backward` accumulated for it, or ``None``."""
    entry = _grads.get(id(tensor))
    return entry[1] if entry is not None and entry[0]() is tensor else None


def set_grad(tensor: Any, value: Any) -> None:
    """``tensor.grad = value`` (``None`` clears it, so the next ``backward`` starts from zero)."""
    if value is None:
        _grads.pop(id(tensor), None)
        return
    t = _tensor_type()
    value = value if isinstance(value, t.Tensor) else t.const(np.asarray(value, dtype=tensor.dtype), tensor.node)
    if tuple(value.shape) != tuple(tensor.shape):
        raise GradientError(f"a gradient of shape {tuple(value.shape)} for a tensor of shape {tuple(tensor.shape)}")
    _store(tensor, value)


def requires_grad(node: Any) -> bool:
    """Whether ``node`` depends on a tensor marked ``requires_grad`` (through ops that carry gradients)."""
    return _reach(node) is not None


def _differentiable(node: Any) -> bool:
    return node.dtype.kind == "f" and node.op not in _NO_GRAD_OPS and node not in _stopped


def _reach(root: Any) -> set[Any] | None:
    """The nodes under ``root`` that lie on a path to a ``requires_grad`` node (``None`` if there are none)."""
    on_path: dict[int, bool] = {}
    found: set[Any] = set()
    # iterative post-order, so deep graphs (long training loops) do not hit the recursion limit
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            if any(on_path[id(i)] for i in node.inputs):
                on_path[id(node)] = True
                found.add(node)
            continue
        if id(node) in on_path:
            continue
        wanted = node in _leaves
        on_path[id(node)] = wanted
        if wanted:
            found.add(node)
        # a wanted intermediate (grad(loss, [h])) still passes gradients on to what it was computed from
        if node.inputs and _differentiable(node):
            stack.append((node, True))
            stack.extend((i, False) for i in node.inputs if id(i) not in on_path)
    return found or None


def _topological(root: Any, keep: set[Any]) -> list[Any]:
    """Nodes of ``keep`` reachable from ``root``, each after every node that uses it (root first): the graph's
    own topological order (``_graph.topo``), reversed."""
    return [n for n in reversed(topo([root])) if n in keep]


# --- the walk ---------------------------------------------------------------------------------------------------


def _gradients(loss: Any, seed: Any | None) -> tuple[dict[Any, Any], set[Any]]:
    t = _tensor_type()
    node = loss.node
    seed_given = seed
    if not np.issubdtype(node.dtype, np.floating):
        raise GradientError(
            f"cannot differentiate a tensor of dtype {node.dtype}: gradients need a floating-point loss; "
            f"compute the loss in float, e.g. loss.astype(np.float64)"
        )
    if seed is None:
        if node.shape != ():
            raise GradientError(
                f"backward() of a tensor of shape {node.shape} needs a seed gradient of that shape: "
                f"reduce it to a scalar first (loss.sum()) or pass backward(gradient=...)"
            )
        seed = t.full((), 1.0, node)
    else:
        seed = _as_tensor(seed, node)
        if tuple(seed.shape) != tuple(node.shape):
            raise GradientError(
                f"the seed gradient has shape {tuple(seed.shape)} but the tensor has shape {node.shape}; "
                f"pass a gradient of the tensor's shape"
            )
    replayable = seed_given is None
    if replayable:  # a structure walked before (a training loop's next step): replay its result
        order = topo([node])
        sig = _backcache.signature(order, _leaves.__contains__, _stopped.__contains__)
        template = _backcache.lookup(sig)
        if template is not None:
            made, kept = _backcache.replay(template, order)
            return {n: t.wrap(g) for n, g in made.items()}, kept
    keep = _reach(node)
    if keep is None:
        return {}, set()
    result = _walk(node, seed, keep, t)
    if replayable:
        _backcache.record(sig, order, result, keep)
    return result, keep


def _walk(node: Any, seed: Any, keep: set[Any], t: Any) -> dict[Any, Any]:
    """The vector-Jacobian rules from ``node`` back to the wanted nodes: each wanted node's gradient."""
    grads: dict[Any, Any] = {node: seed}
    result: dict[Any, Any] = {}
    for n in _topological(node, keep):
        g = grads.pop(n, None)  # complete: every user of n came before it
        if g is None:
            continue
        if n in _leaves:
            result[n] = g
        if not n.inputs or not _differentiable(n):
            continue
        rule = _RULES.get(n.op)
        if rule is None:
            raise NotImplementedError(f"no gradient rule for op {n.op!r}; add one to rxcuda/tensor/_autograd.py")
        wanted = tuple(i in keep for i in n.inputs)
        ins = [t.wrap(i) for i in n.inputs]
        outs = rule(n, g, ins, t.wrap(n), wanted)
        for i, want, gi in zip(n.inputs, wanted, outs, strict=True):
            if not want or gi is None:
                continue
            gi = _fit(gi, i)
            grads[i] = gi if i not in grads else grads[i] + gi
    return result


def backward(loss: Any, gradient: Any | None = None) -> None:
    """Accumulate d(loss)/d(x) into ``x.grad`` for every tensor ``x`` the loss depends on that requires grad.

    ``loss`` must be a floating-point scalar, or pass ``gradient`` (the seed: an array or tensor of the loss's
    shape) to get the vector-Jacobian product. Tensors marked ``requires_grad`` that the loss does not use are
    left alone; use :func:`grad` to get zeros for them.

    Example::

        x = rt.tensor(np.ones(3), requires_grad=True)
        y = x * 2.0
        y.backward(np.array([1.0, 0.0, 1.0]))
        x.grad.numpy()                  # array([2., 0., 2.])
    """
    grads, _ = _gradients(loss, gradient)
    for node, g in grads.items():
        ref = _leaves.get(node)
        tensor = ref() if ref is not None else None
        if tensor is None:
            continue
        old = grad_of(tensor)
        _store(tensor, g if old is None else old + g)


def grad(loss: Any, inputs: Sequence[Any], gradient: Any | None = None) -> list[Any]:
    """d(loss)/d(input) for each of ``inputs``, as tensors; stores nothing on them.

    Each input must require grad (marked itself, or computed from a tensor that is). An input the loss does not
    depend on gets zeros of its shape.

    Example::

        x = rt.tensor(np.array([1.0, 2.0]), requires_grad=True)
        h = x * x
        gx, gh = rt.grad((h * 3.0).sum(), [x, h])   # [6., 12.] and [3., 3.]
    """
    t = _tensor_type()
    inputs = list(inputs)
    for k, x in enumerate(inputs):
        if not isinstance(x, t.Tensor):
            raise TypeError(f"grad(loss, inputs): inputs[{k}] is a {type(x).__name__}, not a Tensor")
        if not requires_grad(x.node):
            raise GradientError(
                f"inputs[{k}] (shape {x.node.shape}, dtype {x.node.dtype}) does not require grad: "
                f"create it with rt.tensor(..., requires_grad=True) or set x.requires_grad = True before "
                f"computing the loss"
            )
    # intermediate tensors asked for become leaves of this walk only
    added = [x.node for x in inputs if x.node not in _leaves]
    for x in inputs:
        if x.node not in _leaves:
            _leaves[x.node] = weakref.ref(x)
    try:
        grads, _ = _gradients(loss, gradient)
    finally:
        for n in added:
            _leaves.pop(n, None)
    return [grads.get(x.node) if x.node in grads else t.full(x.node.shape, 0.0, x.node) for x in inputs]


# --- helpers built from lazy ops --------------------------------------------------------------------------------


class _Api:
    """The few tensor constructors the rules need, on top of the ``Tensor`` of ``rxcuda.tensor``."""

    def __init__(self) -> None:
        from . import Tensor, _ops, cos, log, sin, where

        self.Tensor, self.wrap, self.log, self.sin, self.cos, self.where = Tensor, Tensor, log, sin, cos, where
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


def _tensor_type() -> _Api:
    global _api
    if _api is None:
        _api = _Api()
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
