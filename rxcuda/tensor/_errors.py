"""The errors of ``rxcuda.tensor.function`` (``_function``, ``_replay``), below both."""

from __future__ import annotations

from ..model._errors import RxcudaError


class TraceError(RxcudaError, TypeError):
    """Something inside a traced function needs a tensor's value on the host, or cannot be replayed; the
    message names the function and what to write instead (an :class:`~rxcuda.RxcudaError`, and a TypeError)."""


class CaptureError(RxcudaError, RuntimeError):
    """A traced function's program could not be captured into a CUDA graph; the message says why and what to
    do (an :class:`~rxcuda.RxcudaError`, and a RuntimeError)."""
