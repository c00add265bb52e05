"""Shared pieces of the library calls: the :class:`LibraryCall` spec, dtype checks, validation helpers.

Nothing here touches the GPU: a call is described (and validated) at construction; ``setup`` is where
handles and workspaces appear.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs
import numpy as np

from ..model import _dtypes
from ..model._describe import CallSpec, KernelParam
from ..model._errors import ValidationError

CUDA_DATA_TYPE = {"f16": 2, "bf16": 14, "f32": 0, "f64": 1, "c64": 4, "c128": 5}
"""cudaDataType (library_types.h) of each element type, as plain ints so that describing a call imports no
library; checked against nvmath's enums in the unit tests."""


def dtype_name(op: str, param: str, dtype, allowed: tuple[str, ...]) -> str:
    """Canonical name of ``dtype`` for parameter ``param`` of ``op``, or a ValidationError naming the fix.

    Names are rxcuda's (``rxcuda.model._dtypes``: ``'f32'``, ``'float'``, ``'c64'``, ``'bfloat16'`` ...);
    a string rxcuda does not know is read as NumPy reads it (``'complex'``, ``'<f8'``)."""
    try:
        name = None if dtype is None else _dtypes.dtype_name(dtype)  # NumPy would read None as float64
    except ValueError:
        name = None
        if isinstance(dtype, str):
            try:
                name = _dtypes.dtype_name(np.dtype(dtype.strip()))
            except (TypeError, ValueError):
                name = None
    if name is None or name not in allowed:
        raise ValidationError(
            f"{op}: '{param}' has unsupported dtype {dtype!r}; use one of {', '.join(allowed)}",
            subject=f"{op}.{param}",
        )
    return name


def real_of(dtype: str) -> str:
    """The real type of a complex type's parts (``'c64'`` -> ``'f32'``); a real type is its own."""
    return _dtypes.dtype_name(np.finfo(_dtypes.to_numpy(dtype)).dtype)


def complex_of(dtype: str) -> str:
    """The complex type with parts of ``dtype`` (``'f32'`` -> ``'c64'``, ``'c128'`` -> ``'c128'``)."""
    return _dtypes.dtype_name(np.result_type(_dtypes.to_numpy(dtype), np.complex64))


def invalid(op: str, param: str, message: str) -> ValidationError:
    """A ValidationError for parameter ``param`` of ``op``; ``message`` says what is wrong and the fix."""
    return ValidationError(f"{op}: '{param}': {message}", subject=f"{op}.{param}")


def positive_int(op: str, param: str, value, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        fix = f" ({hint})" if hint else ""
        raise ValidationError(f"{op}: '{param}' must be a positive int, got {value!r}{fix}", subject=f"{op}.{param}")
    return int(value)


def shape_tuple(op: str, param: str, value, ndim: tuple[int, ...]) -> tuple[int, ...]:
    """A shape of one of the allowed ranks, each extent a positive int."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        value = (int(value),)
    try:
        shape = tuple(value)
    except TypeError:
        shape = None
    if shape is None or len(shape) not in ndim:
        ranks = " or ".join(str(n) for n in ndim)
        raise ValidationError(
            f"{op}: '{param}' must be a shape of {ranks} positive ints, got {value!r}",
            subject=f"{op}.{param}",
        )
    return tuple(positive_int(op, param, v, f"every extent of '{param}' must be >= 1") for v in shape)


def real_number(op: str, param: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValidationError(f"{op}: '{param}' must be a real number, got {value!r}", subject=f"{op}.{param}")
    if not math.isfinite(float(value)):
        raise ValidationError(f"{op}: '{param}' must be finite, got {value!r}", subject=f"{op}.{param}")
    return float(value)


def check_name(op: str, name) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValidationError(f"{op}: 'name' must be an identifier-like string, got {name!r}", subject=op)
    return name


def pointer(name: str, dtype: str, direction: str) -> KernelParam:
    return KernelParam(name=name, kind="pointer", size=8, dtype=dtype, direction=direction)


def scalar(name: str, dtype: str, default) -> KernelParam:
    return KernelParam(name=name, kind="scalar", size=_dtypes.itemsize(dtype), dtype=dtype, default=default)


def scaled_output(inputs: list[KernelParam], out: str, out_dtype: str, scalar_dtype: str, alpha, beta,
                  has_beta: bool) -> tuple[list[KernelParam], list[str]]:
    """Params and device scalars of ``out = alpha * f(inputs) (+ beta * out)``, the BLAS/SpMV shape:
    ``out`` is read too when there is a beta, and alpha/beta live in device memory."""
    params = [*inputs, pointer(out, out_dtype, "inout" if has_beta else "out"), scalar("alpha", scalar_dtype, alpha)]
    dscalars = ["alpha"]
    if has_beta:
        params.append(scalar("beta", scalar_dtype, beta))
        dscalars.append("beta")
    return params, dscalars


def _freeze_counts(value) -> Mapping[str, int]:
    return dict(value)


@attrs.frozen(eq=False)
class LibraryCall(CallSpec):
    """A :class:`~rxcuda.model._describe.CallSpec` that also knows its buffers' element counts.

    ``counts`` maps every pointer parameter to its element count (elements of its dtype), so the engine can
    size ports and check connections; ``workspace_bytes`` is the device memory ``setup`` allocates for the
    call (workspaces, plan work areas, constants), for budgeting; ``summary`` a one-line description.

    ``prepare`` (optional, ``Callable[[CaptureArgs], None]``): host-side work that must happen right before
    each capture *and outside it*, with the very args ``record`` will get — e.g. re-seeding cuRAND, which
    cannot happen while a stream captures. Call it (when not None) before ``cuStreamBeginCapture``; it may
    synchronize ``args.stream``. Only the cuRAND backend (and chains containing it) has one.

    ``setup`` keeps handles, plans and the call's own memory, never a pointer of the buffers it is captured
    with: ``record`` reads those from ``CaptureArgs.pointers`` at every capture, so a rebound buffer only
    needs a recapture.
    """

    counts: Mapping[str, int] = attrs.field(factory=dict, converter=_freeze_counts)
    workspace_bytes: int = 0
    summary: str = ""
    prepare: object = None  # Callable[[CaptureArgs], None] | None

    def count(self, name: str) -> int:
        """Element count of pointer parameter ``name``."""
        self.index(name)
        return self.counts[name]

    def nbytes(self, name: str) -> int:
        """Byte size of pointer parameter ``name``."""
        return self.count(name) * _dtypes.itemsize(self.params[self.index(name)].dtype)


def param_counts(spec: CallSpec) -> dict[str, int]:
    """Element count per pointer parameter of a library call (empty for a plain CallSpec)."""
    return dict(getattr(spec, "counts", {}) or {})
