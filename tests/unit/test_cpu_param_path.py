"""A parameter change on the CPU device: the node's update bound once (CpuDriver.kernel_node_updater, what
rxcuda.cuda._fast calls each time), the new values repacked in C, every frame exact against NumPy; a failure the
driver reports on that call still reaches the engine as one."""

import numpy as np
import pytest

import rxcuda
from rxcuda.cuda._cpu import CpuDriver


@pytest.fixture
def engine():
    e = rxcuda.Engine(device="cpu")
    yield e
    e.close()


def test_each_parameter_change_is_a_patch_of_the_node_and_every_frame_is_exact(engine):
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=4096, scale=1.0))
    x = np.random.default_rng().standard_normal(4096).astype(np.float32)
    engine.write(mul["x"], x)
    engine.tick()
    api = engine.device.api
    before = api.count("cuGraphExecKernelNodeSetParams")
    scales = np.random.default_rng().uniform(-5, 5, 50).astype(np.float32)
    for scale in scales:
        mul.params["scale"].value = float(scale)
        assert engine.tick().tiers == ("parameters",)
        np.testing.assert_array_equal(engine.read(mul["out"]), x * scale)
    assert api.count("cuGraphExecKernelNodeSetParams") - before == len(scales)
    assert engine.rebuilds == 1


@pytest.mark.parametrize("bound", [True, False])
def test_a_failure_of_the_node_update_raises_as_the_driver_call_would_and_the_next_change_applies(monkeypatch, bound):
    if not bound:  # the generic path (the driver's call each time): the bound one must behave the same
        monkeypatch.setattr(CpuDriver, "kernel_node_updater", None)
    with rxcuda.Engine(device="cpu") as engine:
        mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=256, scale=1.0))
        x = np.random.default_rng().standard_normal(256).astype(np.float32)
        engine.write(mul["x"], x)
        engine.tick()
        engine.device.api.fail("cuGraphExecKernelNodeSetParams", "CUDA_ERROR_INVALID_VALUE")
        mul.params["scale"].value = 2.0
        with pytest.raises(rxcuda.CudaError, match="cuGraphExecKernelNodeSetParams.*CUDA_ERROR_INVALID_VALUE"):
            engine.tick()
        mul.params["scale"].value = 3.0
        engine.tick()
        np.testing.assert_array_equal(engine.read(mul["out"]), x * np.float32(3.0))
