"""Library calls on the CPU device: each call's NumPy equivalent, issued as a host function in the graph's order.

A call built by this package runs on a GPU through its library (cuBLAS, cuFFT, cuSPARSE, cuSOLVER, cuRAND) and on
the CPU device through the NumPy function :func:`with_host` gives it. The engine does the same on both: it sets
the call up, captures its ``record`` on the capture stream into a child graph, and captures again when a host
scalar changes or a buffer is rebound. Where the CPU device's context is current (``rxcuda.cuda._host``), ``setup``
makes no handles and ``record`` issues one host function (a host node of the captured graph) that computes on the
call's buffers when the graph reaches it, after the kernels before it. Device scalars (``alpha``, ``beta``) are read
from their device slots when it runs, so changing them needs no recapture there either.

Arithmetic follows the GPU's types: f32 calls compute in f32 (NumPy's BLAS and pocketfft), f16/bf16 GEMMs in f32,
SpMV sums in f64 then rounds; results agree with the GPU's to the tolerances its tests use, not bit for bit.
``lu_factor`` is LAPACK's ``getrf`` (partial pivoting, the first largest pivot; ``|re| + |im|`` for complex), so
``lu``, ``piv`` and ``info`` are those cuSOLVER writes, and ``lu_solve`` reads them as ``getrs`` does.
"""

from __future__ import annotations

import ctypes

import attrs
import numpy as np

from ..cuda import _host
from ..model import _dtypes
from ..model._errors import CudaError
from ._common import LibraryCall


class OnHost:
    """What a call's ``setup`` returns on the CPU device: no handles, no workspace."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


def view(ptr: int, dtype: str, count: int) -> np.ndarray:
    """The ``count`` elements of ``dtype`` at host address ``ptr`` (CPU-device memory), as a writable array."""
    np_dt = np.dtype(_dtypes.to_numpy(dtype))
    raw = (ctypes.c_char * (count * np_dt.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=np_dt, count=count)


def with_host(call: LibraryCall, compute) -> LibraryCall:
    """``call``, computing ``compute(arrays, values)`` on the CPU device: ``arrays`` maps every pointer parameter and
    device scalar to its array (a device scalar's holds one element), ``values`` the host scalars."""
    gpu_setup, gpu_record, gpu_teardown, gpu_prepare = call.setup, call.record, call.teardown, call.prepare
    types = {p.name: p.dtype for p in call.params}
    buffers = [p.name for p in call.params if p.is_pointer]
    slots = tuple(call.device_scalars)
    counts = dict(call.counts)
    name = call.name

    def setup(device_ordinal: int):
        if _host.current() is None:
            return gpu_setup(device_ordinal) if gpu_setup is not None else None
        return OnHost(name)

    def record(args) -> None:
        if not isinstance(args.state, OnHost):
            gpu_record(args)
            return
        arrays = {n: view(args.pointers[n], types[n], counts[n]) for n in buffers}
        arrays.update({n: view(args.pointers[n], types[n], 1) for n in slots})
        values = dict(args.values)
        _host.launch_host(args.stream, lambda: compute(arrays, values), f"{name} (NumPy, on the CPU device)")

    def teardown(state) -> None:
        if not isinstance(state, OnHost) and gpu_teardown is not None:
            gpu_teardown(state)

    def prepare(args) -> None:
        if not isinstance(args.state, OnHost):
            gpu_prepare(args)

    return attrs.evolve(call, setup=setup, record=record, teardown=teardown,
                        prepare=prepare if gpu_prepare is not None else None)


def refuse_on_host(call: LibraryCall, why: str) -> LibraryCall:
    """``call``, whose setup on the CPU device raises ``why`` (a call the CPU device cannot reproduce faithfully)."""
    gpu_setup = call.setup

    def setup(device_ordinal: int):
        if _host.current() is not None:
            raise CudaError("library call setup", "CUDA_ERROR_NOT_SUPPORTED", f"{call.name}: {why}", 801)
        return gpu_setup(device_ordinal) if gpu_setup is not None else None

    return attrs.evolve(call, setup=setup)


# -- element types ------------------------------------------------------------------------------------------
def as_f32(a: np.ndarray, dtype: str) -> np.ndarray:
    """f16 or bf16 elements (bf16 held as uint16 bits) as f32."""
    if dtype == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def store(out: np.ndarray, value: np.ndarray, dtype: str) -> None:
    """Write ``value`` into ``out`` as ``dtype`` (bf16: rounded to nearest even, as the GPU converts)."""
    if dtype == "bf16":
        bits = np.ascontiguousarray(value, dtype=np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        nan = np.isnan(value)
        out[...] = np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)
    else:
        out[...] = value


def scaled(result: np.ndarray, arrays: dict, out: str, has_beta: bool) -> np.ndarray:
    """``alpha * result (+ beta * out)``; a zero beta does not read ``out`` (BLAS's rule: garbage there stays out)."""
    alpha = arrays["alpha"][0]
    value = alpha * result
    if has_beta:
        beta = arrays["beta"][0]
        if beta != 0:
            value = value + beta * arrays[out]
    return value


# -- cuBLAS -------------------------------------------------------------------------------------------------
def gemm(m, n, k, batch, dt, out, trans_a, trans_b, has_beta, arrays, values) -> None:
    a = arrays["a"].reshape(batch, *((k, m) if trans_a else (m, k)))
    b = arrays["b"].reshape(batch, *((n, k) if trans_b else (k, n)))
    if dt in ("f16", "bf16"):
        a, b = as_f32(a, dt), as_f32(b, dt)
    a = a.transpose(0, 2, 1) if trans_a else a
    b = b.transpose(0, 2, 1) if trans_b else b
    c = arrays["c"].reshape(batch, m, n)
    ct = np.float64 if dt == "f64" else np.float32
    prev = {"c": as_f32(c, out) if out == "bf16" else c.astype(ct)} if has_beta else {}
    value = scaled(np.matmul(a, b), {**arrays, **prev}, "c", has_beta)
    store(c, value.astype(ct, copy=False), out)


def gemv(m, n, trans, has_beta, arrays, values) -> None:
    a = arrays["a"].reshape(m, n)
    arrays["y"][...] = scaled((a.T if trans else a) @ arrays["x"], arrays, "y", has_beta)


def axpy(arrays, values) -> None:
    arrays["y"][...] = arrays["alpha"][0] * arrays["x"] + arrays["y"]


def scal(arrays, values) -> None:
    arrays["x"][...] = arrays["x"] * arrays["alpha"][0]


# -- cuFFT --------------------------------------------------------------------------------------------------
def fft(kind, shape, batch, inverse, scale, arrays, values) -> None:
    """A C2C, R2C or C2R transform of ``batch`` arrays of ``shape`` (the real side's), unscaled then times
    ``scale``, as cuFFT's transform and the call's ``scal`` step do."""
    axes = tuple(range(-len(shape), 0))
    half = shape[:-1] + (shape[-1] // 2 + 1,)
    y = arrays["y"]
    if kind == "c2c":
        x = arrays["x"].reshape(batch, *shape)
        r = np.fft.ifftn(x, axes=axes, norm="forward") if inverse else np.fft.fftn(x, axes=axes, norm="backward")
    elif kind == "r2c":
        r = np.fft.rfftn(arrays["x"].reshape(batch, *shape), axes=axes, norm="backward")
    else:
        r = np.fft.irfftn(arrays["x"].reshape(batch, *half), s=shape, axes=axes, norm="forward")
    if scale != 1.0:
        r = r * scale
    y[...] = r.reshape(-1).astype(y.dtype, copy=False)


# -- cuSPARSE -----------------------------------------------------------------------------------------------
def spmv(rows, cols, transpose, has_beta, arrays, values) -> None:
    indptr, indices, data, x = arrays["indptr"], arrays["indices"], arrays["data"], arrays["x"]
    nnz = int(indptr[rows]) - int(indptr[0])
    row_of = np.repeat(np.arange(rows), np.diff(indptr.astype(np.int64)))
    cols_of = indices[int(indptr[0]):int(indptr[0]) + nnz]
    vals = data[int(indptr[0]):int(indptr[0]) + nnz].astype(np.float64)
    if transpose:
        r = np.bincount(cols_of, weights=vals * x[row_of], minlength=cols)
    else:
        r = np.bincount(row_of, weights=vals * x[cols_of], minlength=rows)
    y = arrays["y"]
    y[...] = scaled(r.astype(y.dtype), arrays, "y", has_beta)


# -- cuSOLVER -----------------------------------------------------------------------------------------------
def _magnitude(v: np.ndarray) -> np.ndarray:
    return np.abs(v.real) + np.abs(v.imag) if np.iscomplexobj(v) else np.abs(v)


def lu_factor(n, source, target, arrays, values) -> None:
    """LAPACK ``getrf`` of the column-major view of ``a`` (``a.T``), in place in ``target``."""
    f = arrays[source].reshape(n, n).T.copy()  # the column-major matrix getrf factors
    piv, info = arrays["piv"], 0
    for j in range(n):
        p = j + int(np.argmax(_magnitude(f[j:, j])))
        piv[j] = p + 1
        if f[p, j] == 0:
            info = info or j + 1
            continue
        if p != j:
            f[[j, p]] = f[[p, j]]
        f[j + 1:, j] /= f[j, j]
        f[j + 1:, j + 1:] -= np.outer(f[j + 1:, j], f[j, j + 1:])
    arrays[target][...] = f.T.reshape(-1)
    arrays["info"][0] = info


def lu_solve(n, nrhs, source, target, arrays, values) -> None:
    """LAPACK ``getrs`` with ``trans='T'`` on the factors of ``lu_factor``: ``a @ x[j] = b[j]`` for every row."""
    f = arrays["lu"].reshape(n, n).T  # the column-major factors: P M = L U with M = a.T
    lower = np.tril(f, -1) + np.eye(n, dtype=f.dtype)
    upper = np.triu(f)
    rhs = arrays[source].reshape(nrhs, n).T.astype(f.dtype)  # columns: M.T x = b, that is U.T L.T P x = b
    z = np.linalg.solve(lower.T, np.linalg.solve(upper.T, rhs))
    piv = arrays["piv"]
    for j in range(n - 1, -1, -1):  # x = P.T z: the interchanges undone last to first
        p = int(piv[j]) - 1
        if p != j:
            z[[j, p]] = z[[p, j]]
    arrays[target][...] = z.T.reshape(-1)
    arrays["info"][0] = 0

