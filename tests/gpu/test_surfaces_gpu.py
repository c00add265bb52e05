"""What the engine reports matches what runs, on a real GPU (issue 41): a parameter that follows a shape reads the
count the kernels run over, with every element computed; a failed first build launches nothing and says so; a
real driver's live view shows its numbers as measured."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import rxcuda
from rxcuda import Block


def test_a_size_that_follows_its_input_reads_the_count_the_kernel_runs_over(engine, rng):
    a = rng.standard_normal(1024).astype(np.float32)
    b = rng.standard_normal(1024).astype(np.float32)
    add = engine.add(Block.from_kernel("vector_add", size=1024))
    small = engine.add(Block.from_kernel("scalar_mul", size=512, name="small", scale=3.0))
    engine.connect(add["out"], small["x"])
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    assert engine.tick().state == "ok"
    assert small.params["n"].value == 1024 and engine.shape(small["out"]) == (1024,)
    np.testing.assert_allclose(engine.read(small["out"]), (a + b) * 3, rtol=1e-6)  # all 1024, not the first 512
    engine.disconnect(add["out"], small["x"])
    x = rng.standard_normal(512).astype(np.float32)
    engine.write(small["x"], x)
    engine.tick()
    assert small.params["n"].value == 512
    np.testing.assert_allclose(engine.read(small["out"]), x * 3, rtol=1e-6)


def test_a_failed_first_build_launches_nothing_and_says_so(engine):
    add = engine.add(Block.from_kernel("vector_add", size=256))
    engine.write(add["a"], np.ones(256, np.float32))
    with pytest.warns(RuntimeWarning, match="no graph runs until it is fixed"):
        frame = engine.tick()
    assert frame.state == "error" and not frame.launched
    engine.write(add["b"], np.ones(256, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert engine.tick().state == "ok"
    np.testing.assert_array_equal(engine.read(add["out"]), np.full(256, 2.0, np.float32))


def test_a_real_driver_measures_what_the_live_view_shows(engine):
    pytest.importorskip("aiohttp", reason="the live view needs the view extra")
    assert getattr(engine.device.api, "measures", True) is True
    assert not isinstance(engine.device.api, rxcuda.cuda.NullDriver)
