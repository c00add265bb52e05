"""rxcuda.tensor.block in a running engine: outputs vs NumPy on random data, a scalar parameter hot-updated,
the program edited (Code tier) and restructured (Structure tier), a tensor block inside a For region."""

import numpy as np

import rxcuda
import rxcuda.tensor as rt


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def prog(x, y, scale):
    return rt.softmax(x * scale, axis=-1) + y.T.sum(axis=0, keepdims=True)


def expected(x, y, scale, k=1.0):
    return np_softmax(x * np.float32(scale)) + y.T.sum(axis=0, keepdims=True) * np.float32(k)


def test_outputs_vs_numpy_hot_parameter_and_code_tier(engine):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    y = rng.standard_normal((128, 64)).astype(np.float32)
    blk = engine.add(rt.block(prog, x=x, y=y, scale=2.0))
    engine.write(blk["x"], x)
    engine.write(blk["y"], y)
    assert engine.tick().state == "ok", engine.diagnostic_log
    np.testing.assert_allclose(engine.read(blk["out"]), expected(x, y, 2.0), rtol=1e-4, atol=1e-5)
    rebuilds = engine.rebuilds
    blk.params["scale"].value = 0.5  # a hot update: no rebuild, and the kernels use it
    assert engine.tick().tiers == ("parameters",)
    np.testing.assert_allclose(engine.read(blk["out"]), expected(x, y, 0.5), rtol=1e-4, atol=1e-5)
    assert engine.rebuilds == rebuilds
    tier = blk.retrace(lambda x, y, scale: rt.softmax(x * scale, axis=-1) + y.T.sum(axis=0, keepdims=True) * 3)
    assert tier == "code"
    assert engine.tick().tiers == ("code",)
    np.testing.assert_allclose(engine.read(blk["out"]), expected(x, y, 0.5, 3.0), rtol=1e-4, atol=1e-5)
    assert engine.rebuilds == rebuilds
    # a program of another structure: the engine rebuilds and runs it
    assert blk.retrace(lambda x, y, scale: (x * scale).max(axis=-1, keepdims=True)
                       + y.T.sum(axis=0, keepdims=True)) == "structure"
    assert engine.tick().tiers == ("structure",)
    np.testing.assert_allclose(engine.read(blk["out"]), (x * np.float32(0.5)).max(axis=-1, keepdims=True)
                               + y.T.sum(axis=0, keepdims=True), rtol=1e-5, atol=1e-5)


def test_several_outputs_and_reductions(engine):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 256)).astype(np.float32)

    def norm(x, eps):
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return {"y": (x - mu) / rt.sqrt(var + eps), "total": rt.exp(x).sum()}

    blk = engine.add(rt.block(norm, x=rt.input(x.shape, "f32"), eps=1e-5))
    engine.write(blk["x"], x)
    assert engine.tick().state == "ok", engine.diagnostic_log
    mu = x.mean(axis=-1, keepdims=True)
    ref = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(engine.read(blk["y"]), ref, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(engine.read(blk["total"]).reshape(()), np.exp(x).sum(), rtol=1e-4)


def test_a_tensor_block_inside_a_for_region(engine):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(4096).astype(np.float32)
    blk = rt.block(lambda x, s: x * s + 1, x=rt.input(x.shape, "f32"), s=0.5)
    loop = engine.add(rxcuda.For(3, [blk]))
    engine.write(blk["x"], x)
    assert engine.tick().state == "ok", engine.diagnostic_log
    np.testing.assert_allclose(engine.read(blk["out"]), x * 0.5 + 1, rtol=1e-6)  # the same input every pass
    rebuilds = engine.rebuilds
    loop.params["n"].value = 1
    blk.params["s"].value = 2.0
    engine.tick()
    np.testing.assert_allclose(engine.read(blk["out"]), x * 2 + 1, rtol=1e-6)
    assert engine.rebuilds == rebuilds
