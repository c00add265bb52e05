"""Every refused call of ``tests/unit/_refusals.py`` leaves a GPU engine as it was: one device, two positions of one
GPU (``devices=[0, 0]``), with a composite instance and without. After each refusal the engine builds and its frame
is checked against NumPy; after all of them, the block refused on a device past the list is added on the last
device and computes there."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit"))
from _refusals import REFUSALS, build, expected, outputs, snapshot  # noqa: E402

import rxcuda  # noqa: E402

KINDS = {
    "one device, composite": ({}, 1, True),
    "devices [0, 0]": ({"devices": [0, 0]}, 2, False),
    "devices [0, 0], composite": ({"devices": [0, 0]}, 2, True),
}


@pytest.fixture(params=list(KINDS))
def pipeline(request, kernels):
    kw, devices, composite = KINDS[request.param]
    engine = rxcuda.Engine(**kw)
    try:
        yield build(engine, kernels, devices=devices, composite=composite)
    finally:
        engine.close()


def _computes(p) -> None:
    e = p.engine
    e.rebuild()
    frame = e.tick(sync=True)
    assert frame.state == "ok" and frame.launched, frame
    assert {b.name: b.state for b in e.blocks} == {b.name: "ok" for b in e.blocks}
    got, want = outputs(p), expected(p)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6, err_msg=k)


@pytest.mark.parametrize(("label", "call", "error"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_refused_call_leaves_the_gpu_engine_computing_as_before(pipeline, label, call, error):
    if getattr(call, "composite_only", False) and pipeline.inst is None:
        pytest.skip("needs a composite instance")
    before = snapshot(pipeline.engine)
    with pytest.raises(error):
        call(pipeline)
    assert snapshot(pipeline.engine) == before
    _computes(pipeline)


def test_a_series_of_refusals_then_the_refused_block_computes_on_the_last_device(pipeline):
    for _label, call, error in REFUSALS:
        if getattr(call, "composite_only", False) and pipeline.inst is None:
            continue
        with pytest.raises(error):
            call(pipeline)
    _computes(pipeline)
    e = pipeline.engine
    on = {"device": pipeline.devices - 1} if pipeline.devices > 1 else {}
    third = e.add(pipeline.spare, **on)
    e.connect(pipeline.second["out"], third["x"])
    _computes(pipeline)
    np.testing.assert_allclose(e.read(third["out"]), expected(pipeline)["second"] * np.float32(7.0), rtol=1e-6)


def test_a_block_refused_past_the_devices_computes_as_the_first_block_on_the_second_one(kernels):
    """devices=[0, 0] with every block on the first: the block refused on device 2 is then the first one placed on
    device 1 (its graph made for the first time by this rebuild), and computes there."""
    with rxcuda.Engine(devices=[0, 0]) as engine:
        p = build(engine, kernels, devices=1, composite=False)
        with pytest.raises(ValueError, match="device=2 is not one of this engine's devices"):
            engine.add(p.spare, device=2)
        engine.add(p.spare, device=1)
        engine.connect(p.second["out"], p.spare["x"])
        _computes(p)
        np.testing.assert_allclose(engine.read(p.spare["out"]), expected(p)["second"] * np.float32(7.0), rtol=1e-6)
