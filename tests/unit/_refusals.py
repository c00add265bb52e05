"""The refused calls of every engine kind, in one list (``REFUSALS``), and what "left as it was" means: the
pipeline as data, the blocks' names, states, values and launches, the composite instances, and the engine's
frame before and after (``snapshot``). ``tests/unit/test_refusals.py`` runs the list on the null driver (one
device, two devices ``devices=[0, 0]``, composites); ``tests/gpu/test_refusals_gpu.py`` on a GPU, where the frame
after the refusals is checked against NumPy too.

A pipeline here (``build``) is x -> first (scale 2) -> second (scale 3, on the second device where there are
two) -> y, a composite instance ``pair`` (gain 5: two scales of 5) fed by second, so that every kind of
refusal has something to aim at: blocks, a connection, a host-fed input, a composite's inner block and its
parameter; and a block ``spare`` that is refused on a device past the list, then added on the last device.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
from reactivex.subject import Subject

import rxcuda
from rxcuda import Block, Composite

N = 1024


def mul(kernels, name: str, size: int = N, **kw) -> Block:
    return Block.from_kernel(f"{kernels}/scalar_mul.ptx", size=size, name=name, **kw)


def pair(kernels) -> Composite:
    c = Composite("pair")
    a = c.add(mul(kernels, "a"))
    b = c.add(mul(kernels, "b"))
    c.connect(a["out"], b["x"])
    c.expose("x", a["x"])
    c.expose("y", b["out"])
    c.expose_parameter("gain", a.params["scale"], b.params["scale"], value=5.0)
    return c


def build(engine, kernels, *, devices: int = 1, composite: bool = True) -> SimpleNamespace:
    """The pipeline the refusals aim at, built and run one frame."""
    first = engine.add(mul(kernels, "first", scale=2.0))
    on = {"device": 1} if devices > 1 else {}
    second = engine.add(mul(kernels, "second", scale=3.0), **on)
    engine.connect(first["out"], second["x"])
    x = np.arange(N, dtype=np.float32) / N
    engine.write(first["x"], x)
    inst = None
    if composite:
        inst = engine.add(pair(kernels), **on)
        engine.connect(second["out"], inst["x"])
    engine.tick()
    spare = mul(kernels, "third", scale=7.0)  # refused on a device past the list, then added where it fits
    return SimpleNamespace(engine=engine, kernels=kernels, first=first, second=second, inst=inst, x=x,
                           devices=devices, spare=spare)


def expected(p: SimpleNamespace) -> dict[str, np.ndarray]:
    """What the pipeline computes, in NumPy (the GPU tests compare with it)."""
    out = {"second": p.x * np.float32(2.0) * np.float32(3.0)}
    if p.inst is not None:
        out["pair"] = out["second"] * np.float32(5.0) * np.float32(5.0)
    return out


def outputs(p: SimpleNamespace) -> dict[str, np.ndarray]:
    e = p.engine
    got = {"second": e.read(p.second["out"])}
    if p.inst is not None:
        got["pair"] = e.read(p.inst["y"])
    return got


def snapshot(engine) -> tuple:
    """Everything a refused call must leave as it was."""
    blocks = tuple((b.id, b.name, b.state, tuple(sorted((k, p.value) for k, p in b.params.items())),
                    tuple(sorted(b.launches().items())), b._engine is engine) for b in engine.blocks)
    comps = tuple((c.name, tuple(b.id for b in c.blocks), tuple(sorted((k, p.value) for k, p in c.params.items())))
                  for c in engine.composites)
    return engine.describe(), blocks, comps, tuple(str(link) for link in engine.connections)


def _other_engine_block(p):
    other = rxcuda.Engine(driver=p.engine._rt.device.api) if _null(p) else rxcuda.Engine()
    stray = other.add(mul(p.kernels, "elsewhere"))
    return other, stray


def _null(p) -> bool:
    from rxcuda.cuda import NullDriver

    return isinstance(p.engine._rt.device.api, NullDriver)


def _replace_in_other_engine(p):
    other, stray = _other_engine_block(p)
    try:
        p.engine.replace(p.first, stray)
    finally:
        other.close()


def _add_in_other_engine(p):
    other, stray = _other_engine_block(p)
    try:
        p.engine.add(stray)
    finally:
        other.close()


def _inner(p):
    return p.inst.members["a"] if p.inst is not None else p.second


def _composite_only(fn: Callable) -> Callable:
    fn.composite_only = True  # type: ignore[attr-defined]
    return fn


# (what is refused, the call, the error it raises)
REFUSALS: list[tuple[str, Callable, type | tuple[type, ...]]] = [
    # adding
    ("add a non-block", lambda p: p.engine.add("scalar_mul"), TypeError),
    ("add a block already in the engine", lambda p: p.engine.add(p.first), ValueError),
    ("add a block of another engine", _add_in_other_engine, ValueError),
    ("add on a device past the list", lambda p: p.engine.add(p.spare, device=p.devices), ValueError),
    ("add on a negative device", lambda p: p.engine.add(p.spare, device=-1), ValueError),
    ("add on a device that is no int", lambda p: p.engine.add(p.spare, device="1"), ValueError),
    # connecting
    ("connect into a connected input", lambda p: p.engine.connect(p.first["out"], p.second["x"]),
     rxcuda.ValidationError),
    ("connect from an input", lambda p: p.engine.connect(p.first["x"], p.second["x"]), rxcuda.ValidationError),
    ("connect into an output", lambda p: p.engine.connect(p.first["out"], p.second["out"]),
     rxcuda.ValidationError),
    ("connect a cycle", lambda p: p.engine.connect(p.second["out"], p.first["x"]), rxcuda.ValidationError),
    ("connect with delay 2", lambda p: p.engine.connect(p.second["out"], p.first["x"], delay=2),
     rxcuda.ValidationError),
    ("connect an initial value without a delay", lambda p: p.engine.connect(
        p.second["out"], p.first["x"], initial=1.0), rxcuda.ValidationError),
    ("connect a port of a block outside the engine", lambda p: p.engine.connect(
        p.first["out"], mul(p.kernels, "outside")["x"]), (ValueError, rxcuda.ValidationError)),
    ("connect a misspelled port", lambda p: p.engine.connect(p.first["ot"], p.second["x"]), KeyError),
    ("connect a block given whole", lambda p: p.engine.connect(p.first, p.second["x"]), TypeError),
    ("disconnect what is not connected", lambda p: p.engine.disconnect(p.second["out"], p.first["x"]),
     rxcuda.ValidationError),
    # data
    ("write the wrong dtype", lambda p: p.engine.write(p.first["x"], np.zeros(N, np.int64)),
     (TypeError, ValueError)),
    ("write too many elements", lambda p: p.engine.write(p.first["x"], np.zeros(N + 1, np.float32)),
     (TypeError, ValueError)),
    ("resize a connected input", lambda p: p.engine.resize(p.second["x"], (2 * N,)), rxcuda.ValidationError),
    ("resize to a bad shape", lambda p: p.engine.resize(p.first["x"], (0,)), (TypeError, ValueError)),
    ("feed a connected input", lambda p: p.engine.feed(p.second["x"], Subject()), rxcuda.ValidationError),
    ("feed an output", lambda p: p.engine.feed(p.first["out"], Subject()), rxcuda.ValidationError),
    ("observe as an unknown kind", lambda p: p.engine.observe(p.second["out"], kind="torch"), ValueError),
    ("observe every 0th frame", lambda p: p.engine.observe(p.second["out"], every=0), ValueError),
    ("unbind what is not bound", lambda p: p.engine.unbind(p.first["x"]), rxcuda.ValidationError),
    # parameters and launches
    ("set an unknown parameter", lambda p: p.first.set(scale=1.0, nope=2), KeyError),
    ("set a value of the wrong type", lambda p: p.first.set(scale=1.0, n="many"), (TypeError, ValueError)),
    ("set a count past the buffers", lambda p: p.first.set(scale=1.0, n=N + 1), (TypeError, ValueError)),
    ("launch blocks of 0 threads", lambda p: p.first.set_launch(block=0), (TypeError, ValueError)),
    ("launch with threads and a grid", lambda p: p.first.set_launch(threads=N, grid=4), ValueError),
    # removing and replacing
    ("remove a block outside the engine", lambda p: p.engine.remove(mul(p.kernels, "outside")), ValueError),
    ("replace a block outside the engine", lambda p: p.engine.replace(mul(p.kernels, "outside"),
                                                                      mul(p.kernels, "new")), ValueError),
    ("replace with a block in the engine", lambda p: p.engine.replace(p.first, p.second),
     rxcuda.ValidationError),
    ("replace with a block of another engine", _replace_in_other_engine, rxcuda.ValidationError),
    ("replace with a block lacking a used port", lambda p: p.engine.replace(
        p.second, Block.from_kernel(f"{p.kernels}/vector_add.ptx", size=N, name="adder")), rxcuda.ValidationError),
    ("replace with a block of another size", lambda p: p.engine.replace(
        p.second, mul(p.kernels, "tiny", size=16, counts={"x": 16})), rxcuda.ValidationError),
    ("replace with a composite", lambda p: p.engine.replace(p.first, pair(p.kernels)), TypeError),
    # composites
    ("remove a block inside an instance", _composite_only(lambda p: p.engine.remove(_inner(p))),
     rxcuda.ValidationError),
    ("set a composite parameter to a string",
     _composite_only(lambda p: setattr(p.inst.params["gain"], "value", "loud")), (TypeError, ValueError)),
    ("connect into an instance's connected input", _composite_only(lambda p: p.engine.connect(
        p.first["out"], p.inst["x"])), rxcuda.ValidationError),
    ("connect an instance's output back into it", _composite_only(lambda p: p.engine.connect(
        p.inst["y"], p.first["x"])), rxcuda.ValidationError),
    ("replace an inner block with one of another size", _composite_only(lambda p: p.engine.replace(
        _inner(p), mul(p.kernels, "tiny", size=16, counts={"x": 16}))), rxcuda.ValidationError),
    ("replace an inner block with one lacking a port", _composite_only(lambda p: p.engine.replace(
        _inner(p), Block.from_kernel(f"{p.kernels}/vector_add.ptx", size=N, name="adder"))), rxcuda.ValidationError),
]

