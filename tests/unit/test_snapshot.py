"""The engine's snapshot (Runtime._entries) reuses the last snapshot's entries of unchanged blocks, and never an
entry whose block changed a value or a launch, inside the engine or outside it."""

from __future__ import annotations

import pytest

from rxcuda import Block
from rxcuda.model._events import BlockAdded, LaunchChanged, ParameterChanged
from rxcuda.streams._coalesce import PendingPlan


def chain(engine, n=4):
    blocks = [engine.add(Block.from_kernel("scalar_mul", size=16, name=f"m{i}")) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        engine.connect(a["out"], b["x"])
    return blocks


def entries(engine):
    return {e.id: e for e in engine._rt.snapshot().blocks}


def test_an_unchanged_block_keeps_its_entry_object(engine):
    blocks = chain(engine)
    first = entries(engine)
    extra = engine.add(Block.from_kernel("scalar_mul", size=16, name="extra"))  # a structural edit only
    engine.connect(blocks[-1]["out"], extra["x"])
    second = entries(engine)
    assert all(second[b.id] is first[b.id] for b in blocks)
    assert second[extra.id].values == extra.values()


def test_a_value_set_in_the_engine_is_in_the_next_snapshot(engine):
    blocks = chain(engine)
    first = entries(engine)
    blocks[2].params["scale"].value = 3.5
    second = entries(engine)
    assert second[blocks[2].id].value("scale") == 3.5 and second[blocks[2].id] is not first[blocks[2].id]
    assert all(second[b.id] is first[b.id] for b in blocks if b is not blocks[2])


def test_a_launch_set_in_the_engine_is_in_the_next_snapshot(engine):
    blocks = chain(engine)
    entries(engine)
    launch = blocks[1].set_launch(threads=8)
    assert entries(engine)[blocks[1].id].launch("scalar_mul") == launch


def test_a_value_set_while_the_block_was_out_of_the_engine_is_in_the_next_snapshot(engine):
    """Removed, changed outside (nothing folds), added again, with no snapshot between: its entry is made
    again, not the one of before."""
    blocks = chain(engine)
    before = entries(engine)
    last = blocks[-1]
    engine.remove(last)
    last.params["scale"].value = -2.0
    launch = last.set_launch(block=(64, 1, 1))
    engine.add(last)
    engine.connect(blocks[-2]["out"], last["x"])
    after = entries(engine)
    assert after[last.id] is not before[last.id]
    assert after[last.id].value("scale") == -2.0 and after[last.id].launch("scalar_mul") == launch
    assert launch.block == (64, 1, 1)


def test_a_replaced_block_has_the_new_blocks_values(engine):
    blocks = chain(engine, 2)
    entries(engine)
    new = Block.from_kernel("scalar_mul", size=16, name="m1")
    new.params["scale"].value = 9.0
    engine.replace(blocks[1], new)
    assert entries(engine)[new.id].value("scale") == 9.0


@pytest.mark.parametrize("pending", [PendingPlan, None], ids=["python", "engine's"])
def test_value_folds_counts_values_and_launches_alone_and_is_never_reset(engine, pending):
    p = PendingPlan() if pending is PendingPlan else engine._rt.pending
    start = p.value_folds
    p.set_value((1, "scale"), 2.0)
    p.add(ParameterChanged(1, "scale", 3.0))
    p.add(LaunchChanged(1, "k", None))
    p.add(BlockAdded(2, "b"))  # a structural change: not a value
    assert p.value_folds == start + 3
    p.drain()
    assert p.value_folds == start + 3 and not p.count
