"""The CPU device (rxcuda/cuda/_cpu.py): kernels from PTX computed on the host, checked against NumPy on fresh
random inputs; out-of-bounds accesses reported as the GPU's illegal address; the engine on it with its tiers."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import rxcuda
import rxcuda.cuda._driver
from rxcuda.cuda import _cpukernel
from rxcuda.cuda._cpu import CpuDriver
from rxcuda.cuda._nvrtc import compile_ptx

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "kernels"
N = 3000  # not a multiple of the block: the tail threads take the bounds branch
rng = np.random.default_rng()


def _launch(ptx: str | bytes, name: str, arrays: list[np.ndarray], values: list, n: int = N, block: int = 256):
    m = _cpukernel.load(ptx)
    m.launch(name, (-(-n // block), 1, 1), (block, 1, 1), values,
             allocations=[(a.ctypes.data, a.nbytes) for a in arrays])


def _ptx(name: str) -> str:
    return (KERNELS / f"{name}.ptx").read_text()


def test_shipped_elementwise_kernels_match_numpy():
    a, b, c = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
    out = np.zeros(N, np.float32)
    _launch(_ptx("vector_add"), "vector_add", [a, b, out], [a.ctypes.data, b.ctypes.data, out.ctypes.data, N])
    np.testing.assert_array_equal(out, a + b)
    _launch(_ptx("vector_sub"), "vector_sub", [a, b, out], [a.ctypes.data, b.ctypes.data, out.ctypes.data, N])
    np.testing.assert_array_equal(out, a - b)
    _launch(_ptx("vector_add3"), "vector_add3", [a, b, c, out],
            [a.ctypes.data, b.ctypes.data, c.ctypes.data, out.ctypes.data, N])
    np.testing.assert_array_equal(out, a + b + c)
    _launch(_ptx("scalar_mul"), "scalar_mul", [a, out], [a.ctypes.data, out.ctypes.data, 1.75, N])
    np.testing.assert_array_equal(out, a * np.float32(1.75))
    _launch(_ptx("saxpy"), "saxpy", [a, b, out], [a.ctypes.data, b.ctypes.data, out.ctypes.data, -0.5, N])
    np.testing.assert_allclose(out, np.float32(-0.5) * a + b, rtol=1e-6, atol=1e-6)  # (one fma: fused rounding)


def test_append_above_counts_and_keeps_every_value_above():
    values = rng.standard_normal(N).astype(np.float32)
    out = np.zeros(N, np.float32)
    count = np.zeros(1, np.uint32)
    _launch(_ptx("append_above"), "append_above", [values, out, count],
            [values.ctypes.data, out.ctypes.data, count.ctypes.data, 0.5, N, N])
    expected = values[values > 0.5]
    assert int(count[0]) == expected.size
    np.testing.assert_array_equal(np.sort(out[:expected.size]), np.sort(expected))


CPP = (pathlib.Path(__file__).with_name("cpu_device.cu")).read_text()


@pytest.fixture(scope="module")
def cpp_ptx() -> bytes:
    ptx, _ = compile_ptx(CPP, "cpu_test.cu", [b"-arch=compute_75"])
    return ptx


def test_nvrtc_shared_memory_barriers_shuffles_and_atomics(cpp_ptx):
    x = rng.standard_normal(N).astype(np.float32)
    blocks = -(-N // 256)
    out = np.zeros(blocks, np.float32)
    count = np.zeros(1, np.uint32)
    _launch(cpp_ptx, "block_sum", [x, out, count], [x.ctypes.data, out.ctypes.data, count.ctypes.data, N])
    padded = np.zeros(blocks * 256, np.float32)
    padded[:N] = x
    np.testing.assert_allclose(out, padded.reshape(blocks, 256).sum(axis=1, dtype=np.float64), rtol=1e-4, atol=1e-4)
    assert int(count[0]) == blocks


def test_nvrtc_warp_scan_ballot_and_atomic_max(cpp_ptx):
    x = rng.integers(-1000, 1000, N).astype(np.int32)
    prefix = np.zeros(N, np.int32)
    ballots = np.zeros(-(-N // 32), np.uint32)
    maxv = np.array([np.iinfo(np.int32).min], np.int32)
    _launch(cpp_ptx, "warp_ops", [x, prefix, ballots, maxv],
            [x.ctypes.data, prefix.ctypes.data, ballots.ctypes.data, maxv.ctypes.data, N])
    padded = np.zeros(len(ballots) * 32, np.int64)
    padded[:N] = x
    warps = padded.reshape(-1, 32)
    np.testing.assert_array_equal(prefix, np.cumsum(warps, axis=1).reshape(-1)[:N])
    odd = (warps & 1).astype(bool)
    odd.reshape(-1)[N:] = False
    np.testing.assert_array_equal(ballots, (odd * (1 << np.arange(32, dtype=np.uint64))).sum(axis=1))
    assert int(maxv[0]) == int(x.max())


def test_lanes_that_end_first_leave_their_shuffled_values_to_the_others(cpp_ptx):
    x = rng.standard_normal(N).astype(np.float32)
    out = np.zeros(N, np.float32)
    _launch(cpp_ptx, "quad_sums", [x, out], [x.ctypes.data, out.ctypes.data, N])
    padded = np.zeros(-(-N // 256) * 256, np.float32)
    padded[:N] = x
    quads = padded.reshape(-1, 4)
    np.testing.assert_allclose(out, np.repeat(quads.sum(axis=1), 4)[:N], rtol=1e-6, atol=1e-6)


def test_nvrtc_math_and_integer_ops(cpp_ptx):
    x = (rng.standard_normal(N) * 4).astype(np.float32)
    y = np.zeros(N, np.float32)
    z = np.zeros(N, np.int32)
    _launch(cpp_ptx, "math", [x, y, z], [x.ctypes.data, y.ctypes.data, z.ctypes.data, N])
    f = np.float32
    np.testing.assert_allclose(y, np.clip(x, -1, 1) * f(3) + np.abs(x) / f(7) - np.floor(x), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(z, ((x * f(100)).astype(np.int32) >> 2) ^ (np.arange(N, dtype=np.int32) * 3))


def test_an_access_past_a_buffer_names_the_kernel_and_the_argument():
    a, b = (np.zeros(N, np.float32) for _ in range(2))
    out = np.zeros(N - 10, np.float32)  # 10 elements short
    with pytest.raises(_cpukernel.IllegalAddress, match=r"illegal address in kernel 'vector_add': a 4-byte write "
                       r"at 0x[0-9a-f]+, 4 bytes past the end of argument 2 \(vector_add_param_2: a buffer of "
                       rf"{4 * (N - 10)} bytes"):
        _launch(_ptx("vector_add"), "vector_add", [a, b, out], [a.ctypes.data, b.ctypes.data, out.ctypes.data, N])


def test_a_cubin_is_refused_naming_what_the_cpu_device_needs():
    api = CpuDriver()
    with pytest.raises(rxcuda.CudaError, match="CUDA_ERROR_NO_BINARY_FOR_GPU.*runs kernels from their PTX"):
        api.cuModuleLoadData(b"\x7fELF" + bytes(60))


def test_engine_on_the_cpu_device_computes_and_patches_parameters():
    n = 5000
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    with rxcuda.Engine(device="cpu") as engine:
        add = engine.add(rxcuda.Block.from_kernel(KERNELS / "vector_add.ptx", size=n))
        mul = engine.add(rxcuda.Block.from_kernel(KERNELS / "scalar_mul.ptx", size=n, scale=2.0))
        engine.connect(add["out"], mul["x"])
        engine.write(add["a"], a)
        engine.write(add["b"], b)
        engine.tick()
        np.testing.assert_array_equal(engine.read(mul["out"]), (a + b) * np.float32(2.0))
        mul.params["scale"].value = -3.0
        frame = engine.tick()
        assert [t.name.lower() for t in frame.tiers] == ["parameters"] or "parameters" in str(frame.tiers).lower()
        np.testing.assert_array_equal(engine.read(mul["out"]), (a + b) * np.float32(-3.0))
        assert engine.rebuilds == 1


def test_engine_cpu_runs_cuda_cpp_blocks():
    src = ('extern "C" __global__ void cube(const float* x, float* out, int n)'
           '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] * x[i] * x[i]; }')
    x = rng.standard_normal(1000).astype(np.float32)
    with rxcuda.Engine(device="cpu") as engine:
        blk = engine.add(rxcuda.Block.from_cuda(src, size=1000))
        engine.write(blk["x"], x)
        engine.tick()
        np.testing.assert_array_equal(engine.read(blk["out"]), x * x * x)


def test_engine_device_must_be_an_ordinal_cuda_or_cpu():
    with pytest.raises(ValueError, match="'device' must be a GPU ordinal"):
        rxcuda.Engine(device="tpu")


def test_a_curand_backend_call_is_refused_naming_the_philox_backend():
    from rxcuda import libraries as lib

    with rxcuda.Engine(device="cpu") as engine:
        engine.add(rxcuda.Block.from_call(lib.random_uniform(64, backend="curand"), name="noise"))
        engine.tick()
        message = engine.diagnostic_log[-1].message
    assert "random_uniform: backend='curand' does not run on the CPU device" in message
    assert "Use backend='philox'" in message


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to build a fatbin")
def test_a_fatbin_runs_through_the_ptx_it_carries_and_compressed_ptx_says_how_to_build_it(tmp_path):
    src = KERNELS / "scalar_mul.cu"
    plain, packed = tmp_path / "plain.fatbin", tmp_path / "packed.fatbin"
    gencode = ["-gencode", "arch=compute_75,code=compute_75", "-gencode", "arch=compute_80,code=sm_80"]
    subprocess.run(["nvcc", "-fatbin", "--no-compress", *gencode, "-o", str(plain), str(src)], check=True)
    subprocess.run(["nvcc", "-fatbin", *gencode, "-o", str(packed), str(src)], check=True)
    api = CpuDriver()
    module = rxcuda.cuda._driver.check(api.cuModuleLoadData(plain.read_bytes()), "load")
    function = rxcuda.cuda._driver.check(api.cuModuleGetFunction(module, b"scalar_mul"), "get")
    assert api._functions[int(function)].name == "scalar_mul"
    try:
        import zstandard  # noqa: F401
    except ImportError:
        with pytest.raises(rxcuda.CudaError, match="compressed .* nvcc --no-compress"):
            api.cuModuleLoadData(packed.read_bytes())


# -- the tensor kernels: the PTX writer's output, run on the CPU device against the CPU backend ------------------
def _tensor_groups(*tensors):
    import rxcuda.tensor as rt
    from rxcuda.tensor import _codegen, _ir, _ptx
    from rxcuda.tensor._cpu import leaf_value
    from rxcuda.tensor._passes import plan

    p = plan([t.node for t in tensors])
    for g in (g for g in p.groups if g.kind in ("elementwise", "reduce")):
        ir = _ir.group_ir(g, p, [leaf_value(i) for i in g.inputs])
        args = [(np.uint8(bool(i.attrs[0])) if i.dtype == np.bool_ else i.dtype.type(i.attrs[0]))
                if i.op == "full" else leaf_value(i) for i in g.inputs]
        yield _ptx.emit(ir), args, [rt.Tensor(o).numpy() for o in g.outputs], _codegen.launch_shape(ir)


def _run_tensor_kernel(text: str, args: list, want: list, grid: int, block: int) -> list[np.ndarray]:
    module = _cpukernel.load(text)
    (name,) = module.kernels
    outs = [np.full(w.shape, 0xAB, np.uint8).view(w.dtype) if w.dtype.itemsize == 1 else
            np.full(w.shape, np.nan if w.dtype.kind == "f" else 77, w.dtype) for w in want]
    values, spans = [], []
    for a in [*args, *outs]:
        if isinstance(a, np.ndarray):
            lo, hi = np.lib.array_utils.byte_bounds(a)
            values.append(a.__array_interface__["data"][0])
            spans.append((lo, hi - lo))
        else:
            values.append(a.item())
    module.launch(name, (grid, 1, 1), (block, 1, 1), values, allocations=spans)
    return outs


@pytest.mark.parametrize("program", [
    lambda x, y, row: x * y + 1.5,
    lambda x, y, row: np.float32(2) * x - row,                # a broadcast row
    lambda x, y, row: (x - y) / (y * y + 1.0),
])
def test_tensor_elementwise_kernels_match_the_cpu_backend(program):
    import rxcuda.tensor as rt

    x, y = (rt.asarray(rng.standard_normal((37, 29)).astype(np.float32)) for _ in range(2))
    row = rt.asarray(rng.standard_normal((1, 29)).astype(np.float32))
    for text, args, want, (grid, block) in _tensor_groups(program(x, y, row)):
        for g, b in [(grid, block), (1, 1), (3, 100)]:
            for got, w in zip(_run_tensor_kernel(text, args, want, g, b), want, strict=True):
                np.testing.assert_array_equal(got, w, err_msg=f"launch ({g}, {b})")


@pytest.mark.parametrize("program", [
    lambda x: x.sum(axis=1),
    lambda x: x.max(axis=0),
    lambda x: rt_exp_mean(x),
])
def test_tensor_reductions_with_shuffles_and_barriers_match_the_cpu_backend(program):
    import rxcuda.tensor as rt

    x = rt.asarray(rng.standard_normal((6, 300)).astype(np.float32))
    for text, args, want, (grid, block) in _tensor_groups(program(x)):
        for g, b in [(grid, block), (2, 33), (1, 1000)]:
            for got, w in zip(_run_tensor_kernel(text, args, want, g, b), want, strict=True):
                # (the kernel adds in its own order: a few ulps of a sum of 300 values apart from NumPy's)
                np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5, err_msg=f"launch ({g}, {b})")


def rt_exp_mean(x):
    import rxcuda.tensor as rt

    return rt.exp(x - x.max(axis=1, keepdims=True)).mean(axis=1)


def test_kernels_compile_to_ptx_where_the_cpu_device_runs_and_rxcuda_device_cuda_means_cubins(monkeypatch):
    from rxcuda.sources import _nvrtc

    monkeypatch.setenv("RXCUDA_DEVICE", "cpu")
    assert _nvrtc.default_target() == "ptx"
    monkeypatch.setenv("RXCUDA_DEVICE", "cuda")
    assert _nvrtc.default_target() == "cubin"


def test_a_fault_on_the_cpu_device_names_the_cpu_device_not_a_gpu():
    bad = ('extern "C" __global__ void past(const float* x, float* out, int n) '
           "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i + (1 << 28)] = x[i]; }")
    with rxcuda.Engine(device="cpu") as engine:
        blk = engine.add(rxcuda.Block.from_cuda(bad, size=64))
        engine.write(blk["x"], np.ones(64, np.float32))
        with pytest.raises(rxcuda.DeviceLostError) as info:
            engine.tick()
    message = str(info.value)
    assert message.startswith("the CPU device's context is lost (CUDA_ERROR_ILLEGAL_ADDRESS"), message
    assert "restart the process to use the CPU device again" in message and "GPU" not in message.split(";")[0]
