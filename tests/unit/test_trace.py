"""engine.trace: Chrome/Perfetto trace-event JSON from the engine's Observables, on the null driver.

Every event is checked against the trace-event format (the keys and types each phase needs, durations
non-negative, slices of one track nested or apart); the file holds one slice per frame, named tracks, a
counter per parameter set, update, reload and diagnostic instants; per-block, per-kernel and host-phase
times (which the profiling levels add to Frame) become their own slices, tested with Frame records made by
hand. If Perfetto's Python trace processor is installed, it loads the file and its slices are queried.
"""

from __future__ import annotations

import json
import math
from typing import NamedTuple

import numpy as np
import pytest

import rxcuda
from rxcuda.cuda import NullDriver
from rxcuda.view import _trace
from rxcuda.view._trace import GPU, HOST, PARAMS, build_events, read_trace, summarize

N = 64
KERNELS = "kernels"
PHASES = {"X", "i", "C", "M"}


@pytest.fixture
def engine():
    e = rxcuda.Engine(driver=NullDriver())
    yield e
    e.close()


def chain(engine):
    add = engine.add(rxcuda.Block.from_kernel(f"{KERNELS}/vector_add.ptx", size=N))
    mul = engine.add(rxcuda.Block.from_kernel(f"{KERNELS}/scalar_mul.ptx", size=N, scale=3.0))
    engine.connect(add["out"], mul["x"])
    engine.write(add["a"], np.ones(N, np.float32))
    engine.write(add["b"], np.ones(N, np.float32))
    return add, mul


def load(path) -> list[dict]:
    doc = json.loads(path.read_text())
    assert set(doc) >= {"traceEvents", "displayTimeUnit"} and doc["displayTimeUnit"] == "ms"
    validate(doc["traceEvents"])
    return doc["traceEvents"]


def validate(events: list[dict]) -> None:
    """The trace-event format: each phase's keys and types; durations and times non-negative and finite;
    complete events of one thread either nested or apart; every track used is named by an "M" event."""
    named = set()
    for e in events:
        assert isinstance(e, dict), e
        assert isinstance(e.get("name"), str) and e["name"], e
        assert e.get("ph") in PHASES, e
        assert isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        assert isinstance(e.get("ts"), int | float) and math.isfinite(e["ts"]) and e["ts"] >= 0, e
        if "args" in e:
            assert isinstance(e["args"], dict), e
        if e["ph"] == "X":
            assert isinstance(e.get("dur"), int | float) and math.isfinite(e["dur"]) and e["dur"] >= 0, e
            assert isinstance(e.get("cat"), str), e
        elif e["ph"] == "i":
            assert e.get("s") in ("g", "p", "t"), e
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, int | float) and math.isfinite(v) for v in e["args"].values()), e
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index"), e
            if e["name"] == "thread_name":
                assert isinstance(e["args"]["name"], str) and e["args"]["name"]
                named.add((e["pid"], e["tid"]))
    used = {(e["pid"], e["tid"]) for e in events if e["ph"] != "M"}
    assert used <= named, f"tracks without a thread_name: {used - named}"
    tids = {}
    for pid, tid in named:
        assert tids.setdefault(tid, pid) == pid, f"thread {tid} appears under two processes"
    by_track: dict = {}
    for e in events:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for track, slices in by_track.items():
        open_: list = []
        for start, end, name in sorted(slices, key=lambda s: (s[0], -s[1])):
            while open_ and open_[-1][1] <= start + 1e-6:
                open_.pop()
            assert not open_ or end <= open_[-1][1] + 1e-3, f"{name} overlaps {open_[-1][2]} on {track}"
            open_.append((start, end, name))


def thread_names(events, pid=None) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name" and (pid is None or e["pid"] == pid)}


def of(events, ph, cat=None) -> list[dict]:
    return [e for e in events if e["ph"] == ph and (cat is None or e.get("cat") == cat)]


# -- a trace of the engine ----------------------------------------------------------------------------------
def test_a_trace_has_one_slice_per_frame_counters_updates_reloads_and_diagnostics(engine, tmp_path):
    add, mul = chain(engine)
    path = tmp_path / "trace.json"
    with engine.trace(path) as trace:
        engine.tick()                                                      # frame 1: structure
        mul.params["scale"].value = 0.5
        engine.tick()                                                      # frame 2: parameters
        add.set_code(None, rxcuda.load_kernel_file(f"{KERNELS}/vector_sub.ptx"))
        engine.tick()                                                      # frame 3: code
        add.set_code(None, rxcuda.load_kernel_file(f"{KERNELS}/saxpy.ptx"))
        engine.tick()                                                      # frame 4: the rebuild fails
        for _ in range(6):
            engine.tick()
    assert trace.done and trace.frames == 10
    events = load(path)

    frames = of(events, "X", "frame")
    assert [e["name"] for e in frames] == [f"frame {i}" for i in range(1, 11)]
    assert [e["args"]["tiers"] for e in frames[:3]] == [["structure"], ["parameters"], ["code"]]
    assert frames[3]["args"]["state"] == "error"
    starts = [e["ts"] for e in frames]
    assert starts == sorted(starts)
    assert thread_names(events, HOST)[frames[0]["tid"]] == "frames"

    updates = of(events, "i", "update")
    assert [(u["args"]["frame"], u["args"]["tiers"]) for u in updates][:3] == [
        (1, ["structure"]), (2, ["parameters"]), (3, ["code"])]
    assert updates[1]["name"] == "update parameters" and updates[1]["args"]["blocks"] == ["scalar_mul"]

    reloads = of(events, "i", "reload")
    # new code of the same layout is a reload; saxpy's other layout is a structure change (its update says so)
    assert [r["name"] for r in reloads] == ["reload vector_add/vector_add"]
    assert reloads[0]["args"]["frame"] == 3

    diagnostics = of(events, "i", "diagnostic")
    assert diagnostics and diagnostics[0]["name"] == "error: vector_add"
    assert diagnostics[0]["args"]["frame"] == 4 and "rebuild failed" in diagnostics[0]["args"]["message"]

    scale = [c for c in of(events, "C") if c["name"] == "scalar_mul.scale"]
    assert [c["args"]["value"] for c in scale] == [3.0, 0.5]  # the value at the start, then the one set
    assert {c["pid"] for c in of(events, "C")} == {PARAMS}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes[HOST] == "rxcuda host" and processes[PARAMS] == "parameters"


def test_gpu_time_gets_its_own_track(tmp_path):
    with rxcuda.Engine(driver=NullDriver(), timing=True) as engine:
        chain(engine)
        with engine.trace(tmp_path / "t.json"):
            for _ in range(5):
                engine.tick()
    events = load(tmp_path / "t.json")
    gpu = of(events, "X", "gpu")
    assert [e["name"] for e in gpu] == [f"GPU frame {i}" for i in range(1, 6)]
    assert {e["pid"] for e in gpu} == {GPU} and thread_names(events, GPU)[gpu[0]["tid"]] == "frame GPU time"
    assert all(e["args"]["gpu_us"] is not None for e in of(events, "X", "frame"))


def test_frames_n_stops_after_n_frames_and_writes(engine, tmp_path):
    chain(engine)
    trace = engine.trace(tmp_path / "t.json", frames=3)
    for _ in range(5):
        engine.tick()
    assert trace.done and trace.frames == 3
    assert trace.wait(0) == tmp_path / "t.json"
    assert len(of(load(tmp_path / "t.json"), "X", "frame")) == 3
    assert trace.stop() == tmp_path / "t.json"  # once written, stop only returns the path


def test_frames_n_with_run_is_waited_for(engine, tmp_path):
    chain(engine)
    engine.tick()
    trace = engine.trace(tmp_path / "t.json", frames=10)
    running = engine.run(500)
    try:
        assert trace.wait(10) == tmp_path / "t.json"
    finally:
        running.dispose()
    assert len(of(load(tmp_path / "t.json"), "X", "frame")) == 10


def test_recording_does_no_json_work_until_the_end(engine, tmp_path, monkeypatch):
    chain(engine)
    built = []
    real = _trace.build_events
    monkeypatch.setattr(_trace, "build_events", lambda *a, **k: built.append(1) or real(*a, **k))
    dumped = []
    real_dumps = json.dumps
    monkeypatch.setattr(_trace.json, "dumps", lambda *a, **k: dumped.append(1) or real_dumps(*a, **k))
    trace = engine.trace(tmp_path / "t.json")
    for _ in range(20):
        engine.tick()
    assert built == [] and dumped == [] and not (tmp_path / "t.json").exists()
    trace.stop()
    assert built == [1] and dumped and (tmp_path / "t.json").exists()


def test_closing_the_engine_ends_and_writes_the_trace(tmp_path):
    engine = rxcuda.Engine(driver=NullDriver())
    chain(engine)
    trace = engine.trace(tmp_path / "t.json", frames=100)
    engine.tick()
    engine.close()
    assert trace.done and trace.wait(0) == tmp_path / "t.json"
    assert len(of(load(tmp_path / "t.json"), "X", "frame")) == 1


def test_a_finished_trace_costs_the_engine_nothing(engine, tmp_path):
    chain(engine)
    with engine.trace(tmp_path / "t.json"):
        engine.tick()
    assert not engine._frames.observers and not engine._updater.updates.observers


def test_summary(engine, tmp_path):
    _add, mul = chain(engine)
    with engine.trace(tmp_path / "t.json") as trace:
        for i in range(4):
            mul.params["scale"].value = float(i + 1)
            engine.tick()
    s = trace.summary()
    assert s.frames == 4 and s.updates == {"structure": 1, "parameters": 3}
    assert s.host_max_us >= s.host_p99_us >= s.host_median_us > 0 and s.gpu_median_us is None
    assert str(s).startswith("4 frames: host median ") and "updates: structure 1, parameters 3" in str(s)
    assert summarize(tmp_path / "t.json") == s  # the file says what the recording said


# -- profiling levels: per-block, per-kernel and phase times (Frame records made by hand) -------------------
class ProfiledFrame(NamedTuple):
    """A Frame as the profiling levels make it (blocks, kernels, phases): made by hand here."""

    index: int  # type: ignore[assignment]
    host_us: float
    tiers: tuple
    state: str
    launched: bool
    gpu_us: float | None = None
    frames: int = 1
    blocks: dict | None = None
    kernels: dict | None = None
    phases: dict | None = None


def profiled(n: int, *, phases=True, blocks=True, kernels=True) -> list:
    t0, out = 10_000_000, []
    for i in range(1, n + 1):
        end = t0 + i * 1_000_000  # a frame a millisecond
        out.append((end, ProfiledFrame(
            i, 100.0, ("parameters",) if i == 2 else (), "ok", True, 40.0,
            blocks={"add": 15.0, "mul": 20.0, "comp/inner": 4.0} if blocks else None,
            kernels={"add/vector_add": 15.0, "mul/scale": 12.0, "mul/bias": 10.0} if kernels else None,
            phases={"apply": 20.0, "launch": 5.0, "sync": 70.0} if phases else None)))
    return out


def test_per_block_times_give_one_track_per_block_and_one_per_kernel():
    events = build_events(0, profiled(4), device="H200")
    validate(events)
    names = thread_names(events, GPU)
    assert sorted(n for n in names.values() if n.startswith("block ")) == [
        "block add", "block comp/inner", "block mul"]
    assert sorted(n for n in names.values() if n.startswith("kernel ")) == [
        "kernel add/vector_add", "kernel mul/bias", "kernel mul/scale"]
    blocks = of(events, "X", "block")
    assert len(blocks) == 12 and {e["pid"] for e in blocks} == {GPU}
    first = {e["name"]: e for e in blocks if e["args"]["index"] == 1}
    assert first["mul"]["ts"] == pytest.approx(first["add"]["ts"] + 15.0)  # one after another, in the order listed
    kernels = {e["name"]: e for e in of(events, "X", "kernel") if e["args"]["index"] == 1}
    assert kernels["mul/scale"]["ts"] == pytest.approx(first["mul"]["ts"])  # a block's kernels from its start
    assert kernels["mul/bias"]["ts"] == pytest.approx(first["mul"]["ts"] + 12.0)
    order = {e["tid"]: e["args"]["sort_index"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_sort_index" and e["pid"] == GPU}
    rows = [names[tid] for tid in sorted(order, key=order.get)]  # each block's kernels right below it
    assert rows == ["frame GPU time", "block add", "kernel add/vector_add", "block mul", "kernel mul/scale",
                    "kernel mul/bias", "block comp/inner"]
    process = [e for e in events if e["ph"] == "M" and e["name"] == "process_name" and e["pid"] == GPU]
    assert process[0]["args"]["name"] == "GPU: H200"


class UnitTime(NamedTuple):
    """A block's or kernel's time as the profiling levels measure it (start/end from the frame's GPU start)."""

    gpu_us: float
    start_us: float
    end_us: float


def test_measured_starts_place_blocks_where_they_ran():
    # two blocks side by side (a fork in the graph), then a third after both
    frame = ProfiledFrame(1, 200.0, (), "ok", True, 50.0,
                          blocks={"left": UnitTime(30.0, 0.0, 30.0), "right": UnitTime(20.0, 5.0, 25.0),
                                  "join": UnitTime(10.0, 30.0, 40.0)},
                          kernels={"left/a": UnitTime(30.0, 0.0, 30.0)})
    events = build_events(0, [(1_000_000, frame)])
    validate(events)
    gpu = of(events, "X", "gpu")[0]
    at = {e["name"]: e["ts"] - gpu["ts"] for e in of(events, "X") if e.get("cat") in ("block", "kernel")}
    assert at == pytest.approx({"left": 0.0, "right": 5.0, "join": 30.0, "left/a": 0.0})
    assert of(events, "X", "frame")[0]["args"]["blocks"] == {"left": 30.0, "right": 20.0, "join": 10.0}


def test_gpu_times_that_arrive_after_their_frame_are_used():
    class FrameTimes(NamedTuple):
        frame: int
        gpu_us: float | None
        blocks: dict | None
        kernels: dict | None

    frames = [(i * 1_000_000, ProfiledFrame(i, 50.0, (), "ok", True)) for i in (1, 2)]  # sync=False: no times
    late = [(0, FrameTimes(1, 30.0, {"b": UnitTime(30.0, 0.0, 30.0)}, None))]
    events = build_events(0, frames, timings=late)
    validate(events)
    assert [e["name"] for e in of(events, "X", "gpu")] == ["GPU frame 1"]
    assert of(events, "X", "frame")[0]["args"]["gpu_us"] == 30.0 and len(of(events, "X", "block")) == 1


def test_host_phases_nest_in_their_frame_and_the_gpu_starts_after_apply():
    events = build_events(0, profiled(3))
    validate(events)
    frame = of(events, "X", "frame")[0]
    phases = [e for e in of(events, "X", "phase") if frame["ts"] <= e["ts"] <= frame["ts"] + frame["dur"]][:3]
    assert [p["name"] for p in phases] == ["apply", "launch", "sync"]
    assert phases[0]["ts"] == frame["ts"] and phases[1]["ts"] == pytest.approx(frame["ts"] + 20.0)
    assert frame["args"]["phases"] == {"apply": 20.0, "launch": 5.0, "sync": 70.0}
    gpu = of(events, "X", "gpu")[0]
    assert gpu["ts"] == pytest.approx(frame["ts"] + 20.0) and gpu["dur"] == 40.0


@pytest.mark.parametrize("level, kernels, phases", [("per_block", 0, 0), ("per_kernel", 2, 0), ("deep", 2, 3)])
def test_the_engines_profiling_levels_fill_the_tracks(tmp_path, level, kernels, phases):
    if not hasattr(rxcuda.Engine, "profile"):
        pytest.skip("this engine has no profiling levels (engine.profile)")
    with rxcuda.Engine(driver=NullDriver(), profile=level) as engine:
        chain(engine)
        with engine.trace(tmp_path / "t.json"):
            for _ in range(5):
                engine.tick()
    events = load(tmp_path / "t.json")
    names = list(thread_names(events, GPU).values())
    assert sorted(n for n in names if n.startswith("block ")) == ["block scalar_mul", "block vector_add"]
    assert len([n for n in names if n.startswith("kernel ")]) == kernels
    assert len(of(events, "X", "block")) == 10 and len(of(events, "X", "phase")) == 5 * phases
    assert len(of(events, "X", "gpu")) == 5


def test_frames_without_profiling_have_no_block_tracks():
    events = build_events(0, profiled(3, phases=False, blocks=False, kernels=False))
    validate(events)
    assert not of(events, "X", "block") and not of(events, "X", "phase")
    assert set(thread_names(events, GPU).values()) == {"frame GPU time"}
    gpu, frame = of(events, "X", "gpu")[0], of(events, "X", "frame")[0]
    assert gpu["ts"] + gpu["dur"] == pytest.approx(frame["ts"] + frame["dur"])  # ends where the frame ends


def test_kernels_without_block_times_follow_each_other_per_block():
    events = build_events(0, profiled(2, blocks=False))
    validate(events)
    assert not of(events, "X", "block") and len(of(events, "X", "kernel")) == 6
    kernels = {e["name"]: e for e in of(events, "X", "kernel") if e["args"]["index"] == 1}
    assert kernels["mul/bias"]["ts"] == pytest.approx(kernels["mul/scale"]["ts"] + 12.0)


def test_a_batch_is_one_slice_named_by_its_frames():
    frame = ProfiledFrame(100, 500.0, (), "ok", True, None, frames=50)
    events = build_events(0, [(1_000_000, frame)])
    validate(events)
    assert of(events, "X", "frame")[0]["name"] == "frames 51-100"


def test_overlapping_placements_are_moved_apart():
    # a frame published late by another subscriber would overlap the next one: the track stays apart
    frames = [(1_000_000, ProfiledFrame(1, 900.0, (), "ok", True, None)),
              (1_500_000, ProfiledFrame(2, 900.0, (), "ok", True, None))]
    events = build_events(0, frames)
    validate(events)


def test_values_that_are_not_numbers_are_not_counted():
    events = build_events(0, [], values=[(0, 1, "flag", True), (0, 1, "v", (1, 2)), (0, 1, "nan", float("nan")),
                                         (0, 1, "big", np.int64(7))], names={1: "b"})
    validate(events)
    assert {c["name"]: c["args"]["value"] for c in of(events, "C")} == {"b.flag": 1.0, "b.big": 7.0}


# -- reading back and bad inputs -----------------------------------------------------------------------------
def test_read_trace_gives_frames_and_marks(engine, tmp_path):
    chain(engine)
    with engine.trace(tmp_path / "t.json"):
        for _ in range(3):
            engine.tick()
    data = read_trace(tmp_path / "t.json")
    assert [f.index for f in data.frames] == [1, 2, 3] and data.frames[0].tiers == ("structure",)
    assert [u.tiers for u in data.updates] == [("structure",)] and data.device == "Null Device"


@pytest.mark.parametrize("content, message", [
    ("not json", "is not a JSON trace"),
    ('{"events": []}', "no 'traceEvents' list"),
    ('{"traceEvents": [{"ph": "X", "name": "x", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]}', "holds no rxcuda frames"),
])
def test_read_trace_says_what_is_wrong_with_a_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        read_trace(path)
    assert "engine.trace(path)" in str(err.value) and str(path) in str(err.value)


def test_read_trace_of_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trace file .*engine.trace"):
        read_trace(tmp_path / "none.json")


@pytest.mark.parametrize("frames", [0, -1, True, 2.5, "10"])
def test_frames_must_be_a_positive_int(engine, tmp_path, frames):
    with pytest.raises(ValueError, match="positive number of frames"):
        engine.trace(tmp_path / "t.json", frames=frames)


def test_the_folder_must_exist(engine, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; create it"):
        engine.trace(tmp_path / "missing" / "t.json")


def test_the_path_must_not_be_a_folder(engine, tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder"):
        engine.trace(tmp_path)


def test_the_path_must_be_a_path(engine):
    with pytest.raises(TypeError, match="file path"):
        engine.trace(42)


def test_a_closed_engine_cannot_be_traced(tmp_path):
    engine = rxcuda.Engine(driver=NullDriver())
    engine.close()
    with pytest.raises(rxcuda.EngineClosedError, match="closed"):
        engine.trace(tmp_path / "t.json")


def test_only_an_engine_is_traced(tmp_path):
    with pytest.raises(TypeError, match="rxcuda.Engine"):
        rxcuda.view.trace(object(), tmp_path / "t.json")


def test_wait_without_frames_says_how_to_end_the_trace(engine, tmp_path):
    trace = engine.trace(tmp_path / "t.json")
    with pytest.raises(ValueError, match=r"trace.stop\(\)"):
        trace.wait(0)
    trace.stop()


def test_wait_times_out_naming_the_frames_recorded(engine, tmp_path):
    chain(engine)
    trace = engine.trace(tmp_path / "t.json", frames=5)
    engine.tick()
    with pytest.raises(TimeoutError, match="1 of 5 frames"):
        trace.wait(0.01)
    trace.stop()


# -- Perfetto's own reader, where installed ----------------------------------------------------------------
def test_perfetto_trace_processor_loads_the_trace(engine, tmp_path):
    tp_module = pytest.importorskip("perfetto.trace_processor",
                                    reason="Perfetto's Python trace processor is not installed (pip install perfetto)")
    chain(engine)
    with engine.trace(tmp_path / "t.json"):
        for _ in range(20):
            engine.tick()
    try:
        tp = tp_module.TraceProcessor(trace=str(tmp_path / "t.json"))
    except Exception as e:  # it fetches its trace_processor binary on first use, which needs the network
        pytest.skip(f"Perfetto's trace processor could not start here: {e}")
    try:
        rows = list(tp.query("select name from slice where category = 'frame' order by ts"))
        assert [r.name for r in rows] == [f"frame {i}" for i in range(1, 21)]
        threads = {r.name for r in tp.query("select name from thread where name is not null")}
        assert {"frames", "updates"} <= threads
    finally:
        tp.close()
