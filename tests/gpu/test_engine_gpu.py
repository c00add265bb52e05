"""The engine on a real GPU: results checked against NumPy on fresh random data."""

import shutil

import cupy as cp
import numpy as np
import pytest

import rxcuda
from rxcuda import Block, BlockBuilder


def rand(rng, n):
    return rng.standard_normal(n).astype(np.float32) + 0.5


def test_vector_add(engine, rng, kernels):
    n = 100_003
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    a, b = rand(rng, n), rand(rng, n)
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    f = engine.tick()
    assert f.launched and "structure" in f.tiers
    np.testing.assert_allclose(engine.read(add["out"]), a + b, rtol=1e-6)


def test_read_into_the_callers_array_page_locked_or_not(engine, rng, kernels):
    n = 1 << 20
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=1.0))
    plain = np.empty(n, np.float32)
    pinned = None if getattr(engine.device.api, "on_host", False) else cp.cuda.alloc_pinned_memory(4 * n)
    locked = np.frombuffer(pinned, np.float32, n) if pinned is not None else np.empty(n, np.float32)
    for scale in rng.uniform(-3, 3, 3).astype(np.float32):
        x = rand(rng, n)
        engine.write(mul["x"], x)
        mul.params["scale"].value = float(scale)
        engine.tick()
        for out in (plain, locked):
            assert engine.read(mul["out"], out=out) is out
            np.testing.assert_allclose(out, x * scale, rtol=1e-6)
    with pytest.raises(ValueError, match="numpy.empty"):
        engine.read(mul["out"], out=np.empty(n, np.float64))


def test_two_blocks_connected_intermediate_allocated(engine, rng, kernels):
    n = 4096
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=3.0))
    engine.connect(add["out"], mul["x"])
    a, b = rand(rng, n), rand(rng, n)
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), (a + b) * 3, rtol=1e-6)
    kinds = {b.label: b.kind for b in engine.plan.buffers}
    assert kinds["vector_add.out"] == "port"  # the intermediate came from the engine, not the user


def test_diamond(engine, rng, kernels):
    n = 2048
    x = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=1.0, name="x"))
    y = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=1.0, name="y"))
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=5.0, name="times5"))
    engine.connect(x["out"], add["a"])
    engine.connect(y["out"], add["b"])
    engine.connect(add["out"], mul["x"])
    xs, ys = rand(rng, n), rand(rng, n)
    engine.write(x["x"], xs)
    engine.write(y["x"], ys)
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), (xs + ys) * 5, rtol=1e-5)
    p = engine.plan
    add_node = p.kernel_nodes[(add.id, "vector_add")]
    assert set(p.deps[add_node]) == {p.kernel_nodes[(x.id, "scalar_mul")], p.kernel_nodes[(y.id, "scalar_mul")]}


def test_hot_update_without_rebuild(engine, kernels):
    n = 1000
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=10.0))
    engine.write(mul["x"], np.full(n, 3.0, np.float32))
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), 30.0)
    rebuilds = engine.rebuilds
    mul.params["scale"].value = 0.5
    f = engine.tick()
    assert f.tiers == ("parameters",) and engine.rebuilds == rebuilds
    np.testing.assert_allclose(engine.read(mul["out"]), 1.5)


def test_hot_update_random_values_each_frame(engine, rng, kernels):
    n = 777
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    for _ in range(5):
        s = float(rng.uniform(-4, 4))
        mul.set(scale=s)
        engine.tick()
        np.testing.assert_allclose(engine.read(mul["out"]), x * np.float32(s), rtol=1e-6)
    assert engine.rebuilds == 1


def test_warm_rebind_to_new_input(engine, rng, kernels):
    n = 5000
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0))
    x1 = cp.asarray(rand(rng, n))
    x2 = cp.asarray(rand(rng, n))
    engine.bind(mul["x"], x1)
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), cp.asnumpy(x1) * 2, rtol=1e-6)
    rebuilds = engine.rebuilds
    engine.bind(mul["x"], x2)
    f = engine.tick()
    assert f.tiers == ("parameters",) and engine.rebuilds == rebuilds
    np.testing.assert_allclose(engine.read(mul["out"]), cp.asnumpy(x2) * 2, rtol=1e-6)


def test_output_bound_to_user_array_zero_copy(engine, rng, kernels):
    n = 1024
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    out = cp.full(n, np.nan, dtype=cp.float32)
    engine.bind(add["out"], out)
    a, b = rand(rng, n), rand(rng, n)
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    engine.tick()
    np.testing.assert_allclose(cp.asnumpy(out), a + b, rtol=1e-6)


def test_grid_and_n_update(engine, rng, kernels):
    cap = 256
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=cap, threads=128, block_size=64))
    add.set(n=128)
    a, b = rand(rng, cap), rand(rng, cap)
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    engine.write(add["out"], np.full(cap, -7.0, np.float32))
    engine.tick()
    out = engine.read(add["out"])
    np.testing.assert_allclose(out[:128], (a + b)[:128], rtol=1e-6)
    assert np.all(out[128:] == -7.0)
    rebuilds = engine.rebuilds
    add.set(n=256)
    add.set_launch(threads=256)
    f = engine.tick()
    assert f.tiers == ("parameters",) and engine.rebuilds == rebuilds
    np.testing.assert_allclose(engine.read(add["out"]), a + b, rtol=1e-6)


def test_memset_counter_reset(engine, kernels):
    n = 256
    ap = engine.add(Block.from_kernel(kernels / "append_above.ptx", size=n, threshold=1e9))
    engine.write(ap["values"], np.arange(n, dtype=np.float32))
    engine.tick()
    engine.counter_array(ap["out"])[0] = 999
    cp.cuda.Device().synchronize()
    assert engine.count(ap["out"]) == 999
    engine.tick()
    assert engine.count(ap["out"]) == 0
    assert engine.read(ap["out"]).size == 0


def test_append_counts_and_threshold_update(engine, kernels):
    n = 256
    ap = engine.add(Block.from_kernel(kernels / "append_above.ptx", size=n, threshold=200.0))
    engine.write(ap["values"], np.arange(n, dtype=np.float32))
    engine.tick()
    assert engine.count(ap["out"]) == 55
    assert sorted(engine.read(ap["out"]).tolist()) == list(range(201, 256))
    ap.set(threshold=250.0)
    engine.tick()
    assert engine.count(ap["out"]) == 5
    assert sorted(engine.read(ap["out"]).tolist()) == [251, 252, 253, 254, 255]


def test_append_overflow_keeps_capacity(engine, rng, kernels):
    n, cap = 512, 100
    b = BlockBuilder("overflow", size=n)
    k = b.add_kernel(kernels / "append_above.ptx")
    b.input("values", k["values"])
    b.output("out", k["out"], count=cap, counter=k["count"])
    b.scalar("threshold", k["threshold"], default=-1e9)
    b.scalar("capacity", k["capacity"], default=cap)
    b.scalar("n", k["n"])
    ap = engine.add(b.build())
    values = rand(rng, n)
    engine.write(ap["values"], values)
    engine.tick()
    assert engine.count(ap["out"]) == n  # every value passed: the raw counter shows the overflow
    got = engine.read(ap["out"])
    assert got.size == cap  # only what fits is returned
    assert np.isin(got, values).all() and len(set(got.tolist())) == cap


def test_add_block_rebuilds_and_remove_leaves_nothing_compiled(engine, rng, kernels):
    n = 1024
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    a, b = rand(rng, n), rand(rng, n)
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    engine.tick()
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=-2.0))
    engine.connect(add["out"], mul["x"])
    f = engine.tick()
    assert "structure" in f.tiers
    np.testing.assert_allclose(engine.read(mul["out"]), (a + b) * -2, rtol=1e-6)
    mul_key = mul.description.kernels[0].code.key
    assert mul_key in engine._rt.modules
    engine.remove(mul)
    engine.tick()
    assert len(engine.plan.nodes) == 1
    assert mul_key not in engine._rt.modules
    np.testing.assert_allclose(engine.read(add["out"]), a + b, rtol=1e-6)


def test_code_swap_same_signature_in_place(engine, rng, kernels, tmp_path):
    n = 3000
    src = tmp_path / "op.ptx"
    shutil.copy(kernels / "vector_add.ptx", src)
    (tmp_path / "op.json").write_text((kernels / "vector_add.json").read_text())
    blk = engine.add(Block.from_kernel(src, size=n))
    a, b = rand(rng, n), rand(rng, n)
    engine.write(blk["a"], a)
    engine.write(blk["b"], b)
    engine.tick()
    np.testing.assert_allclose(engine.read(blk["out"]), a + b, rtol=1e-6)
    rebuilds = engine.rebuilds
    sub = rxcuda.load_kernel_file(kernels / "vector_sub.ptx")
    # same layout, different entry name: a newly loaded module's function goes into the exec node
    assert blk.set_code(None, sub) == "code"
    f = engine.tick()
    assert f.tiers == ("code",) and engine.rebuilds == rebuilds
    np.testing.assert_allclose(engine.read(blk["out"]), a - b, rtol=1e-6)


def test_file_reload_swaps_code(engine, rng, kernels, tmp_path):
    n = 600
    src = tmp_path / "k.ptx"
    shutil.copy(kernels / "vector_add.ptx", src)
    (tmp_path / "k.json").write_text((kernels / "vector_add.json").read_text())
    blk = engine.add(Block.from_kernel(src, size=n))
    a, b = rand(rng, n), rand(rng, n)
    engine.write(blk["a"], a)
    engine.write(blk["b"], b)
    engine.tick()
    # same entry name, new body: rewrite vector_add's add as sub in the PTX text
    text = (kernels / "vector_sub.ptx").read_text().replace("vector_sub", "vector_add")
    src.write_text(text)
    assert blk.reload() == ["code"]
    engine.tick()
    np.testing.assert_allclose(engine.read(blk["out"]), a - b, rtol=1e-6)


def test_changed_signature_forces_rebuild(engine, rng, kernels):
    n = 512
    b = BlockBuilder("flex", size=n)
    k = b.add_kernel(kernels / "vector_add.ptx")
    b.input("a", k["a"])
    b.input("b", k["b"])
    b.output("out", k["out"])
    b.scalar("n", k["n"])
    blk = engine.add(b.build())
    x, y = rand(rng, n), rand(rng, n)
    engine.write(blk["a"], x)
    engine.write(blk["b"], y)
    engine.tick()
    rebuilds = engine.rebuilds
    add3 = rxcuda.load_kernel_file(kernels / "vector_add3.ptx")
    assert blk.set_code(None, add3) == "structure"
    f = engine.tick()
    # vector_add3 has another parameter (c) that no port feeds: the rebuild fails, the old graph keeps running
    assert "structure" not in f.tiers and engine.rebuilds == rebuilds
    assert blk.state == "error" and "c" in blk.message
    np.testing.assert_allclose(engine.read(blk["out"]), x + y, rtol=1e-6)


def test_failed_rebuild_keeps_last_results(engine, rng, kernels, tmp_path):
    n = 1000
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=4.0))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    engine.tick()
    bad = tmp_path / "broken.ptx"
    bad.write_text((kernels / "vector_add.ptx").read_text().replace("add.f32", "bogus.f32"))
    (tmp_path / "broken.json").write_text((kernels / "vector_add.json").read_text())
    broken = engine.add(Block.from_kernel(bad, size=n))
    engine.connect(mul["out"], broken["a"])
    engine.connect(mul["out"], broken["b"])
    seen = []
    engine.diagnostics.subscribe(seen.append)
    for _ in range(3):
        f = engine.tick()
        assert f.launched
    assert broken.state == "error" and "broken.ptx" in broken.message
    assert len(seen) == 1 and seen[0].subject == broken.name
    mul.set(scale=-1.0)  # parameters still reach the last good graph
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), -x, rtol=1e-6)


def test_missing_required_input_reports_and_keeps_running(engine, rng, kernels):
    n = 100
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    engine.tick()
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    engine.connect(mul["out"], add["a"])  # add.b is neither connected nor bound
    engine.tick()
    assert add.state == "error"
    assert "vector_add.b is neither connected nor bound" in add.message
    np.testing.assert_allclose(engine.read(mul["out"]), x * 2, rtol=1e-6)


def test_bad_connect_raises_and_leaves_engine_unchanged(engine, kernels):
    f = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=64))
    g = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=128, counts={"x": 128}))  # a fixed input
    with pytest.raises(rxcuda.ValidationError, match="sizes differ"):
        engine.connect(f["out"], g["x"])
    with pytest.raises(rxcuda.ValidationError, match="output port"):
        engine.connect(g["x"], f["a"])
    h = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=64, name="h"))
    engine.connect(f["out"], h["x"])
    with pytest.raises(rxcuda.ValidationError, match="cycle"):
        engine.connect(h["out"], f["a"])
    assert len(engine.connections) == 1


def test_bind_wrong_dtype_and_size(engine, kernels):
    blk = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=64))
    with pytest.raises(rxcuda.ValidationError, match="float64|f64"):
        engine.bind(blk["x"], cp.zeros(64, cp.float64))
    with pytest.raises(rxcuda.ValidationError, match="needs 64"):
        engine.bind(blk["x"], cp.zeros(10, cp.float32))


def test_sidecar_disagreeing_with_kernel_names_parameter(engine, kernels, tmp_path):
    import json

    src = tmp_path / "scalar_mul.ptx"
    shutil.copy(kernels / "scalar_mul.ptx", src)
    side = json.loads((kernels / "scalar_mul.json").read_text())
    for p in side["params"]:
        if p["name"] == "scale":
            p["type"] = "f64"
    (tmp_path / "scalar_mul.json").write_text(json.dumps(side))
    with pytest.raises(rxcuda.KernelFileError, match="scale"):
        Block.from_kernel(src, size=16)


def test_multi_kernel_block_with_internal_connection(engine, rng, kernels):
    n = 3333
    b = BlockBuilder("scaled_sum", size=n)
    add = b.add_kernel(kernels / "vector_add.ptx")
    mul = b.add_kernel(kernels / "scalar_mul.ptx")
    b.input("a", add["a"])
    b.input("b", add["b"])
    b.connect(add["out"], mul["x"])
    b.output("out", mul["out"])
    b.scalar("scale", mul["scale"], default=3.0)
    b.scalar("n", [add["n"], mul["n"]])
    blk = engine.add(b.build())
    x, y = rand(rng, n), rand(rng, n)
    engine.write(blk["a"], x)
    engine.write(blk["b"], y)
    engine.tick()
    np.testing.assert_allclose(engine.read(blk["out"]), (x + y) * 3, rtol=1e-6)


def test_array_view_is_zero_copy(engine, rng, kernels):
    n = 256
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    engine.tick()
    view = engine.array(mul["out"])
    assert isinstance(view, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(view), x * 2, rtol=1e-6)
    engine.array(mul["x"])[:] = cp.asarray(x * 0 + 1)
    engine.tick()
    np.testing.assert_allclose(cp.asnumpy(view), 2.0)


def test_buffers_survive_rebuild_and_pool_reuses(engine, rng, kernels):
    n = 4096
    add = engine.add(Block.from_kernel(kernels / "vector_add.ptx", size=n))
    a, b = rand(rng, n), rand(rng, n)
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    engine.tick()
    ptr = engine.array(add["out"]).data.ptr
    other = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n))
    engine.connect(add["out"], other["x"])
    engine.tick()
    assert engine.array(add["out"]).data.ptr == ptr  # same port, same memory across the rebuild
    engine.remove(other)
    engine.tick()
    again = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n))
    engine.connect(add["out"], again["x"])
    engine.tick()
    assert engine.memory.reuses >= 1


def test_engine_summary_and_close(kernels):
    e = rxcuda.Engine()
    blk = e.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=8))
    e.write(blk["x"], np.arange(8, dtype=np.float32))
    e.tick()
    s = str(e)
    assert "scalar_mul: ok" in s and "1 block," in s
    e.close()
    with pytest.raises(rxcuda.EngineClosedError):
        e.tick()
