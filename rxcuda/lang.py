"""The kernel language: compose CUDA kernels from Python, traced once, compiled with NVRTC, cached.

>>> import rxcuda
>>> from rxcuda import lang as rl
>>> @rl.kernel
... def saxpy(x: rl.In[rl.f32], y: rl.In[rl.f32], out: rl.Out[rl.f32], a: rl.f32):
...     i = rl.thread_index()
...     out[i] = a * x[i] + y[i]
>>> block = rxcuda.Block.from_kernel(saxpy, size=1 << 20, a=2.0)  # doctest: +SKIP

Names: array annotations In / Out / InOut; scalar types f32 f64 i32 i64 u32 u64; thread_index, block_idx,
block_dim, grid_dim, size; shared, barrier; atomic_add/min/max; reduce_add/min/max; if_/else_, range,
where/select, cast, var; and the math functions (sin, exp, sqrt, ...). See each one's docstring.
"""

from .sources import _lang
from .sources._compose import ComposedKernel, ComposeError, compose, elementwise, kernel
from .sources._lang import *  # noqa: F403 - this module is the language's namespace

__all__ = ["ComposeError", "ComposedKernel", "kernel", "compose", "elementwise", *_lang.__all__]
