"""Every refused call on a distributed engine leaves it as it was (on a local Ray cluster, workers on the CPU
device, frames through clocks over an ``ipc`` link): the pipeline as data with its placement and transports, the
values and writes waiting for the next frame; then the workers build and run a whole frame, its numbers exact
against NumPy. The local engines' list is tests/unit/_refusals.py (test_refusals.py)."""

from __future__ import annotations

import numpy as np
import pytest
from _ray import cluster, ray  # noqa: E402, F401  (the local cluster; skips this module without Ray)
from reactivex.subject import Subject

import rxcuda
from rxcuda.distributed import Engine, Worker  # noqa: E402

PTX = "scalar_mul"
N = 512


def _stray(name: str = "stray") -> rxcuda.Block:
    return rxcuda.Block.from_kernel(PTX, size=N, name=name)


def _in_another_engine(p):
    other = rxcuda.Engine(driver=rxcuda.cuda.NullDriver())
    try:
        p.dist.add(other.add(_stray("elsewhere")), on="a")
    finally:
        other.close()


REFUSALS = [
    ("add without a worker", lambda p: p.dist.add(_stray()), ValueError),
    ("add on an unknown worker", lambda p: p.dist.add(_stray(), on="c"), rxcuda.ValidationError),
    ("add a composite", lambda p: p.dist.add(rxcuda.Composite("pair"), on="a"), TypeError),
    ("add a non-block", lambda p: p.dist.add("scalar_mul", on="a"), TypeError),
    ("add a block already in it", lambda p: p.dist.add(p.first, on="b"), ValueError),
    ("add a block of a local engine", _in_another_engine, ValueError),
    ("connect with a delay across workers", lambda p: p.dist.connect(p.first["out"], p.third["x"], delay=1),
     rxcuda.ValidationError),
    ("connect with an unknown transport", lambda p: p.dist.connect(p.first["out"], p.third["x"], transport="tcp"),
     rxcuda.ValidationError),
    ("connect on one worker with an unknown transport", lambda p: p.dist.connect(
        p.second["out"], p.third["x"], transport="tcp"), rxcuda.ValidationError),
    ("connect into a connected input", lambda p: p.dist.connect(p.first["out"], p.second["x"]),
     rxcuda.ValidationError),
    ("connect a cycle across workers", lambda p: p.dist.connect(p.second["out"], p.first["x"]),
     rxcuda.ValidationError),
    ("connect from an input", lambda p: p.dist.connect(p.first["x"], p.third["x"]), rxcuda.ValidationError),
    ("connect a misspelled port", lambda p: p.dist.connect(p.first["ot"], p.third["x"]), KeyError),
    ("connect a block outside it", lambda p: p.dist.connect(_stray()["out"], p.third["x"]), rxcuda.ValidationError),
    ("disconnect what is not connected", lambda p: p.dist.disconnect(p.second["out"], p.third["x"]),
     rxcuda.ValidationError),
    ("remove a block outside it", lambda p: p.dist.remove(_stray()), ValueError),
    ("write the wrong dtype", lambda p: p.dist.write(p.first["x"], np.zeros(N, np.int64)), (TypeError, ValueError)),
    ("write too many elements", lambda p: p.dist.write(p.first["x"], np.zeros(N + 1, np.float32)),
     (TypeError, ValueError)),
    ("write a block outside it", lambda p: p.dist.write(_stray()["x"], np.zeros(N, np.float32)),
     rxcuda.ValidationError),
    ("set an unknown parameter", lambda p: p.dist.set(p.second, scale=2.0, nope=1), KeyError),
    ("set a value of the wrong type", lambda p: p.dist.set(p.second, scale="loud"), (TypeError, ValueError)),
    ("set a count past the buffers", lambda p: p.dist.set(p.second, n=N + 1), (TypeError, ValueError)),
    ("set a block outside it", lambda p: p.dist.set(_stray(), scale=2.0), rxcuda.ValidationError),
    ("bind a port", lambda p: p.dist.bind(p.first["x"], Subject()), TypeError),
    ("bind a parameter of a block outside it", lambda p: p.dist.bind(_stray().params["scale"], Subject()),
     rxcuda.ValidationError),
    ("observe every 0th frame", lambda p: p.dist.observe(p.second["out"], every=0), ValueError),
    ("read a block outside it", lambda p: p.dist.read(_stray()["out"]), rxcuda.ValidationError),
]


class _Pipeline:
    """first (a, scale 2) -> second (b, scale 3) over ``ipc``, third (b) fed from the host; ``spec`` the workers'
    (tests/gpu/test_distributed_refusals_gpu.py runs them on a GPU)."""

    def __init__(self, spec: Worker | None = None, share_gpu: str = "off"):
        spec = spec or Worker(cpu=True)
        self.dist = Engine({"a": spec, "b": spec}, share_gpu=share_gpu)
        self.first = self.dist.add(rxcuda.Block.from_kernel(PTX, size=N, name="first", scale=2.0), on="a")
        self.second = self.dist.add(rxcuda.Block.from_kernel(PTX, size=N, name="second", scale=3.0), on="b")
        self.third = self.dist.add(rxcuda.Block.from_kernel(PTX, size=N, name="third"), on="b")
        self.dist.connect(self.first["out"], self.second["x"], transport="ipc")
        self.x = np.random.default_rng().standard_normal(N).astype(np.float32)
        self.dist.write(self.first["x"], self.x)
        self.dist.write(self.third["x"], np.ones(N, np.float32))
        self.dist.tick()

    def computes(self, third_scale: float = 1.0) -> None:
        """second.out and third.out exact against NumPy after the frames in flight."""
        for _ in range(2):
            assert self.dist.tick().complete
        np.testing.assert_array_equal(self.dist.read(self.second["out"]),
                                      (self.x * np.float32(2.0)) * np.float32(3.0))
        np.testing.assert_array_equal(self.dist.read(self.third["out"]), np.full(N, third_scale, np.float32))


@pytest.fixture(scope="module")
def pipeline():
    p = _Pipeline()
    yield p
    p.dist.close()


def _snapshot(dist) -> tuple:
    return (dist.describe(), {w: dict(v) for w, v in dist._pending_params.items()},
            {w: sorted(v) for w, v in dist._pending_writes.items()}, sorted(dist._writes), dict(dist._transports),
            {w: dict(v) for w, v in dist._observed.items()})


@pytest.mark.parametrize(("label", "call", "error"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_refused_call_leaves_the_distributed_engine_as_it_was(pipeline, label, call, error):
    before = _snapshot(pipeline.dist)
    with pytest.raises(error):
        call(pipeline)
    assert _snapshot(pipeline.dist) == before
    pipeline.dist.rebuild()
    frame = pipeline.dist.tick()
    assert frame.complete and all(f.state == "ok" for f in frame.fragments.values()), frame
    pipeline.computes()


def test_after_every_refusal_a_change_is_shipped_built_and_run(pipeline):
    for _label, call, error in REFUSALS:
        with pytest.raises(error):
            call(pipeline)
    _a_change_is_shipped_built_and_run(pipeline)


def test_in_turns_every_refusal_leaves_the_engine_as_it_was_and_a_change_is_shipped_built_and_run():
    """The same with a and b (one CPU device) stepped in turns (``share_gpu="turns"``)."""
    p = _Pipeline(share_gpu="turns")
    try:
        assert p.dist.where("b")["share_gpu"] == "turns" and p.dist.where("b")["turns"] == ("a", "b")
        for label, call, error in REFUSALS:
            before = _snapshot(p.dist)
            with pytest.raises(error):
                call(p)
            assert _snapshot(p.dist) == before, label
        p.computes()
        _a_change_is_shipped_built_and_run(p)
        assert p.dist.where("b")["turns"] == ("a", "b")
    finally:
        p.dist.close()


def _a_change_is_shipped_built_and_run(pipeline) -> None:
    dist = pipeline.dist
    fourth = dist.add(rxcuda.Block.from_kernel(PTX, size=N, name="fourth"), on="b")
    dist.connect(pipeline.first["out"], fourth["x"], transport="ipc")  # a second link from a to b
    pipeline.third.params["scale"].value = 5.0
    frame = dist.tick()
    assert frame.complete and all(f.state == "ok" for f in frame.fragments.values()), frame
    assert dist.describe().transports()["first.out -> fourth.x"] == "ipc"
    assert ray.get(dist.actor("b").describe.remote()).blocks[1].values["scale"] == 5.0
    pipeline.computes(third_scale=5.0)
    np.testing.assert_array_equal(dist.read(fourth["out"]), pipeline.x * np.float32(2.0))
