"""cuFFT calls: 1-D and 2-D complex-to-complex (forward/inverse), real-to-complex, complex-to-real, batched.

Plans are made in ``setup`` (shared per device and layout) with auto-allocation off; each call owns its
work area and sets it on the plan right before executing, so nothing is allocated while capturing.

Layouts are C-order and contiguous: ``batch`` transforms back to back. A real transform of logical size
``n`` (last axis) has ``n // 2 + 1`` complex values on its last axis, as in NumPy.

Normalisation follows NumPy's ``norm``: ``"backward"`` (default: inverse scaled by ``1/N``), ``"ortho"``
(both by ``1/sqrt(N)``), ``"forward"`` (forward scaled by ``1/N``), or ``None`` for cuFFT's raw unscaled
transforms (cheapest: no extra kernel). Scaling is a cuBLAS ``scal`` on the output, captured with the FFT.
"""

from __future__ import annotations

import functools
import math

from ..cuda import _launch
from ..model import _dtypes
from . import _handles as H
from . import _host
from ._blas import blas_handle
from ._common import (
    LibraryCall,
    check_name,
    complex_of,
    dtype_name,
    invalid,
    pointer,
    positive_int,
    real_of,
    shape_tuple,
)

FORWARD, INVERSE = -1, 1
_C2C = {"c64": 41, "c128": 105}
_R2C = {"f32": 42, "f64": 106}
_C2R = {"c64": 44, "c128": 108}
_EXEC = {41: "exec_c2c", 105: "exec_z2z", 42: "exec_r2c", 106: "exec_d2z", 44: "exec_c2r", 108: "exec_z2d"}
_NORMS = ("backward", "ortho", "forward", None)
SCALE_WORKSPACE = 1 << 20  # cuBLAS workspace of the scaling step (a level-1 call)


def _scale(norm: str | None, inverse: bool, size: int) -> float:
    if norm is None:
        return 1.0
    if norm == "ortho":
        return 1.0 / math.sqrt(size)
    if (norm == "backward") == inverse:
        return 1.0 / size
    return 1.0


def _setup(plan_key: tuple, scratch_bytes: int, scale: float, real_out: str, device_ordinal: int):
    st = H.Resources(device_ordinal)
    try:
        plan, work = st.libs.fft_plan(plan_key)
        st.extra["plan"] = plan
        st.extra["work"] = st.alloc(work)
        if scratch_bytes:
            st.extra["scratch"] = st.alloc(scratch_bytes)
        if scale != 1.0:
            st.extra["handle"] = st.libs.cublas()
            st.extra["workspace"] = st.alloc(SCALE_WORKSPACE)
            st.extra["scale"] = st.constant(scale, real_out).ptr
    except BaseException:
        st.close()
        raise
    return st


def _transform(
    op: str,
    kind: str,
    shape: tuple[int, ...],
    batch: int,
    dtype,
    norm,
    inverse: bool,
    name: str,
    preserve_input: bool = True,
) -> LibraryCall:
    check_name(op, name)
    batch = positive_int(op, "batch", batch, "number of transforms back to back")
    if norm not in _NORMS:
        raise invalid(op, "norm", f"got {norm!r}; use 'backward', 'ortho', 'forward' or None (unscaled)")
    if kind == "c2c":
        cdt = dtype_name(op, "dtype", dtype, ("c64", "c128", "f32", "f64"))
        if cdt in ("f32", "f64"):
            raise invalid(
                op,
                "dtype",
                f"{cdt} is real; complex-to-complex transforms take c64 or c128 (use rfft/irfft for real data)",
            )
        rdt = real_of(cdt)
    else:  # the dtype names the precision: f32 or c64 -> single, f64 or c128 -> double
        rdt = real_of(dtype_name(op, "dtype", dtype, ("f32", "f64", "c64", "c128")))
        cdt = complex_of(rdt)
    n = math.prod(shape)
    half = shape[:-1] + (shape[-1] // 2 + 1,)
    if kind == "c2c":
        in_shape, out_shape, ftype = shape, shape, _C2C[cdt]
        in_dt, out_dt = cdt, cdt
    elif kind == "r2c":
        in_shape, out_shape, ftype = shape, half, _R2C[rdt]
        in_dt, out_dt = rdt, cdt
    else:
        in_shape, out_shape, ftype = half, shape, _C2R[cdt]
        in_dt, out_dt = cdt, rdt
    plan_key = (
        len(shape),
        list(shape),
        list(in_shape),
        1,
        math.prod(in_shape),
        list(out_shape),
        1,
        math.prod(out_shape),
        ftype,
        batch,
    )
    plan_key = tuple(tuple(v) if isinstance(v, list) else v for v in plan_key)
    count_in = batch * math.prod(in_shape)
    count_out = batch * math.prod(out_shape)
    scale = _scale(norm, inverse, n)
    copy_in = kind == "c2r" and preserve_input
    scratch = count_in * _dtypes.itemsize(in_dt) if copy_in else 0
    exec_name = _EXEC[ftype]
    direction = INVERSE if inverse else FORWARD
    scal_name = {"c64": "csscal", "c128": "zdscal", "f32": "sscal", "f64": "dscal"}[out_dt]
    # scal takes an int count: complex outputs count complex elements
    nbytes_in = count_in * _dtypes.itemsize(in_dt)

    def record(args):
        st = args.state
        cufft = H.binding("cufft")
        plan = st.extra["plan"]
        cufft.set_stream(plan, args.stream)
        cufft.set_work_area(plan, st.extra["work"].ptr)
        src = args.pointers["x"]
        if copy_in:
            tmp = st.extra["scratch"].ptr
            _launch.copy_async(tmp, src, nbytes_in, args.stream)
            src = tmp
        dst = args.pointers["y"]
        if kind == "c2c":
            getattr(cufft, exec_name)(plan, src, dst, direction)
        else:
            getattr(cufft, exec_name)(plan, src, dst)
        if scale != 1.0:
            h = blas_handle(st, args.stream)
            getattr(H.binding("cublas"), scal_name)(h, count_out, st.extra["scale"], dst, 1)

    x_dir = "inout" if (kind == "c2r" and not preserve_input) else "in"
    params = (pointer("x", in_dt, x_dir), pointer("y", out_dt, "out"))
    key = ("fft", kind, shape, batch, in_dt, bool(inverse), norm, copy_in)
    ws_guess = scratch + (SCALE_WORKSPACE if scale != 1.0 else 0)
    label = {"c2c": "inverse" if inverse else "forward", "r2c": "real->complex", "c2r": "complex->real"}[kind]
    call = LibraryCall(
        name=name,
        params=params,
        record=record,
        key=key,
        device_scalars=(),
        setup=functools.partial(_setup, plan_key, scratch, scale, rdt),
        teardown=H.close_resources,
        counts={"x": count_in, "y": count_out},
        workspace_bytes=ws_guess,
        summary=f"fft {label} {in_dt}->{out_dt} shape={shape} batch={batch} norm={norm}",
    )
    return _host.with_host(call, functools.partial(_host.fft, kind, shape, batch, bool(inverse), scale))


def fft(n: int, *, batch: int = 1, dtype="c64", norm="backward", name: str = "fft") -> LibraryCall:
    """Forward complex FFT of length ``n`` over ``batch`` rows: ``y[b] = numpy.fft.fft(x[b])``.

    >>> f = fft(1024, batch=8)
    >>> f.counts["x"], f.params[0].dtype
    (8192, 'c64')
    """
    n = positive_int("fft", "n", n, "transform length")
    return _transform("fft", "c2c", (n,), batch, dtype, norm, False, name)


def ifft(n: int, *, batch: int = 1, dtype="c64", norm="backward", name: str = "ifft") -> LibraryCall:
    """Inverse complex FFT of length ``n`` (scaled by ``1/n`` with the default ``norm``), like NumPy.

    >>> ifft(256, batch=2, dtype="c128").summary
    'fft inverse c128->c128 shape=(256,) batch=2 norm=backward'
    """
    n = positive_int("ifft", "n", n, "transform length")
    return _transform("ifft", "c2c", (n,), batch, dtype, norm, True, name)


def fft2(shape, *, batch: int = 1, dtype="c64", norm="backward", name: str = "fft2") -> LibraryCall:
    """Forward 2-D complex FFT of C-order ``shape = (rows, cols)`` images, ``batch`` of them.

    >>> fft2((480, 640)).counts["y"]
    307200
    """
    shape = shape_tuple("fft2", "shape", shape, (2,))
    return _transform("fft2", "c2c", shape, batch, dtype, norm, False, name)


def ifft2(shape, *, batch: int = 1, dtype="c64", norm="backward", name: str = "ifft2") -> LibraryCall:
    """Inverse 2-D complex FFT (NumPy's ``ifft2`` scaling by default)."""
    shape = shape_tuple("ifft2", "shape", shape, (2,))
    return _transform("ifft2", "c2c", shape, batch, dtype, norm, True, name)


def rfft(n: int, *, batch: int = 1, dtype="f32", norm="backward", name: str = "rfft") -> LibraryCall:
    """Real-to-complex FFT: ``n`` real values -> ``n // 2 + 1`` complex ones per row (f32 or f64 input).

    >>> r = rfft(1000, batch=4)
    >>> r.counts["x"], r.counts["y"], r.params[1].dtype
    (4000, 2004, 'c64')
    """
    n = positive_int("rfft", "n", n, "logical (real) transform length")
    return _transform("rfft", "r2c", (n,), batch, dtype, norm, False, name)


def irfft(
    n: int, *, batch: int = 1, dtype="f32", norm="backward", preserve_input: bool = True, name: str = "irfft"
) -> LibraryCall:
    """Complex-to-real FFT: ``n // 2 + 1`` complex values -> ``n`` real ones per row (``n`` is the output).

    ``dtype`` names the precision (``"f32"``/``"c64"`` or ``"f64"``/``"c128"``). cuFFT overwrites the input
    of a complex-to-real transform; by default the call copies it to a scratch buffer first so ``x`` stays
    intact. ``preserve_input=False`` skips the copy and declares ``x`` as ``inout``.

    >>> irfft(1000).counts["x"]
    501
    """
    n = positive_int("irfft", "n", n, "logical (real) output length")
    return _transform("irfft", "c2r", (n,), batch, dtype, norm, True, name, preserve_input)


def rfft2(shape, *, batch: int = 1, dtype="f32", norm="backward", name: str = "rfft2") -> LibraryCall:
    """2-D real-to-complex FFT of ``(rows, cols)`` images -> ``(rows, cols // 2 + 1)`` complex values."""
    shape = shape_tuple("rfft2", "shape", shape, (2,))
    return _transform("rfft2", "r2c", shape, batch, dtype, norm, False, name)


def irfft2(
    shape, *, batch: int = 1, dtype="f32", norm="backward", preserve_input: bool = True, name: str = "irfft2"
) -> LibraryCall:
    """2-D complex-to-real FFT; ``shape`` is the real output's ``(rows, cols)``."""
    shape = shape_tuple("irfft2", "shape", shape, (2,))
    return _transform("irfft2", "c2r", shape, batch, dtype, norm, True, name, preserve_input)
