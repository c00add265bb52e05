"""Shared pieces of the library calls: the :class:`LibraryCall` spec, dtype names, validation helpers.

Nothing here touches the GPU: a call is described (and validated) at construction; ``setup`` is where
handles and workspaces appear.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs
import numpy as np

from ..model._describe import CallSpec, KernelParam
from ..model._errors import ValidationError

# dtype names of library calls: the engine's short names plus the two complex types and bfloat16,
# which only library calls use (NumPy has no bfloat16; its elements travel as 16-bit words).
_NAMES = {
    "f16": "f16",
    "float16": "f16",
    "half": "f16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "f32": "f32",
    "float32": "f32",
    "float": "f32",
    "f64": "f64",
    "float64": "f64",
    "double": "f64",
    "c64": "c64",
    "complex64": "c64",
    "c128": "c128",
    "complex128": "c128",
    "complex": "c128",
    "i32": "i32",
    "int32": "i32",
    "i64": "i64",
    "int64": "i64",
    "u8": "u8",
    "uint8": "u8",
    "u32": "u32",
    "uint32": "u32",
    "u64": "u64",
    "uint64": "u64",
}
ITEMSIZE = {
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "i32": 4,
    "i64": 8,
    "u8": 1,
    "u32": 4,
    "u64": 8,
}
REAL_OF = {"c64": "f32", "c128": "f64"}
COMPLEX_OF = {"f32": "c64", "f64": "c128"}


def dtype_name(op: str, param: str, dtype, allowed: tuple[str, ...]) -> str:
    """Canonical name of ``dtype`` for parameter ``param`` of ``op``, or a ValidationError naming the fix."""
    name = None
    if isinstance(dtype, str):
        name = _NAMES.get(dtype.strip().lower())
    elif dtype is not None:
        try:
            name = _NAMES.get(np.dtype(dtype).name)
        except TypeError:
            name = None
    if name is None or name not in allowed:
        raise ValidationError(
            f"{op}: '{param}' has unsupported dtype {dtype!r}; use one of {', '.join(allowed)}",
            subject=f"{op}.{param}",
        )
    return name


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
    return KernelParam(name=name, kind="scalar", size=ITEMSIZE[dtype], dtype=dtype, default=default)


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
        return self.count(name) * ITEMSIZE[self.params[self.index(name)].dtype]

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.is_pointer and p.direction in ("in", "inout"))

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if p.is_pointer and p.direction in ("out", "inout"))

    @property
    def scalars(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params if not p.is_pointer)

    def defaults(self) -> dict[str, float | int]:
        """Default value of every scalar (device scalars included)."""
        return {p.name: p.default for p in self.params if not p.is_pointer}


def prepare_for_capture(spec: CallSpec, args) -> None:
    """Run ``spec.prepare(args)`` if the call has one (before ``cuStreamBeginCapture``, never inside it)."""
    prepare = getattr(spec, "prepare", None)
    if prepare is not None:
        prepare(args)


def param_counts(spec: CallSpec) -> dict[str, int]:
    """Element count per pointer parameter of a library call (empty for a plain CallSpec)."""
    return dict(getattr(spec, "counts", {}) or {})
