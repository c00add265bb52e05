"""Matrix products through cuBLAS that a stream capture can record (``rt.function`` on ``cuda``).

CuPy refuses to call cuBLAS while a stream captures, so the CUDA backend's matmul groups go through :class:`Gemm`
when ``Backend.capturing`` is set: ``gemm_ex`` through nvmath's bindings, host-side ``alpha``/``beta`` and a
fixed workspace (no allocation inside the capture).
"""

from __future__ import annotations

import numpy as np

from ._graph import Node

_TYPES = {np.dtype(np.float32): (0, 68, np.float32), np.dtype(np.float64): (1, 70, np.float64),
          np.dtype(np.float16): (2, 68, np.float32)}  # cudaDataType, cublasComputeType, scale type
_OP_N, _OP_T = 0, 1
_WORKSPACE = 32 << 20


class Gemm:
    """``a @ b`` (NumPy's matmul rules) through cuBLAS ``gemm_ex`` on ``stream``: C-order operands or their
    transposes read in place, batches as one call each; host-side scalars and a fixed workspace, so the calls
    can be captured into a graph."""

    def __init__(self, cp, stream):
        from ..libraries._handles import binding

        self.cp = cp
        self.cublas = binding("cublas")
        self.handle = self.cublas.create()
        self.cublas.set_stream(self.handle, stream.ptr)
        with stream:
            self.workspace = cp.empty(_WORKSPACE, dtype=cp.uint8)
        self.cublas.set_workspace(self.handle, self.workspace.data.ptr, _WORKSPACE)
        self.cublas.set_pointer_mode(self.handle, 0)  # host: alpha and beta are read when a call is issued
        self.scalars = {t: (np.ones(1, t), np.zeros(1, t)) for t in (np.float32, np.float64)}

    def __call__(self, a, b, node: Node):
        cp = self.cp
        dt = node.dtype
        if dt not in _TYPES or a.dtype != dt or b.dtype != dt:
            raise TypeError(f"matmul of {a.dtype} and {b.dtype} inside a CUDA graph: cuBLAS takes two operands of one "
                            "type, f32, f64 or f16; cast them in the function (x.astype('f32') @ w), or use "
                            "rt.function(f, graphs=False)")
        a2 = a if a.ndim > 1 else a.reshape(1, -1)
        b2 = b if b.ndim > 1 else b.reshape(-1, 1)
        m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
        if 0 in (m, n, k):
            return cp.zeros(node.shape, dt)
        if a2.ndim == 2 and b2.ndim == 2:
            out = cp.empty((m, n), dt)
            self._mm(a2, b2, out, dt)
            return out.reshape(node.shape)
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        a3 = cp.ascontiguousarray(cp.broadcast_to(a2, batch + (m, k))).reshape(-1, m, k)
        b3 = cp.ascontiguousarray(cp.broadcast_to(b2, batch + (k, n))).reshape(-1, k, n)
        out = cp.empty((a3.shape[0], m, n), dt)
        for i in range(a3.shape[0]):
            self._mm(a3[i], b3[i], out[i], dt)
        return out.reshape(node.shape)

    def _operand(self, x):
        """(cuBLAS op, leading dimension, array) of a 2-D operand stored row-major or as a transpose."""
        if x.flags.c_contiguous:
            return _OP_N, max(x.shape[1], 1), x
        if x.flags.f_contiguous:
            return _OP_T, max(x.shape[0], 1), x
        x = self.cp.ascontiguousarray(x)
        return _OP_N, max(x.shape[1], 1), x

    def _mm(self, a, b, c, dt) -> None:
        # row-major C = A @ B is column-major C^T = B^T @ A^T: the operands swap (rxcuda/libraries/_blas.py)
        data, compute, scale = _TYPES[np.dtype(dt)]
        one, zero = self.scalars[scale]
        opa, lda, a = self._operand(a)
        opb, ldb, b = self._operand(b)
        m, k = a.shape
        n = b.shape[1]
        self.cublas.gemm_ex(self.handle, opb, opa, n, m, k, one.ctypes.data, b.data.ptr, data, ldb,
                            a.data.ptr, data, lda, zero.ctypes.data, c.data.ptr, data, n, compute, -1)
