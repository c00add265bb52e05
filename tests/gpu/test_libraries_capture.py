"""Every library call captured into the engine's graph on a real GPU, checked against NumPy on fresh random data.

Each case runs as a user runs it: ``Block.from_call(spec)`` in an :class:`rxcuda.Engine`, ``engine.write`` the
inputs, ``engine.tick()``, ``engine.read`` the outputs. A frame that ran means the call was captured as a
child-graph node with no memory nodes (the engine refuses captures that allocate). References are computed
in float64 (complex128) by NumPy; tolerances are relative norms of the difference.

The cuRAND capture probe (which host-API sequences capture at all) is a benchmark script, not a test:
``python bench/curand_capture_probe.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda import Block, Launch
from rxcuda import libraries as lib
from rxcuda.libraries._handles import DeviceLibraries


def rel(actual, expected) -> float:
    """Relative norm of the difference, in float64 / complex128."""
    expected = np.asarray(expected)
    wide = np.complex128 if np.iscomplexobj(expected) or np.iscomplexobj(actual) else np.float64
    a = np.asarray(actual).reshape(expected.shape).astype(wide)
    return float(np.linalg.norm(a - expected) / max(np.linalg.norm(expected), 1e-300))


def diagnostics(engine) -> str:
    return "; ".join(d.message for d in engine.diagnostic_log) or "no diagnostic"


class Ran:
    """A call block after a frame: ``get(name)`` reads one of its ports."""

    def __init__(self, engine, block):
        self.engine = engine
        self.block = block

    def get(self, name: str) -> np.ndarray:
        return self.engine.read(self.block[name])


def run(engine, spec, inputs: dict, **scalars) -> Ran:
    """Add ``spec`` as a block, write ``inputs`` (inputs, and the starting value of in-place outputs), tick."""
    blk = engine.add(Block.from_call(spec, **scalars))
    for name, data in inputs.items():
        engine.write(blk[name], np.ascontiguousarray(data).reshape(-1))
    frame = engine.tick()
    assert frame.launched and frame.state == "ok", f"{spec.summary}: {diagnostics(engine)}"
    return Ran(engine, blk)


def crand(rng, shape, dtype):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (round to nearest even) of float32 values."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def _csr(dense):
    rows, cols = np.nonzero(dense)
    indptr = np.zeros(dense.shape[0] + 1, np.int32)
    np.add.at(indptr, rows + 1, 1)
    return np.cumsum(indptr).astype(np.int32), cols.astype(np.int32), dense[rows, cols]


# -- every call: (spec, inputs, check(ran)) ----------------------------------------------------------------
def case_gemm_f32(rng):
    m, n, k = 129, 96, 77
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    return lib.gemm(m, n, k), {"a": a, "b": b}, lambda r: rel(r.get("c"), a.astype(np.float64) @ b) < 1e-5


def case_gemm_f32_trans_alpha_beta(rng):
    m, n, k = 64, 80, 48
    a, b = rng.standard_normal((k, m), np.float32), rng.standard_normal((n, k), np.float32)
    c0 = rng.standard_normal((m, n), np.float32)
    spec = lib.gemm(m, n, k, trans_a=True, trans_b=True, alpha=0.5, beta=2.0)
    ref = 0.5 * (a.T.astype(np.float64) @ b.T) + 2 * c0.astype(np.float64)
    return spec, {"a": a, "b": b, "c": c0}, lambda r: rel(r.get("c"), ref) < 1e-5


def case_gemm_f64_batched(rng):
    m, n, k, batch = 33, 17, 65, 3
    a, b = rng.standard_normal((batch, m, k)), rng.standard_normal((batch, k, n))
    return lib.gemm(m, n, k, dtype="f64", batch=batch), {"a": a, "b": b}, lambda r: rel(r.get("c"), a @ b) < 1e-12


def case_gemm_f16_to_f32(rng):
    m, n, k = 128, 64, 256
    a, b = rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    return lib.gemm(m, n, k, dtype="f16", out_dtype="f32"), {"a": a, "b": b}, lambda r: rel(r.get("c"), ref) < 1e-4


def case_gemm_f16(rng):
    m, n, k = 64, 64, 64
    a, b = rng.standard_normal((m, k)).astype(np.float16), rng.standard_normal((k, n)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    return lib.gemm(m, n, k, dtype="f16"), {"a": a, "b": b}, lambda r: rel(r.get("c"), ref) < 2e-3  # f16 output


def case_gemm_bf16_to_f32(rng):
    m, n, k = 96, 64, 128
    a, b = to_bf16(rng.standard_normal((m, k))), to_bf16(rng.standard_normal((k, n)))
    ref = from_bf16(a).astype(np.float64) @ from_bf16(b)
    spec = lib.gemm(m, n, k, dtype="bf16", out_dtype="f32")
    return spec, {"a": a, "b": b}, lambda r: rel(r.get("c"), ref) < 1e-5


def case_gemv(rng):
    m, n = 300, 200
    a, x = rng.standard_normal((m, n), np.float32), rng.standard_normal(n, np.float32)
    ref = 1.5 * (a.astype(np.float64) @ x)
    return lib.gemv(m, n, alpha=1.5), {"a": a, "x": x}, lambda r: rel(r.get("y"), ref) < 1e-5


def case_gemv_trans_beta_f64(rng):
    m, n = 150, 70
    a, x, y0 = rng.standard_normal((m, n)), rng.standard_normal(m), rng.standard_normal(n)
    spec = lib.gemv(m, n, dtype="f64", trans=True, alpha=-1.0, beta=0.25)
    return spec, {"a": a, "x": x, "y": y0}, lambda r: rel(r.get("y"), -(a.T @ x) + 0.25 * y0) < 1e-12


def case_axpy(rng):
    x, y = rng.standard_normal(10_001), rng.standard_normal(10_001)
    spec = lib.axpy(10_001, dtype="f64", alpha=-3.0)
    return spec, {"x": x, "y": y}, lambda r: rel(r.get("y"), -3.0 * x + y) < 1e-14


def case_scal_c64(rng):
    x = crand(rng, 4097, np.complex64)
    return lib.scal(4097, dtype="c64", alpha=0.75), {"x": x}, lambda r: rel(r.get("x"), 0.75 * x) < 1e-6


def case_fft(rng):
    n, batch = 1000, 4
    x = crand(rng, (batch, n), np.complex64)
    ref = np.fft.fft(x.astype(np.complex128))
    return lib.fft(n, batch=batch), {"x": x}, lambda r: rel(r.get("y"), ref) < 1e-5


def case_ifft_c128(rng):
    n, batch = 384, 3
    x = crand(rng, (batch, n), np.complex128)
    return lib.ifft(n, batch=batch, dtype="c128"), {"x": x}, lambda r: rel(r.get("y"), np.fft.ifft(x)) < 1e-13


def case_ifft_unscaled(rng):
    n = 512
    x = crand(rng, n, np.complex64)
    ref = np.fft.ifft(x.astype(np.complex128)) * n  # norm=None: cuFFT's raw inverse
    return lib.ifft(n, norm=None), {"x": x}, lambda r: rel(r.get("y"), ref) < 1e-5


def case_fft2_ortho(rng):
    shape, batch = (48, 80), 2
    x = crand(rng, (batch, *shape), np.complex64)
    ref = np.fft.fft2(x.astype(np.complex128), norm="ortho")
    return lib.fft2(shape, batch=batch, norm="ortho"), {"x": x}, lambda r: rel(r.get("y"), ref) < 1e-5


def case_ifft2(rng):
    shape = (64, 30)
    x = crand(rng, shape, np.complex128)
    return lib.ifft2(shape, dtype="c128"), {"x": x}, lambda r: rel(r.get("y"), np.fft.ifft2(x)) < 1e-13


def case_rfft(rng):
    n, batch = 1000, 3
    x = rng.standard_normal((batch, n), np.float32)
    ref = np.fft.rfft(x.astype(np.float64))
    return lib.rfft(n, batch=batch), {"x": x}, lambda r: rel(r.get("y"), ref) < 1e-5


def case_irfft_preserves_input(rng):
    n, batch = 1000, 3
    spectrum = np.fft.rfft(rng.standard_normal((batch, n)))

    def check(r):
        assert rel(r.get("y"), np.fft.irfft(spectrum, n)) < 1e-13
        np.testing.assert_array_equal(r.get("x").reshape(spectrum.shape), spectrum)  # cuFFT would overwrite it
        return True

    return lib.irfft(n, batch=batch, dtype="f64"), {"x": spectrum}, check


def case_rfft2_forward(rng):
    shape = (40, 66)
    x = rng.standard_normal(shape, np.float32)
    ref = np.fft.rfft2(x.astype(np.float64), norm="forward")
    return lib.rfft2(shape, norm="forward"), {"x": x}, lambda r: rel(r.get("y"), ref) < 1e-5


def case_irfft2(rng):
    shape = (40, 66)
    spectrum = np.fft.rfft2(rng.standard_normal(shape)).astype(np.complex64)
    ref = np.fft.irfft2(spectrum.astype(np.complex128), shape)
    return lib.irfft2(shape), {"x": spectrum}, lambda r: rel(r.get("y"), ref) < 1e-5


def case_spmv(rng):
    rows, cols = 500, 300
    dense = rng.standard_normal((rows, cols)) * (rng.random((rows, cols)) < 0.02)
    indptr, indices, data = _csr(dense)
    x = rng.standard_normal(cols, np.float32)
    ref = 2.0 * (dense.astype(np.float32).astype(np.float64) @ x)  # the matrix as the f32 call holds it
    spec = lib.spmv(rows, cols, data.size, alpha=2.0)
    inputs = {"indptr": indptr, "indices": indices, "data": data.astype(np.float32), "x": x}
    return spec, inputs, lambda r: rel(r.get("y"), ref) < 1e-5


def case_spmv_transpose_beta_f64(rng):
    rows, cols = 200, 350
    dense = rng.standard_normal((rows, cols)) * (rng.random((rows, cols)) < 0.05)
    indptr, indices, data = _csr(dense)
    x, y0 = rng.standard_normal(rows), rng.standard_normal(cols)
    spec = lib.spmv(rows, cols, data.size, dtype="f64", index_dtype="i64", transpose=True, beta=-1.0)
    inputs = {"indptr": indptr.astype(np.int64), "indices": indices.astype(np.int64), "data": data, "x": x, "y": y0}
    return spec, inputs, lambda r: rel(r.get("y"), dense.T @ x - y0) < 1e-12


def case_lu_factor(rng):
    n = 64
    a = rng.standard_normal((n, n)) + n * np.eye(n) * 0.1

    def check(r):
        assert r.get("info")[0] == 0
        piv = r.get("piv")
        assert piv.min() >= 1 and piv.max() <= n
        # lu holds the column-major factors of a.T: rebuild P^T L U and compare with a.T
        lu = r.get("lu").reshape(n, n).T  # column-major -> (row, col)
        lower, upper = np.tril(lu, -1) + np.eye(n), np.triu(lu)
        perm = np.arange(n)
        for i, p in enumerate(piv - 1):
            perm[[i, p]] = perm[[p, i]]
        return rel(lower @ upper, a.T[perm]) < 1e-12

    return lib.lu_factor(n, dtype="f64"), {"a": a}, check


def case_lu_solve_chain(rng):
    n, nrhs = 50, 3
    a = rng.standard_normal((n, n)).astype(np.float32) + np.eye(n, dtype=np.float32) * 8
    b = rng.standard_normal((nrhs, n), np.float32)
    solve = lib.chain(lib.lu_factor(n), lib.lu_solve(n, nrhs), name="solve")
    ref = np.linalg.solve(a.astype(np.float64), b.T.astype(np.float64)).T

    def check(r):
        assert r.get("info")[0] == 0
        return rel(r.get("x"), ref) < 1e-4

    return solve, {"a": a, "b": b}, check


def case_random_uniform_philox(rng):
    n = 1_000_003

    def check(r):
        u = r.get("out")
        assert u.min() >= -2.0 and u.max() <= 6.0 and np.isfinite(u).all()
        assert abs(u.mean() - 2.0) < 0.02 and abs(u.var() - 64 / 12) < 0.05
        hist, _ = np.histogram(u, bins=16, range=(-2, 6))
        return hist.min() > 0.9 * n / 16

    spec = lib.random_uniform(n, low=-2.0, high=6.0, seed=int(rng.integers(1 << 62)), backend="philox")
    return spec, {}, check


def case_random_normal_philox_f64(rng):
    n = 999_999

    def check(r):
        z = r.get("out")
        assert np.isfinite(z).all()
        assert abs(z.mean() + 1.0) < 0.01 and abs(z.std() - 2.0) < 0.01
        return abs(np.mean(np.abs(z + 1.0) < 2.0) - 0.6827) < 0.005

    spec = lib.random_normal(n, dtype="f64", mean=-1.0, stddev=2.0, backend="philox", seed=int(rng.integers(1 << 62)))
    return spec, {}, check


CASES = [v for k, v in sorted(globals().items()) if k.startswith("case_")]


@pytest.mark.parametrize("make", CASES, ids=[c.__name__[5:] for c in CASES])
def test_call_in_the_engine_matches_numpy(make, engine, rng):
    spec, inputs, check = make(rng)
    assert check(run(engine, spec, inputs)), spec.summary


# -- the update paths ---------------------------------------------------------------------------------------
SCALE_SRC = r"""
extern "C" __global__ void scale_add(float* x, float factor, float shift, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * factor + shift;
}
"""


@pytest.fixture(scope="module")
def scale_code():
    """``x = x * factor + shift`` (n defaults to the buffer size), compiled with NVRTC as any .cu kernel."""
    return rxcuda.compile_cuda(SCALE_SRC, "scale_add")


def test_device_scalar_change_needs_no_recapture(engine, rng):
    m, n, k = 70, 50, 40
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    c0 = rng.standard_normal((m, n), np.float32)
    ran = run(engine, lib.gemm(m, n, k, alpha=1.0, beta=0.0), {"a": a, "b": b, "c": c0})
    ab = a.astype(np.float64) @ b
    assert rel(ran.get("c"), ab) < 1e-5
    counts = (engine.recaptures, engine.rebuilds)
    for alpha, beta in [(rng.uniform(-3, 3), 0.0), (rng.uniform(-3, 3), 0.5)]:
        before = ran.get("c").reshape(m, n).astype(np.float64)
        ran.block.set(alpha=alpha, beta=beta)
        frame = engine.tick()
        assert frame.tiers == ("parameters",)
        assert rel(ran.get("c"), alpha * ab + beta * before) < 1e-5
    assert (engine.recaptures, engine.rebuilds) == counts


def test_philox_seed_and_offset_change_without_recapture(engine):
    ran = run(engine, lib.random_normal(4099, backend="philox", seed=7), {})
    counts = (engine.recaptures, engine.rebuilds)
    first = ran.get("out")
    ran.block.set(offset=1)
    assert engine.tick().tiers == ("parameters",)
    second = ran.get("out")
    assert not np.allclose(first, second)
    ran.block.set(seed=8)
    engine.tick()
    third = ran.get("out")
    assert not np.allclose(second, third)
    ran.block.set(seed=7, offset=0)
    engine.tick()
    np.testing.assert_array_equal(ran.get("out"), first)
    assert (engine.recaptures, engine.rebuilds) == counts


def test_host_scalar_recaptures_the_child_node_in_place(engine, scale_code):
    """Host scalar (kernel factor) -> recapture in place; device scalar (offset) -> a slot write only. The random
    numbers are the same across the recapture because seed and offset did not move."""
    n = 10_000
    step = lib.kernel(scale_code, Launch.for_threads(n), counts={"x": n})
    spec = lib.chain(lib.random_normal(n, seed=5), (step, {"x": "out"}))
    ran = run(engine, spec, {}, factor=3.0, shift=1.0)
    noise = (ran.get("out").astype(np.float64) - 1.0) / 3.0
    assert abs(noise.std() - 1.0) < 0.05
    recaptures, rebuilds = engine.recaptures, engine.rebuilds
    ran.block.set(factor=-1.0, shift=0.5)
    frame = engine.tick()
    assert "recapture" in frame.tiers and frame.state == "ok", diagnostics(engine)
    assert rel(ran.get("out"), -noise + 0.5) < 1e-5
    ran.block.set(offset=9)  # fresh numbers, same exec graph, no recapture
    assert engine.tick().tiers == ("parameters",)
    fresh = ran.get("out").astype(np.float64)
    assert rel(fresh, -noise + 0.5) > 0.1
    assert abs((0.5 - fresh).std() - 1.0) < 0.05
    assert engine.recaptures > recaptures and engine.rebuilds == rebuilds


def test_chain_gemm_scale_rfft_is_one_node(engine, rng):
    m, n, k = 32, 64, 24
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    spec = lib.chain(
        lib.gemm(m, n, k),
        (lib.scal(m * n, alpha=0.5), {"x": "c", "alpha": "gain"}),
        (lib.rfft(n, batch=m), {"x": "c", "y": "spectrum"}),
        internal=("c",),
    )
    ran = run(engine, spec, {"a": a, "b": b})
    assert len(engine.plan.nodes) == 1
    ref = np.fft.rfft(0.5 * (a.astype(np.float64) @ b), axis=-1)
    assert rel(ran.get("spectrum"), ref) < 1e-5
    recaptures = engine.recaptures
    ran.block.set(gain=-2.0)  # a chain's device scalar: still no recapture
    assert engine.tick().tiers == ("parameters",)
    assert rel(ran.get("spectrum"), -4 * ref) < 1e-5
    assert engine.recaptures == recaptures


def test_chain_with_an_engine_kernel_between_library_calls(engine, rng, scale_code):
    m, n, k = 16, 128, 32
    step = lib.kernel(scale_code, Launch.for_threads(m * n), counts={"x": m * n})
    with pytest.raises(rxcuda.ValidationError, match=r"chain: 'c'.*f32.*c64"):  # caught when composing, not at launch
        lib.chain(lib.gemm(m, n, k), (step, {"x": "c"}), (lib.fft(n, batch=m), {"x": "c", "y": "out"}))
    real = lib.chain(lib.gemm(m, n, k), (step, {"x": "c"}), (lib.rfft(n, batch=m), {"x": "c", "y": "out"}),
                     internal="c")
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    ran = run(engine, real, {"a": a, "b": b}, factor=3.0, shift=1.0)
    ab = a.astype(np.float64) @ b
    assert rel(ran.get("out"), np.fft.rfft(ab * 3.0 + 1.0, axis=-1)) < 1e-5
    ran.block.set(factor=-0.5, shift=0.0)  # kernel scalars are host scalars: recapture, same topology
    frame = engine.tick()
    assert "recapture" in frame.tiers and frame.state == "ok", diagnostics(engine)
    assert rel(ran.get("out"), np.fft.rfft(ab * -0.5, axis=-1)) < 1e-5


def test_handles_are_shared_per_device_and_released(rng):
    assert DeviceLibraries.live(0) is None
    with rxcuda.Engine(0) as engine:
        for size in (8, 16):
            mm = engine.add(Block.from_call(lib.gemm(size, size, size)))
            engine.write(mm["a"], rng.standard_normal(size * size, np.float32))
            engine.write(mm["b"], rng.standard_normal(size * size, np.float32))
        for spec in (lib.fft(256), lib.ifft(256)):
            engine.write(engine.add(Block.from_call(spec))["x"], crand(rng, 256, np.complex64))
        assert engine.tick().state == "ok", diagnostics(engine)
        libs = DeviceLibraries.live(0)
        # one cuBLAS handle for both GEMMs and ifft's scaling; fft and ifft of one shape share one plan
        assert libs is not None and libs.refs == 4
        assert libs.created["cublas"] == 1 and libs.created["cufft_plan"] == 1
    assert DeviceLibraries.live(0) is None  # the engine tore every call down


def test_many_sizes_of_gemm_capture_without_memory_nodes(engine, rng):
    for size in (64, 512, 2048):
        a = rng.standard_normal((size, size), np.float32)
        b = rng.standard_normal((size, size), np.float32)
        ran = run(engine, lib.gemm(size, size, size, tf32=True), {"a": a, "b": b})
        assert rel(ran.get("c"), a.astype(np.float64) @ b) < 3e-3  # TF32: 10-bit mantissas
        engine.remove(ran.block)


def test_each_host_scalar_change_recaptures_one_node_without_a_rebuild(engine, rng, scale_code):
    """Ten host-scalar changes: ten recaptures, no rebuild, the last value in the result. (What a recapture
    costs is measured by bench/libraries.py, not asserted here: timings are noisy on shared machines.)"""
    m = 256
    step = lib.kernel(scale_code, Launch.for_threads(m * m), counts={"x": m * m})
    spec = lib.chain(lib.gemm(m, m, m), (step, {"x": "c"}))
    a, b = rng.standard_normal((m, m), np.float32), rng.standard_normal((m, m), np.float32)
    ran = run(engine, spec, {"a": a, "b": b}, factor=1.0, shift=0.0)
    recaptures, rebuilds = engine.recaptures, engine.rebuilds
    for i in range(10):
        ran.block.set(factor=1.0 + i)
        frame = engine.tick()
        assert "recapture" in frame.tiers and frame.state == "ok", diagnostics(engine)
    assert engine.recaptures == recaptures + 10 and engine.rebuilds == rebuilds
    assert rel(ran.get("c"), 10.0 * (a.astype(np.float64) @ b)) < 1e-5


# -- cuRAND's host API through the engine ------------------------------------------------------------------
def _curand_failure(message: str) -> bool:
    """Whether a diagnostic is cuRAND refusing to work under capture (``LAUNCH_FAILURE (201)`` and the like);
    the runtime's last error, which cuRAND leaves behind, is cleared for the tests that follow."""
    from cuda.bindings import runtime
    from nvmath.bindings.curand import Status

    failed = any(f"{s.name} ({int(s)})" in message for s in Status)
    if failed:
        runtime.cudaGetLastError()
    return failed


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_curand_backend(dist, engine, rng):
    """cuRAND host API: primed in setup, positioned by prepare() outside each capture, generate captured."""
    make = lib.random_uniform if dist == "uniform" else lib.random_normal
    seed = int(rng.integers(1 << 62))
    blk = engine.add(Block.from_call(make(1 << 16, seed=seed, backend="curand")))
    frame = engine.tick()
    if not frame.launched and _curand_failure(diagnostics(engine)):
        pytest.xfail(f"cuRAND host API does not capture on this driver/library: {diagnostics(engine)}")
    assert frame.launched and frame.state == "ok", diagnostics(engine)
    mean = 0.5 if dist == "uniform" else 0.0
    first = engine.read(blk["out"])
    assert abs(first.mean() - mean) < 0.02
    # the generator's position lives on the device: each launch of the same capture draws new numbers
    engine.tick()
    second = engine.read(blk["out"])
    assert abs(second.mean() - mean) < 0.02 and not np.allclose(second, first)
    blk.set(seed=seed + 1)  # host scalar: prepare re-seeds outside the capture, then a recapture
    frame = engine.tick()
    if blk.state == "error" and _curand_failure(blk.message):
        pytest.xfail(f"cuRAND re-seeding before a recapture failed: {blk.message}")
    assert "recapture" in frame.tiers and frame.state == "ok", diagnostics(engine)
    third = engine.read(blk["out"])
    assert abs(third.mean() - mean) < 0.02 and not np.allclose(third, first)

