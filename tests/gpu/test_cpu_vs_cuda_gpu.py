"""On a machine with a GPU: the CPU device computes what the GPU computes. The same pipelines (shipped kernels,
CUDA C++ with shared memory, barriers and shuffles, an append output with its atomics) on
``Engine(device="cpu")`` and ``Engine()`` with the same inputs give the same numbers (to float32 tolerance, exactly
where the arithmetic is one IEEE operation), and the examples that run on the CPU device run there on this machine
too (``RXCUDA_DEVICE=cpu``; two_gpus on two positions of the CPU device), each checking itself against NumPy."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import gpu_subprocess_env

ON_CPU = ["hot_reload", "particles", "particles_gl", "quickstart", "sensor_params", "two_gpus", "video_filter"]
ARGS = {"two_gpus": "3"}  # (two_gpus checks its pipelined frames from the second on)

# block_sum: shared memory, barriers, shuffles (and an atomic count of the blocks, not compared: the GPU's buffer
# starts as whatever it held)
REDUCE_PATH = pathlib.Path(__file__).parents[1] / "unit" / "cpu_device.cu"


@pytest.mark.parametrize("name", ON_CPU)
def test_the_example_runs_on_the_cpu_device_of_a_gpu_machine(name, tmp_path):
    if name == "video_filter" and importlib.util.find_spec("av") is None:
        pytest.skip("video_filter decodes video with PyAV, which this Python lacks: pip install '.[media]'")
    if name == "particles_gl" and importlib.util.find_spec("moderngl") is None:
        pytest.skip("particles_gl draws with moderngl, which this Python lacks: pip install '.[gl]'")
    env = {**gpu_subprocess_env(), "RXCUDA_DEVICE": "cpu"}
    proc = subprocess.run([sys.executable, "-m", f"rxcuda.examples.{name}", ARGS.get(name, "1")], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)
    if name == "particles_gl" and "no OpenGL context through EGL" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    if name == "two_gpus":  # both halves on two positions of the CPU device, whatever GPUs the machine has
        assert proc.stdout.startswith("RXCUDA_DEVICE=cpu: running on the CPU device, both halves on it"), proc.stdout
        assert proc.stdout.rstrip().endswith("OK: 3 frames over two devices and 2 pipelined frames match NumPy")


# Both devices' engines in one process run in a child: after this file's comparisons ran in the test process, every
# later PTX JIT of that process failed (CUDA_ERROR_INVALID_PTX: 73 of tests/gpu/test_tensor_ptx_gpu.py, which passes
# alone; H100, driver 580; cause not found yet: docs/cpu.md, "Known issues"), which would fail the tests after it.
COMPARE = r"""
import pathlib, sys
import numpy as np
import rxcuda

rng = np.random.default_rng()


def quickstart(engine, a, b, scale, threshold):
    n = a.size
    add = engine.add(rxcuda.Block.from_kernel("vector_add", size=n))
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=scale))
    above = engine.add(rxcuda.Block.from_kernel("append_above", size=n, threshold=threshold))
    engine.connect(add["out"], mul["x"])
    engine.connect(mul["out"], above["values"])
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    engine.tick()
    count = engine.count(above["out"])
    return engine.read(mul["out"]), count, np.sort(engine.read(above["out"])[:count])


if sys.argv[1] == "quickstart":
    n = 1 << 18
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    with rxcuda.Engine(device="cpu") as cpu:
        on_cpu = quickstart(cpu, a, b, 2.5, 1.0)
    with rxcuda.Engine() as gpu:
        on_gpu = quickstart(gpu, a, b, 2.5, 1.0)
    np.testing.assert_array_equal(on_cpu[0], on_gpu[0])
    assert on_cpu[1] == on_gpu[1]
    np.testing.assert_array_equal(on_cpu[2], on_gpu[2])
else:  # block_sum: shared memory, barriers, shuffles
    n = 100_000
    x = rng.standard_normal(n).astype(np.float32)
    out = {}
    for device in ("cpu", "cuda"):
        with rxcuda.Engine(device=device) as engine:
            blk = engine.add(rxcuda.Block.from_cuda(pathlib.Path(sys.argv[2]).read_text(), "block_sum", size=n,
                                                    block_size=256))
            engine.write(blk["x"], x)
            engine.tick()
            blocks = -(-n // 256)  # (one value per block; the rest of the buffers is never written)
            out[device] = engine.read(blk["out"])[:blocks]
    # the same tree of additions in the same order: the same floats
    np.testing.assert_allclose(out["cpu"], out["cuda"], rtol=1e-6, atol=1e-6)
print("same")
"""


def _compare(what: str, tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-c", COMPARE, what, str(REDUCE_PATH)], capture_output=True, text=True,
                          cwd=tmp_path, env=gpu_subprocess_env(), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("same"), proc.stdout + proc.stderr


def test_the_quickstart_pipeline_gives_the_same_numbers_on_both_devices(tmp_path):
    _compare("quickstart", tmp_path)


def test_cuda_cpp_with_shared_memory_barriers_and_shuffles_gives_the_same_numbers_on_both_devices(tmp_path):
    _compare("reduce", tmp_path)


def test_the_cpu_device_is_forced_by_the_environment(tmp_path):
    code = "import rxcuda; e = rxcuda.Engine(); print(e.device.name); e.close()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**gpu_subprocess_env(), "RXCUDA_DEVICE": "cpu"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "CPU (rxcuda)"
    assert os.environ.get("RXCUDA_DEVICE") != "cpu"  # (the suite itself runs on the GPU)
