"""Lazy tensors: NumPy-style array programs that build a graph, optimise it, and run it when a result is
needed.

Nothing runs while you write ``y = (x * 2 + 1).sum(axis=0)``: each operation adds a node. ``y.numpy()`` (or
``realize(y)``) runs the passes (dead nodes, common subexpressions, vertical and horizontal fusion), evaluates
the plan and keeps the results in a cache, so evaluating the same program again with unchanged inputs runs
nothing. ``explain(y)`` shows the plan. Broadcasting and dtypes follow NumPy exactly.

Nodes on ``"cpu"`` run on the CPU backend (NumPy); nodes on ``"cuda"`` run on the CUDA backend (CuPy arrays,
one generated kernel per fused group, matmul through cuBLAS). Without CuPy or a CUDA device, evaluating a
node on ``"cuda"`` raises CudaUnavailableError.

>>> import numpy as np
>>> import rxcuda.tensor as rt
>>> x = rt.tensor(np.arange(6.0).reshape(2, 3))
>>> y = rt.softmax(x * 2, axis=-1)
>>> y.shape, y.dtype
((2, 3), dtype('float64'))
>>> bool(np.allclose(y.numpy().sum(axis=-1), 1.0))
True
"""

from __future__ import annotations

from ..model._shapes import ShapeError
from ._autograd import GradientError, grad, is_grad_enabled, no_grad
from ._block import InputSpec, TensorBlock, block, input, update  # a tensor program as a block of a pipeline
from ._cache import Stats
from ._cuda import CudaUnavailableError
from ._graph import Buffer, Node
from ._ops import DeviceError
from ._passes import Group, Passes, Plan, plan  # noqa: F401 - rt.plan: the passes on their own
from ._run import (  # noqa: F401 - the runnable-program cache, for bench/tensor.py and tests
    _DEFAULT_PASSES,
    _PROGRAMS,
    _leaves,
    _program,
    _signature,
    _values,
    cache,
    clear_cache,
    reset_stats,
    stats,
    wait_compiled,
)
from ._tensor import (
    Tensor,
    abs,
    arange,
    asarray,
    cos,
    exp,
    explain,
    full,
    log,
    logsumexp,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    ones,
    realize,
    sin,
    softmax,
    sqrt,
    sum,
    tanh,
    tensor,
    where,
    zeros,
)

__all__ = [
    "Buffer", "CudaUnavailableError", "DeviceError", "GradientError", "Group", "Node", "Passes", "Plan", "ShapeError",
    "Stats",
    "Tensor", "abs", "arange", "asarray", "cache", "clear_cache", "cos", "exp", "explain", "full", "grad",
    "is_grad_enabled", "log",
    "logsumexp", "matmul", "max", "maximum", "mean", "min", "minimum", "no_grad", "ones", "realize", "reset_stats",
    "sin", "softmax", "sqrt", "stats", "sum", "tanh", "tensor", "wait_compiled", "where", "zeros",
]
__all__ += ["InputSpec", "TensorBlock", "block", "input", "update"]  # rxcuda/tensor/_block.py
from ._function import CaptureError, Function, FunctionStats, TraceError, function, jit  # noqa: E402 - traced, replayed
from ._numpy import (  # noqa: E402 - attaches // % & | ~, float(), item(), str(), NumPy's functions to Tensor
    argmax,
    argmin,
    clip,
    concatenate,
    cumsum,
    expand_dims,
    prod,
    squeeze,
    stack,
    std,
    take,
    var,
)
from ._optim import SGD, Adam  # noqa: E402 - in-place updates a traced training step replays

__all__ += ["argmax", "argmin", "clip", "concatenate", "cumsum", "expand_dims", "prod", "squeeze", "stack", "std",
            "take", "var"]
__all__ += ["Adam", "CaptureError", "Function", "FunctionStats", "SGD", "TraceError", "function", "jit"]
