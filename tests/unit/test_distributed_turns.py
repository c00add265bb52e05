"""Workers that share a device stepped in turns (``Engine(share_gpu="turns")``, ``_stepping``,
``_sharing.turn_groups``): which workers take turns, the order the driver steps them in (a producer answered before
its consumer on the same device is stepped; workers on other devices at once), frames exact against NumPy over
``ipc`` and ``host`` links, what ``describe()`` and ``where()`` say, and a producer's ``ipc`` export waiting for its
copy before it answers. CPU-device workers (real numbers) and null-driver workers, as child processes of this one
(``backend="process"``: no Ray cluster); the CPU-device workers of one host share its CPU device, the null-driver
ones its null driver: two devices."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

import rxcuda
from rxcuda.cuda import NullDriver
from rxcuda.distributed import Engine, Worker, _clock, _mps, _procs, _sharing, split
from rxcuda.distributed._placement import check_workers
from rxcuda.distributed._stepping import ClockSteps
from rxcuda.distributed._worker import FragmentHost
from rxcuda.lowlevel import PortRef

PTX = "scalar_mul"
N = 384
CPU, NULL = Worker(cpu=True), Worker(null=True)


# -- which workers take turns --------------------------------------------------------------------------------------
def test_workers_on_one_gpu_without_mps_take_turns_in_the_frames_order_and_others_do_not():
    gpu = Worker(num_gpus=0.5)
    where = {"a": {"node": "n1", "gpu": "g1", "mps": False}, "b": {"node": "n1", "gpu": "g1", "mps": False},
             "c": {"node": "n1", "gpu": "g2", "mps": False}, "d": {"node": "n2", "gpu": "g1", "mps": False},
             "e": {"node": "n2", "gpu": "g1", "mps": False}, "f": {"node": "n1", "gpu": "g2", "mps": True},
             "g": {"node": "n1", "gpu": None, "mps": None}, "h": {"node": "n1", "gpu": None, "mps": None}}
    workers = {w: gpu for w in where}
    # a group per (node, GPU), in the order given (producers first); MPS-served and not-yet-built workers take none
    assert _sharing.turn_groups(where, workers, ["e", "b", "c", "a", "d", "f", "g", "h"]) == (("e", "d"), ("b", "a"))
    assert _sharing.turn_groups(where, workers, ["a", "c"]) == ()  # a frame that steps one of a GPU's workers
    # without a GPU: one device per kind and node (the CPU device's cores, the null driver)
    where = {w: {"node": "n1"} for w in "abcd"} | {"e": {"node": "n2"}}
    workers = {"a": CPU, "b": NULL, "c": CPU, "d": NULL, "e": CPU}
    assert _sharing.turn_groups(where, workers, list("abcde")) == (("a", "c"), ("b", "d"))


def test_turns_is_a_share_gpu_choice_that_starts_no_daemon_and_tells_the_workers():
    assert _mps.check_share_gpu("turns") == "turns"
    c = _mps.choose("turns", None, candidates=(), user_pipe=None, binary=None)
    assert (c.mode, c.warn) == ("turns", False) and str(c).startswith("share_gpu='turns' -> turns: asked for")
    share = _mps.Share("turns", ("a", "b"), placed_first=True)
    assert share.mode == "turns" and share.env == {_mps.TURNS: "1"} and share.news is share.choice
    assert share.decide([("a", "b")]) is share.choice and _mps._daemon is None
    share.close()
    with pytest.raises(ValueError, match="'share_gpu' must be one of auto, off, mps, turns"):
        _mps.check_share_gpu("turn")


def test_in_turns_workers_sharing_a_gpu_are_no_warning_the_choice_an_info_once():
    choice = _mps.choose("turns", [("a", "b")], candidates=("a", "b"), user_pipe=None, binary=None)
    where = {"a": {"node": "n1", "gpus": ["0"]}, "b": {"node": "n1", "gpus": ["0"]}}
    warned: set = set()
    assert _sharing.placed(where, warned, "a", {"gpu": "ef" * 16, "mps": False}, choice) == [("info", str(choice))]
    assert _sharing.placed(where, warned, "b", {"gpu": "ef" * 16, "mps": False}, choice) == []
    ((severity, advice),) = _sharing.placed(where, set(), "b", {"gpu": "ef" * 16, "mps": False})  # not in turns
    assert severity == "warning" and "share_gpu='turns' (the driver steps them one after another" in advice


# -- the order of the steps, the driver's side alone -----------------------------------------------------------------
class _Ref:
    def __init__(self, w: str):
        self.w = w


class _Method:
    def __init__(self, log: list, w: str):
        self.log, self.w = log, w

    def remote(self, index, params, writes, observed, *payloads):
        self.log.append(("step", self.w, tuple(p.w for p in payloads)))
        return _Ref(f"{self.w}.out"), _Ref(self.w)


class _Ray:
    """Ray's wait as the turns see it: the step started first (and not yet answered) finishes first."""

    def __init__(self, log: list):
        self.log = log

    def wait(self, refs, num_returns=1, timeout=None):
        started = [w for kind, w, *_ in self.log if kind == "step"]
        ref = min(refs, key=lambda r: started.index(r.w))
        self.log.append(("answer", ref.w))
        return [ref], [r for r in refs if r is not ref]


class _Steps(ClockSteps):
    def __init__(self, turns):
        self.log: list = []
        self._ray = _Ray(self.log)
        self._turns, self._answered, self._where, self._driver_node = turns, {}, {}, None


def test_ray_steps_in_turns_wait_for_the_one_before_and_a_consumer_of_ray_results_for_its_producers_step():
    """Workers a, b, d share a device (in that order), c and e are alone on theirs; e takes d's result through Ray
    (a link across hosts). c starts with a; b once a answered, d once b did; e once d is stepped."""
    def steps(log: list) -> tuple:
        return tuple((w, _Method(log, w), ("d",) if w == "e" else (), True) for w in "abcde")

    eng = _Steps((("a", "b", "d"),))
    outs, reports = eng._step_frame(7, steps(eng.log), {}, {}, {w: {} for w in "abcde"})
    assert eng.log == [("step", "a", ()), ("step", "c", ()), ("answer", "a"), ("step", "b", ()), ("answer", "b"),
                       ("step", "d", ()), ("step", "e", ("d.out",)), ("answer", "d")]
    assert set(reports) == set("abcde") and outs["d"].w == "d.out"
    eng = _Steps(())  # no turns: every step at once, none waited for here
    eng._step_frame(7, steps(eng.log), {}, {}, {w: {} for w in "abcde"})
    assert eng.log == [("step", w, ("d.out",) if w == "e" else ()) for w in "abcde"]


# -- on child processes: the order, frames exact, what describe() and where() say ----------------------------------
def _journal(monkeypatch) -> list:
    """The driver's steps through clocks and the answers it read, in order: ("step" | "answer", worker, frame)."""
    log: list = []
    step, wait = _clock.Clock.step, _clock.wait

    def logged_step(self, index, inline=b""):
        log.append(("step", self.worker, index))
        return step(self, index, inline)

    def logged_wait(clocks, index, on_silence=None, first=False):
        got = wait(clocks, index, on_silence, first)
        log.extend(("answer", w, index) for w in got)
        return got

    monkeypatch.setattr(_clock.Clock, "step", logged_step)
    monkeypatch.setattr(_clock, "wait", logged_wait)
    return log


def _three(share_gpu: str, **kw) -> tuple:
    """CPU-device workers a and b (one device) and null-driver worker c (another): first (a) -> second (b) over
    ``ipc``, first -> third (b) over ``host``, fourth alone on c."""
    dist = Engine({"a": CPU, "b": CPU, "c": NULL}, backend="process", share_gpu=share_gpu, **kw)
    first = dist.add(rxcuda.Block.from_kernel(PTX, size=N, name="first", scale=1.5), on="a")
    second = dist.add(rxcuda.Block.from_kernel(PTX, size=N, name="second", scale=2.0), on="b")
    third = dist.add(rxcuda.Block.from_kernel(PTX, size=N, name="third", scale=3.0), on="b")
    fourth = dist.add(rxcuda.Block.from_kernel(PTX, size=N, name="fourth"), on="c")
    dist.connect(first["out"], second["x"], transport="ipc")
    dist.connect(first["out"], third["x"], transport="host")
    dist.write(first["x"], np.ones(N, np.float32))
    dist.write(fourth["x"], np.ones(N, np.float32))
    return dist, first, second, third


def test_in_turns_the_producer_answers_before_its_consumer_on_the_device_steps_and_another_device_goes_at_once(
        monkeypatch):
    log = _journal(monkeypatch)
    with _three("turns")[0] as dist:
        for _ in range(4):
            assert dist.tick().complete
        assert dist.where("a")["turns"] == dist.where("b")["turns"] == ("a", "b") and dist.where("c")["turns"] == ()
        frames = sorted({i for _k, _w, i in log})
        assert len(frames) == 4
        for i in frames:
            at = {(k, w): n for n, (k, w, j) in enumerate(log) if j == i}
            assert at["answer", "a"] < at["step", "b"], (i, log)  # b only once a answered
            assert at["step", "c"] < at["answer", "a"], (i, log)  # c, on another device, with a
            assert at["step", "a"] < at["step", "c"]  # the frame's order: a's group first, c alongside
        later = [n for n, (k, w, j) in enumerate(log) if (k, w) == ("step", "a") and j == frames[-1]]
        assert later[0] > max(n for n, (k, w, j) in enumerate(log) if (k, w, j) == ("answer", "b", frames[-2]))
    del log[:]
    with _three("off")[0] as dist:  # the default: every worker stepped at once, b before a answered
        for _ in range(2):
            assert dist.tick().complete
        i = max(j for _k, _w, j in log)
        at = {(k, w): n for n, (k, w, j) in enumerate(log) if j == i}
        assert at["step", "b"] < at["answer", "a"] and dist.where("a")["turns"] == ()


def test_in_turns_a_device_waits_for_each_of_its_workers_in_turn_while_another_device_runs_alongside():
    """a and b (the CPU device) take 0.3 s a step each, c (the null driver) 0.3 s: a frame takes a's and b's time
    one after the other, c's alongside (all three one after another would take 0.9 s)."""
    dist = Engine({"a": CPU, "b": CPU, "c": NULL}, backend="process", share_gpu="turns")
    try:
        for w in "abc":
            k = dist.add(rxcuda.Block.from_kernel(PTX, size=N, name=f"k{w}"), on=w)
            dist.write(k["x"], np.ones(N, np.float32))
        assert dist.tick().complete
        for w in "abc":
            _procs.get(dist.actor(w).throttle.remote(0.3))
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            assert dist.tick().complete
            times.append(time.perf_counter() - t0)
        assert 0.6 <= min(times) < 0.85, times
    finally:
        dist.close()


@pytest.mark.parametrize("stepping", ["auto", "ray"])
def test_frames_in_turns_are_exact_over_ipc_and_host_links(stepping):
    dist, first, second, third = _three("turns", stepping=stepping)
    try:
        said: list = []
        dist.diagnostics.subscribe(said.append)
        rng = np.random.default_rng()
        for i in range(6):
            x = rng.standard_normal(N).astype(np.float32)
            scale = float(rng.integers(2, 100))
            dist.write(first["x"], x)
            second.params["scale"].value = scale
            frame = dist.tick()
            assert frame.complete and set(frame.fragments) == {"a", "b", "c"}
            y = x * np.float32(1.5)
            np.testing.assert_array_equal(dist.read(second["out"]), y * np.float32(scale), err_msg=f"ipc, frame {i}")
            np.testing.assert_array_equal(dist.read(third["out"]), y * np.float32(3.0), err_msg=f"host, frame {i}")
        assert dist.describe().stepping == dict.fromkeys("abc", "clock" if stepping == "auto" else "ray")
        assert dist.describe().transports() == {"first.out -> second.x": "ipc", "first.out -> third.x": "host"}
        assert dist.describe().share_gpu == str(dist._share.choice) and "-> turns:" in dist.describe().share_gpu
        assert {dist.where(w)["share_gpu"] for w in "abc"} == {"turns"}
        assert dist.where("b")["turns"] == ("a", "b")
        assert all(d.severity == "info" for d in said), [str(d) for d in said]
        stats = _procs.get(dist.actor("b").stats.remote())
        assert stats["received"] == {"first.out -> second.x": 6, "first.out -> third.x": 6}
        assert stats["waited"] == 0  # stepped once a answered: its frames were on the boards already
    finally:
        dist.close()


def test_a_turns_engine_says_what_it_came_to_once_in_an_info():
    dist, *_ = _three("turns")
    try:
        said: list = []
        dist.diagnostics.subscribe(said.append)
        dist.tick()
        dist.tick()
        infos = [d for d in said if d.worker == "driver" and d.diagnostic.subject == "placement"]
        assert [d.message for d in infos] == [dist.describe().share_gpu] and infos[0].severity == "info"
    finally:
        dist.close()


# -- the producer's end of an ipc link, in turns ---------------------------------------------------------------------
def test_in_turns_an_ipc_export_waits_for_its_copy_before_the_step_answers():
    model = rxcuda.Engine(driver=NullDriver())
    first = model.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"))
    second = model.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"))
    model.connect(first["out"], second["x"])
    model.write(first["x"], np.zeros(N, np.float32))
    spec = Worker(num_gpus=0.5)
    s = split(model.describe(), {first.id: "a", second.id: "b"}, check_workers({"a": spec, "b": spec}),
              nodes={"a": "n1", "b": "n1"})
    model.close()
    assert s.links[0].transport == "ipc"
    for turns in (True, False):
        session = uuid.uuid4().hex[:12]
        env = {_mps.TURNS: "1"} if turns else {}
        a = FragmentHost("a", null=True, session=session, device_slots=True, env=env)
        b = FragmentHost("b", null=True, session=session, device_slots=True, env=env)
        a.build(s.fragments["a"], {})
        b.build(s.fragments["b"], {})
        api = a.engine.device.api
        for index in (1, 2, 3):
            mark = len(api.calls)
            a.step(index, {}, {}, {})
            calls = api.calls[mark:]
            last = max(n for n, (name, _args) in enumerate(calls) if name == "cuEventRecord")  # the slot's event
            after = [(name, args) for name, args in calls[last + 1:] if name == "cuEventSynchronize"]
            if turns:  # that very event waited for: no work of a's context left on the GPU when it answers
                assert after and after[0][1][0] == calls[last][1][0]
            else:
                assert after == []
            b.step(index, {}, {}, {})
        assert b.stats()["received"] == {"first.out -> second.x": 3}
        b.close()
        a.close()
        assert api.leaks() == {}
    assert PortRef(first.id, "out") == s.links[0].src
