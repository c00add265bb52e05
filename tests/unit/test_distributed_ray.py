"""The distributed engine on a local Ray cluster (2 CPUs, started once for the module) whose workers run the null
driver: placement through the facade and its errors, the fragments the workers build, host links every frame,
Rx across processes both ways, backpressure, a worker killed and restarted, and close leaving no process."""

from __future__ import annotations

import os
import time

import attrs
import numpy as np
import pytest
from _ray import cluster, ray, run_with_slow_b  # noqa: E402, F401  (the local cluster; skips this module without Ray)
from reactivex.subject import Subject

import rxcuda
from rxcuda.distributed import DistributedFrame, Engine, FragmentDiagnostic, FragmentFrame, Worker  # noqa: E402

PTX = "scalar_mul"
N = 512


def _two(**kw) -> Engine:
    return Engine({"a": Worker(null=True, **kw), "b": Worker(null=True, **kw)})


@pytest.fixture(scope="module")
def dist():
    engine = _two()
    first = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"), on="a")
    second = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"), on="b")
    engine.connect(first["out"], second["x"])
    engine.write(first["x"], np.ones(N, np.float32))
    yield engine, first, second
    engine.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- placement through the facade --------------------------------------------------------------------------------
def test_placement_errors_name_the_block_the_worker_and_the_fix(dist):
    engine, first, second = dist
    with pytest.raises(ValueError, match=r"say which worker holds scalar_mul: add\(block, on=...\) \(workers: a, b\)"):
        engine.add(rxcuda.Block.from_kernel(PTX, size=N))
    with pytest.raises(rxcuda.ValidationError, match=r"no worker named 'c'.*"):
        engine.add(rxcuda.Block.from_kernel(PTX, size=N), on="c")
    with pytest.raises(rxcuda.ValidationError, match=r"did you mean 'a'\?"):
        engine.add(rxcuda.Block.from_kernel(PTX, size=N), on="A")
    comp = rxcuda.Composite("pair")
    with pytest.raises(TypeError, match=r"places plain blocks \(got Composite\); composites and regions run inside"):
        engine.add(comp, on="a")
    stray = rxcuda.Block.from_kernel(PTX, size=N, name="stray")
    with pytest.raises(rxcuda.ValidationError, match=r"stray is not in this distributed engine; add\(block, on=...\)"):
        engine.write(stray["x"], np.ones(N, np.float32))
    with pytest.raises(rxcuda.ValidationError, match=r"first.out -> second.x: a delayed connection lives in one "
                                                      r"graph, and these blocks run on workers 'a' and 'b'"):
        engine.connect(first["out"], second["x"], delay=1)
    with pytest.raises(rxcuda.ValidationError, match=r"transport must be one of auto, ipc, host \(got 'tcp'\)"):
        engine.connect(first["out"], second["x"], transport="tcp")
    assert [b.name for b in engine._model.blocks] == ["first", "second"]  # nothing changed


def test_a_bad_write_is_refused_on_the_driver_as_a_local_engine_would(dist):
    engine, first, _ = dist
    with pytest.raises((TypeError, ValueError), match=r"first.x"):
        engine.write(first["x"], np.ones(N + 1, np.float32))


def test_bind_and_observe_refuse_what_cannot_cross(dist):
    engine, first, _ = dist
    with pytest.raises(TypeError, match=r"bind takes a parameter .* a device array lives in one process"):
        engine.bind(first["x"], Subject())
    stray = rxcuda.Block.from_kernel(PTX, size=N, name="stray")
    with pytest.raises(rxcuda.ValidationError, match=r"parameter scale belongs to no block of this distributed"):
        engine.bind(stray.params["scale"], Subject())
    with pytest.raises(ValueError, match=r"'every' must be a positive int \(got 0\)"):
        engine.observe(first["out"], every=0)


def test_a_worker_ray_cannot_place_is_named_with_what_it_asked_for():
    # (a loaded machine may not place the small one within the 2 s either: it is named then too)
    with pytest.raises(RuntimeError, match=r"Ray placed no actor for worker\(s\) (small, )?big within 2 s: no node has "
                                           r"what they ask for \((small: .*; )?big: Worker\(num_gpus=1, num_cpus=64.*"
                                           r"Ask for less"):
        Engine({"small": Worker(null=True), "big": Worker(null=True, num_cpus=64)}, start_timeout=2)


def test_a_bad_worker_set_is_refused_before_ray_starts_anything():
    with pytest.raises(ValueError, match=r"'max_in_flight' must be a positive int \(got 0\)"):
        Engine(["a"], max_in_flight=0)
    with pytest.raises(ValueError, match=r"worker 'a' is named twice"):
        Engine(["a", "a"])
    with pytest.raises(ValueError, match=r"'start_timeout' must be a positive number of seconds \(got 0\)"):
        Engine(["a"], start_timeout=0)


# -- fragments and links ---------------------------------------------------------------------------------------
def test_each_worker_builds_its_fragment_and_a_host_link_runs_every_frame(dist):
    engine, first, second = dist
    frame = engine.tick()
    assert isinstance(frame, DistributedFrame) and frame.complete
    assert [b.desc.name for b in ray.get(engine.actor("a").describe.remote()).blocks] == ["first"]
    assert [b.desc.name for b in ray.get(engine.actor("b").describe.remote()).blocks] == ["second"]
    assert engine.describe().transports() == {"first.out -> second.x": "host"}
    assert engine.placement(second) == "b"
    before = ray.get(engine.actor("b").stats.remote())["received"]["first.out -> second.x"]
    for _ in range(3):
        engine.tick()
    after = ray.get(engine.actor("b").stats.remote())["received"]["first.out -> second.x"]
    assert after == before + 3
    assert engine.read(second["out"]).shape == (N,)  # the null driver computes nothing: zeros of the port's shape
    assert "host (2 KiB a frame)" in engine.to_dot()


def test_the_picture_is_saved_as_dot_text_and_a_bad_format_is_named(dist, tmp_path):
    engine, first, second = dist
    path = engine.save_graph(tmp_path / "pipeline.dot")
    assert path.read_text() == engine.to_dot() and "worker a (null driver)" in path.read_text()
    with pytest.raises(ValueError, match=r"format 'bmp' is not one save_graph writes"):
        engine.save_graph(tmp_path / "pipeline.bmp")


def test_a_parameter_set_on_the_driver_reaches_its_worker_as_a_hot_update(dist):
    engine, first, second = dist
    engine.tick()
    frames: list[FragmentFrame] = []
    sub = engine.frames.subscribe(frames.append)
    second.params["scale"].value = 6.5
    frame = engine.tick()
    sub.dispose()
    assert frame.fragments["b"].tiers == (rxcuda.Tier.PARAMETERS,) and frame.fragments["a"].tiers == ()
    assert ray.get(engine.actor("b").describe.remote()).blocks[0].values["scale"] == 6.5
    assert sorted(f.worker for f in frames) == ["a", "b"] and {f.index for f in frames} == {frame.index}


def test_a_bound_observable_crosses_coalesced_latest_value_wins(dist):
    engine, first, _ = dist
    knob = Subject()
    binding = engine.bind(first.params["scale"], knob)
    for v in range(100):
        knob.on_next(float(v))
    frame = engine.tick()
    assert frame.fragments["a"].tiers == (rxcuda.Tier.PARAMETERS,)
    assert ray.get(engine.actor("a").describe.remote()).blocks[0].values["scale"] == 99.0
    knob.on_next("loud")  # refused on the driver: a diagnostic, the binding lives on
    knob.on_next(3.0)
    engine.tick()
    assert ray.get(engine.actor("a").describe.remote()).blocks[0].values["scale"] == 3.0
    binding.dispose()


def test_a_remote_port_is_a_local_observable(dist):
    engine, first, second = dist
    got: list = []
    sub = engine.observe(second["out"], every=2).subscribe(got.append)
    start = engine.tick().index
    for _ in range(4):
        engine.tick()
    sub.dispose()
    expected = [i for i in range(start, start + 5) if i % 2 == 0]
    assert len(got) == len(expected) and all(a.shape == (N,) and a.dtype == np.float32 for a in got)


def test_feed_streams_arrays_to_a_remote_input(dist):
    engine, first, _ = dist
    source = Subject()
    sub = engine.feed(first["x"], source)
    diags: list[FragmentDiagnostic] = []
    dsub = engine.diagnostics.subscribe(diags.append)
    source.on_next(np.full(N, 2.0, np.float32))
    source.on_next(np.ones(3, np.int64))  # refused: a driver diagnostic naming the port
    engine.tick()
    dsub.dispose()
    sub.dispose()
    assert [d.worker for d in diags if "feed" in d.message] == ["driver"]
    assert "first.x" in str(diags[0])


def test_an_ipc_link_steps_producer_and_consumer_at_once_and_meets_on_its_board():
    engine = _two()
    try:
        first = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"), on="a")
        second = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"), on="b")
        engine.connect(first["out"], second["x"], transport="ipc")  # null workers: the slots are shared memory
        engine.write(first["x"], np.ones(N, np.float32))
        assert engine.describe().transports() == {"first.out -> second.x": "ipc"}
        assert "ipc (2 KiB a frame)" in engine.to_dot()
        engine.tick()
        ray.get(engine.actor("a").throttle.remote(0.3))  # the producer's step takes 0.3 s
        for _ in range(3):
            assert engine.tick().complete
        ray.get(engine.actor("a").throttle.remote(0))
        stats = ray.get(engine.actor("b").stats.remote())
        assert stats["received"] == {"first.out -> second.x": 4} and stats["skipped"] == {}
        # the consumer's step was running before its producer's had published: the two were in flight together
        assert stats["waited"] >= 1
        extra = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="extra"), on="a")
        engine.write(extra["x"], np.ones(N, np.float32))  # a's fragment is rebuilt: a new board; b's is not
        for _ in range(2):
            assert engine.tick().complete
        stats = ray.get(engine.actor("b").stats.remote())
        assert stats["received"] == {"first.out -> second.x": 6} and stats["skipped"] == {}
    finally:
        engine.close()
    assert not [n for n in os.listdir(_board_dir()) if n.startswith(f"rxcuda-{engine._session}-")]


def _board_dir() -> str:
    from rxcuda.distributed._board import board_dir

    return board_dir()


def test_a_slow_worker_slows_its_producer_and_frames_in_flight_stay_bounded(dist):
    engine, first, second = dist
    engine.tick()
    counts, most = run_with_slow_b(engine, 1.5)  # far slower than the 500 frames a second asked
    assert 10 <= counts["b"] <= 40
    assert counts["a"] <= counts["b"] + engine.max_in_flight + 1  # a was held back to b's pace
    assert most <= engine.max_in_flight


# -- faults and lifetime -----------------------------------------------------------------------------------------
def test_a_killed_worker_is_a_diagnostic_restarts_and_rebuilds_with_the_last_values():
    engine = Engine({"a": Worker(null=True), "b": Worker(null=True)}, standby=False)  # Ray's restart
    try:
        first = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"), on="a")
        second = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"), on="b")
        engine.connect(first["out"], second["x"])
        engine.write(first["x"], np.ones(N, np.float32))
        second.params["scale"].value = 9.0
        engine.tick()
        old_pid = engine.where("b")["pid"]
        diags: list[FragmentDiagnostic] = []
        engine.diagnostics.subscribe(diags.append)
        ray.kill(engine.actor("b"), no_restart=False)
        second.params["scale"].value = 11.0  # set while b is down: it arrives once b is back
        frames, back = [], False
        deadline = time.time() + 60  # a restart takes ~0.1-1 s; far longer on a loaded 2-core machine
        while time.time() < deadline:
            f = engine.tick()
            frames.append(f)
            if any(d.severity == "info" for d in diags):
                back = True
            if back and f.complete:
                break
            time.sleep(0.05)
        assert back and frames[-1].complete, [str(d) for d in diags]
        assert all(f.fragments["a"] is not None for f in frames), [str(d) for d in diags]  # a kept running
        died = [d for d in diags if d.severity == "error"]
        assert died[0].worker == "b" and "worker 'b' died" in died[0].message and "Ray restarts it" in died[0].message
        assert "worker 'b' is back" in [d for d in diags if d.severity == "info"][0].message
        assert engine.where("b")["pid"] != old_pid
        engine.tick()
        assert ray.get(engine.actor("b").describe.remote()).blocks[0].values["scale"] == 11.0
    finally:
        engine.close()


@pytest.mark.parametrize("transport", ["host", "ipc"])
def test_when_a_producer_dies_only_it_is_reported_and_its_consumer_skips_until_it_is_back(transport):
    engine = _two()
    try:
        first = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"), on="a")
        second = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"), on="b")
        engine.connect(first["out"], second["x"], transport=transport)
        engine.write(first["x"], np.ones(N, np.float32))
        engine.tick()
        b_pid = engine.where("b")["pid"]
        diags: list[FragmentDiagnostic] = []
        engine.diagnostics.subscribe(diags.append)
        engine.actor("a").crash.remote()  # the process ends at once, as a fault would end it
        deadline = time.time() + 60
        while time.time() < deadline:
            f = engine.tick()
            if f.complete and any(d.severity == "info" for d in diags):
                break
            time.sleep(0.05)
        assert f.complete, [str(d) for d in diags]
        # b was never reported dead
        assert {d.worker for d in diags if d.severity == "error"} == {"a"}, [str(d) for d in diags]
        assert engine.where("b")["pid"] == b_pid  # and never restarted
        received = ray.get(engine.actor("b").stats.remote())["received"]["first.out -> second.x"]
        for _ in range(3):
            assert engine.tick().complete
        # the link carries frames again: from the restarted producer (over ipc: its new board)
        assert ray.get(engine.actor("b").stats.remote())["received"]["first.out -> second.x"] == received + 3
    finally:
        engine.close()


def test_close_leaves_no_worker_process_and_refuses_verbs_after():
    engine = _two()
    first = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"), on="a")
    engine.write(first["x"], np.ones(N, np.float32))
    assert set(engine.tick().fragments) == {"a"}  # b holds no block: it is not stepped
    got: list = []
    done: list = []
    engine.observe(first["out"]).subscribe(got.append, on_completed=lambda: done.append(True))
    pids = [engine.where(w)["pid"] for w in ("a", "b")]
    engine.close()
    engine.close()  # twice is fine
    deadline = time.time() + 20
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)
    assert done == [True]  # observables complete
    with pytest.raises(rxcuda.EngineClosedError, match=r"the distributed engine is closed; create a new one"):
        engine.tick()


def test_the_docs_snippet_runs_as_pasted(capsys):
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    page = (root / "docs" / "distributed.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    exec(compile(snippet, "docs/distributed.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out == ["{'gain.out -> level.x': 'host'}", "('parameters',)"]


@pytest.fixture
def fresh():
    engine = _two()
    first = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="first"), on="a")
    second = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"), on="b")
    engine.connect(first["out"], second["x"])
    engine.write(first["x"], np.ones(N, np.float32))
    engine.tick()
    yield engine, first, second
    engine.close()


def test_a_change_that_cannot_be_built_is_a_diagnostic_the_last_fragments_run_and_rebuild_raises_it(fresh):
    engine, first, second = fresh
    diags: list[FragmentDiagnostic] = []
    engine.diagnostics.subscribe(diags.append)
    engine.disconnect(first["out"], second["x"])  # second.x is now neither connected nor fed
    assert engine.tick().complete  # both workers run their last good fragments
    (d,) = [d for d in diags if "could not be built" in d.message]
    assert d.worker == "driver" and d.severity == "error" and "the workers keep their last good fragments" in d.message
    assert "second.x is neither connected nor bound" in d.message
    with pytest.raises(rxcuda.ValidationError, match=r"required input second.x is neither connected nor bound"):
        engine.rebuild()
    engine.connect(first["out"], second["x"])
    engine.rebuild()
    assert engine.tick().complete


def test_removing_a_block_rebuilds_its_worker_and_completes_its_observers(fresh):
    engine, first, second = fresh
    third = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="third"), on="b")
    engine.connect(second["out"], third["x"])
    done: list = []
    engine.observe(third["out"]).subscribe(on_completed=lambda: done.append(True))
    engine.tick()
    assert [b.desc.name for b in ray.get(engine.actor("b").describe.remote()).blocks] == ["second", "third"]
    engine.remove(third)
    assert done == [True]
    assert engine.tick().complete
    assert [b.desc.name for b in ray.get(engine.actor("b").describe.remote()).blocks] == ["second"]


def test_an_observer_that_raises_is_a_diagnostic_and_the_frames_go_on(fresh):
    engine, first, second = fresh
    diags: list[FragmentDiagnostic] = []
    engine.diagnostics.subscribe(diags.append)

    def broken(_array):
        raise ZeroDivisionError("oops")

    engine.observe(second["out"]).subscribe(broken)
    assert engine.tick().complete and engine.tick().complete
    assert [d.worker for d in diags if "ZeroDivisionError: oops" in d.message] == ["driver", "driver"]


def test_new_code_or_a_new_launch_on_a_remote_block_changes_it_in_place(fresh):
    engine, first, second = fresh
    pid, rebuilds = engine.where("a")["pid"], ray.get(engine.actor("a").stats.remote())["rebuilds"]
    first.set_launch(threads=N // 2)
    frame = engine.tick()
    assert frame.fragments["a"].tiers == (rxcuda.Tier.PARAMETERS,) and frame.fragments["b"].tiers == ()
    code = rxcuda.load_kernel_file(rxcuda.kernels.path(PTX))
    first.set_code(None, attrs.evolve(code, key="a new build of the same kernel"))
    frame = engine.tick()
    assert frame.fragments["a"].tiers == (rxcuda.Tier.CODE,)
    assert ray.get(engine.actor("a").describe.remote()).blocks[0].desc.kernels[0].code.key == \
        "a new build of the same kernel"
    assert ray.get(engine.actor("a").stats.remote())["rebuilds"] == rebuilds and engine.where("a")["pid"] == pid
