"""Optimizers that update weights in place: :class:`SGD` (with momentum) and :class:`Adam`, as PyTorch's.

``opt.step(grads)`` writes every parameter (``p[...] = new``) and the optimizer's state (momentum, moments, the
step count) in place. Called inside an ``rxcuda.tensor.function`` the writes become part of the traced program,
so a whole training step (forward, ``rt.grad`` and the update) replays as one CUDA graph on ``cuda``; called
outside, each write runs at once. The learning rate is a 0-d tensor (``opt.lr[...] = 0.01`` changes it between
calls without tracing again); so is Adam's step count, which the bias correction reads.

>>> import numpy as np, rxcuda.tensor as rt
>>> w = rt.tensor(np.array([1.0, -2.0]), requires_grad=True)
>>> opt = rt.SGD([w], lr=0.1, momentum=0.9)
>>> @rt.function
... def step(x):
...     loss = ((w * x).sum() - 1.0) ** 2
...     opt.step(rt.grad(loss, [w]))
...     return loss
>>> losses = [float(step(rt.tensor(np.array([1.0, 1.0])))) for _ in range(20)]
>>> losses[-1] < losses[0]
True
"""

from __future__ import annotations

from collections.abc import Sequence

from ._function import settle
from ._tensor import Tensor, full, sqrt, tensor, zeros

__all__ = ["SGD", "Adam"]


def _params(params) -> list[Tensor]:
    params = list(params)
    if not params:
        raise ValueError("an optimizer needs at least one parameter tensor")
    for k, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"params[{k}] is a {type(p).__name__}, not a Tensor")
        if p.dtype.kind != "f":
            raise TypeError(f"params[{k}] has dtype {p.dtype}; an optimizer updates float tensors")
    return params


def _check(name: str, value, low: float, high: float | None = None) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < low or \
            (high is not None and value >= high):
        span = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"'{name}' must be a number {span} (got {value!r})")
    return float(value)


def _state(p: Tensor) -> Tensor:
    """A zero tensor beside ``p`` (same shape, dtype and device) that the optimizer writes in place."""
    return _on(zeros(p.shape, p.dtype), p.device)


def _on(t: Tensor, device: str) -> Tensor:
    """``t`` as data on ``device`` (a write target must be data there, not a lazy copy)."""
    if device == "cpu":
        return tensor(t.numpy())
    import cupy

    return tensor(cupy.asarray(t.numpy()))


class _Optimizer:
    def __init__(self, params, lr: float):
        self.params = _params(params)
        for p in self.params:
            settle(p)  # the parameters' data lives on their device, where the updates write it
        p0 = self.params[0]
        self.lr = _on(full((), _check("lr", lr, 0.0), p0.dtype), p0.device)

    def _grads(self, grads) -> list[Tensor]:
        if grads is None:
            grads = [p.grad for p in self.params]
            if any(g is None for g in grads):
                raise ValueError("step() without gradients reads p.grad, and a parameter has none: call "
                                 "loss.backward() first, or pass step(rt.grad(loss, params))")
        grads = list(grads)
        if len(grads) != len(self.params):
            raise ValueError(f"step() got {len(grads)} gradients for {len(self.params)} parameters")
        for k, (p, g) in enumerate(zip(self.params, grads, strict=True)):
            if not isinstance(g, Tensor) or g.shape != p.shape:
                got = g.shape if isinstance(g, Tensor) else type(g).__name__
                raise ValueError(f"gradient {k} has shape {got}; parameter {k} has shape {p.shape}")
        return grads

    def zero_grad(self) -> None:
        """Clear ``p.grad`` of every parameter (as PyTorch's ``zero_grad(set_to_none=True)``)."""
        for p in self.params:
            p.grad = None


class SGD(_Optimizer):
    """Stochastic gradient descent with optional momentum and weight decay, as ``torch.optim.SGD``:
    ``g += weight_decay * p``; ``v = momentum * v + g`` (``v = g`` at the first step); ``p -= lr * v``."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.01, momentum: float = 0.0,
                 weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.momentum = _check("momentum", momentum, 0.0)
        self.weight_decay = _check("weight_decay", weight_decay, 0.0)
        self.velocity = [_state(p) for p in self.params] if self.momentum else []

    def step(self, grads: Sequence[Tensor] | None = None) -> None:
        """Update every parameter in place from ``grads`` (one per parameter; ``p.grad`` when None)."""
        grads = self._grads(grads)
        for k, (p, g) in enumerate(zip(self.params, grads, strict=True)):
            g = g.detach()
            if self.weight_decay:
                g = g + self.weight_decay * p.detach()
            if self.momentum:
                v = self.velocity[k]
                v[...] = self.momentum * v + g  # v starts at 0, so the first step takes v = g as torch's does
                g = v
            p[...] = p.detach() - self.lr * g


class Adam(_Optimizer):
    """Adam, as ``torch.optim.Adam``: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``,
    ``p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``, with ``t`` the step count (a tensor)."""

    def __init__(self, params: Sequence[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, lr)
        self.beta1 = _check("betas[0]", betas[0], 0.0, 1.0)
        self.beta2 = _check("betas[1]", betas[1], 0.0, 1.0)
        self.eps = _check("eps", eps, 0.0)
        self.weight_decay = _check("weight_decay", weight_decay, 0.0)
        self.m = [_state(p) for p in self.params]
        self.v = [_state(p) for p in self.params]
        self.t = _on(full((), 0.0, self.params[0].dtype), self.params[0].device)

    def step(self, grads: Sequence[Tensor] | None = None) -> None:
        """Update every parameter in place from ``grads`` (one per parameter; ``p.grad`` when None)."""
        grads = self._grads(grads)
        self.t[...] = self.t + 1.0
        c1 = 1.0 - self.beta1 ** self.t
        c2 = 1.0 - self.beta2 ** self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
            g = g.detach()
            if self.weight_decay:
                g = g + self.weight_decay * p.detach()
            m[...] = self.beta1 * m + (1.0 - self.beta1) * g
            v[...] = self.beta2 * v + (1.0 - self.beta2) * (g * g)
            p[...] = p.detach() - self.lr * (m / c1) / (sqrt(v / c2) + self.eps)
