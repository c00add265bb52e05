"""PendingPlan: the coalescing rules of rxcuda/streams/_coalesce.py, one test per rule, plus concurrency."""

from __future__ import annotations

import threading

import pytest

from rxcuda.model._describe import KernelCode, KernelSignature, Launch, PortRef
from rxcuda.streams import (
    BlockAdded,
    BlockChanged,
    BlockRemoved,
    CodeChanged,
    Connected,
    Disconnected,
    FileChanged,
    LaunchChanged,
    ParameterChanged,
    PendingPlan,
    PortRebound,
    Tier,
    UpdatePlan,
)


def code(entry: str = "forces", image: bytes = b"// ptx") -> KernelCode:
    return KernelCode(entry=entry, image=image, format="ptx", signature=KernelSignature(entry))


def test_latest_value_wins_per_parameter():
    pending = PendingPlan()
    for v in (1.0, 2.0, 3.0):
        pending.add(ParameterChanged(1, "gravity", v))
    pending.set_parameter(1, "wind", 0.5)
    pending.set_parameter(1, "wind", 0.7)
    plan = pending.drain()
    assert plan.params == {(1, "gravity"): 3.0, (1, "wind"): 0.7}
    assert plan.events == 5


def test_equal_priorities_keep_first_arrival_order():
    pending = PendingPlan()
    pending.set_parameter(2, "b", 1)
    pending.set_parameter(1, "a", 1)
    pending.set_parameter(3, "c", 1)
    pending.set_parameter(2, "b", 2)  # a newer value keeps the key's place
    assert list(pending.drain().params) == [(2, "b"), (1, "a"), (3, "c")]


def test_structure_events_keep_arrival_order_and_repeat():
    pending = PendingPlan()
    src, dst = PortRef(1, "out"), PortRef(2, "in")
    events = [BlockAdded(1, "emit"), BlockAdded(2, "forces"), Connected(src, dst), Disconnected(src, dst),
              Connected(src, dst), BlockChanged(2, "forces", "signature")]
    pending.add_all(events)
    plan = pending.drain()
    assert plan.structure == tuple(events)
    assert plan.tiers == (Tier.STRUCTURE,)


def test_each_event_type_folds_into_its_table():
    pending = PendingPlan()
    arr = object()
    launch = Launch(grid=(4,))
    kcode = code()
    pending.add_all([
        PortRebound(1, "x", arr),
        LaunchChanged(1, "forces", launch),
        CodeChanged(1, "forces", kcode),
    ])
    plan = pending.drain()
    assert plan.rebinds == {(1, "x"): arr}
    assert plan.launches == {(1, "forces"): launch}
    assert plan.code == {(1, "forces"): kcode}
    assert plan.events == 3


def test_block_removed_drops_lower_tiers_of_that_block_only():
    pending = PendingPlan()
    pending.add_all([
        ParameterChanged(1, "gravity", 9.8),
        ParameterChanged(2, "gain", 0.5),
        CodeChanged(1, "forces", code()),
        LaunchChanged(1, "forces", Launch(grid=2)),
        PortRebound(1, "x", object()),
        BlockRemoved(1, "forces"),
    ])
    plan = pending.drain()
    assert plan.params == {(2, "gain"): 0.5}
    assert not (plan.code or plan.launches or plan.rebinds)
    assert plan.structure == (BlockRemoved(1, "forces"),)
    assert plan.tiers == (Tier.STRUCTURE, Tier.PARAMETERS)


def test_values_set_after_block_removed_are_kept():
    # Removal drops what came before it; a value that arrives later belongs to whatever the id is next.
    pending = PendingPlan()
    pending.add(BlockRemoved(1, "forces"))
    pending.set_parameter(1, "gravity", 1.0)
    assert pending.drain().params == {(1, "gravity"): 1.0}


def test_code_change_keeps_parameters_of_that_kernel():
    pending = PendingPlan()
    pending.set_parameter(1, "gravity", 9.8)
    pending.add(CodeChanged(1, "forces", code()))
    plan = pending.drain()
    assert plan.params == {(1, "gravity"): 9.8}
    assert plan.tiers == (Tier.CODE, Tier.PARAMETERS)


def test_drain_empties_and_returns_none_when_nothing_is_pending():
    pending = PendingPlan()
    assert not pending.dirty
    assert pending.drain() is None
    pending.set_parameter(1, "a", 1)
    assert pending.dirty
    plan = pending.drain()
    assert plan and plan.params == {(1, "a"): 1}
    assert not pending.dirty
    assert pending.drain() is None
    # the drained plan is not aliased by the next round
    pending.set_parameter(1, "a", 2)
    assert plan.params == {(1, "a"): 1}


def test_update_plan_tiers_are_highest_first():
    plan = UpdatePlan(
        structure=(BlockAdded(1, "a"),),
        code={(1, "k"): code()},
        params={(1, "g"): 1},
        events=3,
    )
    assert plan.tiers == (Tier.STRUCTURE, Tier.CODE, Tier.PARAMETERS)
    assert UpdatePlan(launches={(1, "k"): Launch(grid=1)}, events=1).tiers == (Tier.PARAMETERS,)
    assert UpdatePlan(rebinds={(1, "x"): object()}, events=1).tiers == (Tier.PARAMETERS,)
    empty = UpdatePlan()
    assert empty.tiers == () and not empty


def test_tier_order_matches_the_design():
    assert [t.rank for t in (Tier.STRUCTURE, Tier.CODE, Tier.RECAPTURE, Tier.PARAMETERS)] == [3, 2, 1, 0]
    assert sorted(Tier, key=lambda t: -t.rank) == [Tier.STRUCTURE, Tier.CODE, Tier.RECAPTURE, Tier.PARAMETERS]
    assert ParameterChanged(1, "g", 1).tier is Tier.PARAMETERS
    assert CodeChanged(1, "k", code()).tier is Tier.CODE
    assert BlockRemoved(1, "b").tier is Tier.STRUCTURE


def test_plan_blocks_include_both_ends_of_a_connection():
    pending = PendingPlan()
    pending.add(Connected(PortRef(4, "out"), PortRef(5, "in")))
    pending.set_parameter(7, "g", 1)
    pending.add(LaunchChanged(8, "fft", Launch(grid=1)))
    assert pending.drain().blocks() == frozenset({4, 5, 7, 8})


@pytest.mark.parametrize("bad", [42, "gravity", FileChanged("/k/forces.cu", "abc"), None])
def test_non_event_raises_type_error_and_changes_nothing(bad):
    pending = PendingPlan()
    with pytest.raises(TypeError, match="not a change event"):
        pending.add(bad)
    assert not pending.dirty
    assert pending.drain() is None


def test_eight_producer_threads_last_value_per_parameter_wins():
    threads_n, per_thread, params_per_thread = 8, 100_000, 64
    pending = PendingPlan()
    applied: dict = {}
    applied_events = 0
    start = threading.Barrier(threads_n + 1)
    done = threading.Event()

    def produce(block: int) -> None:
        names = [f"p{i}" for i in range(params_per_thread)]
        set_parameter = pending.set_parameter
        start.wait()
        for i in range(per_thread):
            set_parameter(block, names[i % params_per_thread], i)

    def consume() -> None:  # the engine thread: drain once per "frame" while producers run
        nonlocal applied_events
        start.wait()
        while not done.is_set():
            plan = pending.drain()
            if plan:
                applied.update(plan.params)
                applied_events += plan.events

    producers = [threading.Thread(target=produce, args=(b,)) for b in range(threads_n)]
    consumer = threading.Thread(target=consume)
    for t in (*producers, consumer):
        t.start()
    for t in producers:
        t.join()
    done.set()
    consumer.join()
    final = pending.drain()
    if final:
        applied.update(final.params)
        applied_events += final.events

    last = {i % params_per_thread: i for i in range(per_thread)}  # the last i written to each name
    expected = {(b, f"p{p}"): v for b in range(threads_n) for p, v in last.items()}
    assert applied == expected
    assert applied_events == threads_n * per_thread


def test_changes_are_published_only_to_subscribers_and_in_order():
    pending = PendingPlan()
    seen: list = []
    pending.set_parameter(1, "a", 0.5)  # nobody listens: no event is made
    sub = pending.changes.subscribe(seen.append)
    pending.set_parameter(1, "a", 1.5)
    pending.add(BlockAdded(2, "b"))
    sub.dispose()
    pending.set_parameter(1, "a", 2.5)
    assert seen == [ParameterChanged(1, "a", 1.5), BlockAdded(2, "b")]
    assert pending.drain().params == {(1, "a"): 2.5}


def test_changes_is_read_only_and_completes_on_close():
    pending = PendingPlan()
    done: list = []
    pending.changes.subscribe(on_completed=lambda: done.append(True))
    assert not hasattr(pending.changes, "on_next")
    pending.close()
    assert done == [True]
    late: list = []
    pending.changes.subscribe(on_completed=lambda: late.append(True))  # subscribing after close completes at once
    assert late == [True]


def test_a_failing_subscriber_does_not_lose_the_change():
    pending = PendingPlan()

    def boom(_ev):
        raise RuntimeError("subscriber bug")

    pending.changes.subscribe(boom)
    with pytest.raises(RuntimeError, match="subscriber bug"):
        pending.set_parameter(1, "a", 1.0)  # the producer hears about it ...
    assert pending.drain().params == {(1, "a"): 1.0}  # ... and the value is folded all the same


def test_tiers_spell_as_strings():
    assert Tier.STRUCTURE == "structure" and (Tier.PARAMETERS,) == ("parameters",)
    assert repr((Tier.CODE,)) == "('code',)"
    assert [t.rank for t in Tier] == [3, 2, 1, 0]


def test_of_type_hands_each_kind_only_its_own_events_in_order_and_completes_on_close():
    from rxcuda.model._events import BlockAdded, BlockRemoved, CodeChanged

    pending = PendingPlan()
    values: list = []
    structure: list = []
    both: list = []
    everything: list = []
    done: list = []
    pending.of_type(ParameterChanged).subscribe(values.append, on_completed=lambda: done.append("values"))
    pending.of_type(BlockAdded, BlockRemoved).subscribe(structure.append, on_completed=lambda: done.append("s"))
    pending.of_type(ParameterChanged, BlockAdded).subscribe(both.append)
    pending.changes.subscribe(everything.append)
    events = [BlockAdded(1, "a"), ParameterChanged(1, "g", 0.5), CodeChanged(1, "k", None), BlockRemoved(1, "a")]
    pending.set_parameter(2, "h", 1)
    pending.add_all(events)
    pending.set_parameter(2, "h", 2)
    assert values == [ParameterChanged(2, "h", 1), ParameterChanged(1, "g", 0.5), ParameterChanged(2, "h", 2)]
    assert structure == [BlockAdded(1, "a"), BlockRemoved(1, "a")]
    assert both == [ParameterChanged(2, "h", 1), BlockAdded(1, "a"), ParameterChanged(1, "g", 0.5),
                    ParameterChanged(2, "h", 2)]
    assert everything == [ParameterChanged(2, "h", 1), *events, ParameterChanged(2, "h", 2)]
    pending.close()
    assert sorted(done) == ["s", "values"]


def test_a_failing_parameter_changes_subscriber_is_reported_and_the_change_kept():
    reported: list = []
    pending = PendingPlan(on_subscriber_error=lambda err, ev: reported.append((str(err), ev)))
    seen: list = []

    def boom(_ev):
        raise RuntimeError("subscriber bug")

    pending.of_type(ParameterChanged).subscribe(boom)
    pending.of_type(ParameterChanged).subscribe(seen.append)
    pending.set_parameter(1, "a", 1.0)
    assert reported == [("subscriber bug", ParameterChanged(1, "a", 1.0))] and seen == [ParameterChanged(1, "a", 1.0)]
    assert pending.drain().params == {(1, "a"): 1.0}
