"""Library calls as blocks in the engine's graph, with kernels on either side; checked against NumPy."""

import attrs
import numpy as np
import pytest

import rxcuda
from rxcuda import Block, Launch
from rxcuda import libraries as lib
from rxcuda.libraries._handles import DeviceLibraries


def rand(rng, *shape, dtype=np.float32):
    return (rng.standard_normal(shape) + 0.1).astype(dtype)


def rel(a, b):
    a = np.asarray(a, np.complex128 if np.iscomplexobj(a) else np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def test_gemm_block(engine, rng):
    m, n, k = 96, 80, 64
    mm = engine.add(Block.from_call(lib.gemm(m, n, k), alpha=1.0))
    a, b = rand(rng, m, k), rand(rng, k, n)
    engine.write(mm["a"], a.ravel())
    engine.write(mm["b"], b.ravel())
    engine.tick()
    assert rel(engine.read(mm["c"]).reshape(m, n), a.astype(np.float64) @ b) < 1e-5


def test_kernel_library_kernel_ordering(engine, rng, kernels):
    m = n = k = 64
    pre = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=m * k, scale=2.0, name="pre"))
    mm = engine.add(Block.from_call(lib.gemm(m, n, k)))
    post = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=m * n, scale=3.0, name="post"))
    engine.connect(pre["out"], mm["a"])
    engine.connect(mm["c"], post["x"])
    a, b = rand(rng, m, k), rand(rng, k, n)
    engine.write(pre["x"], a.ravel())
    engine.write(mm["b"], b.ravel())
    for _ in range(3):  # repeated frames: the ordering is a real graph dependency every time
        engine.tick()
        assert rel(engine.read(post["out"]).reshape(m, n), (2 * a.astype(np.float64)) @ b * 3) < 1e-5
    p = engine.plan
    g = p.kernel_nodes[(mm.id, "gemm")]
    assert p.kernel_nodes[(pre.id, "scalar_mul")] in p.deps[g]
    assert g in p.deps[p.kernel_nodes[(post.id, "scalar_mul")]]


def test_library_kernel_library(engine, rng, kernels):
    m, n, k = 16, 256, 32
    mm = engine.add(Block.from_call(lib.gemm(m, n, k)))
    mid = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=m * n, scale=0.5))
    spec = engine.add(Block.from_call(lib.rfft(n, batch=m, norm=None)))
    engine.connect(mm["c"], mid["x"])
    engine.connect(mid["out"], spec[spec.inputs[0].name])
    a, b = rand(rng, m, k), rand(rng, k, n)
    engine.write(mm["a"], a.ravel())
    engine.write(mm["b"], b.ravel())
    engine.tick()
    want = np.fft.rfft((a.astype(np.float64) @ b) * 0.5, axis=1)
    got = engine.read(spec[spec.outputs[0].name]).reshape(m, n // 2 + 1)
    assert rel(got, want) < 1e-5


def test_device_scalar_update_without_recapture(engine, rng):
    m, n, k = 32, 48, 40
    mm = engine.add(Block.from_call(lib.gemm(m, n, k), alpha=1.0))
    a, b = rand(rng, m, k), rand(rng, k, n)
    engine.write(mm["a"], a.ravel())
    engine.write(mm["b"], b.ravel())
    engine.tick()
    recaptures, rebuilds = engine.recaptures, engine.rebuilds
    for alpha in (2.5, -0.75):
        mm.set(alpha=alpha)
        f = engine.tick()
        assert f.tiers == ("parameters",)
        assert rel(engine.read(mm["c"]).reshape(m, n), alpha * (a.astype(np.float64) @ b)) < 1e-5
    assert (engine.recaptures, engine.rebuilds) == (recaptures, rebuilds)
    assert engine.plan.route_of(mm.id, "alpha").startswith("parameters (device scalar")


def test_host_scalar_change_recaptures_in_place(engine, rng, kernels):
    n = 4096
    code = rxcuda.load_kernel_file(kernels / "scalar_mul.ptx")
    step = lib.chain(lib.kernel(code, Launch.for_threads(n), counts={"x": n, "out": n}))
    blk = engine.add(Block.from_call(step, scale=2.0))
    x = rand(rng, n)
    engine.write(blk["x"], x)
    engine.tick()
    np.testing.assert_allclose(engine.read(blk["out"]), 2 * x, rtol=1e-6)
    recaptures, rebuilds = engine.recaptures, engine.rebuilds
    assert engine.plan.tier_of(blk.id, "scale") == "recapture"  # a Tier: equal to its name
    blk.set(scale=-4.0)
    engine.tick()
    np.testing.assert_allclose(engine.read(blk["out"]), -4 * x, rtol=1e-6)
    assert engine.recaptures == recaptures + 1 and engine.rebuilds == rebuilds


def test_chain_gemm_scale_fft_is_one_node(engine, rng):
    m = n = k = 64
    step = lib.chain(lib.gemm(m, n, k), (lib.rfft(n, batch=m, norm=None), {"x": "c", "y": "spectrum"}),
                     internal=("c",))
    blk = engine.add(Block.from_call(step, alpha=0.5))
    a, b = rand(rng, m, k), rand(rng, k, n)
    engine.write(blk["a"], a.ravel())
    engine.write(blk["b"], b.ravel())
    engine.tick()
    assert len(engine.plan.nodes) == 1
    want = np.fft.rfft(0.5 * (a.astype(np.float64) @ b), axis=1)
    assert rel(engine.read(blk["spectrum"]).reshape(m, n // 2 + 1), want) < 1e-5


def test_library_state_reused_across_rebuilds(engine, rng, kernels):
    """A rebuild keeps each call's handles, plans and workspaces; they go when the block leaves."""
    m = n = k = 32
    spec = lib.gemm(m, n, k)
    setups, teardowns = [], []

    def setup(ordinal):
        setups.append(ordinal)
        return spec.setup(ordinal)

    def teardown(state):
        teardowns.append(state)
        spec.teardown(state)

    mm = engine.add(Block.from_call(attrs.evolve(spec, setup=setup, teardown=teardown)))
    a, b = rand(rng, m, k), rand(rng, k, n)
    engine.write(mm["a"], a.ravel())
    engine.write(mm["b"], b.ravel())
    engine.tick()
    rebuilds = engine.rebuilds
    extra = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=m * n, scale=1.0))
    engine.connect(mm["c"], extra["x"])
    engine.tick()
    assert engine.rebuilds == rebuilds + 1
    assert len(setups) == 1 and teardowns == []
    assert rel(engine.read(extra["out"]).reshape(m, n), a.astype(np.float64) @ b) < 1e-5
    engine.remove(mm)
    engine.remove(extra)
    engine.tick()
    assert len(setups) == 1 and len(teardowns) == 1  # released once the block left the graph
    assert DeviceLibraries.live(0) is None  # the fixture engine runs on device 0


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_axpy_and_scal(engine, rng, dtype):
    n = 5000
    np_dt = np.float32 if dtype == "f32" else np.float64
    ax = engine.add(Block.from_call(lib.axpy(n, dtype=dtype), alpha=1.5))
    x, y = rand(rng, n, dtype=np_dt), rand(rng, n, dtype=np_dt)
    engine.write(ax["x"], x)
    engine.write(ax[ax.outputs[0].name], y)
    engine.tick()
    np.testing.assert_allclose(engine.read(ax[ax.outputs[0].name]), 1.5 * x + y, rtol=1e-5, atol=1e-6)


def test_mismatched_library_connection_is_refused(engine):
    mm = engine.add(Block.from_call(lib.gemm(8, 8, 8)))
    spec = engine.add(Block.from_call(lib.rfft(16, batch=2)))
    with pytest.raises(rxcuda.ValidationError, match="differ"):
        engine.connect(mm["c"], spec[spec.inputs[0].name])


def test_bad_library_input_errors_at_construction():
    with pytest.raises(rxcuda.ValidationError, match="gemm"):
        lib.gemm(0, 8, 8)
    with pytest.raises(rxcuda.ValidationError, match="dtype"):
        lib.gemm(8, 8, 8, dtype="i8")


# -- rebinding a buffer a library call reads (issue 8, item 1) ----------------------------------------------
def _device(cp, host):
    arr = cp.asarray(host)
    cp.cuda.get_current_stream().synchronize()  # this test is about rebinding, not about producer ordering
    return arr


def test_rebind_reaches_library_call(engine, rng):
    """``engine.bind(gemm["b"], Y)`` after frames ran with X: the next frame's GEMM reads Y. The call node is
    captured again with the new pointer (tier 'recapture'), no rebuild."""
    cp = pytest.importorskip("cupy")
    m, n, k = 48, 40, 32
    mm = engine.add(Block.from_call(lib.gemm(m, n, k)))
    a = rand(rng, m, k)
    engine.write(mm["a"], a.ravel())
    x = _device(cp, rand(rng, k, n))
    engine.bind(mm["b"], x)
    engine.tick()
    assert rel(engine.read(mm["c"]).reshape(m, n), a.astype(np.float64) @ cp.asnumpy(x)) < 1e-5
    rebuilds, recaptures = engine.rebuilds, engine.recaptures
    y = _device(cp, rand(rng, k, n))
    assert y.data.ptr != x.data.ptr  # x stays alive, so a GEMM still reading it would give a @ x
    engine.bind(mm["b"], y)
    frame = engine.tick()
    assert rel(engine.read(mm["c"]).reshape(m, n), a.astype(np.float64) @ cp.asnumpy(y)) < 1e-5
    assert "recapture" in frame.tiers
    assert engine.rebuilds == rebuilds
    assert engine.recaptures == recaptures + 1


def test_rebind_reaches_a_chain_step(engine, rng):
    """The same for a buffer read by the first step of a chain (gemm -> rfft, one captured node)."""
    cp = pytest.importorskip("cupy")
    m = n = k = 32
    step = lib.chain(lib.gemm(m, n, k), (lib.rfft(n, batch=m, norm=None), {"x": "c", "y": "spectrum"}),
                     internal=("c",))
    blk = engine.add(Block.from_call(step))
    b = rand(rng, k, n)
    engine.write(blk["b"], b.ravel())
    x = _device(cp, rand(rng, m, k))
    engine.bind(blk["a"], x)
    engine.tick()
    want = np.fft.rfft(cp.asnumpy(x).astype(np.float64) @ b, axis=1)
    assert rel(engine.read(blk["spectrum"]).reshape(m, n // 2 + 1), want) < 1e-5
    rebuilds = engine.rebuilds
    y = _device(cp, rand(rng, m, k))
    engine.bind(blk["a"], y)
    frame = engine.tick()
    want = np.fft.rfft(cp.asnumpy(y).astype(np.float64) @ b, axis=1)
    assert rel(engine.read(blk["spectrum"]).reshape(m, n // 2 + 1), want) < 1e-5
    assert "recapture" in frame.tiers and engine.rebuilds == rebuilds
