"""Library calls as graph blocks: cuBLAS, cuFFT, cuRAND, cuSPARSE and cuSOLVER, captured into the graph.

Each factory returns a :class:`LibraryCall` (a :class:`~rxcuda.model._describe.CallSpec`): its ``params``
are the block's ports (buffers with dtype, direction and element count in ``counts``) and scalars;
the engine sets it up once (handles, plans, workspaces), captures its ``record`` into a child-graph node,
and recaptures only when a host scalar changes or one of its buffers is rebound. ``alpha``/``beta``-like
scalars (``device_scalars``) live in device memory: changing them is a small copy, no recapture. Arrays are
C-order (NumPy/CuPy layout).

Shapes and dtypes are checked when the call is made, never at launch::

    >>> from rxcuda import libraries as lib
    >>> mm = lib.gemm(512, 256, 128, dtype="f16", out_dtype="f32")   # c = a @ b, f32 accumulation
    >>> spectrum = lib.rfft(4096, batch=16)                          # 16 frames of 4096 samples
    >>> noise = lib.random_normal(1 << 16, stddev=0.1, backend="philox")
    >>> step = lib.chain(lib.gemm(64, 64, 64), (lib.rfft(64, batch=64), {"x": "c", "y": "spectrum"}),
    ...                  internal=("c",))                             # one captured node
    >>> [p.name for p in step.params], step.counts["spectrum"]
    (['a', 'b', 'alpha', 'spectrum'], 2112)

Functions: :func:`gemm`, :func:`gemv`, :func:`axpy`, :func:`scal` (cuBLAS); :func:`fft`, :func:`ifft`,
:func:`rfft`, :func:`irfft`, :func:`fft2`, :func:`ifft2`, :func:`rfft2`, :func:`irfft2` (cuFFT);
:func:`random_uniform`, :func:`random_normal` (cuRAND or a Philox kernel); :func:`spmv` (cuSPARSE CSR);
:func:`lu_factor`, :func:`lu_solve` (cuSOLVER); :func:`chain` and :func:`kernel` (one node from many calls).
"""

from ._blas import axpy, gemm, gemv, scal
from ._chain import chain, kernel
from ._common import LibraryCall
from ._fft import fft, fft2, ifft, ifft2, irfft, irfft2, rfft, rfft2
from ._rand import random_normal, random_uniform
from ._solve import lu_factor, lu_solve
from ._sparse import spmv

__all__ = [
    "LibraryCall",
    "axpy",
    "chain",
    "fft",
    "fft2",
    "gemm",
    "gemv",
    "ifft",
    "ifft2",
    "irfft",
    "irfft2",
    "kernel",
    "lu_factor",
    "lu_solve",
    "random_normal",
    "random_uniform",
    "rfft",
    "rfft2",
    "scal",
    "spmv",
]
