"""Kernel sources on a GPU: what compile_cuda gives the engine is what the kernel needs at run time."""

import numpy as np

import rxcuda
from rxcuda.sources._nvrtc import compile_cuda

BOUNDED = """
extern "C" __global__ void __launch_bounds__(128)
bounded(const float* x, float* out, float* block_dims, float s, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = x[i] * s + 1.0f;
        block_dims[i] = (float)blockDim.x;
    }
}
"""


def test_launch_bounds_give_the_block_size_the_engine_launches(engine):
    rng = np.random.default_rng()
    n = 10_000  # not a multiple of 128 or 256
    code = compile_cuda(BOUNDED)
    assert code.block_size == 128
    block = engine.add(rxcuda.Block.from_kernel(code, size=n, s=2.5))
    x = rng.uniform(0.5, 2.0, n).astype(np.float32) * rng.choice([-1.0, 1.0], n).astype(np.float32)
    engine.write(block["x"], x)
    engine.tick()  # a 256-thread launch of a 128-bound kernel fails on the GPU
    np.testing.assert_allclose(engine.read(block["out"]), x * np.float32(2.5) + np.float32(1.0), rtol=1e-6)
    np.testing.assert_array_equal(engine.read(block["block_dims"]), np.full(n, 128.0, np.float32))
