"""rxcuda.tensor on a GPU through rxcuda's own CUDA layer (issue 18): its kernels are loaded as
``rxcuda.cuda._kernels.KernelModule`` and launched by ``KernelLauncher`` on the backend's stream, PTX first
tiers, NVRTC builds and the tuned build swapped in alike, with results checked against NumPy on fresh random
data; the public compile count; and a tensor made from data on another device written and read back."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import rxcuda.tensor as rt  # noqa: E402
from rxcuda.cuda._kernels import KernelFunction, KernelLauncher, KernelModule  # noqa: E402
from rxcuda.tensor import _cuda, _factory  # noqa: E402

F32 = np.float32


@pytest.fixture(autouse=True)
def fresh():
    rt.clear_cache()
    rt._PROGRAMS.clear()
    yield
    rt._PROGRAMS.clear()


@pytest.fixture
def launches(monkeypatch):
    """Every KernelLauncher call of the test: (entry, grid, block, stream)."""
    seen = []
    original = KernelLauncher.__call__

    def counting(self, grid, block, args, stream, shared_mem=0):
        seen.append((self.function.entry, grid, block, stream))
        return original(self, grid, block, args, stream, shared_mem)

    monkeypatch.setattr(KernelLauncher, "__call__", counting)
    return seen


def programs(rng):
    """Programs over fresh random data (elementwise with fills, a register-row softmax, a strided reduction, an
    int and a bool one with a bool fill) and their NumPy answers."""
    a = rng.standard_normal((37, 129)).astype(F32)
    w = rng.standard_normal(129).astype(F32)
    i = rng.integers(-1000, 1000, (9, 33)).astype(np.int32)
    x, v, n = (rt.tensor(z, device="cuda") for z in (a, w, i))
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return [
        (rt.exp(x * 0.5) - v, np.exp(a * F32(0.5)) - w, 2e-6),
        (rt.softmax(x, axis=-1), e / e.sum(axis=-1, keepdims=True), 2e-6),
        ((x * v).sum(axis=0), (a * w).sum(axis=0), 1e-4),  # float32 sums of 37 products: ~1e-5 apart
        (n * 3 - 7, i * 3 - 7, 0),
        (rt.where(x > 0.5, True, x < -0.5), np.where(a > 0.5, True, a < -0.5), 0),
    ]


def check(got, want, rtol):
    """``got`` is NumPy's ``want``: bit for bit (``rtol`` 0), or within ``rtol`` (and ``rtol / 10`` absolute, at
    least 1e-5: values near 0 after a cancellation)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    if rtol:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=max(1e-5, rtol / 10))
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("ptx", [True, False], ids=["ptx", "nvrtc"])
def test_tensor_kernels_load_and_launch_through_the_cuda_layer(monkeypatch, launches, rng, ptx):
    factory = _factory.KernelFactory(ptx=ptx)
    monkeypatch.setattr(_cuda, "FACTORY", factory)
    cases = programs(rng)
    for y, want, rtol in cases:
        check(y.numpy(), want, rtol)
    assert factory.misses >= len(cases)
    assert factory.ptx_misses >= 1 if ptx else factory.nvrtc_misses == factory.misses
    for kernel in factory._kernels.values():
        assert isinstance(kernel.module, KernelModule) and isinstance(kernel.function, KernelFunction)
        assert kernel.function.module is kernel.module and not kernel.module.closed
    stream = _cuda.backend(cases[0][0].node).stream.ptr
    assert len(launches) >= len(cases)
    assert all(entry == "rx_group" and s == stream and grid >= 1 and 1 <= block <= 1024
               for entry, grid, block, s in launches)


def test_the_tuned_build_swaps_in_through_a_new_launcher(monkeypatch, launches, rng):
    factory = _factory.KernelFactory(upgrade=True)
    monkeypatch.setattr(_cuda, "FACTORY", factory)

    def run():
        a = rng.standard_normal((64, 1000)).astype(F32)
        b = rng.standard_normal(1000).astype(F32)
        y = rt.tanh(rt.tensor(a, device="cuda") * rt.tensor(b, device="cuda")) + 0.25
        check(y.numpy(), np.tanh(a * b) + F32(0.25), 2e-6)

    run()
    (kernel,) = factory._kernels.values()
    first = kernel.function
    assert kernel.code.format == "ptx"  # the first tier
    run()  # the second launch starts the NVRTC build
    assert factory.wait(timeout=300) == 0
    run()  # swapped in at this launch
    assert factory.upgrades == 1 and kernel.function is not first and kernel.code.format == "cubin"
    assert isinstance(kernel.module, KernelModule)
    run()
    assert len(launches) == 4


def test_compiles_are_public_in_stats(rng):
    rt.reset_stats()
    cols = 1000 + int(rng.integers(1, 5000))  # a structure no other test made
    a = rng.standard_normal((3, cols)).astype(F32)
    check((rt.exp(rt.tensor(a, device="cuda")) * 2.0).numpy(), np.exp(a) * F32(2.0), 2e-6)
    compiled = rt.stats().compiles
    assert compiled >= 1
    b = rng.standard_normal((3, cols)).astype(F32)
    check((rt.exp(rt.tensor(b, device="cuda")) * 2.0).numpy(), np.exp(b) * F32(2.0), 2e-6)
    assert rt.stats().compiles == compiled  # the same structure: no compile


def test_a_tensor_made_from_host_data_on_cuda_is_written_and_read_back(rng):
    a = rng.standard_normal((5, 7)).astype(F32)
    pristine = a.copy()
    t = rt.tensor(a, device="cuda")
    y = t * 2.0 + 1.0
    check(y.numpy(), a * F32(2.0) + F32(1.0), 1e-6)
    want = a.copy()
    row = rng.standard_normal(7).astype(F32)
    t[2] = row
    want[2] = row
    t[0, 1:3] = cp.asarray(row[:2])  # a device array written into the host data
    want[0, 1:3] = row[:2]
    t[4] = rt.tensor(row[::-1].copy(), device="cuda")  # a tensor's value
    want[4] = row[::-1]
    assert t.version == 3
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal(t.cupy().get(), want)
    check(y.numpy(), want * F32(2.0) + F32(1.0), 1e-6)  # the result that read the old data is computed again
    np.testing.assert_array_equal(a, pristine)  # tensor() wrote into its own copy, not the user's array


def test_a_tensor_made_from_device_data_on_cpu_is_written_and_read_back(rng):
    a = rng.standard_normal((4, 6))
    g = cp.asarray(a)
    h = rt.tensor(g, device="cpu")
    check((h * 3.0).numpy(), a * 3.0, 1e-12)
    row = rng.standard_normal(6)
    h[1] = row
    want = a.copy()
    want[1] = row
    np.testing.assert_array_equal(h.numpy(), want)
    check((h * 3.0).numpy(), want * 3.0, 1e-12)
    np.testing.assert_array_equal(g.get(), a)  # tensor() copied the CuPy array
