"""cuSOLVER dense LU: ``lu_factor`` (getrf, partial pivoting) and ``lu_solve`` (getrs).

Matrices are C-order. cuSOLVER is column-major, so ``lu_factor`` factors the column-major view of ``a``
(that is ``a.T``) and ``lu_solve`` solves with the transposed factors, which is ``a @ x = b`` — no copy
or transpose kernel. ``lu`` and ``piv`` are therefore meant for :func:`lu_solve`, not for SciPy.

Right-hand sides are rows: ``b`` has shape ``(nrhs, n)`` and ``x[j]`` solves ``a @ x[j] = b[j]``
(``numpy.linalg.solve(a, b.T).T``). ``info`` (one i32) is cuSOLVER's status: 0 on success, ``i > 0``
when ``U[i-1, i-1]`` is exactly zero (singular matrix). The getrf workspace is allocated in ``setup``.
"""

from __future__ import annotations

import functools

from ..cuda import _launch
from ..model import _dtypes
from . import _handles as H
from . import _host
from ._common import LibraryCall, check_name, dtype_name, pointer, positive_int

_PREFIX = {"f32": "s", "f64": "d", "c64": "c", "c128": "z"}
OP_T = 1  # CUBLAS_OP_T
DTYPES = ("f32", "f64", "c64", "c128")


def _factor_setup(n: int, dt: str, device_ordinal: int):
    st = H.Resources(device_ordinal)
    try:
        cusolver = H.binding("cusolverDn")
        handle = st.libs.cusolver()
        st.extra["handle"] = handle
        dummy = st.alloc(256).ptr
        lwork = int(getattr(cusolver, f"{_PREFIX[dt]}getrf_buffer_size")(handle, n, n, dummy, n))
        st.extra["workspace"] = st.alloc(max(lwork, 1) * _dtypes.itemsize(dt))
    except BaseException:
        st.close()
        raise
    return st


def _solve_setup(device_ordinal: int):
    st = H.Resources(device_ordinal)
    try:
        st.extra["handle"] = st.libs.cusolver()
    except BaseException:
        st.close()
        raise
    return st


def _prelude(args, copy: tuple[str, str] | None, nbytes: int):
    """cuSOLVER bound to the capturing stream; first copy ``copy[1]`` into ``copy[0]`` when the call must
    not overwrite its input. Returns (bindings, handle, pointers)."""
    cusolver = H.binding("cusolverDn")
    h = args.state.extra["handle"]
    cusolver.set_stream(h, args.stream)
    p = args.pointers
    if copy is not None:
        _launch.copy_async(p[copy[0]], p[copy[1]], nbytes, args.stream)
    return cusolver, h, p


def lu_factor(n: int, *, dtype="f32", overwrite_a: bool = False, name: str = "lu_factor") -> LibraryCall:
    """LU factorisation with partial pivoting of a C-order ``(n, n)`` matrix ``a``.

    Ports: ``a`` (in), ``lu`` (out, the factors), ``piv`` (out, ``n`` i32 pivots, 1-based), ``info`` (out,
    one i32). With ``overwrite_a`` the factors replace ``a`` (``a`` is inout, no ``lu`` port, no copy).
    dtypes f32, f64, c64, c128.

    >>> f = lu_factor(512, dtype="f64")
    >>> [p.name for p in f.params], f.counts["piv"]
    (['a', 'lu', 'piv', 'info'], 512)
    """
    op = "lu_factor"
    check_name(op, name)
    n = positive_int(op, "n", n, "order of the square matrix a")
    dt = dtype_name(op, "dtype", dtype, DTYPES)
    fn = f"{_PREFIX[dt]}getrf"
    nbytes = n * n * _dtypes.itemsize(dt)
    target = "a" if overwrite_a else "lu"

    def record(args):
        cusolver, h, p = _prelude(args, None if overwrite_a else ("lu", "a"), nbytes)
        getattr(cusolver, fn)(h, n, n, p[target], n, args.state.extra["workspace"].ptr, p["piv"], p["info"])

    if overwrite_a:
        params = (pointer("a", dt, "inout"),)
        counts = {"a": n * n}
    else:
        params = (pointer("a", dt, "in"), pointer("lu", dt, "out"))
        counts = {"a": n * n, "lu": n * n}
    params += (pointer("piv", "i32", "out"), pointer("info", "i32", "out"))
    counts.update(piv=n, info=1)
    return _host.with_host(LibraryCall(
        name=name,
        params=params,
        record=record,
        key=("lu_factor", n, dt, bool(overwrite_a)),
        setup=functools.partial(_factor_setup, n, dt),
        teardown=H.close_resources,
        counts=counts,
        summary=f"lu_factor {dt} {n}x{n}",
    ), functools.partial(_host.lu_factor, n, "a", target))


def lu_solve(n: int, nrhs: int = 1, *, dtype="f32", overwrite_b: bool = False, name: str = "lu_solve") -> LibraryCall:
    """Solve ``a @ x[j] = b[j]`` for ``nrhs`` right-hand sides with the output of :func:`lu_factor`.

    Ports: ``lu`` and ``piv`` (in, from ``lu_factor``), ``b`` (in, ``(nrhs, n)`` C-order), ``x`` (out, same
    shape), ``info`` (out, one i32). With ``overwrite_b`` the solution replaces ``b`` (inout, no ``x``).

    >>> s = lu_solve(512, 4, dtype="f64")
    >>> s.counts["b"], s.counts["x"]
    (2048, 2048)
    """
    op = "lu_solve"
    check_name(op, name)
    n = positive_int(op, "n", n, "order of the factored matrix")
    nrhs = positive_int(op, "nrhs", nrhs, "number of right-hand sides (rows of b)")
    dt = dtype_name(op, "dtype", dtype, DTYPES)
    fn = f"{_PREFIX[dt]}getrs"
    nbytes = n * nrhs * _dtypes.itemsize(dt)
    target = "b" if overwrite_b else "x"

    def record(args):
        cusolver, h, p = _prelude(args, None if overwrite_b else ("x", "b"), nbytes)
        getattr(cusolver, fn)(h, OP_T, n, nrhs, p["lu"], n, p["piv"], p[target], n, p["info"])

    params = (pointer("lu", dt, "in"), pointer("piv", "i32", "in"))
    counts = {"lu": n * n, "piv": n}
    if overwrite_b:
        params += (pointer("b", dt, "inout"),)
        counts["b"] = n * nrhs
    else:
        params += (pointer("b", dt, "in"), pointer("x", dt, "out"))
        counts.update(b=n * nrhs, x=n * nrhs)
    params += (pointer("info", "i32", "out"),)
    counts["info"] = 1
    return _host.with_host(LibraryCall(
        name=name,
        params=params,
        record=record,
        key=("lu_solve", n, nrhs, dt, bool(overwrite_b)),
        setup=_solve_setup,
        teardown=H.close_resources,
        counts=counts,
        summary=f"lu_solve {dt} {n}x{n}, {nrhs} right-hand side(s)",
    ), functools.partial(_host.lu_solve, n, nrhs, "b", target))
