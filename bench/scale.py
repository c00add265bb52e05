"""Cost that grows with the pipeline: a chain of N scalar_mul blocks, through the public API only.

    python bench/scale.py [--sizes 100 1000 10000] [--repeats 5]

For each N, one table row:
  declare       engine.add x N, engine.connect x N-1 and one engine.write: total ms, and µs per call
  first tick    the cold build: plan, load, allocate, build and instantiate the graph, launch, sync
  +1 block      add one block, connect it at the end of the chain, tick (median of --repeats)
  -1 block      remove that block again, tick (median of --repeats)
  plan()        rxcuda.plan(engine.describe()) alone (median of --repeats); describe() beside it

Targets (issue 9, a 1000-block chain on an H100/H200): declaring ≤ 100 ms in all and growing linearly,
cold build ≤ 30 ms, one block added or removed ≤ 10 ms. Needs a CUDA device: without one it says so in
one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ELEMENTS = 1024  # per block: small kernels, so the engine's own costs are what the table shows


def _ms(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def _tick_ok(engine) -> None:
    frame = engine.tick()
    if frame.state != "ok" or not frame.launched:
        bad = [f"{b.name}: {b.message}" for b in engine.blocks if b.state == "error"][:3]
        raise RuntimeError(f"the frame did not run cleanly ({frame.state}): {'; '.join(bad) or 'see diagnostics'}")


def measure(engine, n: int, code, repeats: int) -> dict[str, float]:
    """One row of the table for a chain of ``n`` blocks, built in ``engine`` (which must be empty)."""
    import numpy as np

    import rxcuda

    blocks = [rxcuda.Block.from_kernel(code, size=ELEMENTS, scale=1.0, name=f"m{i}") for i in range(n)]
    data = np.ones(ELEMENTS, np.float32)
    t0 = time.perf_counter_ns()
    for b in blocks:
        engine.add(b)
    for src, dst in zip(blocks, blocks[1:], strict=False):
        engine.connect(src["out"], dst["x"])
    engine.write(blocks[0]["x"], data)
    declare = _ms(t0)

    t0 = time.perf_counter_ns()
    _tick_ok(engine)
    cold = _ms(t0)

    added, removed = [], []
    for _ in range(repeats):
        extra = rxcuda.Block.from_kernel(code, size=ELEMENTS, scale=1.0, name="extra")
        t0 = time.perf_counter_ns()
        engine.add(extra)
        engine.connect(blocks[-1]["out"], extra["x"])
        _tick_ok(engine)
        added.append(_ms(t0))
        t0 = time.perf_counter_ns()
        engine.remove(extra)
        _tick_ok(engine)
        removed.append(_ms(t0))

    described, planned = [], []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        desc = engine.describe()
        described.append(_ms(t0))
        t0 = time.perf_counter_ns()
        rxcuda.plan(desc)
        planned.append(_ms(t0))

    for b in blocks:
        engine.remove(b)
    engine.tick()  # an empty pipeline: releases the chain's graph and buffers before the next size
    calls = n + (n - 1) + 1
    return {
        "declare_ms": declare,
        "per_call_us": declare / calls * 1e3,
        "cold_ms": cold,
        "add_ms": statistics.median(added),
        "remove_ms": statistics.median(removed),
        "plan_ms": statistics.median(planned),
        "describe_ms": statistics.median(described),
    }


def table(device: str, rows: list[tuple[int, dict[str, float]]]) -> str:
    head = (f"{'blocks':>7} | {'declare ms':>10} | {'µs/call':>7} | {'first tick ms':>13} | {'+1 block ms':>11} | "
            f"{'-1 block ms':>11} | {'plan() ms':>9} | {'describe() ms':>13}")
    lines = [f"bench/scale.py on {device}: a chain of scalar_mul blocks, {ELEMENTS} elements each", head,
             "-" * len(head)]
    for n, r in rows:
        lines.append(f"{n:>7} | {r['declare_ms']:>10.1f} | {r['per_call_us']:>7.1f} | {r['cold_ms']:>13.1f} | "
                     f"{r['add_ms']:>11.2f} | {r['remove_ms']:>11.2f} | {r['plan_ms']:>9.2f} | "
                     f"{r['describe_ms']:>13.2f}")
    lines.append("targets at 1000 blocks (issue 9): declare <= 100 ms, first tick <= 30 ms, +1/-1 block <= 10 ms")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000], help="chain lengths (blocks)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each +1/-1 block and plan() timing (median)")
    args = ap.parse_args(argv)
    if any(n < 1 for n in args.sizes) or args.repeats < 1:
        ap.error("--sizes and --repeats take positive ints")

    import rxcuda

    ok, why = rxcuda.probe()
    if not ok:
        print(f"bench/scale.py needs a CUDA device: {why}", file=sys.stderr)
        return 2
    code = rxcuda.load_kernel_file(ROOT / "kernels" / "scalar_mul.ptx")
    rows = []
    with rxcuda.Engine() as engine:
        device = engine.device.name
        for n in args.sizes:
            rows.append((n, measure(engine, n, code, args.repeats)))
            print(f"  {n} blocks done", file=sys.stderr, flush=True)
    print(table(device, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
