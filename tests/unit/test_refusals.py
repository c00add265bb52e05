"""Every refused call leaves its engine as it was, on every kind of engine: on the null driver one device and two
positions of one GPU (``devices=[0, 0]``), on the CPU device (real numbers, checked against NumPy) one device and two
(``devices=["cpu", "cpu"]``); each with a composite instance and without. Each refusal of
``_refusals.REFUSALS`` is checked alone on a fresh pipeline (the pipeline as data, the blocks' states, values
and launches unchanged; then a build and a frame that run), and all of them one after another on one engine (then
a block added, a frame, and every block ``ok``). ``tests/gpu/test_refusals_gpu.py`` runs the list on a GPU and
checks the numbers."""

from __future__ import annotations

import numpy as np
import pytest
from _refusals import REFUSALS, build, expected, outputs, snapshot

import rxcuda
from rxcuda.cuda import NullDriver

KERNELS = "kernels"
KINDS = {  # name -> (Engine keywords: the null driver's unless they name the CPU device, devices, composite)
    "one device": ({}, 1, False),
    "one device, composite": ({}, 1, True),
    "devices [0, 0]": ({"devices": [0, 0]}, 2, False),
    "devices [0, 0], composite": ({"devices": [0, 0]}, 2, True),
    "cpu device": ({"device": "cpu"}, 1, False),
    "cpu device, composite": ({"device": "cpu"}, 1, True),
    "devices [cpu, cpu]": ({"devices": ["cpu", "cpu"]}, 2, False),
    "devices [cpu, cpu], composite": ({"devices": ["cpu", "cpu"]}, 2, True),
}


def _engine(kw: dict) -> rxcuda.Engine:
    return rxcuda.Engine(**kw) if "cpu" in str(kw) else rxcuda.Engine(driver=NullDriver(), **kw)


@pytest.fixture(params=list(KINDS))
def pipeline(request):
    kw, devices, composite = KINDS[request.param]
    engine = _engine(kw)
    try:
        p = build(engine, KERNELS, devices=devices, composite=composite)
        p.cpu = "cpu" in str(kw)
        yield p
    finally:
        engine.close()


def _refuse(p, label, call, error) -> None:
    """``call`` raises ``error`` and no change event leaves the engine (nothing waits for the next frame)."""
    events: list = []
    sub = p.engine.changes.subscribe(events.append)
    try:
        with pytest.raises(error):
            call(p)
    finally:
        sub.dispose()
    assert events == [], f"{label}: {events}"


def _runs(p) -> None:
    """A rebuild and a frame that run, every block ok; on the CPU device, the outputs exact against NumPy."""
    e = p.engine
    e.rebuild()
    frame = e.tick(sync=True)
    assert frame.state == "ok" and frame.launched, frame
    assert {b.name: b.state for b in e.blocks} == {b.name: "ok" for b in e.blocks}
    if p.cpu:
        got, want = outputs(p), expected(p)
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-6, err_msg=k)


@pytest.mark.parametrize(("label", "call", "error"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_refused_call_leaves_the_engine_as_it_was(pipeline, label, call, error):
    if getattr(call, "composite_only", False) and pipeline.inst is None:
        pytest.skip("needs a composite instance")
    before = snapshot(pipeline.engine)
    _refuse(pipeline, label, call, error)
    assert snapshot(pipeline.engine) == before
    _runs(pipeline)


@pytest.mark.spares  # graphs built with spare nodes, as on a GPU: the block added after is placed in place
def test_a_series_of_refusals_then_a_change_builds_and_runs(pipeline):
    before = snapshot(pipeline.engine)
    for label, call, error in REFUSALS:
        if getattr(call, "composite_only", False) and pipeline.inst is None:
            continue
        _refuse(pipeline, label, call, error)
    assert snapshot(pipeline.engine) == before
    _runs(pipeline)
    on = {"device": pipeline.devices - 1} if pipeline.devices > 1 else {}
    third = pipeline.engine.add(pipeline.spare, **on)  # the block refused on a device past the list
    pipeline.engine.connect(pipeline.second["out"], third["x"])
    _runs(pipeline)
    assert third.state == "ok" and third.name == "third"
    if pipeline.cpu:
        np.testing.assert_allclose(pipeline.engine.read(third["out"]), expected(pipeline)["second"] * np.float32(7.0),
                                   rtol=1e-6)
    if pipeline.devices > 1:
        assert pipeline.engine.describe().placement[third.id] == 1


@pytest.mark.parametrize("devices", [[0, 0], ["cpu", "cpu"]], ids=["null [0, 0]", "cpu [cpu, cpu]"])
def test_a_block_refused_past_the_devices_computes_as_the_first_block_on_the_second_one(devices):
    """Two devices with every block on the first: the block refused on device 2 is then the first one placed on
    device 1, whose graph the rebuild makes for the first time (on the CPU device: and computes there)."""
    engine = _engine({"devices": devices})
    try:
        p = build(engine, KERNELS, devices=1, composite=False)
        p.cpu = devices[0] == "cpu"
        _refuse(p, "add on a device past the list", lambda p: p.engine.add(p.spare, device=2), ValueError)
        engine.add(p.spare, device=1)
        engine.connect(p.second["out"], p.spare["x"])
        _runs(p)
        assert engine.describe().placement[p.spare.id] == 1 and len(engine.devices.memory) == 2
        if p.cpu:
            np.testing.assert_allclose(engine.read(p.spare["out"]), expected(p)["second"] * np.float32(7.0), rtol=1e-6)
    finally:
        engine.close()
