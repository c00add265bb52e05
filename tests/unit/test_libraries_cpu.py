"""Library calls on the CPU device (rxcuda/libraries/_host.py): each against NumPy on fresh random inputs, in an
engine's graph, where the call is captured as a host node of its child graph."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda import libraries as lib
from rxcuda.cuda._cpu import CpuDriver


def rand(rng, *shape, dtype=np.float32):
    a = rng.standard_normal(shape) + 0.1
    if np.dtype(dtype).kind == "c":
        a = a + 1j * (rng.standard_normal(shape) - 0.1)
    return a.astype(dtype)


def rel(a, b):
    a = np.asarray(a, np.complex128 if np.iscomplexobj(a) else np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def run(call, inputs: dict, **params) -> tuple[dict, rxcuda.Engine]:
    """One frame of ``call`` on the CPU device with ``inputs`` written; every port read back."""
    engine = rxcuda.Engine(device="cpu")
    blk = engine.add(rxcuda.Block.from_call(call, **params))
    for name, value in inputs.items():
        engine.write(blk[name], np.ascontiguousarray(value).ravel())
    frame = engine.tick()
    assert frame.launched, engine.diagnostic_log[-1].message if engine.diagnostic_log else frame
    out = {p.name: engine.read(blk[p.name]) for p in call.params if p.is_pointer and p.direction != "in"}
    engine.close()
    return out, engine


@pytest.fixture
def rng():
    return np.random.default_rng()


@pytest.mark.parametrize("trans_a,trans_b,batch", [(False, False, 1), (True, False, 1), (False, True, 3)])
def test_gemm_f32(rng, trans_a, trans_b, batch):
    m, n, k = 33, 20, 17
    a = rand(rng, batch, *((k, m) if trans_a else (m, k)))
    b = rand(rng, batch, *((n, k) if trans_b else (k, n)))
    c0 = rand(rng, batch, m, n)
    out, _ = run(lib.gemm(m, n, k, trans_a=trans_a, trans_b=trans_b, batch=batch, beta=0.5),
                 {"a": a, "b": b, "c": c0}, alpha=-1.5)
    opa = a.transpose(0, 2, 1) if trans_a else a
    opb = b.transpose(0, 2, 1) if trans_b else b
    want = -1.5 * (opa.astype(np.float64) @ opb) + 0.5 * c0
    assert rel(out["c"].reshape(batch, m, n), want) < 1e-5


@pytest.mark.parametrize("dtype,out_dtype,tol", [("f64", None, 1e-12), ("f16", "f32", 1e-3), ("bf16", "f32", 1e-2),
                                                 ("f16", None, 2e-3)])
def test_gemm_other_types(rng, dtype, out_dtype, tol):
    m, n, k = 16, 24, 40
    np_in = {"f64": np.float64, "f16": np.float16, "bf16": np.float32}[dtype]
    a, b = rand(rng, m, k, dtype=np_in), rand(rng, k, n, dtype=np_in)
    if dtype == "bf16":  # bf16 values held as their top 16 bits
        a_bits, b_bits = (a.view(np.uint32) >> 16).astype(np.uint16), (b.view(np.uint32) >> 16).astype(np.uint16)
        a = (a_bits.astype(np.uint32) << 16).view(np.float32)
        b = (b_bits.astype(np.uint32) << 16).view(np.float32)
        inputs = {"a": a_bits, "b": b_bits}
    else:
        inputs = {"a": a, "b": b}
    out, _ = run(lib.gemm(m, n, k, dtype=dtype, out_dtype=out_dtype), inputs)
    assert rel(out["c"].reshape(m, n), a.astype(np.float64) @ b) < tol


def test_gemm_bf16_output_rounds_to_nearest(rng):
    m = n = k = 8
    a = (rand(rng, m, k).view(np.uint32) >> 16).astype(np.uint16)
    b = (rand(rng, k, n).view(np.uint32) >> 16).astype(np.uint16)
    out, _ = run(lib.gemm(m, n, k, dtype="bf16"), {"a": a, "b": b})
    exact = (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64) @ (b.astype(np.uint32) << 16).view(
        np.float32)
    got = (out["c"].astype(np.uint32) << 16).view(np.float32).reshape(m, n)
    assert np.all(np.abs(got - exact) <= np.abs(exact) * 2.0 ** -8 + 1e-6)


@pytest.mark.parametrize("trans", [False, True])
def test_gemv_with_beta(rng, trans):
    m, n = 37, 23
    a = rand(rng, m, n, dtype=np.float64)
    x = rand(rng, m if trans else n, dtype=np.float64)
    y0 = rand(rng, n if trans else m, dtype=np.float64)
    out, _ = run(lib.gemv(m, n, dtype="f64", trans=trans, beta=2.0), {"a": a, "x": x, "y": y0}, alpha=0.25)
    want = 0.25 * ((a.T if trans else a) @ x) + 2.0 * y0
    np.testing.assert_allclose(out["y"], want, rtol=1e-12)


def test_axpy_and_scal(rng):
    x, y = rand(rng, 1000), rand(rng, 1000)
    out, _ = run(lib.axpy(1000), {"x": x, "y": y}, alpha=-0.75)
    np.testing.assert_allclose(out["y"], -0.75 * x + y, rtol=1e-6, atol=1e-6)
    z = rand(rng, 500, dtype=np.complex64)
    out, _ = run(lib.scal(500, dtype="c64"), {"x": z}, alpha=3.0)
    np.testing.assert_allclose(out["x"], 3.0 * z, rtol=1e-6)


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward", None])
def test_complex_ffts(rng, norm):
    x = rand(rng, 4, 96, dtype=np.complex64)
    raw = "backward" if norm is None else norm
    out, _ = run(lib.fft(96, batch=4, norm=norm), {"x": x})
    assert rel(out["y"].reshape(4, 96), np.fft.fft(x.astype(np.complex128), axis=1, norm=raw)) < 1e-5
    out, _ = run(lib.ifft(96, batch=4, norm=norm, dtype="c128"), {"x": x.astype(np.complex128)})
    want = np.fft.ifft(x.astype(np.complex128), axis=1, norm="forward" if norm is None else norm)
    assert rel(out["y"].reshape(4, 96), want) < 1e-12


def test_real_ffts_and_2d(rng):
    x = rand(rng, 3, 100)
    out, _ = run(lib.rfft(100, batch=3), {"x": x})
    assert rel(out["y"].reshape(3, 51), np.fft.rfft(x.astype(np.float64), axis=1)) < 1e-5
    spec = np.fft.rfft(x.astype(np.float64), axis=1).astype(np.complex64)
    out, _ = run(lib.irfft(100, batch=3), {"x": spec})
    assert rel(out["y"].reshape(3, 100), x) < 1e-5
    img = rand(rng, 2, 12, 20, dtype=np.complex64)
    out, _ = run(lib.fft2((12, 20), batch=2, norm="ortho"), {"x": img})
    assert rel(out["y"].reshape(2, 12, 20), np.fft.fft2(img.astype(np.complex128), norm="ortho")) < 1e-5
    real = rand(rng, 12, 20, dtype=np.float64)
    half = np.fft.rfft2(real)
    out, _ = run(lib.irfft2((12, 20), dtype="f64"), {"x": half})
    assert rel(out["y"].reshape(12, 20), real) < 1e-12


def _csr(rng, rows, cols, density, index_dtype):
    dense = rand(rng, rows, cols) * (rng.random((rows, cols)) < density)
    indptr = np.concatenate([[0], np.cumsum((dense != 0).sum(axis=1))]).astype(index_dtype)
    indices = np.nonzero(dense)[1].astype(index_dtype)
    return dense, indptr, indices, dense[dense != 0]


@pytest.mark.parametrize("transpose,index_dtype", [(False, np.int32), (True, np.int64)])
def test_spmv(rng, transpose, index_dtype):
    rows, cols = 60, 45
    dense, indptr, indices, data = _csr(rng, rows, cols, 0.2, index_dtype)
    x = rand(rng, rows if transpose else cols)
    y0 = rand(rng, cols if transpose else rows)
    call = lib.spmv(rows, cols, len(data), index_dtype="i64" if index_dtype is np.int64 else "i32",
                    transpose=transpose, beta=-1.0)
    out, _ = run(call, {"indptr": indptr, "indices": indices, "data": data, "x": x, "y": y0}, alpha=2.0)
    want = 2.0 * ((dense.T if transpose else dense).astype(np.float64) @ x) - y0
    np.testing.assert_allclose(out["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,np_dt,tol", [("f32", np.float32, 1e-4), ("f64", np.float64, 1e-11),
                                             ("c128", np.complex128, 1e-11)])
def test_lu_factor_then_solve_in_one_graph(rng, dtype, np_dt, tol):
    n, nrhs = 40, 3
    a = rand(rng, n, n, dtype=np_dt) + n * np.eye(n, dtype=np_dt) * 0.1
    b = rand(rng, nrhs, n, dtype=np_dt)
    engine = rxcuda.Engine(device="cpu")
    f = engine.add(rxcuda.Block.from_call(lib.lu_factor(n, dtype=dtype)))
    s = engine.add(rxcuda.Block.from_call(lib.lu_solve(n, nrhs, dtype=dtype)))
    engine.connect(f["lu"], s["lu"])
    engine.connect(f["piv"], s["piv"])
    engine.write(f["a"], a.ravel())
    engine.write(s["b"], b.ravel())
    assert engine.tick().launched
    x = engine.read(s["x"]).reshape(nrhs, n)
    lu, piv = engine.read(f["lu"]).reshape(n, n).T, engine.read(f["piv"])
    info = (int(engine.read(f["info"])[0]), int(engine.read(s["info"])[0]))
    engine.close()
    assert rel(x, np.linalg.solve(a, b.T).T) < tol and info == (0, 0)
    # getrf's factors of the column-major view (a.T): P a.T = L U, the pivots 1-based row interchanges
    perm = np.arange(n)
    for j, p in enumerate(piv - 1):
        perm[[j, p]] = perm[[p, j]]
    lower, upper = np.tril(lu, -1) + np.eye(n), np.triu(lu)
    assert rel(lower @ upper, a.T[perm]) < tol
    bound = np.sqrt(2) if np.iscomplexobj(lu) else 1.0  # a complex pivot is the largest in |re| + |im|
    assert np.all(np.abs(np.tril(lu, -1)) <= bound + 1e-6)  # partial pivoting: multipliers at most that


def test_lu_factor_of_a_singular_matrix_reports_info(rng):
    n = 6
    a = rand(rng, n, n, dtype=np.float64)
    a[:, 2] = 0.0  # column 2 of a is row 2 of the column-major matrix getrf factors: U[2, 2] is zero
    a[2, :] = 0.0
    out, _ = run(lib.lu_factor(n, dtype="f64"), {"a": a})
    assert out["info"][0] > 0


def _philox(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 in NumPy: ``counter`` (N, 4) uint32, ``key`` (k0, k1)."""
    c = counter.astype(np.uint64)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    mask = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c[:, 0], np.uint64(0xCD9E8D57) * c[:, 2]
        c = np.stack([((p1 >> np.uint64(32)) ^ c[:, 1] ^ k0) & mask, p1 & mask,
                      ((p0 >> np.uint64(32)) ^ c[:, 3] ^ k1) & mask, p0 & mask], axis=1)
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    return c.astype(np.uint32)


def test_philox_uniform_is_philox4x32_10_bit_for_bit(rng):
    n, seed, offset = 1001, int(rng.integers(1 << 63)), int(rng.integers(1 << 20))
    out, _ = run(lib.random_uniform(n, seed=seed, offset=offset, low=-2.0, high=3.0), {})
    groups = np.arange(-(-n // 4), dtype=np.uint64)
    counter = np.stack([groups & 0xFFFFFFFF, groups >> np.uint64(32), np.full_like(groups, offset & 0xFFFFFFFF),
                        np.full_like(groups, offset >> 32)], axis=1)
    bits = _philox(counter, (seed & 0xFFFFFFFF, seed >> 32)).ravel()[:n]
    u01 = ((bits >> 8).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / 16777216.0)
    want = np.float32(-2.0) + np.float32(5.0) * u01
    fused = (np.float32(5.0).astype(np.float64) * u01 - 2.0).astype(np.float32)  # where the PTX fuses to an fma
    assert np.all((out["out"] == want) | (out["out"] == fused))


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_philox_normal_statistics_and_a_seed_change_without_recapture(rng, dtype):
    n = 200_000
    engine = rxcuda.Engine(device="cpu")
    blk = engine.add(rxcuda.Block.from_call(lib.random_normal(n, dtype=dtype, mean=1.0, stddev=2.0, seed=7)))
    engine.tick()
    first = engine.read(blk["out"]).copy()
    recaptures = engine.recaptures
    blk.params["seed"].value = 8
    engine.tick()
    second = engine.read(blk["out"])
    assert engine.recaptures == recaptures
    engine.close()
    assert not np.array_equal(first, second)
    for v in (first, second):
        assert abs(v.mean() - 1.0) < 0.03 and abs(v.std() - 2.0) < 0.03


def test_a_chain_with_an_internal_buffer_runs_its_steps_in_order(rng):
    m = n = k = 16
    steps = [lib.gemm(m, n, k), (lib.scal(m * n, alpha=0.5), {"x": "c", "alpha": "gain"}),
             (lib.rfft(n, batch=m, norm=None), {"x": "c", "y": "spectrum"})]
    call = lib.chain(*steps, internal=("c",))
    a, b = rand(rng, m, k), rand(rng, k, n)
    out, _ = run(call, {"a": a, "b": b}, gain=-3.0)
    want = np.fft.rfft(-3.0 * (a.astype(np.float64) @ b), axis=1)
    assert rel(out["spectrum"].reshape(m, n // 2 + 1), want) < 1e-5


def test_the_cpu_driver_captures_a_host_function_between_kernels_in_order():
    api = CpuDriver()
    order = []
    check = rxcuda.cuda._driver.check
    check(api.cuStreamBeginCapture(3, 0), "begin")
    check(api.cuLaunchHostFunc(3, order.append, "first"), "host")
    _, ptr = api.cuMemAlloc(16)
    check(api.cuMemsetD32Async(ptr, 7, 4, 3), "memset")
    check(api.cuLaunchHostFunc(3, lambda _: order.append(np.ctypeslib.as_array(
        (np.ctypeslib.ctypes.c_uint32 * 4).from_address(int(ptr))).tolist()), None), "host")
    graph = check(api.cuStreamEndCapture(3), "end")
    assert order == []  # captured, not run
    ex = check(api.cuGraphInstantiate(graph, 0), "instantiate")
    check(api.cuGraphLaunch(ex, 3), "launch")
    assert order == ["first", [7, 7, 7, 7]]
    with pytest.raises(rxcuda.CudaError, match="cannot be captured"):
        api.cuStreamBeginCapture(4, 0)
        api.cuMemcpyHtoDAsync(ptr, np.zeros(4, np.uint32).ctypes.data, 16, 4)
