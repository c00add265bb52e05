"""rxcuda's Rx operators and bindings, in virtual time (TestScheduler, marbles): no sleeps, no real files.

Editors' save patterns are replayed as the watchdog events they produce, through the same event mapping
and filter that watch_files uses, onto a fake disk whose "digest" is the file's content.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import reactivex
from reactivex import operators as ops
from reactivex.subject import Subject
from reactivex.testing import ReactiveTest, TestScheduler
from reactivex.testing.marbles import marbles_testing
from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
)

import rxcuda.streams as streams
from rxcuda.streams import (
    FileChanged,
    ParameterChanged,
    PendingPlan,
    bind_parameter,
    coalesce_into,
    debounce_by_content,
    sample_every,
)
from rxcuda.streams._files import DEFAULT_PATTERNS, _Handler, _matcher

on_next = ReactiveTest.on_next
on_completed = ReactiveTest.on_completed
on_error = ReactiveTest.on_error

DIR = "/proj/kernels"
FORCES = f"{DIR}/forces.cu"
EMIT = f"{DIR}/emit.cu"


# -- debounce_by_content: timing and dedupe -----------------------------------------------------------


def test_debounce_40_turns_on_next_250_into_a_change_at_290():
    sch = TestScheduler()
    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_completed(500))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, {"a.cu": "v1"}.get)))
    assert res.messages == [on_next(290, FileChanged("a.cu", "v1")), on_completed(500)]


def test_a_burst_is_one_change_after_the_last_event():
    sch = TestScheduler()
    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_next(260, "a.cu"), on_next(285, "a.cu"))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, {"a.cu": "v1"}.get)))
    assert res.messages == [on_next(325, FileChanged("a.cu", "v1"))]


def test_marbles_burst_then_quiet():
    disk = {"a": "v1"}
    with marbles_testing(timespan=10) as (start, cold, hot, exp):
        source = cold("-a-a-a----------|")  # a at 210, 230, 250; completes at 360
        expected = exp("---------x------|", lookup={"x": FileChanged("a", "v1")})  # 250 + 40
        assert start(source.pipe(debounce_by_content(40, disk.get))) == expected


def test_unchanged_content_emits_nothing_the_second_time():
    sch = TestScheduler()
    disk = {"a.cu": "v1"}
    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_next(400, "a.cu"))  # a touch at 400
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, disk.get)))
    assert res.messages == [on_next(290, FileChanged("a.cu", "v1"))]


def test_initial_digests_suppress_the_first_unchanged_save():
    sch = TestScheduler()
    disk = {"a.cu": "v1"}
    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_next(400, "a.cu"))
    sch.schedule_absolute(390, lambda *_: disk.update({"a.cu": "v2"}))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, disk.get, initial={"a.cu": "v1"})))
    assert res.messages == [on_next(440, FileChanged("a.cu", "v2"))]


def test_initial_function_runs_on_each_subscribe():
    calls = []

    def seed():
        calls.append(1)
        return {"a.cu": "v1"}

    sch = TestScheduler()
    xs = sch.create_hot_observable(on_next(250, "a.cu"))
    op = debounce_by_content(40, {"a.cu": "v1"}.get, initial=seed)
    assert calls == []  # nothing happens before subscribe
    res = sch.start(lambda: xs.pipe(op))
    assert calls == [1] and res.messages == []


def test_content_changed_and_changed_back_within_a_burst_emits_nothing():
    sch = TestScheduler()
    disk = {"a.cu": "v1"}
    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_next(260, "a.cu"))
    sch.schedule_absolute(249, lambda *_: disk.update({"a.cu": "v2"}))
    sch.schedule_absolute(259, lambda *_: disk.update({"a.cu": "v1"}))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, disk.get, initial={"a.cu": "v1"})))
    assert res.messages == []


def test_changed_back_in_a_later_save_is_a_change():
    sch = TestScheduler()
    disk = {"a.cu": "v2"}
    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_next(400, "a.cu"))
    sch.schedule_absolute(399, lambda *_: disk.update({"a.cu": "v1"}))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, disk.get, initial={"a.cu": "v1"})))
    assert res.messages == [on_next(290, FileChanged("a.cu", "v2")), on_next(440, FileChanged("a.cu", "v1"))]


def test_paths_are_independent():
    sch = TestScheduler()
    disk = {"a.cu": "a1", "b.cu": "b1"}
    # a.cu keeps getting events every 20 ticks; b.cu's single event must not wait for a.cu's quiet
    xs = sch.create_hot_observable(
        *(on_next(t, "a.cu") for t in range(250, 400, 20)), on_next(255, "b.cu")
    )
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, disk.get)))
    assert res.messages == [on_next(295, FileChanged("b.cu", "b1")), on_next(430, FileChanged("a.cu", "a1"))]


def test_missing_file_is_skipped_until_it_appears():
    sch = TestScheduler()
    disk: dict[str, str] = {}
    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_next(400, "a.cu"))
    sch.schedule_absolute(399, lambda *_: disk.update({"a.cu": "v1"}))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, disk.get)))
    assert res.messages == [on_next(440, FileChanged("a.cu", "v1"))]


def test_an_event_during_the_digest_read_defers_to_the_newer_timer():
    # A write racing the read: the content read may be partial, so that check must not emit.
    sch = TestScheduler()
    disk = {"a.cu": "v2-partial"}
    events: Subject[str] = Subject()
    reads = []

    def digest(path):
        reads.append(sch.clock)
        value = disk[path]
        if len(reads) == 1:  # the writer finishes while we read, and reports it
            disk[path] = "v2"
            events.on_next(path)
        return value

    sch.schedule_absolute(250, lambda *_: events.on_next("a.cu"))
    res = sch.start(lambda: events.pipe(debounce_by_content(40, digest, initial={"a.cu": "v1"})))
    assert reads == [290, 330]
    assert res.messages == [on_next(330, FileChanged("a.cu", "v2"))]


def test_pathlike_items_become_str_paths():
    sch = TestScheduler()
    xs = sch.create_hot_observable(on_next(250, Path("k") / "a.cu"))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, {"k/a.cu": "v1"}.get)))
    assert res.messages == [on_next(290, FileChanged("k/a.cu", "v1"))]
    assert type(res.messages[0].value.value.path) is str


def test_completion_checks_pending_paths_at_once():
    sch = TestScheduler()
    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_completed(260))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, {"a.cu": "v1"}.get)))
    assert res.messages == [on_next(260, FileChanged("a.cu", "v1")), on_completed(260)]


def test_error_cancels_pending_timers():
    sch = TestScheduler()
    boom = RuntimeError("watcher died")
    reads = []
    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_error(260, boom))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, lambda p: reads.append(p) or "v1")))
    assert res.messages == [on_error(260, boom)]
    assert reads == []


def test_dispose_cancels_pending_timers():
    sch = TestScheduler()
    reads = []
    xs = sch.create_hot_observable(on_next(250, "a.cu"))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, lambda p: reads.append(p) or "v1")), disposed=270)
    assert res.messages == [] and reads == []
    assert xs.subscriptions == [ReactiveTest.subscribe(200, 270)]


def test_digest_error_goes_downstream():
    sch = TestScheduler()
    boom = PermissionError("denied")

    def digest(path):
        raise boom

    xs = sch.create_hot_observable(on_next(250, "a.cu"), on_next(400, "a.cu"))
    res = sch.start(lambda: xs.pipe(debounce_by_content(40, digest)))
    assert res.messages == [on_error(290, boom)]
    assert xs.subscriptions == [ReactiveTest.subscribe(200, 290)]


# -- editors' save patterns, as watchdog reports them, through watch_files' mapping and filter --------


class FakeDisk:
    """Files as strings; each step changes them and dispatches the watchdog events a real save makes."""

    def __init__(self, sch: TestScheduler, files: dict[str, str]) -> None:
        self.sch = sch
        self.files = dict(files)
        self.reads: list[str] = []
        self.raw: Subject[str] = Subject()
        self.handler = _Handler(self.raw, _matcher(frozenset(), frozenset({DIR}), DEFAULT_PATTERNS, False))

    def digest(self, path: str) -> str | None:
        self.reads.append(path)
        return self.files.get(path) or None  # like file_digest: missing or empty -> None

    def at(self, t: int, step) -> None:
        self.sch.schedule_absolute(t, lambda *_: step())

    def create(self, path, content=""):
        self.files[path] = content
        self.handler.dispatch(FileCreatedEvent(path))

    def modify(self, path, content):
        self.files[path] = content
        self.handler.dispatch(FileModifiedEvent(path))

    def close(self, path):
        self.handler.dispatch(FileClosedEvent(path))

    def move(self, src, dst):
        self.files[dst] = self.files.pop(src)
        self.handler.dispatch(FileMovedEvent(src, dst))

    def delete(self, path):
        del self.files[path]
        self.handler.dispatch(FileDeletedEvent(path))


def save_vim(disk: FakeDisk, t: int, path: str, content: str) -> None:
    probe, backup = f"{DIR}/4913", path + "~"
    disk.at(t, lambda: (disk.create(probe), disk.close(probe), disk.delete(probe)))
    disk.at(t + 1, lambda: disk.move(path, backup))
    disk.at(t + 2, lambda: disk.create(path))
    disk.at(t + 3, lambda: (disk.modify(path, content), disk.close(path)))
    disk.at(t + 4, lambda: disk.delete(backup))


def save_vscode(disk: FakeDisk, t: int, path: str, content: str) -> None:
    half = content[: len(content) // 2]
    disk.at(t, lambda: disk.modify(path, ""))  # truncate
    disk.at(t + 1, lambda: disk.modify(path, half))
    disk.at(t + 2, lambda: (disk.modify(path, content), disk.close(path)))


def save_jetbrains(disk: FakeDisk, t: int, path: str, content: str) -> None:
    tmp, old = path + "___jb_tmp___", path + "___jb_old___"
    disk.at(t, lambda: (disk.create(tmp), disk.modify(tmp, content), disk.close(tmp)))
    disk.at(t + 1, lambda: disk.move(path, old))
    disk.at(t + 2, lambda: disk.move(tmp, path))
    disk.at(t + 3, lambda: disk.delete(old))


EDITORS = {"vim": (save_vim, 3), "vscode": (save_vscode, 2), "jetbrains": (save_jetbrains, 2)}


def run_disk(disk: FakeDisk, duetime: int = 40, **kw):
    op = debounce_by_content(duetime, disk.digest, initial={p: c for p, c in disk.files.items() if c})
    return disk.sch.start(lambda: disk.raw.pipe(op), **kw).messages


@pytest.mark.parametrize("editor", sorted(EDITORS))
def test_editor_save_is_one_change(editor):
    save, last_event = EDITORS[editor]
    disk = FakeDisk(TestScheduler(), {FORCES: "gravity = 9.8"})
    save(disk, 300, FORCES, "gravity = 1.6")
    assert run_disk(disk) == [on_next(300 + last_event + 40, FileChanged(FORCES, "gravity = 1.6"))]
    assert set(disk.reads) == {FORCES}  # probes, backups and temp files never reach the digest


@pytest.mark.parametrize("editor", sorted(EDITORS))
def test_editor_save_without_change_emits_nothing(editor):
    save, _ = EDITORS[editor]
    disk = FakeDisk(TestScheduler(), {FORCES: "gravity = 9.8"})
    save(disk, 300, FORCES, "gravity = 9.8")
    assert run_disk(disk) == []
    assert disk.reads == [FORCES]  # one look per burst


def test_three_saves_in_a_row_each_change_once():
    disk = FakeDisk(TestScheduler(), {FORCES: "v1"})
    save_vim(disk, 300, FORCES, "v2")
    save_vscode(disk, 400, FORCES, "v3")
    save_jetbrains(disk, 500, FORCES, "v4")
    assert run_disk(disk) == [
        on_next(343, FileChanged(FORCES, "v2")),
        on_next(442, FileChanged(FORCES, "v3")),
        on_next(542, FileChanged(FORCES, "v4")),
    ]


def test_slow_truncate_then_write_skips_the_empty_file():
    disk = FakeDisk(TestScheduler(), {FORCES: "v1"})
    disk.at(300, lambda: disk.modify(FORCES, ""))  # truncated, then the editor stalls past the debounce
    disk.at(380, lambda: (disk.modify(FORCES, "v2"), disk.close(FORCES)))
    assert run_disk(disk) == [on_next(420, FileChanged(FORCES, "v2"))]
    assert disk.reads == [FORCES, FORCES]


def test_two_files_saved_together_each_change_once():
    disk = FakeDisk(TestScheduler(), {FORCES: "f1", EMIT: "e1"})
    save_vim(disk, 300, FORCES, "f2")
    save_jetbrains(disk, 302, EMIT, "e2")
    assert run_disk(disk) == [on_next(343, FileChanged(FORCES, "f2")), on_next(344, FileChanged(EMIT, "e2"))]


def test_files_outside_the_patterns_never_reach_the_digest():
    disk = FakeDisk(TestScheduler(), {FORCES: "f1"})
    notes = f"{DIR}/notes.txt"
    disk.at(300, lambda: (disk.create(notes, "todo"), disk.close(notes)))
    swap = f"{DIR}/.forces.cu.swp"
    disk.at(310, lambda: (disk.create(swap, "swap"), disk.modify(swap, "swap2")))
    disk.at(320, lambda: disk.create(f"{DIR}/sub/other.cu", "nested"))  # not recursive
    assert run_disk(disk) == []
    assert disk.reads == []


# -- sample_every ---------------------------------------------------------------------------------


def test_sample_every_marbles():
    with marbles_testing(timespan=10) as (start, cold, hot, exp):
        source = cold("-a-b-c-d-e-|")
        assert start(source.pipe(sample_every(2))) == exp("-a---c---e-|")


def test_sample_every_one_passes_everything_and_errors_pass_through():
    boom = ValueError("x")
    with marbles_testing(timespan=10) as (start, cold, hot, exp):
        source = cold("-a-b-c-#", error=boom)
        assert start(source.pipe(sample_every(1))) == exp("-a-b-c-#", error=boom)


def test_sample_every_counts_per_subscription():
    op = sample_every(3)
    source = reactivex.of(*range(7))
    first, second = [], []
    source.pipe(op).subscribe(first.append)
    source.pipe(op).subscribe(second.append)
    assert first == second == [0, 3, 6]


@pytest.mark.parametrize(
    ("n", "exc"), [(0, ValueError), (-3, ValueError), (1.5, TypeError), (True, TypeError)]
)
def test_sample_every_rejects_bad_n(n, exc):
    with pytest.raises(exc, match=r"'n' must be a positive int \(got "):
        sample_every(n)


# -- coalesce_into --------------------------------------------------------------------------------


def test_coalesce_into_folds_events_and_passes_only_completion():
    sch = TestScheduler()
    pending = PendingPlan()
    xs = sch.create_hot_observable(
        on_next(210, ParameterChanged(1, "gravity", 1.0)),
        on_next(220, ParameterChanged(1, "wind", 0.1)),
        on_next(230, ParameterChanged(1, "gravity", 2.0)),
        on_completed(300),
    )
    res = sch.start(lambda: xs.pipe(coalesce_into(pending)))
    assert res.messages == [on_completed(300)]
    plan = pending.drain()
    assert plan.params == {(1, "gravity"): 2.0, (1, "wind"): 0.1}
    assert plan.events == 3


def test_coalesce_into_ends_with_type_error_on_a_non_event():
    sch = TestScheduler()
    pending = PendingPlan()
    xs = sch.create_hot_observable(
        on_next(210, ParameterChanged(1, "g", 1.0)),
        on_next(220, 3.14),
        on_next(230, ParameterChanged(1, "g", 2.0)),
    )
    res = sch.start(lambda: xs.pipe(coalesce_into(pending)))
    assert len(res.messages) == 1
    assert res.messages[0].time == 220 and isinstance(res.messages[0].value.exception, TypeError)
    assert pending.drain().params == {(1, "g"): 1.0}  # nothing after the error was folded
    assert xs.subscriptions == [ReactiveTest.subscribe(200, 220)]


def test_coalesce_into_stops_folding_on_dispose():
    pending = PendingPlan()
    changes: Subject[ParameterChanged] = Subject()
    d = changes.pipe(coalesce_into(pending)).subscribe()
    changes.on_next(ParameterChanged(1, "g", 1))
    d.dispose()
    changes.on_next(ParameterChanged(1, "g", 2))
    assert pending.drain().params == {(1, "g"): 1}
    assert pending.drain() is None


def test_coalesce_into_composes_with_rxpy_operators():
    pending = PendingPlan()
    readings = reactivex.of(1.0, 3.0, 5.0, 7.0)
    smoothed = readings.pipe(ops.scan(lambda acc, x: 0.5 * acc + 0.5 * x, 0.0))
    smoothed.pipe(ops.map(lambda v: ParameterChanged(2, "wind", v)), coalesce_into(pending)).subscribe()
    plan = pending.drain()
    assert plan.params == {(2, "wind"): pytest.approx(5.1875)}
    assert plan.events == 4


# -- bind_parameter -------------------------------------------------------------------------------


def test_bind_sets_each_value_in_order():
    got, errors = [], []
    source: Subject[float] = Subject()
    d = bind_parameter(source, got.append, errors.append)
    for v in (1.0, 2.0, 3.0):
        source.on_next(v)
    assert got == [1.0, 2.0, 3.0] and errors == []
    d.dispose()


def test_bind_reports_source_error_and_other_bindings_keep_going():
    got_a, got_b, errors = [], [], []
    a: Subject[int] = Subject()
    b: Subject[int] = Subject()
    bind_parameter(a, got_a.append, errors.append)
    bind_parameter(b, got_b.append, errors.append)
    boom = RuntimeError("sensor unplugged")
    a.on_next(1)
    a.on_error(boom)
    b.on_next(10)
    b.on_next(11)
    assert errors == [boom]
    assert got_a == [1] and got_b == [10, 11]


def test_bind_survives_a_setter_error():
    got, errors = [], []

    def set_value(v):
        if v < 0:
            raise ValueError(f"gravity must be >= 0 (got {v})")
        got.append(v)

    source: Subject[int] = Subject()
    bind_parameter(source, set_value, errors.append)
    for v in (1, -1, 2):
        source.on_next(v)
    assert got == [1, 2]
    assert len(errors) == 1 and "got -1" in str(errors[0])


def test_bind_dispose_stops_values_and_is_idempotent():
    got = []
    source: Subject[int] = Subject()
    d = bind_parameter(source, got.append, pytest.fail)
    source.on_next(1)
    d.dispose()
    d.dispose()
    source.on_next(2)
    assert got == [1]
    assert not source.observers


def test_bind_may_dispose_itself_from_the_setter():
    got = []
    source: Subject[int] = Subject()
    holder = {}

    def set_value(v):
        got.append(v)
        if v == 2:
            holder["d"].dispose()

    holder["d"] = bind_parameter(source, set_value, pytest.fail)
    for v in (1, 2, 3):
        source.on_next(v)
    assert got == [1, 2]


def test_bind_dispose_waits_for_a_value_in_flight():
    entered, release = threading.Event(), threading.Event()
    got = []

    def set_value(v):
        entered.set()
        release.wait(5)
        got.append(v)

    source: Subject[int] = Subject()
    d = bind_parameter(source, set_value, pytest.fail)
    producer = threading.Thread(target=source.on_next, args=(1,))
    producer.start()
    assert entered.wait(5)
    disposer = threading.Thread(target=d.dispose)
    disposer.start()
    disposer.join(0.05)
    assert disposer.is_alive()  # dispose waits for the in-flight set_value
    release.set()
    disposer.join(5)
    producer.join(5)
    assert not disposer.is_alive() and got == [1]
    source.on_next(2)
    assert got == [1]


def test_bind_takes_synchronous_sources():
    pending = PendingPlan()
    bind_parameter(reactivex.of(1, 2, 3), lambda v: pending.set_parameter(1, "g", v), pytest.fail)
    assert pending.drain().params == {(1, "g"): 3}


def test_bind_from_many_producer_threads_latest_value_wins():
    pending = PendingPlan()
    n_threads, n_values = 8, 20_000
    subjects = [Subject() for _ in range(n_threads)]
    for i, s in enumerate(subjects):
        bind_parameter(s, lambda v, i=i: pending.set_parameter(i, "value", v), pytest.fail)

    def produce(s):
        for v in range(n_values):
            s.on_next(v)

    threads = [threading.Thread(target=produce, args=(s,)) for s in subjects]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    plan = pending.drain()
    assert plan.params == {(i, "value"): n_values - 1 for i in range(n_threads)}
    assert plan.events == n_threads * n_values


# -- the facade -----------------------------------------------------------------------------------


def test_streams_facade_exports_resolve():
    required = {
        "ParameterChanged", "CodeChanged", "FileChanged", "Tier", "UpdatePlan", "PendingPlan",
        "watch_files", "debounce_by_content", "sample_every", "bind_parameter", "coalesce_into",
        "file_digest",
    }
    assert required <= set(streams.__all__)
    assert all(getattr(streams, name) is not None for name in streams.__all__)
    assert len(set(streams.__all__)) == len(streams.__all__)
