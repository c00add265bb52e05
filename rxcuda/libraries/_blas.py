"""cuBLAS calls: GEMM, GEMV, AXPY, SCAL — row-major (C-order) arrays, alpha/beta in device memory.

All arrays are C-order, as NumPy and CuPy hand them in. cuBLAS is column-major, so a row-major
``C = op(A) @ op(B)`` is issued as the column-major ``C^T = op(B)^T @ op(A)^T`` (operands swapped, no copy).

``alpha`` (and ``beta`` when given) are *device scalars*: the handle is in ``CUBLAS_POINTER_MODE_DEVICE``
and the call reads them from the engine's device slots at run time, so changing them is a small copy,
never a recapture. Without ``beta`` the output is write-only and a device zero owned by the call is used.
"""

from __future__ import annotations

import functools

from . import _handles as H
from . import _host
from ._common import (
    CUDA_DATA_TYPE,
    LibraryCall,
    check_name,
    dtype_name,
    invalid,
    pointer,
    positive_int,
    real_number,
    real_of,
    scalar,
    scaled_output,
)

# cuBLAS enum values, as plain ints so construction needs no import of nvmath; checked against nvmath's
# enums in the unit tests.
COMPUTE_32F = 68
COMPUTE_32F_FAST_TF32 = 77
COMPUTE_64F = 70
OP_N, OP_T = 0, 1
GEMM_DEFAULT_ALGO = -1

GEMM_DTYPES = ("f32", "f64", "f16", "bf16")
VECTOR_DTYPES = ("f32", "f64")
SCAL_DTYPES = ("f32", "f64", "c64", "c128")


def _alpha_type(dt: str) -> str:
    """Type of alpha/beta: f32 for half inputs (f32 accumulation), else the real type of the elements."""
    return "f32" if dt in ("f16", "bf16") else real_of(dt)


# -- shared setup / record helpers ------------------------------------------------------------------------
def _blas_setup(workspace_bytes: int, zero_dtype: str | None, device_ordinal: int):
    st = H.Resources(device_ordinal)
    try:
        st.extra["handle"] = st.libs.cublas()
        st.extra["workspace"] = st.alloc(workspace_bytes)
        if zero_dtype is not None:
            st.extra["zero"] = st.constant(0, zero_dtype).ptr
    except BaseException:
        st.close()
        raise
    return st


def blas_handle(st, stream: int) -> int:
    """The shared cuBLAS handle, bound to ``stream`` and to this call's own workspace."""
    cublas = H.binding("cublas")
    handle = st.extra["handle"]
    ws = st.extra["workspace"]
    cublas.set_stream(handle, stream)
    cublas.set_workspace(handle, ws.ptr, ws.nbytes)
    cublas.set_pointer_mode(handle, 1)  # CUBLAS_POINTER_MODE_DEVICE
    return handle


def _beta_ptr(args, st, has_beta: bool) -> int:
    return args.pointers["beta"] if has_beta else st.extra["zero"]


def _spec(name, params, record, key, counts, device_scalars, workspace_bytes, zero_dtype, summary, host):
    return _host.with_host(LibraryCall(
        name=name,
        params=tuple(params),
        record=record,
        key=key,
        device_scalars=tuple(device_scalars),
        setup=functools.partial(_blas_setup, workspace_bytes, zero_dtype),
        teardown=H.close_resources,
        counts=counts,
        workspace_bytes=workspace_bytes + (8 if zero_dtype else 0),
        summary=summary,
    ), host)


def _workspace(op: str, value) -> int:
    return positive_int(op, "workspace_bytes", value, "64 MiB keeps captured GEMMs free of memory nodes")


# -- GEMM -------------------------------------------------------------------------------------------------
def gemm(
    m: int,
    n: int,
    k: int,
    *,
    dtype="f32",
    out_dtype=None,
    trans_a: bool = False,
    trans_b: bool = False,
    alpha: float = 1.0,
    beta: float | None = None,
    batch: int = 1,
    tf32: bool = False,
    workspace_bytes: int = H.DEFAULT_GEMM_WORKSPACE,
    name: str = "gemm",
) -> LibraryCall:
    """``c = alpha * op(a) @ op(b) (+ beta * c)`` with C-order matrices, through ``cublasGemmEx``.

    ``op(a)`` is ``m x k`` and ``op(b)`` is ``k x n``; ``a`` is stored ``(m, k)`` (``(k, m)`` with
    ``trans_a``), ``b`` is stored ``(k, n)`` (``(n, k)`` with ``trans_b``), ``c`` is ``(m, n)``. With
    ``batch > 1`` the buffers hold ``batch`` matrices back to back (strided batched GEMM).

    dtypes: f32 and f64 (the output has the same type); f16 and bf16 inputs accumulate in f32 and write
    ``out_dtype`` (the input type by default, or ``"f32"``). ``tf32=True`` lets f32 GEMMs use TF32 tensor
    cores. ``alpha`` and ``beta`` are device scalars (f32, or f64 for f64 GEMMs): changing them needs no
    recapture. Without ``beta``, ``c`` is write-only; with it, ``c`` is read and written.

    >>> mm = gemm(256, 128, 64)                        # c(256,128) = a(256,64) @ b(64,128)
    >>> mm.counts["a"], mm.counts["b"], mm.counts["c"]
    (16384, 8192, 32768)
    """
    op = "gemm"
    check_name(op, name)
    m = positive_int(op, "m", m, "rows of op(a) and of c")
    n = positive_int(op, "n", n, "columns of op(b) and of c")
    k = positive_int(op, "k", k, "columns of op(a) = rows of op(b)")
    batch = positive_int(op, "batch", batch, "number of matrices in each buffer")
    dt = dtype_name(op, "dtype", dtype, GEMM_DTYPES)
    if out_dtype is None:
        out = dt
    else:
        allowed = (dt, "f32") if dt in ("f16", "bf16") else (dt,)
        out = dtype_name(op, "out_dtype", out_dtype, allowed)
    if tf32 and dt != "f32":
        raise invalid(op, "tf32", f"tf32=True applies to f32 GEMMs only (dtype is {dt}); drop it")
    st = _alpha_type(dt)
    alpha = real_number(op, "alpha", alpha)
    has_beta = beta is not None
    if has_beta:
        beta = real_number(op, "beta", beta)
    ws = _workspace(op, workspace_bytes)
    compute = COMPUTE_64F if dt == "f64" else (COMPUTE_32F_FAST_TF32 if tf32 else COMPUTE_32F)

    lda = m if trans_a else k
    ldb = k if trans_b else n
    ldc = n
    # column-major view: C^T(n x m) = op(B)^T(n x k) @ op(A)^T(k x m)
    opb = OP_T if trans_b else OP_N
    opa = OP_T if trans_a else OP_N
    types = (CUDA_DATA_TYPE[dt], CUDA_DATA_TYPE[out])

    def record(args):
        s = args.state
        cublas = H.binding("cublas")
        h = blas_handle(s, args.stream)
        p = args.pointers
        beta_ptr = _beta_ptr(args, s, has_beta)
        b_op = (p["b"], types[0], ldb)  # first column-major operand: b
        a_op = (p["a"], types[0], lda)
        c_op = (p["c"], types[1], ldc)
        if batch == 1:
            cublas.gemm_ex(h, opb, opa, n, m, k, p["alpha"], *b_op, *a_op, beta_ptr, *c_op, compute, GEMM_DEFAULT_ALGO)
        else:
            cublas.gemm_strided_batched_ex(
                h, opb, opa, n, m, k, p["alpha"], *b_op, k * n, *a_op, m * k, beta_ptr, *c_op, m * n, batch,
                compute, GEMM_DEFAULT_ALGO,
            )  # fmt: skip

    params, dscalars = scaled_output([pointer("a", dt, "in"), pointer("b", dt, "in")], "c", out, st, alpha, beta,
                                     has_beta)
    counts = {"a": batch * m * k, "b": batch * k * n, "c": batch * m * n}
    key = ("gemm", m, n, k, batch, dt, out, bool(trans_a), bool(trans_b), has_beta, bool(tf32), ws)
    summary = f"gemm {dt}->{out} ({m}x{k})@({k}x{n})" + (f" x{batch}" if batch > 1 else "")
    host = functools.partial(_host.gemm, m, n, k, batch, dt, out, bool(trans_a), bool(trans_b), has_beta)
    return _spec(name, params, record, key, counts, dscalars, ws, None if has_beta else st, summary, host)


# -- GEMV -------------------------------------------------------------------------------------------------
def gemv(
    m: int,
    n: int,
    *,
    dtype="f32",
    trans: bool = False,
    alpha: float = 1.0,
    beta: float | None = None,
    workspace_bytes: int = H.DEFAULT_BLAS_WORKSPACE,
    name: str = "gemv",
) -> LibraryCall:
    """``y = alpha * op(a) @ x (+ beta * y)`` with ``a`` a C-order ``(m, n)`` matrix.

    Without ``trans``: ``x`` has ``n`` elements and ``y`` has ``m``; with ``trans`` (``a.T @ x``) the other
    way round. f32 or f64; ``alpha``/``beta`` are device scalars.

    >>> mv = gemv(1000, 500)
    >>> mv.counts["x"], mv.counts["y"]
    (500, 1000)
    """
    op = "gemv"
    check_name(op, name)
    m = positive_int(op, "m", m, "rows of a")
    n = positive_int(op, "n", n, "columns of a")
    dt = dtype_name(op, "dtype", dtype, VECTOR_DTYPES)
    alpha = real_number(op, "alpha", alpha)
    has_beta = beta is not None
    if has_beta:
        beta = real_number(op, "beta", beta)
    ws = _workspace(op, workspace_bytes)
    # column-major view of a is a^T: n rows, m columns, ld n
    cop = OP_N if trans else OP_T
    x_len, y_len = (m, n) if trans else (n, m)
    fn = "sgemv" if dt == "f32" else "dgemv"

    def record(args):
        s = args.state
        h = blas_handle(s, args.stream)
        p = args.pointers
        getattr(H.binding("cublas"), fn)(
            h, cop, n, m, p["alpha"], p["a"], n, p["x"], 1, _beta_ptr(args, s, has_beta), p["y"], 1
        )

    params, dscalars = scaled_output([pointer("a", dt, "in"), pointer("x", dt, "in")], "y", dt, dt, alpha, beta,
                                     has_beta)
    counts = {"a": m * n, "x": x_len, "y": y_len}
    key = ("gemv", m, n, dt, bool(trans), has_beta, ws)
    return _spec(
        name,
        params,
        record,
        key,
        counts,
        dscalars,
        ws,
        None if has_beta else dt,
        f"gemv {dt} ({m}x{n}){'^T' if trans else ''}",
        functools.partial(_host.gemv, m, n, bool(trans), has_beta),
    )


# -- AXPY / SCAL ------------------------------------------------------------------------------------------
def axpy(
    n: int,
    *,
    dtype="f32",
    alpha: float = 1.0,
    workspace_bytes: int = H.DEFAULT_BLAS_WORKSPACE,
    name: str = "axpy",
) -> LibraryCall:
    """``y = alpha * x + y`` over ``n`` elements (f32 or f64); ``alpha`` is a device scalar.

    >>> axpy(4096, alpha=0.5).device_scalars
    ('alpha',)
    """
    op = "axpy"
    check_name(op, name)
    n = positive_int(op, "n", n, "number of elements of x and y")
    dt = dtype_name(op, "dtype", dtype, VECTOR_DTYPES)
    alpha = real_number(op, "alpha", alpha)
    ws = _workspace(op, workspace_bytes)
    fn = "saxpy" if dt == "f32" else "daxpy"

    def record(args):
        h = blas_handle(args.state, args.stream)
        p = args.pointers
        getattr(H.binding("cublas"), fn)(h, n, p["alpha"], p["x"], 1, p["y"], 1)

    params = [pointer("x", dt, "in"), pointer("y", dt, "inout"), scalar("alpha", dt, alpha)]
    return _spec(
        name,
        params,
        record,
        ("axpy", n, dt, ws),
        {"x": n, "y": n},
        ["alpha"],
        ws,
        None,
        f"axpy {dt} n={n}",
        _host.axpy,
    )


def scal(
    n: int,
    *,
    dtype="f32",
    alpha: float = 1.0,
    workspace_bytes: int = H.DEFAULT_BLAS_WORKSPACE,
    name: str = "scal",
) -> LibraryCall:
    """``x = alpha * x`` in place over ``n`` elements (f32, f64, or complex c64/c128 with a real alpha).

    ``alpha`` is a device scalar (f32, or f64 for f64/c128).

    >>> scal(1024, dtype="c64", alpha=0.25).params[1].dtype
    'f32'
    """
    op = "scal"
    check_name(op, name)
    n = positive_int(op, "n", n, "number of elements of x")
    dt = dtype_name(op, "dtype", dtype, SCAL_DTYPES)
    alpha = real_number(op, "alpha", alpha)
    ws = _workspace(op, workspace_bytes)
    st = _alpha_type(dt)
    fn = {"f32": "sscal", "f64": "dscal", "c64": "csscal", "c128": "zdscal"}[dt]

    def record(args):
        h = blas_handle(args.state, args.stream)
        p = args.pointers
        getattr(H.binding("cublas"), fn)(h, n, p["alpha"], p["x"], 1)

    params = [pointer("x", dt, "inout"), scalar("alpha", st, alpha)]
    return _spec(name, params, record, ("scal", n, dt, ws), {"x": n}, ["alpha"], ws, None, f"scal {dt} n={n}",
                 _host.scal)
