"""The kernels shipped with rxcuda, loaded by name from a directory with no kernels/ in it, compute what their
sources say: checked against NumPy on fresh random data."""

import numpy as np
import pytest

from rxcuda import Block, kernels


def rand(rng, n):
    return rng.standard_normal(n).astype(np.float32) + 0.5


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_vector_add_and_scalar_mul_by_name(engine, rng, elsewhere):
    n = 50_001
    add = engine.add(Block.from_kernel("vector_add", size=n))
    mul = engine.add(Block.from_kernel("scalar_mul", size=n, scale=-1.75))
    engine.connect(add["out"], mul["x"])
    a, b = rand(rng, n), rand(rng, n)
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    frame = engine.tick()
    assert frame.launched and "structure" in frame.tiers
    np.testing.assert_allclose(engine.read(mul["out"]), (a + b) * np.float32(-1.75), rtol=1e-6)
    mul.params["scale"].value = 0.5
    assert engine.tick().tiers == ("parameters",)
    np.testing.assert_allclose(engine.read(mul["out"]), (a + b) * np.float32(0.5), rtol=1e-6)
    assert list(elsewhere.iterdir()) == []


def test_saxpy_by_name_from_its_ptx_and_from_its_cu_source(engine, rng, elsewhere):
    n = 4099
    from_ptx = engine.add(Block.from_kernel("saxpy", size=n, a=2.5, name="ptx"))
    from_cu = engine.add(Block.from_cuda("saxpy", size=n, a=2.5, name="cu"))
    x, y = rand(rng, n), rand(rng, n)
    for blk in (from_ptx, from_cu):
        engine.write(blk["x"], x)
        engine.write(blk["y"], y)
    assert engine.tick().launched
    # a * x + y compiles to one fused multiply-add (rounded once): the same sum in float64, rounded to float32
    want = (2.5 * x.astype(np.float64) + y).astype(np.float32)
    np.testing.assert_allclose(engine.read(from_ptx["y_out"]), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(engine.read(from_cu["y_out"]), want, rtol=1e-6, atol=1e-6)


def test_the_other_shipped_kernels_by_name_match_numpy(engine, rng, elsewhere):
    n = 3001
    x = {name: rand(rng, n) for name in ("a", "b", "c")}
    sub = engine.add(Block.from_kernel("vector_sub", size=n))
    add3 = engine.add(Block.from_kernel("vector_add3", size=n))
    above = engine.add(Block.from_kernel("append_above", size=n, threshold=0.7))
    for blk in (sub, add3):
        for port in blk.description.ports:
            if port.direction == "in":
                engine.write(blk[port.name], x[port.name])
    engine.write(above["values"], x["a"])
    assert engine.tick().launched
    np.testing.assert_allclose(engine.read(sub["out"]), x["a"] - x["b"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(engine.read(add3["out"]), x["a"] + x["b"] + x["c"], rtol=1e-6, atol=1e-6)
    want = np.sort(x["a"][x["a"] > np.float32(0.7)])
    assert 0 < want.size < n and engine.count(above["out"]) == want.size
    np.testing.assert_array_equal(np.sort(engine.read(above["out"])), want)
    # every shipped kernel is checked in this file
    assert set(kernels.names()) == {"vector_add", "scalar_mul", "saxpy", "vector_sub", "vector_add3", "append_above"}
