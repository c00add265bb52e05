"""Tooltips on the null driver: str(port), str(link) and str(engine) say what a user looks for."""

from __future__ import annotations

import numpy as np
import pytest
from _pipeline import mul

import rxcuda as rx
from rxcuda.cuda import NullDriver


@pytest.fixture
def engine():
    e = rx.Engine(driver=NullDriver())
    yield e
    e.close()


def test_port_and_link_texts(engine):
    a, b, c = (engine.add(mul(size=4096, name=n)) for n in "abc")
    engine.write(a["x"], np.ones(4096, np.float32))
    engine.connect(a["out"], b["x"])
    engine.connect(b["out"], c["x"])
    assert str(a["x"]) == "a.x: input f32[4096], 16 KiB (no graph yet)"
    engine.tick()
    assert str(a["x"]) == "a.x: input f32[4096], 16 KiB, pool class 16 KiB, engine-owned, written from the host"
    assert str(b["x"]).endswith("engine-owned, from a.out")
    assert str(c["out"]).startswith("c.out: output f32[4096], 16 KiB, pool class 16 KiB")
    link = engine.connections[0]
    src, dst = link  # a link unpacks as a pair
    assert (src.name, dst.name, link.delay) == ("out", "x", 0)
    assert str(link) == "a.out -> b.x: output f32[4096], 16 KiB, pool class 16 KiB, engine-owned"


def test_a_port_outside_an_engine_and_a_delayed_link(engine):
    lone = mul(size=64, name="lone")
    assert str(lone["x"]) == "lone.x: input f32[64], 256 B (not in an engine)"
    acc = engine.add(mul(size=64, name="acc"))
    engine.connect(acc["out"], acc["x"], delay=1)
    engine.tick()
    link = engine.connections[0]
    assert link.delay == 1 and str(link).startswith("acc.out -(delay 1)-> acc.x:")
    assert "(delayed: last frame's value)" in str(acc["x"])


def test_engine_text_names_pool_classes_and_the_last_rebuild(engine):
    a = engine.add(mul(size=4096, name="a"))
    engine.write(a["x"], np.ones(4096, np.float32))
    engine.tick()
    text = str(engine)
    assert "1 rebuild (the last took" in text and "profile none" in text
    assert "by pool class: 16 KiB x2" in text
    assert "graph buffers: 2 buffers in 2 allocations" in text
