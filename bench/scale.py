"""Cost that grows with the pipeline: a chain of N scalar_mul blocks, through the public API only.

    python bench/scale.py [--sizes 100 1000 10000] [--repeats 5] [--null]

For each N, one table row:
  blocks(code)  Block.from_kernel(code, ...) x N with one loaded KernelCode: total ms
  blocks(path)  Block.from_kernel("kernels/scalar_mul.ptx", ...) x N, as users write it: total ms
  declare       engine.add x N, engine.connect x N-1 and one engine.write: total ms, and µs per call
  first tick    the cold build: plan, load, allocate, build and instantiate the graph, launch, sync
  +1 block      add one block, connect it at the end of the chain, tick, wait for the frame (median of --repeats)
  -1 block      remove that block again, tick, wait for the frame (median of --repeats)
  plain tick    a tick with nothing to apply, and the wait for its frame (median of --repeats): the frame that
                +1/-1 block each include; the change's own work is the difference
  plan()        rxcuda.plan(engine.describe()) alone (median of --repeats); describe() beside it

and, for each N, a row of live editing (``--live-seconds``, 0 skips it): ``engine.run(60)`` while another
thread edits the chain four times a second (a block added at the end and connected, then removed again):
  edits         structural changes swapped in during the run
  swap ms       the frame thread's time for one structural change: the host time of the frame that swapped
                the new graph in, less the median frame's (median, and the largest)
  frames        frames produced of the clock's ticks (a tick the frame thread could not start in time merges
                into the next frame), and the largest gap between two frames in clock periods

Each timed section starts as timeit's do: after a collection, with the cycle collector paused until it ends.

Targets (issue 9, a 1000-block chain on an H100/H200): declaring ≤ 100 ms in all and growing linearly,
cold build ≤ 30 ms, one block added or removed ≤ 10 ms; issue 20: 1000 blocks declared by path ≤ 30 ms, cold
build ≤ 25 ms, one block added or removed ≤ 5 ms, the swap ≤ 0.5 ms, ≥ 99 % of a 60 Hz clock's frames produced
while editing, no gap over 1.5 periods. Needs a CUDA device: without one it says so in one line and exits with
status 2. ``--null`` runs on the null driver instead (no device): the host's share of each number, for profiling
the Python side.
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import statistics
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ELEMENTS = 1024  # per block: small kernels, so the engine's own costs are what the table shows


def _start() -> int:
    """Start a timed section as timeit does: after a collection, with the cycle collector paused until ``_ms``,
    so a section's time is its own work and not a collection that an earlier section's garbage triggers."""
    gc.collect()
    gc.disable()
    return time.perf_counter_ns()


def _ms(t0: int) -> float:
    ms = (time.perf_counter_ns() - t0) / 1e6
    gc.enable()
    return ms


def _tick_ok(engine) -> None:
    frame = engine.tick()
    if frame.state != "ok" or not frame.launched:
        bad = [f"{b.name}: {b.message}" for b in engine.blocks if b.state == "error"][:3]
        raise RuntimeError(f"the frame did not run cleanly ({frame.state}): {'; '.join(bad) or 'see diagnostics'}")


def measure(engine, n: int, code, repeats: int) -> dict[str, float]:
    """One row of the table for a chain of ``n`` blocks, built in ``engine`` (which must be empty)."""
    import numpy as np

    import rxcuda

    t0 = _start()
    blocks = [rxcuda.Block.from_kernel(code, size=ELEMENTS, scale=1.0, name=f"m{i}") for i in range(n)]
    by_code = _ms(t0)
    path = str(ROOT / "kernels" / "scalar_mul.ptx")
    t0 = _start()
    [rxcuda.Block.from_kernel(path, size=ELEMENTS, scale=1.0, name=f"p{i}") for i in range(n)]
    by_path = _ms(t0)
    data = np.ones(ELEMENTS, np.float32)
    t0 = _start()
    for b in blocks:
        engine.add(b)
    for src, dst in zip(blocks, blocks[1:], strict=False):
        engine.connect(src["out"], dst["x"])
    engine.write(blocks[0]["x"], data)
    declare = _ms(t0)

    t0 = _start()
    _tick_ok(engine)
    engine.synchronize()
    cold = _ms(t0)

    # each timed tick waits for its frame on the GPU: an edit's work, to the end of the frame that shows it, is its
    # own and not partly the next measurement's (a build waits for the frames in flight before it swaps)
    added, removed, plain = [], [], []
    for _ in range(repeats):
        t0 = _start()
        _tick_ok(engine)  # a frame with nothing to apply: what +1/-1 block's own tick costs anyway
        engine.synchronize()
        plain.append(_ms(t0))
        extra = rxcuda.Block.from_kernel(code, size=ELEMENTS, scale=1.0, name="extra")
        t0 = _start()
        engine.add(extra)
        engine.connect(blocks[-1]["out"], extra["x"])
        _tick_ok(engine)
        engine.synchronize()
        added.append(_ms(t0))
        t0 = _start()
        engine.remove(extra)
        _tick_ok(engine)
        engine.synchronize()
        removed.append(_ms(t0))

    described, planned = [], []
    for _ in range(repeats):
        t0 = _start()
        desc = engine.describe()
        described.append(_ms(t0))
        t0 = _start()
        rxcuda.plan(desc)
        planned.append(_ms(t0))

    for b in blocks:
        engine.remove(b)
    engine.tick()  # an empty pipeline: releases the chain's graph and buffers before the next size
    calls = n + (n - 1) + 1
    return {
        "code_ms": by_code,
        "path_ms": by_path,
        "declare_ms": declare,
        "per_call_us": declare / calls * 1e3,
        "cold_ms": cold,
        "add_ms": statistics.median(added),
        "remove_ms": statistics.median(removed),
        "tick_ms": statistics.median(plain),
        "plan_ms": statistics.median(planned),
        "describe_ms": statistics.median(described),
    }


def live(engine, n: int, code, seconds: float, rate: float = 60.0, edits_per_s: float = 4.0) -> dict[str, float]:
    """``engine.run(rate)`` over a chain of ``n`` blocks while another thread edits it ``edits_per_s`` times a
    second for ``seconds``: the frame-thread time of each swap, frames produced of the clock's ticks, the
    largest gap between frames."""
    import numpy as np

    import rxcuda

    blocks = [rxcuda.Block.from_kernel(code, size=ELEMENTS, scale=1.0, name=f"l{i}") for i in range(n)]
    for b in blocks:
        engine.add(b)
    for src, dst in zip(blocks, blocks[1:], strict=False):
        engine.connect(src["out"], dst["x"])
    engine.write(blocks[0]["x"], np.ones(ELEMENTS, np.float32))
    _tick_ok(engine)
    seen: list[tuple[float, float, bool]] = []  # (when emitted, host µs, swapped a new graph in)
    recording = threading.Event()

    def on_frame(f) -> None:
        if recording.is_set():
            seen.append((time.perf_counter(), f.host_us, "structure" in f.tiers))

    sub = engine.frames.subscribe(on_frame)
    running = engine.run(rate)
    time.sleep(0.5)  # settle
    stats = engine.loop.stats
    frames0, merged0 = stats.frames, stats.merged
    recording.set()
    extra = None
    t_end = time.perf_counter() + seconds
    next_edit = time.perf_counter()
    while time.perf_counter() < t_end:
        time.sleep(max(0.0, next_edit - time.perf_counter()))
        next_edit += 1.0 / edits_per_s
        if extra is None:
            extra = engine.add(rxcuda.Block.from_kernel(code, size=ELEMENTS, scale=1.0, name="live_extra"))
            engine.connect(blocks[-1]["out"], extra["x"])
        else:
            engine.remove(extra)
            extra = None
    recording.clear()
    produced, merged = stats.frames - frames0, stats.merged - merged0
    running.dispose()
    sub.dispose()
    if extra is not None:
        engine.remove(extra)
    for b in blocks:
        engine.remove(b)
    engine.tick()
    plain = statistics.median(us for _, us, swapped in seen if not swapped) if seen else 0.0
    swaps = [max(0.0, us - plain) / 1e3 for _, us, swapped in seen if swapped]
    gaps = [b[0] - a[0] for a, b in zip(seen, seen[1:], strict=False)]
    return {
        "edits": len(swaps),
        "swap_ms": statistics.median(swaps) if swaps else float("nan"),
        "swap_max_ms": max(swaps) if swaps else float("nan"),
        "frames_pct": 100.0 * produced / (produced + merged) if produced + merged else float("nan"),
        "max_gap_periods": max(gaps) * rate if gaps else float("nan"),
    }


def live_table(rows: list[tuple[int, dict[str, float]]], seconds: float) -> str:
    head = (f"{'blocks':>7} | {'edits':>5} | {'swap ms':>7} | {'max swap ms':>11} | {'60 Hz frames %':>14} | "
            f"{'max gap (periods)':>17}")
    lines = [f"editing while engine.run(60) drives the frames: 4 edits a second for {seconds:g} s", head,
             "-" * len(head)]
    for n, r in rows:
        lines.append(f"{n:>7} | {r['edits']:>5} | {r['swap_ms']:>7.3f} | {r['swap_max_ms']:>11.3f} | "
                     f"{r['frames_pct']:>14.1f} | {r['max_gap_periods']:>17.2f}")
    lines.append("targets at 1000 blocks (issue 20): swap <= 0.5 ms, frames >= 99 %, no gap over 1.5 periods")
    return "\n".join(lines)


def table(device: str, rows: list[tuple[int, dict[str, float]]]) -> str:
    head = (f"{'blocks':>7} | {'blocks(code) ms':>15} | {'blocks(path) ms':>15} | {'declare ms':>10} | "
            f"{'µs/call':>7} | {'first tick ms':>13} | {'+1 block ms':>11} | "
            f"{'-1 block ms':>11} | {'plain tick ms':>13} | {'plan() ms':>9} | {'describe() ms':>13}")
    lines = [f"bench/scale.py on {device}: a chain of scalar_mul blocks, {ELEMENTS} elements each", head,
             "-" * len(head)]
    for n, r in rows:
        lines.append(f"{n:>7} | {r['code_ms']:>15.1f} | {r['path_ms']:>15.1f} | {r['declare_ms']:>10.1f} | "
                     f"{r['per_call_us']:>7.1f} | {r['cold_ms']:>13.1f} | "
                     f"{r['add_ms']:>11.2f} | {r['remove_ms']:>11.2f} | {r['tick_ms']:>13.2f} | {r['plan_ms']:>9.2f} | "
                     f"{r['describe_ms']:>13.2f}")
    lines.append("targets at 1000 blocks (issue 9): declare <= 100 ms, first tick <= 30 ms, +1/-1 block <= 10 ms")
    lines.append("targets at 1000 blocks (issue 20): blocks(path) <= 30 ms, first tick <= 25 ms, +1/-1 block <= 5 ms")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000], help="chain lengths (blocks)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each +1/-1 block and plan() timing (median)")
    ap.add_argument("--live-seconds", type=float, default=10.0,
                    help="seconds of editing under engine.run(60) per size (0: skip)")
    ap.add_argument("--null", action="store_true", help="run on the null driver (no device): the host's share")
    args = ap.parse_args(argv)
    if any(n < 1 for n in args.sizes) or args.repeats < 1:
        ap.error("--sizes and --repeats take positive ints")
    if args.live_seconds < 0:
        ap.error("--live-seconds takes a number of seconds, 0 or more")

    import rxcuda

    driver = None
    if args.null:
        from rxcuda.cuda import NullDriver

        driver = NullDriver()
    else:
        ok, why = rxcuda.probe()
        if not ok:
            print(f"bench/scale.py needs a CUDA device: {why} (--null runs on the null driver)", file=sys.stderr)
            return 2
    code = rxcuda.load_kernel_file(ROOT / "kernels" / "scalar_mul.ptx")
    rows, live_rows = [], []
    with rxcuda.Engine(driver=driver) as engine:
        device = engine.device.name
        for n in args.sizes:  # every size's row first: a run() before them would leave threads that share the GIL
            rows.append((n, measure(engine, n, code, args.repeats)))
            print(f"  {n} blocks done", file=sys.stderr, flush=True)
        for n in args.sizes if args.live_seconds else ():
            live_rows.append((n, live(engine, n, code, args.live_seconds)))
            print(f"  {n} blocks edited live", file=sys.stderr, flush=True)
    print(table(device, rows))
    if live_rows:
        print()
        print(live_table(live_rows, args.live_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
