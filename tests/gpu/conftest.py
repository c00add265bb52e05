"""GPU tests: skipped, with the reason, where no CUDA device is usable."""

import os
import pathlib

import numpy as np
import pytest

from rxcuda.cuda._driver import probe

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "kernels"

_ok, _why = probe()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu_fault`` make a kernel fault on purpose (in a subprocess) and run last: after a fault
    anywhere on the GPU, CUDA-OpenGL interop on that machine stops ordering GL's draws after the frame (39 of 40
    first draws wrong, even with a host sync before the unmap) and a later map can hang, in new processes too,
    until the GPU is reset (seen on an H200, driver 580.159.04, headless EGL). Everything else keeps working."""
    if _ok:
        faulting = [item for item in items if item.get_closest_marker("gpu_fault")]
        if faulting:
            items[:] = [item for item in items if not item.get_closest_marker("gpu_fault")] + faulting
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: {_why}")
    for item in items:
        if "tests/gpu" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


def gpu_subprocess_env() -> dict:
    """The environment for a child Python: the checkout first on PYTHONPATH, keeping what was there (the
    wheels the GPU machine installs beside it, say)."""
    root = str(KERNELS.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def engine():
    import rxcuda

    with rxcuda.Engine() as e:
        yield e


@pytest.fixture
def rng():
    return np.random.default_rng()


@pytest.fixture
def kernels():
    return KERNELS
