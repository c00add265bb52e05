"""engine.read(port, out=...): into the caller's array, on the CPU device (real numbers); the array checked first,
with an error that names the array to make, and the engine running on after a refusal. The isolated engine's
reads (through its clock and page-locked shared memory) give the same numbers, with or without ``out``."""

import numpy as np
import pytest

import rxcuda

N = 1 << 12


@pytest.fixture
def engine():
    e = rxcuda.Engine(device="cpu")
    yield e
    e.close()


def _scaled(engine, n=N, scale=2.5):
    b = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=scale))
    x = np.random.default_rng().standard_normal(n).astype(np.float32)
    engine.write(b["x"], x)
    assert engine.tick().state == "ok"
    return b, x


def test_a_read_into_the_callers_array_is_that_array_with_the_frames_numbers(engine):
    b, x = _scaled(engine)
    out = np.full(N, np.nan, np.float32)
    assert engine.read(b["out"], out=out) is out
    np.testing.assert_array_equal(out, x * np.float32(2.5))
    b.params["scale"].value = -1.25  # the same array again next frame
    engine.tick()
    engine.read(b["out"], out=out)
    np.testing.assert_array_equal(out, x * np.float32(-1.25))


@pytest.mark.parametrize("bad, said", [
    (np.empty(N - 1, np.float32), "float32 (4095,)"),
    (np.empty(N, np.float64), "float64 (4096,)"),
    (np.empty(2 * N, np.float32)[::2], "not C-contiguous"),
    (np.frombuffer(bytes(4 * N), np.float32), "read-only"),
    ([0.0] * N, "list"),
])
def test_an_out_array_that_does_not_fit_is_refused_naming_the_one_to_make(engine, bad, said):
    b, x = _scaled(engine)
    with pytest.raises(ValueError, match=r"numpy.empty\(\(4096,\), numpy.float32\)") as err:
        engine.read(b["out"], out=bad)
    assert said in str(err.value)
    assert engine.tick().state == "ok"  # nothing changed: the engine runs on and reads as before
    np.testing.assert_array_equal(engine.read(b["out"]), x * np.float32(2.5))


def test_an_isolated_engine_reads_the_same_numbers_with_and_without_out():
    with rxcuda.IsolatedEngine(device="cpu", deadline=5.0) as iso:
        b, x = _scaled(iso, n=1 << 16)
        np.testing.assert_array_equal(iso.read(b["out"]), x * np.float32(2.5))
        out = np.empty(1 << 16, np.float32)
        for scale in np.random.default_rng().uniform(-3, 3, 5).astype(np.float32):
            b.params["scale"].value = float(scale)
            iso.tick()
            assert iso.read(b["out"], out=out) is out
            np.testing.assert_array_equal(out, x * scale)
        with pytest.raises(ValueError, match="numpy.empty"):
            iso.read(b["out"], out=np.empty(3, np.float32))
        np.testing.assert_array_equal(iso.read(b["x"]), x)  # another port, its own shared file


def test_an_append_outputs_count_reads_into_a_u32_array_and_a_wrong_one_is_refused(engine):
    above = engine.add(rxcuda.Block.from_kernel("append_above", size=N, threshold=0.5))
    x = np.random.default_rng().standard_normal(N).astype(np.float32)
    engine.write(above["values"], x)
    engine.tick()
    count = np.zeros(1, np.uint32)
    assert engine.read(above["out"].count, out=count) is count
    assert int(count[0]) == int((x > 0.5).sum()) == engine.count(above["out"])
    with pytest.raises(ValueError, match=r"numpy.empty\(\(1,\), numpy.uint32\)"):
        engine.read(above["out"].count, out=np.zeros(1, np.int64))
