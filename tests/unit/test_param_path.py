"""One parameter change from the setter to the exec-node update (the engine's hot path, rxcuda/engine/_update.py's
hot table) on the null driver: which graph it reaches, what its subscribers see, and when it leaves the hot path."""

from __future__ import annotations

import numpy as np
import pytest

from rxcuda import Block
from rxcuda.model._events import ParameterChanged
from rxcuda.streams._coalesce import PendingPlan

N = 1024
MUL = "kernels/scalar_mul.ptx"


def fed_mul(engine, name="scalar_mul"):
    mul = engine.add(Block.from_kernel(MUL, size=N, scale=1.0, name=name))
    engine.write(mul["x"], np.ones(N, np.float32))
    engine.tick()
    return mul


def updates_of(api, mark):
    """(exec handle, node handle) of every exec-node update since ``mark``."""
    return [args for name, args in api.calls[mark:] if name == "cuGraphExecKernelNodeSetParams"]


def test_one_value_is_one_exec_node_update_of_the_running_graph(engine, api):
    mul = fed_mul(engine)
    g = engine._rt.graph
    node = g.nodes[engine._rt.graph.plan.kernel_nodes[mul.id, "scalar_mul"]]
    mark = len(api.calls)
    mul.params["scale"].value = 0.25
    assert engine.tick().tiers == ("parameters",)
    assert updates_of(api, mark) == [(g._exec_h, node.handle_int)]
    view, idx = node.slots[2]  # scalar_mul(x, out, scale, n): the value sits in the node's argument storage
    assert view[idx] == np.float32(0.25)


def test_after_a_rebuild_the_hot_path_reaches_the_new_graph(engine, api):
    mul = fed_mul(engine)
    mul.set(scale=0.5)
    engine.tick()  # the hot table of the first graph holds an entry for scale now
    old = engine._rt.graph
    other = fed_mul(engine, name="other")  # a structure change: a new graph
    new = engine._rt.graph
    assert new is not old and engine._updater._hot_graph is not new  # re-armed on the next value
    mark = len(api.calls)
    mul.set(scale=0.75)
    engine.tick()
    node = new.nodes[new.plan.kernel_nodes[mul.id, "scalar_mul"]]
    assert updates_of(api, mark) == [(new._exec_h, node.handle_int)]
    assert engine._updater._hot_graph is new and other.params["scale"].value == 1.0


def test_an_applied_update_of_one_value_names_its_block_and_counts_its_changes(engine):
    mul = fed_mul(engine)
    seen: list = []
    sub = engine.updates.subscribe(seen.append)
    mul.params["scale"].value = 2.0
    mul.params["scale"].value = 3.0  # coalesced: one value applied, two changes counted
    frame = engine.tick()
    (u,) = seen
    assert (u.frame, u.tiers, u.blocks, u.events) == (frame.index, ("parameters",), ("scalar_mul",), 2)
    assert u.seconds >= 0
    sub.dispose()


def test_every_change_reaches_the_changes_subscribers_in_order(engine):
    mul = fed_mul(engine)
    seen: list = []
    sub = engine.changes.subscribe(seen.append)
    for v in (0.5, 0.25, 0.125):
        mul.params["scale"].value = v
    engine.tick()
    assert seen == [ParameterChanged(mul.id, "scale", v) for v in (0.5, 0.25, 0.125)]
    sub.dispose()


def test_a_count_value_within_the_running_buffers_takes_the_hot_path(engine, api):
    mul = fed_mul(engine)
    mark = len(api.calls)
    mul.params["n"].value = N // 2
    assert engine.tick().tiers == ("parameters",)
    assert len(updates_of(api, mark)) == 1
    apply, names = engine._updater._hot[mul.id, "n"]  # its limit is [0, N], the running plan's buffer
    assert names == ("scalar_mul",)
    mark = len(api.calls)
    assert apply(N + 1) is False and apply(-1) is False and updates_of(api, mark) == []  # left to the general path
    assert apply(N) is True and len(updates_of(api, mark)) == 1  # one kernel node reads it: one update
    apply, _ = engine._updater._hot[mul.id, "scale"]  # not a count: no limit
    assert apply(1e30) is True and len(updates_of(api, mark)) == 2


def test_a_count_value_past_the_running_buffers_leaves_the_hot_path_and_is_refused(engine, api):
    mul = fed_mul(engine)
    seen: list = []
    engine.diagnostics.subscribe(seen.append)
    mark = len(api.calls)
    engine._rt.pending.set_value((mul.id, "n"), N + 1)  # what a set racing a shrinking resize leaves pending
    assert engine.tick().tiers == ()
    assert updates_of(api, mark) == []
    (d,) = seen
    assert d.severity == "error" and "the value was not applied" in d.message and f"{N} elements" in d.message


def test_nothing_pending_applies_nothing(engine, api):
    fed_mul(engine)
    mark = len(api.calls)
    assert engine._updater.apply_pending() == ()
    assert api.since(mark) == []


def test_the_setter_after_replace_reaches_the_block_in_the_engine(engine, api):
    old = fed_mul(engine)
    new = Block.from_kernel(MUL, size=N, scale=1.0)
    engine.replace(old, new)
    engine.tick()
    mark = len(api.calls)
    new.params["scale"].value = 4.0
    assert engine.tick().tiers == ("parameters",)
    assert len(updates_of(api, mark)) == 1
    with pytest.raises(TypeError, match=r"scalar_mul.scale \(f32\) takes a number"):
        new.params["scale"].value = "4"


def test_set_value_folds_like_set_parameter_and_publishes_one_event():
    pending = PendingPlan()
    seen: list = []
    pending.changes.subscribe(seen.append)
    pending.set_value((7, "gain"), 0.5)
    pending.set_parameter(7, "gain", 0.75)
    assert pending.count == 2 and pending.take_parameters() == {(7, "gain"): 0.75}
    assert seen == [ParameterChanged(7, "gain", 0.5), ParameterChanged(7, "gain", 0.75)]
    assert pending.count == 0 and not pending.dirty


@pytest.mark.parametrize(("dtype", "size", "value"), [
    ("f16", 2, 0.333), ("f64", 8, 1e-300), ("i64", 8, -(2**40)), ("u8", 1, 255), ("i16", 2, -7), ("f32", 4, 3)])
def test_a_value_lands_in_the_argument_storage_as_numpy_would_store_it(engine, dtype, size, value):
    from _pipeline import builder, kcode, ptr, scalar

    b = builder("typed")
    k = b.add_kernel(kcode("typed", ptr("x", "inout"), scalar("v", dtype, default=0, size=size)))
    b.input("x", k["x"])
    b.scalar("v", k["v"])
    block = engine.add(b.build())
    engine.write(block["x"], np.ones(64, np.float32))
    engine.tick()
    block.params["v"].value = value
    assert engine.tick().tiers == ("parameters",)
    g = engine._rt.graph
    node = g.nodes[g.plan.kernel_nodes[block.id, "typed"]]
    view, idx = node.slots[1]
    want = np.zeros(1, view.dtype)
    want[0] = block.params["v"].value  # what a NumPy write of the checked value stores
    assert view[idx] == want[0]


def test_a_float_value_that_skipped_the_setter_check_still_reaches_an_f32_slot(engine):
    mul = fed_mul(engine)
    engine._rt.pending.set_value((mul.id, "scale"), np.float32(0.5))  # a raw producer, no check
    assert engine.tick().tiers == ("parameters",)
    g = engine._rt.graph
    view, idx = g.nodes[g.plan.kernel_nodes[mul.id, "scalar_mul"]].slots[2]
    assert view[idx] == np.float32(0.5)


_EDGES = [0, 1, -1, 7, 255, 256, -129, 2**31 - 1, 2**31, -(2**31) - 1, 2**63, 0.0, 0.5, -2.5, 65504.0, 65505.0,
          3.4028235e38, 3.5e38, 1e308, float("inf"), float("-inf"), float("nan"), True, False, np.float32(1.5),
          np.int64(3), np.bool_(True), "1", None]


@pytest.mark.parametrize("dtype, lo, hi", [("f16", None, None), ("f32", None, None), ("f64", None, None),
                                           ("f32", -1.0, 2), ("i32", None, None), ("u8", None, None),
                                           ("i64", 0, 100), ("u32", None, 7), ("bf16", None, None)])
def test_the_setters_fast_test_passes_only_what_the_full_check_returns_unchanged(dtype, lo, hi):
    from rxcuda.blocks._params import Parameter

    class Owner:  # what a parameter's errors name
        name = "blk"
        _sink = None

    p = Parameter(Owner(), "p", dtype, 0, min=lo, max=hi)
    for v in _EDGES:
        try:
            want = ("ok", p._check(v))
        except (TypeError, ValueError) as e:
            want = (type(e), str(e))
        fast = type(v) is p._plain and p._lo <= v <= p._hi
        if fast:  # the setter stores it without the full check: that must be what the check returns
            assert want[0] == "ok" and type(want[1]) is type(v) and want[1] == v, (dtype, v)
        try:
            p.value = v
            got = ("ok", p.value)
        except (TypeError, ValueError) as e:
            got = (type(e), str(e))
        assert got == want or (want[0] == "ok" and got[0] == "ok" and np.isnan(got[1]) and np.isnan(want[1])), (
            dtype, v, got, want)
    assert p._plain is (float if dtype[0] in "fb" else int)


def test_a_count_parameter_always_takes_the_full_check(engine):
    mul = fed_mul(engine)
    assert mul.params["n"]._plain is None  # its bound moves with resizes: never the fast test
    with pytest.raises(ValueError, match="more than port"):
        mul.params["n"].value = N + 1
    assert mul.params["scale"]._plain is float


def test_a_failing_updates_subscriber_on_the_hot_path_is_reported_and_the_others_still_hear(engine):
    mul = fed_mul(engine)
    seen: list = []
    warnings: list = []

    def boom(_u):
        raise RuntimeError("subscriber bug")

    subs = [engine.updates.subscribe(boom), engine.updates.subscribe(seen.append),
            engine.diagnostics.subscribe(warnings.append)]
    mul.params["scale"].value = 2.0
    assert engine.tick().tiers == ("parameters",)
    assert [u.blocks for u in seen] == [("scalar_mul",)]
    assert any("subscriber bug" in d.message and d.subject == "engine.updates" for d in warnings)
    for s in subs:
        s.dispose()
