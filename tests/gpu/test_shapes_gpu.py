"""Shapes and element types on a real GPU, checked against NumPy on fresh random data: float4 buffers through
two kernels, struct ports, a bound (n, 4) CuPy array, float4 state fed back through delayed connections, a 2-D
shape reduced over an axis, and resizes flowing downstream (in place and by a rebuild), right before and after."""

from __future__ import annotations

import cupy as cp
import numpy as np
import pytest

import rxcuda
from rxcuda import Block, BlockBuilder, Follow, Reduce

DRIFT = r"""
extern "C" __global__ void drift(const float4* pos, const float4* vel, float4* out, float dt, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float4 p = pos[i], v = vel[i];
                 out[i] = make_float4(p.x + dt * v.x, p.y + dt * v.y, p.z + dt * v.z, p.w); }
}
"""
SCALE4 = r"""
extern "C" __global__ void scale4(const float4* v, float4* out, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float4 a = v[i]; out[i] = make_float4(a.x * s, a.y * s, a.z * s, a.w - 1.0f); }
}
"""
WEIGH = r"""
struct Particle { float3 pos; float3 vel; float mass; };
extern "C" __global__ void weigh(const Particle* ps, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = ps[i].mass * ps[i].vel.x + ps[i].pos.z;
}
"""
INTEGRATE = r"""
extern "C" __global__ void integrate(const float4* pos, const float4* vel, float4* pos_out, float4* vel_out,
                                     float dt, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float4 p = pos[i], v = vel[i]; v.y -= 9.8f * dt;
                 pos_out[i] = make_float4(p.x + dt * v.x, p.y + dt * v.y, p.z + dt * v.z, p.w); vel_out[i] = v; }
}
"""
SQUARE2D = r"""
extern "C" __global__ void square2d(const float* x, float* out, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r = blockIdx.y * blockDim.y + threadIdx.y;
    if (r < rows && c < cols) { float v = x[r * cols + c]; out[r * cols + c] = v * v + 1.0f; }
}
"""
ROWSUM = r"""
extern "C" __global__ void rowsum(const float* x, float* s, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) { float acc = 0.0f; for (int c = 0; c < cols; ++c) acc += x[r * cols + c]; s[r] = acc; }
}
"""


def rand4(rng, n):
    return (rng.standard_normal((n, 4)) + 0.5).astype(np.float32)


def test_a_float4_buffer_through_two_kernels(engine, rng):
    n = 10_007
    drift = engine.add(Block.from_cuda(DRIFT, size=n, dt=0.25))
    scale = engine.add(Block.from_cuda(SCALE4, size=n, s=-2.0))
    engine.connect(drift["out"], scale["v"])
    pos, vel = rand4(rng, n), rand4(rng, n)
    engine.write(drift["pos"], pos)
    engine.write(drift["vel"], vel)
    engine.tick()
    moved = pos.copy()
    moved[:, :3] += np.float32(0.25) * vel[:, :3]
    want = moved.copy()
    want[:, :3] *= np.float32(-2.0)
    want[:, 3] -= 1.0
    got = engine.read(scale["out"])
    assert got.shape == (n, 4) and got.dtype == np.float32
    np.testing.assert_allclose(engine.read(drift["out"]), moved, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    view = engine.array(scale["out"])  # CuPy: the lanes on a last axis
    assert view.shape == (n, 4)
    np.testing.assert_allclose(cp.asnumpy(view), want, rtol=1e-6, atol=1e-6)


def test_a_bound_cupy_array_of_lanes_is_a_float4_port(engine, rng):
    n = 4099
    drift = engine.add(Block.from_cuda(DRIFT, size=n, dt=0.5))
    pos, vel = rand4(rng, n), rand4(rng, n)
    engine.bind(drift["pos"], cp.asarray(pos))
    engine.write(drift["vel"], vel)
    engine.tick()
    want = pos.copy()
    want[:, :3] += np.float32(0.5) * vel[:, :3]
    np.testing.assert_allclose(engine.read(drift["out"]), want, rtol=1e-6, atol=1e-6)


def test_a_struct_port(engine, rng):
    n = 3001
    weigh = engine.add(Block.from_cuda(WEIGH, size=n))
    ps = np.zeros(n, rxcuda.numpy_dtype(weigh["ps"].spec.dtype))
    ps["pos"] = rng.standard_normal((n, 3))
    ps["vel"] = rng.standard_normal((n, 3))
    ps["mass"] = rng.uniform(0.5, 2.0, n)
    engine.write(weigh["ps"], ps)
    engine.tick()
    want = ps["mass"] * ps["vel"][:, 0] + ps["pos"][:, 2]
    np.testing.assert_allclose(engine.read(weigh["out"]), want, rtol=1e-6, atol=1e-6)


def test_float4_state_through_delayed_connections(engine, rng):
    n, dt = 2048, np.float32(0.01)
    integ = engine.add(Block.from_cuda(INTEGRATE, size=n, dt=float(dt)))
    pos, vel = rand4(rng, n), rand4(rng, n)
    engine.connect(integ["pos_out"], integ["pos"], delay=1, initial=pos)
    engine.connect(integ["vel_out"], integ["vel"], delay=1, initial=vel)
    p, v = pos.copy(), vel.copy()
    for _ in range(5):
        engine.tick()
        v[:, 1] -= np.float32(9.8) * dt
        p[:, :3] += dt * v[:, :3]
        np.testing.assert_allclose(engine.read(integ["pos_out"]), p, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(engine.read(integ["vel_out"]), v, rtol=1e-5, atol=1e-5)


def _square(shape):
    b = BlockBuilder("square", shape=shape)
    k = b.add_kernel(rxcuda.compile_cuda(SQUARE2D), block=(16, 16))  # a 2-D grid over the shape
    b.input("x", k["x"])
    b.output("out", k["out"])
    b.scalar("rows", k["rows"], size_of=("x", 0))
    b.scalar("cols", k["cols"], size_of=("x", 1))
    return b.build()


def _rowsum(shape):
    b = BlockBuilder("rowsum")
    k = b.add_kernel(rxcuda.compile_cuda(ROWSUM), over="s", block=64)  # one thread per row
    b.input("x", k["x"], shape=shape, rule=Follow())
    b.output("s", k["s"], shape=Reduce("x", axis=1))
    b.scalar("rows", k["rows"], size_of=("x", 0))
    b.scalar("cols", k["cols"], size_of=("x", 1))
    return b.build()


def _check_2d(engine, square, rowsum, x):
    np.testing.assert_allclose(engine.read(square["out"]), x * x + 1, rtol=1e-6)
    got = engine.read(rowsum["s"])
    assert got.shape == (x.shape[0],)
    np.testing.assert_allclose(got, (x.astype(np.float64) ** 2 + 1).sum(axis=1), rtol=1e-4)


def test_a_2d_shape_reduced_over_an_axis_and_resized(engine, rng):
    h, w = 123, 77
    square = engine.add(_square((h, w)))
    rowsum = engine.add(_rowsum((h, w)))
    engine.connect(square["out"], rowsum["x"])
    assert square.launch().grid == (5, 8, 1) and rowsum["s"].spec.shape == (h,)
    x = rng.standard_normal((h, w)).astype(np.float32)
    engine.write(square["x"], x)
    engine.tick()
    _check_2d(engine, square, rowsum, x)
    # smaller: every buffer still fits, so only grids and sizes change in the running graph
    x = rng.standard_normal((100, 60)).astype(np.float32)
    engine.write(square["x"], x, resize=True)
    frame = engine.tick()
    assert frame.tiers == ("parameters",)
    assert engine.shape(rowsum["s"]) == (100,)
    _check_2d(engine, square, rowsum, x)
    # larger: the buffers are reallocated and the graph rebuilt
    x = rng.standard_normal((300, 129)).astype(np.float32)
    engine.write(square["x"], x, resize=True)
    frame = engine.tick()
    assert frame.tiers == ("structure",)
    _check_2d(engine, square, rowsum, x)


def test_a_resize_flows_downstream(engine, rng, kernels):
    n = 5000
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=3.0))
    engine.connect(add["out"], mul["x"])
    for m, tier in ((n, None), (3001, "parameters"), (20_000, "structure"), (7, "parameters")):
        a = rng.standard_normal(m).astype(np.float32)
        b = rng.standard_normal(m).astype(np.float32)
        engine.write(add["a"], a, resize=True)
        engine.write(add["b"], b, resize=True)
        frame = engine.tick()
        if tier is not None:
            assert frame.tiers == (tier,), m
        got = engine.read(mul["out"])
        assert got.shape == (m,)
        np.testing.assert_allclose(got, (a + b) * 3, rtol=1e-6, atol=1e-6)
        # unchanged data, another frame: the same results
        engine.tick()
        np.testing.assert_allclose(engine.read(mul["out"]), (a + b) * 3, rtol=1e-6, atol=1e-6)


def test_a_resize_seen_by_an_observer_and_a_stream(engine, rng, kernels):
    from reactivex.subject import Subject

    n = 1000
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    a_in, b_in = Subject(), Subject()
    engine.feed(add["a"], a_in)
    engine.feed(add["b"], b_in)
    seen: list = []
    sub = engine.observe(add["out"]).subscribe(seen.append)  # one subscription across the resizes
    for m in (n, 600, 3000):
        a, b = rng.standard_normal(m).astype(np.float32), rng.standard_normal(m).astype(np.float32)
        if m != n:
            engine.resize(add["a"], (m,))
            engine.resize(add["b"], (m,))
            engine.tick()  # the new shape; the streams give arrays of it from now on
        a_in.on_next(a)
        b_in.on_next(b)
        engine.tick()
        assert seen[-1].shape == (m,)
        np.testing.assert_allclose(seen[-1], a + b, rtol=1e-6)
    sub.dispose()


def test_a_resize_through_a_delayed_loop_keeps_the_state(engine, rng, kernels):
    n, m = 4096, 1500
    acc = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n, name="acc"))
    start = rng.standard_normal(n).astype(np.float32)
    engine.connect(acc["out"], acc["b"], delay=1, initial=start)  # out = (last frame's out) + a
    x = rng.standard_normal(n).astype(np.float32)
    engine.write(acc["a"], x)
    want = start
    for _ in range(3):
        engine.tick()
        want = want + x
    np.testing.assert_array_equal(engine.read(acc["out"]), want)
    x2 = rng.standard_normal(m).astype(np.float32)
    engine.write(acc["a"], x2, resize=True)  # smaller: in place, the state buffer keeps its first m values
    assert engine.tick().tiers == ("parameters",)
    want = want[:m] + x2
    np.testing.assert_array_equal(engine.read(acc["out"]), want)
    engine.tick()
    np.testing.assert_array_equal(engine.read(acc["out"]), want + x2)


@pytest.mark.parametrize("shape", [(64, 48), (33, 100)])
def test_from_kernel_with_a_2d_shape(engine, rng, shape):
    src = r"""
    extern "C" __global__ void twice(const float* x, float* out, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = 2.0f * x[i];
    }"""
    blk = engine.add(Block.from_cuda(src, shape=shape))
    x = rng.standard_normal(shape).astype(np.float32)
    engine.write(blk["x"], x)
    engine.tick()
    got = engine.read(blk["out"])
    assert got.shape == shape
    np.testing.assert_allclose(got, 2 * x, rtol=1e-6)
