"""cuSPARSE CSR sparse matrix-vector product, ``y = alpha * op(A) @ x (+ beta * y)``.

The matrix is given as the three CSR arrays SciPy's ``csr_matrix`` holds (``indptr``, ``indices``,
``data``), zero-based. The external buffer cuSPARSE needs is sized and allocated in ``setup``; the
descriptors, which only wrap pointers and sizes, are made right before the call while capturing (they
are host objects, so a buffer rebound by the engine just needs a recapture).

``alpha``/``beta`` are device scalars (cuSPARSE in ``CUSPARSE_POINTER_MODE_DEVICE``): no recapture.
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
    scaled_output,
)

_INDEX_TYPE = {"i32": 2, "i64": 3}  # CUSPARSE_INDEX_32I, CUSPARSE_INDEX_64I
ALGS = {"default": 0, "csr_alg1": 2, "csr_alg2": 3}
OP_N, OP_T = 0, 1
INDEX_BASE_ZERO = 0
POINTER_MODE_DEVICE = 1


def _descriptors(cusparse, shape, nnz, itype, vtype, ptrs):
    rows, cols, x_len, y_len = shape
    mat = cusparse.create_csr(rows, cols, nnz, ptrs[0], ptrs[1], ptrs[2], itype, itype, INDEX_BASE_ZERO, vtype)
    try:
        vx = cusparse.create_dn_vec(x_len, ptrs[3], vtype)
        try:
            vy = cusparse.create_dn_vec(y_len, ptrs[4], vtype)
        except BaseException:
            cusparse.destroy_dn_vec(vx)
            raise
    except BaseException:
        cusparse.destroy_sp_mat(mat)
        raise
    return mat, vx, vy


def _destroy(cusparse, mat, vx, vy):
    cusparse.destroy_dn_vec(vy)
    cusparse.destroy_dn_vec(vx)
    cusparse.destroy_sp_mat(mat)


def _setup(shape, nnz, itype, vtype, dt, op_a, alg, has_beta, device_ordinal: int):
    st = H.Resources(device_ordinal)
    try:
        cusparse = H.binding("cusparse")
        handle = st.libs.cusparse()
        st.extra["handle"] = handle
        one = st.constant(1, dt).ptr
        zero = st.constant(0, dt).ptr
        if not has_beta:
            st.extra["zero"] = zero
        # size the external buffer with stand-in pointers: cusparseSpMV_bufferSize reads no data
        dummy = st.alloc(256).ptr
        mat, vx, vy = _descriptors(cusparse, shape, nnz, itype, vtype, (dummy,) * 5)
        try:
            size = cusparse.sp_mv_buffer_size(handle, op_a, one, mat, vx, zero, vy, vtype, alg)
        finally:
            _destroy(cusparse, mat, vx, vy)
        st.extra["buffer"] = st.alloc(max(int(size), 256))
    except BaseException:
        st.close()
        raise
    return st


def spmv(
    rows: int,
    cols: int,
    nnz: int,
    *,
    dtype="f32",
    index_dtype="i32",
    transpose: bool = False,
    alpha: float = 1.0,
    beta: float | None = None,
    alg: str = "default",
    name: str = "spmv",
) -> LibraryCall:
    """CSR ``(rows x cols)`` matrix with ``nnz`` stored values times a dense vector.

    Ports: ``indptr`` (``rows + 1`` indices), ``indices`` (``nnz`` column indices), ``data`` (``nnz``
    values), ``x`` and ``y``: ``y = A @ x`` (``x`` has ``cols`` values, ``y`` has ``rows``) or, with
    ``transpose``, ``y = A.T @ x``. Values f32 or f64; indices i32 or i64. Without ``beta``, ``y`` is
    write-only. ``alg``: ``"default"``, ``"csr_alg1"`` or ``"csr_alg2"`` (deterministic).

    >>> s = spmv(1000, 800, 5000)
    >>> s.counts["indptr"], s.counts["x"], s.counts["y"]
    (1001, 800, 1000)
    """
    op = "spmv"
    check_name(op, name)
    rows = positive_int(op, "rows", rows, "rows of the sparse matrix")
    cols = positive_int(op, "cols", cols, "columns of the sparse matrix")
    nnz = positive_int(op, "nnz", nnz, "number of stored values, len(data)")
    if nnz > rows * cols:
        raise invalid(op, "nnz", f"{nnz} stored values do not fit a {rows}x{cols} matrix; pass len(data)")
    dt = dtype_name(op, "dtype", dtype, ("f32", "f64"))
    it = dtype_name(op, "index_dtype", index_dtype, ("i32", "i64"))
    if it == "i32" and nnz >= 1 << 31:
        raise invalid(op, "index_dtype", f"nnz={nnz} overflows i32 indices; use index_dtype='i64'")
    if alg not in ALGS:
        raise invalid(op, "alg", f"got {alg!r}; use one of {', '.join(ALGS)}")
    alpha = real_number(op, "alpha", alpha)
    has_beta = beta is not None
    if has_beta:
        beta = real_number(op, "beta", beta)
    x_len, y_len = (rows, cols) if transpose else (cols, rows)
    shape = (rows, cols, x_len, y_len)
    itype, vtype, alg_id = _INDEX_TYPE[it], CUDA_DATA_TYPE[dt], ALGS[alg]
    op_a = OP_T if transpose else OP_N

    def record(args):
        st = args.state
        cusparse = H.binding("cusparse")
        h = st.extra["handle"]
        cusparse.set_stream(h, args.stream)
        cusparse.set_pointer_mode(h, POINTER_MODE_DEVICE)
        p = args.pointers
        mat, vx, vy = _descriptors(
            cusparse, shape, nnz, itype, vtype, (p["indptr"], p["indices"], p["data"], p["x"], p["y"])
        )
        try:
            beta_ptr = p["beta"] if has_beta else st.extra["zero"]
            cusparse.sp_mv(h, op_a, p["alpha"], mat, vx, beta_ptr, vy, vtype, alg_id, st.extra["buffer"].ptr)
        finally:
            _destroy(cusparse, mat, vx, vy)

    inputs = [pointer("indptr", it, "in"), pointer("indices", it, "in"), pointer("data", dt, "in"),
              pointer("x", dt, "in")]
    params, dscalars = scaled_output(inputs, "y", dt, dt, alpha, beta, has_beta)
    return _host.with_host(LibraryCall(
        name=name,
        params=tuple(params),
        record=record,
        key=("spmv", rows, cols, nnz, dt, it, bool(transpose), has_beta, alg),
        device_scalars=tuple(dscalars),
        setup=functools.partial(_setup, shape, nnz, itype, vtype, dt, op_a, alg_id, has_beta),
        teardown=H.close_resources,
        counts={"indptr": rows + 1, "indices": nnz, "data": nnz, "x": x_len, "y": y_len},
        summary=f"spmv csr {dt}/{it} {rows}x{cols} nnz={nnz}{' (A^T)' if transpose else ''}",
    ), functools.partial(_host.spmv, rows, cols, bool(transpose), has_beta))
