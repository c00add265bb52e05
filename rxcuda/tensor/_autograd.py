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
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model._errors import RxcudaError
from . import _backcache, _ops
from ._graph import topo
from ._vjp import _NO_GRAD_OPS, _RULES, _as_tensor, _fit, _tensor_type, unbroadcast

__all__ = ["GradientError", "backward", "detach", "grad", "grad_of", "no_grad", "set_grad", "unbroadcast"]


class GradientError(RxcudaError, ValueError):
    """A gradient was asked for in a way that has no answer; the message says how to ask instead (an
    :class:`~rxcuda.RxcudaError`, and a ValueError)."""


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
