"""Every refused call of tests/unit/test_distributed_refusals.py on a distributed engine whose two workers share
one GPU (``num_gpus=0.5`` each, an ``ipc`` link, clocks) leaves it as it was; after each refusal and after all of
them (then a block added on the consumer, a second link and a parameter set) the workers build and compute, the
outputs exact against NumPy. Needs Ray (on the GPU machine: ../shared/tools/device-prep.sh --ray)."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

import rxcuda

ray = pytest.importorskip("ray", reason="rxcuda.distributed runs on Ray: pip install 'rxcuda[ray]'")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit"))
from test_distributed_refusals import PTX, REFUSALS, N, _Pipeline, _snapshot  # noqa: E402

from rxcuda.distributed import Worker  # noqa: E402


@pytest.fixture(scope="module")
def pipeline(cluster):
    p = _Pipeline(Worker(num_gpus=0.5))
    assert p.dist.describe().transports()["first.out -> second.x"] == "ipc"
    yield p
    p.dist.close()


@pytest.mark.parametrize(("label", "call", "error"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_refused_call_leaves_the_distributed_gpu_engine_computing_as_before(pipeline, label, call, error):
    before = _snapshot(pipeline.dist)
    with pytest.raises(error):
        call(pipeline)
    assert _snapshot(pipeline.dist) == before
    pipeline.dist.rebuild()
    pipeline.computes()


def test_after_every_refusal_a_change_is_built_and_computes_on_the_gpu(pipeline):
    for _label, call, error in REFUSALS:
        with pytest.raises(error):
            call(pipeline)
    dist = pipeline.dist
    fourth = dist.add(rxcuda.Block.from_kernel(PTX, size=N, name="fourth"), on="b")
    dist.connect(pipeline.first["out"], fourth["x"], transport="ipc")
    pipeline.third.params["scale"].value = 5.0
    pipeline.computes(third_scale=5.0)
    np.testing.assert_array_equal(dist.read(fourth["out"]), pipeline.x * np.float32(2.0))
