"""The graph computes what the same nodes compute when run one by one (Engine(debug=True)), for pipelines
whose correctness hangs on the dependencies the planner derives: read-after-write, write-after-read and
write-after-write on one buffer. Every buffer is poisoned before each run and compared with NumPy too."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda import BlockBuilder

N = 1 << 22  # large enough that a missing dependency shows up as a race

ACC = r'''
extern "C" __global__ void accumulate(/*inout*/ float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}'''


def hazards_block(kernels) -> rxcuda.Block:
    """t = a + b (write); u = 2 t (read after write); t += c (write after read of u's kernel, and after
    the first write); v = 3 t (read after the second write)."""
    b = BlockBuilder("hazards", size=N)
    add = b.add_kernel(kernels / "vector_add.ptx", name="add")
    mul_u = b.add_kernel(kernels / "scalar_mul.ptx", name="mul_u")
    acc = b.add_kernel(rxcuda.compile_cuda(ACC), name="acc")
    mul_v = b.add_kernel(kernels / "scalar_mul.ptx", name="mul_v")
    b.input("a", add["a"])
    b.input("b", add["b"])
    b.input("c", acc["x"])
    b.connect(add["out"], [mul_u["x"], acc["y"], mul_v["x"]], name="t")
    b.output("u", mul_u["out"])
    b.output("v", mul_v["out"])
    b.scalar("su", mul_u["scale"], default=2.0)
    b.scalar("sv", mul_v["scale"], default=3.0)
    b.scalar("n", [add["n"], mul_u["n"], acc["n"], mul_v["n"]], default=N)
    return b.build()


@pytest.mark.parametrize("debug", [False, True], ids=["graph", "eager"])
def test_hazards_on_one_buffer_are_ordered(kernels, rng, debug):
    with rxcuda.Engine(debug=debug) as engine:
        blk = engine.add(hazards_block(kernels))
        for _ in range(5):
            a, b, c = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
            for port, value in (("a", a), ("b", b), ("c", c)):
                engine.write(blk[port], value)
            for port in ("u", "v"):
                engine.write(blk[port], np.full(N, np.nan, np.float32))  # poison
            engine.tick()
            p = engine.plan
            assert [n.label for n in p.nodes] == ["hazards/add", "hazards/mul_u", "hazards/acc", "hazards/mul_v"]
            assert p.deps == ((), (0,), (0, 1), (2,))  # RAW, WAR + WAW, RAW
            t = a.astype(np.float64) + b
            np.testing.assert_allclose(engine.read(blk["u"]), 2 * t, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(engine.read(blk["v"]), 3 * (t + c), rtol=1e-5, atol=1e-5)


def test_graph_and_eager_runs_agree_on_every_buffer(kernels, rng):
    a, b, c = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    results = []
    for debug in (False, True):
        with rxcuda.Engine(debug=debug) as engine:
            blk = engine.add(hazards_block(kernels))
            for port, value in (("a", a), ("b", b), ("c", c)):
                engine.write(blk[port], value)
            engine.tick()
            results.append({p: engine.read(blk[p]) for p in ("a", "b", "c", "u", "v")})
    graph, eager = results
    for port in graph:
        np.testing.assert_array_equal(graph[port], eager[port], err_msg=port)
