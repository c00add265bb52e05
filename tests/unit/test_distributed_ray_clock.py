"""Frames stepped through the workers' clocks (every worker on the driver's host) on a local Ray cluster whose workers
run the null driver: the stepping each worker uses, a value set between frames landing in the next one, observed
ports and frames brought back, backpressure, a killed worker detected and restarted under its clock, and close
leaving no pipe or board."""

from __future__ import annotations

import os
import stat
import time

import numpy as np
import pytest
from _ray import cluster, ray, run_with_slow_b  # noqa: E402, F401  (the local cluster; skips this module without Ray)

import rxcuda
from rxcuda.distributed import Engine, FragmentDiagnostic, FragmentFrame, Worker  # noqa: E402
from rxcuda.distributed._board import board_dir  # noqa: E402

PTX = "scalar_mul"
N = 512


def _linked(transport: str = "ipc", **kw) -> tuple[Engine, rxcuda.Block, rxcuda.Block]:
    engine = Engine({"a": Worker(null=True), "b": Worker(null=True)}, **kw)
    first = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"), on="a")
    second = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"), on="b")
    engine.connect(first["out"], second["x"], transport=transport)
    engine.write(first["x"], np.ones(N, np.float32))
    return engine, first, second


def _mine(engine: Engine) -> list[str]:
    return [n for n in os.listdir(board_dir()) if n.startswith(f"rxcuda-{engine._session}-")]


@pytest.fixture(scope="module")
def dist():
    engine, first, second = _linked()
    engine.tick()
    yield engine, first, second
    engine.close()


def test_same_host_frames_step_through_the_clock_not_a_ray_call_each(dist):
    engine, first, second = dist
    assert engine.describe().stepping == {"a": "clock", "b": "clock"}
    before = {w: ray.get(engine.actor(w).stats.remote())["clock_frames"] for w in ("a", "b")}
    frames: list[FragmentFrame] = []
    sub = engine.frames.subscribe(frames.append)
    for _ in range(5):
        assert engine.tick().complete
    sub.dispose()
    for w in ("a", "b"):
        stats = ray.get(engine.actor(w).stats.remote())
        assert stats["clock_frames"] == before[w] + 5
    assert ray.get(engine.actor("b").stats.remote())["skipped"] == {}
    assert sorted(f.worker for f in frames) == ["a"] * 5 + ["b"] * 5
    assert all(f.frame.state == "ok" and f.frame.launched for f in frames)
    assert sum(stat.S_ISFIFO(os.stat(os.path.join(board_dir(), n)).st_mode) for n in _mine(engine)) == 4


def test_a_value_set_between_two_frames_lands_in_the_next_one(dist):
    engine, first, second = dist
    for v in (2.0, 3.0, 4.0):
        second.params["scale"].value = v
        frame = engine.tick()
        assert frame.fragments["b"].tiers == (rxcuda.Tier.PARAMETERS,) and frame.fragments["a"].tiers == ()
        assert ray.get(engine.actor("b").describe.remote()).blocks[0].values["scale"] == v
    engine.write(first["x"], np.full(N, 2.0, np.float32))  # a write too, with the next frame
    assert engine.tick().complete


def test_observed_ports_come_back_under_the_clock(dist):
    engine, first, second = dist
    got: list = []
    sub = engine.observe(second["out"], every=1).subscribe(got.append)
    for _ in range(3):
        engine.tick()
    sub.dispose()
    assert len(got) == 3 and all(a.shape == (N,) and a.dtype == np.float32 for a in got)


def test_a_slow_worker_holds_back_the_clocked_frames(dist):
    engine, first, second = dist
    counts, most = run_with_slow_b(engine, 1.0)  # far slower than the 500 frames a second asked
    assert 5 <= counts["b"] <= 25
    assert counts["a"] <= counts["b"] + engine.max_in_flight + 1
    assert most <= engine.max_in_flight


def test_a_host_link_on_one_host_steps_through_clocks_and_stepping_ray_by_ray_calls():
    engine, first, second = _linked("host")  # one host: the link meets on a shared-memory board, no Ray call
    try:
        assert engine.describe().stepping == {"a": "clock", "b": "clock"}
        assert engine.describe().transports(why=True) == {
            "first.out -> second.x": "host: asked for; one host: through a shared-memory board, pinned, no Ray call"}
        for _ in range(3):
            assert engine.tick().complete
        assert ray.get(engine.actor("b").stats.remote())["received"] == {"first.out -> second.x": 3}
    finally:
        engine.close()
    engine, first, second = _linked("host", stepping="ray")
    try:
        assert engine.describe().stepping == {"a": "ray", "b": "ray"}
        assert engine.tick().complete
        assert ray.get(engine.actor("a").stats.remote())["clock_frames"] == 0
        assert not [n for n in _mine(engine) if stat.S_ISFIFO(os.stat(os.path.join(board_dir(), n)).st_mode)]
    finally:
        engine.close()
    with pytest.raises(ValueError, match=r"'stepping' must be one of auto, ray \(got 'pipes'\)"):
        Engine(["a"], stepping="pipes")


def test_a_worker_killed_under_its_clock_is_named_restarted_and_gets_a_new_clock_then_close_leaves_nothing():
    engine, first, second = _linked()
    try:
        engine.tick()
        old_pid, old_clock = engine.where("b")["pid"], engine._clocks["b"]
        diags: list[FragmentDiagnostic] = []
        engine.diagnostics.subscribe(diags.append)
        ray.kill(engine.actor("b"), no_restart=False)
        second.params["scale"].value = 7.0  # set while b is down: it arrives once b is back
        deadline, back = time.time() + 60, False
        while time.time() < deadline:
            f = engine.tick()  # never blocks on the dead worker: its pipe hangs up
            back = back or any(d.severity == "info" for d in diags)
            if back and f.complete:
                break
            time.sleep(0.05)
        assert back and f.complete, [str(d) for d in diags]
        died = [d for d in diags if d.severity == "error"]
        assert died[0].worker == "b" and "worker 'b' died" in died[0].message, [str(d) for d in diags]
        assert engine.where("b")["pid"] != old_pid
        assert engine._clocks["b"] is not old_clock and not os.path.exists(old_clock.go_path)
        assert engine.describe().stepping["b"] == "clock"
        engine.tick()
        assert ray.get(engine.actor("b").describe.remote()).blocks[0].values["scale"] == 7.0
        assert ray.get(engine.actor("b").stats.remote())["clock_frames"] >= 2
        assert _mine(engine)
    finally:
        engine.close()
    assert not _mine(engine)  # no pipe, no board
