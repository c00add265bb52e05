"""rxcuda.tensor.block in a running engine: outputs vs NumPy on random data, a scalar parameter hot-updated,
the program edited (Code tier) and restructured (Structure tier), a tensor block inside a For region; matmuls as
cuBLAS GEMM calls of the block (an MLP forward, transposed and vector operands, f64 and f16), a tensor block in a
composite and in an If region whose flag another tensor block computes."""

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


# -- matmul: cuBLAS GEMM calls inside the block ----------------------------------------------------------------
def mlp(x, w1, b1, w2, b2):
    return rt.softmax(rt.maximum(x @ w1 + b1, 0) @ w2 + b2, axis=-1)


def np_mlp(x, w1, b1, w2, b2, alpha0=1.0, alpha1=1.0, scale=1.0, rows=None):
    x, w1, b1, w2, b2 = (v.astype(np.float64) for v in (x, w1, b1, w2, b2))
    h = np.maximum(alpha0 * (x @ w1) + b1, 0)[:rows]
    return np_softmax((alpha1 * (h @ w2) + b2) * scale)


def mlp_inputs(rng, batch=64, d_in=128, hidden=256, d_out=10):
    f32 = np.float32
    return {"x": rng.standard_normal((batch, d_in)).astype(f32),
            "w1": (rng.standard_normal((d_in, hidden)) / np.sqrt(d_in)).astype(f32),
            "b1": rng.standard_normal(hidden).astype(f32) * f32(0.1),
            "w2": (rng.standard_normal((hidden, d_out)) / np.sqrt(hidden)).astype(f32),
            "b2": rng.standard_normal(d_out).astype(f32) * f32(0.1)}


def write_all(engine, blk, values):
    for name, v in values.items():
        engine.write(blk[name], v)


def close(got, want, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_an_mlp_forward_with_two_gemms_hot_alpha_code_tier_and_structure(engine, rng):
    v = mlp_inputs(rng)
    blk = engine.add(rt.block(mlp, **v))
    assert [s.name for s in blk.description.kernels] == ["gemm0", "k0", "gemm1", "k1"]
    write_all(engine, blk, v)
    assert engine.tick().state == "ok", engine.diagnostic_log
    close(engine.read(blk["out"]), np_mlp(**v))
    rebuilds = engine.rebuilds
    # new data: the same graph, the new numbers
    v["x"] = rng.standard_normal(v["x"].shape).astype(np.float32)
    engine.write(blk["x"], v["x"])
    engine.tick()
    close(engine.read(blk["out"]), np_mlp(**v))
    # each GEMM's alpha lives in device memory: a hot update, no rebuild, no recapture
    blk.params["gemm0_alpha"].value = 0.5
    blk.params["gemm1_alpha"].value = 2.0
    assert engine.tick().tiers == ("parameters",)
    close(engine.read(blk["out"]), np_mlp(**v, alpha0=0.5, alpha1=2.0))
    assert engine.rebuilds == rebuilds and engine.recaptures == 0
    # an edited literal in the kernel after the second GEMM: a Code-tier swap, the GEMMs untouched
    assert blk.retrace(lambda x, w1, b1, w2, b2: rt.softmax((rt.maximum(x @ w1 + b1, 0) @ w2 + b2) * 0.25,
                                                            axis=-1)) == "code"
    assert engine.tick().tiers == ("code",)
    close(engine.read(blk["out"]), np_mlp(**v, alpha0=0.5, alpha1=2.0, scale=0.25))
    assert engine.rebuilds == rebuilds
    # other GEMM shapes (the first 16 rows into the second GEMM): a rebuild that runs the new program
    assert blk.retrace(lambda x, w1, b1, w2, b2: rt.softmax(rt.maximum(x @ w1 + b1, 0)[:16] @ w2 + b2,
                                                            axis=-1)) == "structure"
    assert engine.tick().tiers == ("structure",) and engine.rebuilds == rebuilds + 1
    close(engine.read(blk["out"]), np_mlp(**v, alpha0=0.5, alpha1=2.0, rows=16))


def test_transposed_and_vector_operands(engine, rng):
    f32 = np.float32
    v = {"x": rng.standard_normal((96, 64)).astype(f32), "w": rng.standard_normal((96, 32)).astype(f32),
         "y": rng.standard_normal((48, 64)).astype(f32), "z": rng.standard_normal((40, 96)).astype(f32),
         "u": rng.standard_normal(64).astype(f32)}

    def prog(x, w, y, z, u):
        return {"at": x.T @ w,                  # trans_a, from an input port
                "bt": x @ y.T,                  # trans_b
                "both": x.T @ z.T,              # both
                "ct": rt.tanh(x).T @ w * 2,     # trans_a of a computed buffer, a kernel after the GEMM
                "mv": x @ u,                    # a column vector
                "vm": u @ y.T}                  # a row vector times a transpose

    blk = engine.add(rt.block(prog, **v))
    keys = {s.name: s.key[7:9] for s in blk.description.kernels if s.name.startswith("gemm")}
    assert sorted(keys.values()) == sorted([(True, False), (False, True), (True, True), (True, False),
                                            (False, False), (False, True)])
    write_all(engine, blk, v)
    assert engine.tick().state == "ok", engine.diagnostic_log
    x, w, y, z, u = (v[k].astype(np.float64) for k in "xwyzu")
    want = {"at": x.T @ w, "bt": x @ y.T, "both": x.T @ z.T, "ct": np.tanh(x).T @ w * 2, "mv": x @ u,
            "vm": u @ y.T}
    for name, ref in want.items():
        close(engine.read(blk[name]), ref, rtol=1e-4, atol=1e-3)


def test_f64_and_f16_gemms(engine, rng):
    a, b = rng.standard_normal((64, 48)), rng.standard_normal((48, 32))
    d = engine.add(rt.block(lambda a, b: rt.exp(a @ b * 0.1), a=a, b=b, name="f64"))
    h = engine.add(rt.block(lambda a, b: a @ b, a=a.astype(np.float16), b=b.astype(np.float16), name="f16"))
    write_all(engine, d, {"a": a, "b": b})
    write_all(engine, h, {"a": a.astype(np.float16), "b": b.astype(np.float16)})
    assert engine.tick().state == "ok", engine.diagnostic_log
    close(engine.read(d["out"]), np.exp(a @ b * 0.1), rtol=1e-10, atol=1e-12)
    ref16 = a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64)
    close(engine.read(h["out"]).astype(np.float64), ref16, rtol=1e-2, atol=3e-2)  # f32 accumulation, f16 result


def test_a_tensor_block_with_gemms_inside_a_composite(engine, rng):
    v = mlp_inputs(rng, batch=32, d_in=64, hidden=128, d_out=8)
    specs = {k: rt.input(a.shape, "f32") for k, a in v.items()}
    head = rxcuda.Composite("head")
    norm = head.add(rt.block(lambda x: x - x.mean(axis=-1, keepdims=True), x=specs["x"], name="norm"))
    net = head.add(rt.block(lambda x, w1, b1, w2, b2, t: rt.softmax((rt.maximum(x @ w1 + b1, 0) @ w2 + b2) * t,
                                                                    axis=-1), name="mlp", t=1.0, **specs))
    head.connect(norm["out"], net["x"])
    head.expose("x", norm["x"])
    head.expose("y", net["out"])
    for name in ("w1", "b1", "w2", "b2"):
        head.expose(name, net[name])
    head.expose_parameter("gain", net.params["gemm0_alpha"], value=2.0)
    head.expose_parameter("t", net.params["t"])
    one = engine.add(head)
    write_all(engine, one, v)
    assert engine.tick().state == "ok", engine.diagnostic_log
    centred = v["x"] - v["x"].mean(axis=-1, keepdims=True)
    close(engine.read(one["y"]), np_mlp(centred, *(v[k] for k in ("w1", "b1", "w2", "b2")), alpha0=2.0))
    rebuilds = engine.rebuilds
    one.params["gain"].value = 0.5
    one.params["t"].value = 3.0
    assert engine.tick().tiers == ("parameters",) and engine.rebuilds == rebuilds
    close(engine.read(one["y"]), np_mlp(centred, *(v[k] for k in ("w1", "b1", "w2", "b2")), alpha0=0.5, scale=3.0))


def test_a_tensor_block_with_gemms_in_an_if_region_gated_by_a_tensor_block_flag(engine, rng):
    v = mlp_inputs(rng, batch=16, d_in=32, hidden=64, d_out=4)
    gate = engine.add(rt.block(lambda g: g.max() > 0, g=rt.input(8, "f32"), name="gate"))
    body = rt.block(mlp, **v)
    engine.add(rxcuda.If(gate["out"], [body]))
    write_all(engine, body, v)
    engine.write(gate["g"], np.abs(rng.standard_normal(8)).astype(np.float32))  # max > 0: the body runs
    assert engine.tick().state == "ok", engine.diagnostic_log
    assert engine.read(gate["out"]).reshape(()) == 1
    close(engine.read(body["out"]), np_mlp(**v))
    engine.write(gate["g"], -np.abs(rng.standard_normal(8)).astype(np.float32) - 1)  # the body does not run
    engine.tick()
    assert engine.read(gate["out"]).reshape(()) == 0
    np.testing.assert_array_equal(engine.read(body["out"]), 0)  # outputs of an If body are zeroed before it
