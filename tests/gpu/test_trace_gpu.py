"""engine.trace on a GPU: the demo pipeline (vector_add -> scalar_mul -> append_above, as ``rxcuda demo``
builds it) traced for 100 frames gives 100 frame slices, and with ``engine.profile = "per_block"`` one GPU
track per block with a measured slice per frame; the frame-time picture draws from it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import rxcuda
from rxcuda._cli import SCALES, demo_blocks

SIZE = 1 << 16
FRAMES = 100


def demo(engine, kernels):
    blocks, connections = demo_blocks(kernels, SIZE)
    for b in blocks:
        engine.add(b)
    for src, dst in connections:
        engine.connect(src, dst)
    rng = np.random.default_rng(7)
    add = blocks[0]
    engine.write(add["a"], rng.standard_normal(SIZE).astype(np.float32))
    engine.write(add["b"], rng.standard_normal(SIZE).astype(np.float32))
    return blocks


def run(engine, blocks, path) -> list[dict]:
    mul = blocks[1]
    trace = engine.trace(path, frames=FRAMES)
    for i in range(FRAMES + 5):  # the trace stops by itself after FRAMES
        if i and i % 25 == 0:
            mul.params["scale"].value = SCALES[(i // 25) % len(SCALES)]
        engine.tick()
    assert trace.wait(0) == path
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    return doc["traceEvents"]


def thread_names(events, pid: int) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid}


def test_a_trace_of_100_demo_frames_has_100_frame_slices(engine, kernels, tmp_path):
    blocks = demo(engine, kernels)
    engine.tick()  # built before the trace: every traced frame is a plain one
    events = run(engine, blocks, tmp_path / "demo.json")
    frames = [e for e in events if e["ph"] == "X" and e.get("cat") == "frame"]
    assert len(frames) == FRAMES
    assert [e["args"]["index"] for e in frames] == list(range(2, FRAMES + 2))
    assert all(e["dur"] > 0 and math.isfinite(e["dur"]) for e in frames)
    updates = [e for e in events if e["ph"] == "i" and e.get("cat") == "update"]
    assert [u["args"]["tiers"] for u in updates] == [["parameters"]] * 3  # at ticks 25, 50 and 75
    scale = [e["args"]["value"] for e in events if e["ph"] == "C" and e["name"] == "scalar_mul.scale"]
    assert scale == [SCALES[0], SCALES[1], SCALES[2], SCALES[3]]  # the value at the start, then each one set


def test_per_block_profiling_gives_one_gpu_track_per_block(engine, kernels, tmp_path):
    from rxcuda.view._trace import GPU

    blocks = demo(engine, kernels)
    engine.profile = "per_block"
    engine.tick()
    events = run(engine, blocks, tmp_path / "blocks.json")
    names = thread_names(events, GPU)
    block_tracks = {tid: n.removeprefix("block ") for tid, n in names.items() if n.startswith("block ")}
    assert sorted(block_tracks.values()) == sorted(b.name for b in blocks)
    for tid, name in block_tracks.items():
        slices = [e for e in events if e["ph"] == "X" and e["tid"] == tid]
        assert len(slices) == FRAMES and all(e["name"] == name for e in slices)
        assert all(e["dur"] >= 0 for e in slices) and sum(e["dur"] for e in slices) > 0, f"{name}: no GPU time"
    gpu = [e for e in events if e["ph"] == "X" and e.get("cat") == "gpu"]
    assert len(gpu) == FRAMES and all(e["dur"] > 0 for e in gpu)
    summary = rxcuda.view.summarize(tmp_path / "blocks.json")
    assert summary.frames == FRAMES and summary.gpu_median_us > 0


def test_the_frame_time_picture_of_a_gpu_trace(engine, kernels, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install '.[view]')")
    blocks = demo(engine, kernels)
    engine.profile = "summary"
    events = run(engine, blocks, tmp_path / "t.json")
    assert sum(1 for e in events if e.get("cat") == "gpu") == FRAMES
    out = rxcuda.view.plot_frames(tmp_path / "t.json", tmp_path / "t.png")
    assert out.read_bytes().startswith(b"\x89PNG")
