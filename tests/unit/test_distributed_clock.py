"""A worker's clock in-process (no Ray): the record each way, the control messages a frame waits for, a failed step,
a worker whose end hangs up or whose process is gone, the pipes removed on close; and a worker's engine stepped
through its clock."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import uuid

import numpy as np

import rxcuda
from rxcuda.cuda import NullDriver
from rxcuda.distributed import Worker, _clock, split
from rxcuda.distributed._placement import check_workers
from rxcuda.distributed._worker import FragmentHost
from rxcuda.engine._records import Frame
from rxcuda.lowlevel import PortRef
from rxcuda.model._events import Tier


def test_a_frame_crosses_in_one_record_and_one_that_does_not_fit_asks_for_more():
    frame = Frame(41, 17.25, (Tier.CODE, Tier.PARAMETERS), "error", False, 3.5, 4)
    index, status, flags, back = _clock.decode(_clock.encode(9, _clock.DONE, 0, frame))
    assert (index, status, flags) == (9, "done", 0)
    assert back == frame and back.tiers == ("code", "parameters")
    assert _clock.decode(_clock.encode(9, _clock.DONE, 0, frame._replace(gpu_us=None)))[3].gpu_us is None
    profiled = frame._replace(blocks={"first": 1.0})
    assert _clock.decode(_clock.encode(9, _clock.DONE, 0, profiled))[2] & _clock.MORE
    assert _clock.decode(_clock.encode(9, _clock.FAILED, 0, None))[1:3] == ("failed", _clock.MORE)


def test_loops_at_their_bound_ask_for_more_and_reindexed_is_replace():
    """A frame naming loops at their bound does not fit the record (the driver collects it whole); reindexed()
    is _replace(index=...) on the frame path."""
    frame = Frame(41, 17.25, (), "ok", True, None, 1, loops_at_bound=("check",))
    assert _clock.encode(9, _clock.DONE, 0, frame)[16] & _clock.MORE
    assert _clock.decode(_clock.encode(9, _clock.DONE, 0, frame._replace(loops_at_bound=())))[2] == 0
    got = _clock.reindexed(frame, 7)
    assert got == frame._replace(index=7) and type(got) is Frame and got.loops_at_bound == ("check",)


def test_the_doorbell_counts_each_record_both_ways(monkeypatch):
    """Each request and each answer bumps its counter in the clock's shared doorbell, which a spinning end polls
    (with a spin, as on hosts of 8 cores or more) instead of its pipe; the answers are the same; the bell's file
    is removed with the pipes."""
    monkeypatch.setattr(_clock, "SPIN_S", 0.05)
    h = _Hand()
    try:
        assert h.clock.bell is not None and h.hand.bell is not None
        for i in range(1, 6):
            h.clock.step(i)
            status, _flags, frame = _clock.answer(h.clock, i)
            assert (status, frame.index) == ("done", i)
        assert (h.clock.bell[_clock.GO_BELL], h.clock.bell[_clock.DONE_BELL]) == (5, 5)
        assert h.hand.bell[_clock.DONE_BELL] == 5  # one file, mapped by both ends
        assert [e for e in h.log if e[0] == "step"] == [("step", i) for i in range(1, 6)]
    finally:
        bell = h.clock.bell_path
        h.close()
    assert not os.path.exists(bell)


class _Hand:
    """A clock with both ends in this process: the steps it ran and the messages it applied, in order."""

    def __init__(self, step=None, read=None):
        self.log: list = []
        self.clock = _clock.Clock(uuid.uuid4().hex[:12], "w", os.getpid())

        def default(index):
            self.log.append(("step", index))
            return Frame(index, 1.0, (), "ok", True, None, 1), None

        self.hand = _clock.ClockHand(self.clock.go_path, self.clock.done_path, self.clock.generation,
                                     step or default, lambda ms: self.log.append(("apply", ms)), read)

    def post(self, message) -> None:
        self.clock.seq += 1
        self.hand.post(self.clock.seq, message)

    def close(self) -> None:
        self.clock.close()
        self.hand.stop()


def _mailing(monkeypatch, spin_s):
    monkeypatch.setattr(_clock, "SPIN_S", spin_s)
    monkeypatch.setattr(_clock, "_X86", True)  # (the mailbox's order argument is x86's; the test's is the GIL's)


def test_the_mailbox_carries_the_common_frame_both_ways_and_keeps_order_with_the_pipe(monkeypatch):
    """Frames requested through the mailbox are answered there, in order with the requests and reads that take
    the pipe (a control message inline, a read between frames); the pipes carry none of the mailed ones."""
    _mailing(monkeypatch, 0.05)
    h = _Hand(read=lambda what: ("value", what))
    try:
        assert h.clock.can_mail
        for i in range(1, 31):
            if i % 10 == 5:  # a control message with the request: the pipe
                h.clock.seq += 1
                h.clock.step(i, _clock.pickle.dumps(("m", i)))
                got = _clock.answer(h.clock, i)
            elif i % 10 == 9:  # a small one: in the mailbox with its request
                h.clock.seq += 1
                h.clock.mail(i, _clock.pickle.dumps(("small", i)))
                got = _clock.answer_mail(h.clock, i)
            else:
                h.clock.mail(i)
                got = _clock.answer_mail(h.clock, i)
            assert got[0] == "done" and got[2].index == i, got
            if i % 10 == 7:
                assert _clock.answer(h.clock, h.clock.read(("r", i))) == (True, ("value", ("r", i)))
        assert h.clock.mailed == 27 and h.clock.bell[_clock.M_DONE] == 27
        assert h.clock.bell[_clock.GO_BELL] == 3 + 3  # three inline requests, three reads: the rest were mailed
        assert [e[1] for e in h.log if e[0] == "step"] == list(range(1, 31))
        assert [e[1] for e in h.log if e[0] == "apply"] == [[("m", 5)], [("small", 9)], [("m", 15)], [("small", 19)],
                                                            [("m", 25)], [("small", 29)]]
    finally:
        h.close()


def test_a_sleeping_end_is_woken_either_way(monkeypatch):
    """A worker asleep in its pipe (the requests come slower than its spin) is woken by a WAKE request; a driver
    asleep (the frame takes longer than its spin) by a WAKE record; the wake-ups are dropped, the frames exact."""
    _mailing(monkeypatch, 2e-4)
    slow = threading.Event()

    def step(index):
        if slow.is_set():
            threading.Event().wait(0.02)  # longer than the driver's spin
        return Frame(index, 1.0, (), "ok", True, None, 1), None

    h = _Hand(step=step)
    try:
        for i in range(1, 6):
            threading.Event().wait(0.02)  # the worker's spin is over: it sleeps in its pipe
            assert h.hand.bell[_clock.CHILD_SLEEPS] == 1
            h.clock.mail(i)
            assert _clock.answer_mail(h.clock, i)[2].index == i
        slow.set()
        for i in range(6, 11):
            h.clock.mail(i)
            assert _clock.answer_mail(h.clock, i)[2].index == i
            assert h.clock.bell[_clock.DRIVER_SLEEPS] == 0
        assert h.clock.bell[_clock.GO_BELL] == 0 and h.clock.bell[_clock.DONE_BELL] >= 5  # wakes only in the pipes
        h.clock.step(11)  # the pipe after the mailbox: the wake-ups left in it are dropped, not taken as answers
        assert _clock.answer(h.clock, 11)[2].index == 11
    finally:
        h.close()


def test_a_mailed_frame_of_a_worker_that_died_is_dead_not_waited_for(monkeypatch):
    _mailing(monkeypatch, 1e-3)
    h = _Hand()
    h.clock.step(_clock.STOP)  # the frame thread ends and closes its end of the pipes
    h.hand.stop()
    h.clock.mail(1)
    assert _clock.answer_mail(h.clock, 1) == "dead"
    h.clock.close()


def test_a_frame_waits_for_the_control_messages_its_request_names():
    h = _Hand()
    try:
        h.clock.step(1)
        assert h.clock.seq == 0 and _clock.wait({"w": h.clock}, 1)["w"][0] == "done"
        h.clock.seq = 2  # two messages posted before frame 2, the second after its request reached the worker
        h.clock.step(2)
        h.hand.post(1, "first")
        threading.Timer(0.05, h.hand.post, (2, "second")).start()
        status, flags, frame = _clock.wait({"w": h.clock}, 2)["w"]
        assert status == "done" and flags == 0 and frame.index == 2
        assert h.log == [("step", 1), ("apply", ["first", "second"]), ("step", 2)]
        assert h.hand.frames == 2
    finally:
        h.close()


def test_frames_in_flight_are_answered_in_order_and_an_older_answer_is_dropped():
    h = _Hand()
    try:
        for i in (1, 2, 3):
            h.clock.step(i)
        assert _clock.wait({"w": h.clock}, 2)["w"][2].index == 2  # frame 1's answer read and dropped
        assert _clock.wait({"w": h.clock}, 3)["w"][2].index == 3
    finally:
        h.close()


def test_a_failed_step_is_answered_and_its_error_waits_to_be_collected():
    def broken(index):
        raise ZeroDivisionError("oops")

    h = _Hand(broken)
    try:
        h.clock.step(5)
        status, flags, _ = _clock.wait({"w": h.clock}, 5)["w"]
        assert status == "failed" and flags & _clock.MORE
        assert h.hand.more.pop(5) == (None, {}, (), "ZeroDivisionError: oops")
    finally:
        h.close()


def test_a_worker_whose_end_hangs_up_or_whose_process_is_gone_is_dead_not_waited_for():
    h = _Hand()
    h.clock.step(_clock.STOP)  # the frame thread ends and closes its end of the pipes
    h.hand.stop()
    assert not h.hand.thread.is_alive()
    h.clock.step(1)
    assert _clock.wait({"w": h.clock}, 1) == {"w": "dead"}
    h.clock.close()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    silent = _clock.Clock(uuid.uuid4().hex[:12], "s", int(gone.stdout))
    try:
        fd = os.open(silent.done_path, os.O_WRONLY)  # a writer that never answers, in a process that has ended
        silent.step(1)
        assert _clock.wait({"s": silent}, 1) == {"s": "dead"}
        os.close(fd)
    finally:
        silent.close()


def test_a_read_between_frames_is_answered_in_order_with_its_value_or_its_error():
    def read(what):
        if what == "missing":
            raise KeyError("no such port")
        return {"asked": what, "data": np.arange(3)}

    h = _Hand(read=read)
    try:
        h.clock.step(1)
        r = h.clock.read(("block", 7, "out"))
        assert r <= _clock.READ
        ok, value = _clock.answer(h.clock, r)  # frame 1's answer (not waited for) is read and dropped on the way
        assert ok and value["asked"] == ("block", 7, "out") and value["data"].tolist() == [0, 1, 2]
        ok, err = _clock.answer(h.clock, h.clock.read("missing"))
        assert not ok and isinstance(err, KeyError) and "no such port" in str(err)
        h.clock.read("a read nobody waits for")
        h.clock.step(2)
        assert _clock.wait({"w": h.clock}, 2)["w"][2].index == 2  # the read's answer (and payload) skipped
        assert h.log == [("step", 1), ("step", 2)]
    finally:
        h.close()
    plain = _Hand()  # a clock whose worker takes no reads says so
    try:
        ok, err = _clock.answer(plain.clock, plain.clock.read("x"))
        assert not ok and "takes no reads" in str(err)
        plain.clock.step(_clock.STOP)  # the frame thread ends: a read then is "dead", not waited for
        plain.hand.stop()
        assert _clock.answer(plain.clock, plain.clock.read("x")) == "dead"
    finally:
        plain.close()


def test_close_removes_the_pipes():
    h = _Hand()
    paths = [h.clock.go_path, h.clock.done_path]
    assert all(stat.S_ISFIFO(os.stat(p).st_mode) for p in paths)
    h.close()
    assert not any(os.path.exists(p) for p in paths) and not h.hand.thread.is_alive()


def test_a_worker_steps_its_fragment_through_its_clock_with_the_posted_values():
    model = rxcuda.Engine(driver=NullDriver())
    first = model.add(rxcuda.Block.from_kernel("scalar_mul", size=64, name="first"))
    model.write(first["x"], np.zeros(64, np.float32))
    s = split(model.describe(), {first.id: "a"}, check_workers({"a": Worker(null=True)}))
    model.close()
    host = FragmentHost("a", null=True)
    host.build(s.fragments["a"], {})
    clock = _clock.Clock(host.session, "a", os.getpid())
    try:
        host.start_clock(clock.go_path, clock.done_path, clock.generation)
        ref = PortRef(first.id, "out")
        clock.seq = 1
        host.post(clock.generation, 1, {first.id: {"scale": 4.0}}, {}, {ref: 1})
        host.post(clock.generation + 1, 1, {first.id: {"scale": 99.0}}, {}, None)  # an older clock's: dropped
        clock.step(1)
        status, flags, frame = _clock.wait({"a": clock}, 1)["a"]
        assert status == "done" and frame.tiers == ("parameters",) and flags & _clock.MORE  # an observed port
        full, seen, diags, err = host.collect(1)
        assert err is None and seen[ref].shape == (64,) and host.collect(1) is None
        assert host.describe().blocks[0].values["scale"] == 4.0
        assert host.stats()["clock_frames"] == 1
    finally:
        clock.close()
        host.close()
    assert host._clock is None
