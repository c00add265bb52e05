"""Cost that grows with the pipeline: a chain of N scalar_mul blocks, through the public API only.

    python bench/scale.py [--sizes 100 1000 10000] [--repeats 5] [--null]

For each N, one table row:
  blocks(code)  Block.from_kernel(code, ...) x N with one loaded KernelCode: total ms
  blocks(path)  Block.from_kernel("kernels/scalar_mul.ptx", ...) x N, as users write it: total ms
  declare       engine.add x N, engine.connect x N-1 and one engine.write: total ms, and µs per call
  first tick    the cold build: plan, load, allocate, build and instantiate the graph, launch, sync
  +1 block      add one block, connect it at the end of the chain, tick (median of --repeats)
  -1 block      remove that block again, tick (median of --repeats)
  plan()        rxcuda.plan(engine.describe()) alone (median of --repeats); describe() beside it

Targets (issue 9, a 1000-block chain on an H100/H200): declaring ≤ 100 ms in all and growing linearly,
cold build ≤ 30 ms, one block added or removed ≤ 10 ms; issue 20: 1000 blocks declared by path ≤ 30 ms, cold
build ≤ 25 ms, one block added or removed ≤ 5 ms. Needs a CUDA device: without one it says so in one line and
exits with status 2. ``--null`` runs on the null driver instead (no device): the host's share of each number,
for profiling the Python side.
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

    t0 = time.perf_counter_ns()
    blocks = [rxcuda.Block.from_kernel(code, size=ELEMENTS, scale=1.0, name=f"m{i}") for i in range(n)]
    by_code = _ms(t0)
    path = str(ROOT / "kernels" / "scalar_mul.ptx")
    t0 = time.perf_counter_ns()
    [rxcuda.Block.from_kernel(path, size=ELEMENTS, scale=1.0, name=f"p{i}") for i in range(n)]
    by_path = _ms(t0)
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
        "code_ms": by_code,
        "path_ms": by_path,
        "declare_ms": declare,
        "per_call_us": declare / calls * 1e3,
        "cold_ms": cold,
        "add_ms": statistics.median(added),
        "remove_ms": statistics.median(removed),
        "plan_ms": statistics.median(planned),
        "describe_ms": statistics.median(described),
    }


def table(device: str, rows: list[tuple[int, dict[str, float]]]) -> str:
    head = (f"{'blocks':>7} | {'blocks(code) ms':>15} | {'blocks(path) ms':>15} | {'declare ms':>10} | "
            f"{'µs/call':>7} | {'first tick ms':>13} | {'+1 block ms':>11} | "
            f"{'-1 block ms':>11} | {'plan() ms':>9} | {'describe() ms':>13}")
    lines = [f"bench/scale.py on {device}: a chain of scalar_mul blocks, {ELEMENTS} elements each", head,
             "-" * len(head)]
    for n, r in rows:
        lines.append(f"{n:>7} | {r['code_ms']:>15.1f} | {r['path_ms']:>15.1f} | {r['declare_ms']:>10.1f} | "
                     f"{r['per_call_us']:>7.1f} | {r['cold_ms']:>13.1f} | "
                     f"{r['add_ms']:>11.2f} | {r['remove_ms']:>11.2f} | {r['plan_ms']:>9.2f} | "
                     f"{r['describe_ms']:>13.2f}")
    lines.append("targets at 1000 blocks (issue 9): declare <= 100 ms, first tick <= 30 ms, +1/-1 block <= 10 ms")
    lines.append("targets at 1000 blocks (issue 20): blocks(path) <= 30 ms, first tick <= 25 ms, +1/-1 block <= 5 ms")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000], help="chain lengths (blocks)")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each +1/-1 block and plan() timing (median)")
    ap.add_argument("--null", action="store_true", help="run on the null driver (no device): the host's share")
    args = ap.parse_args(argv)
    if any(n < 1 for n in args.sizes) or args.repeats < 1:
        ap.error("--sizes and --repeats take positive ints")

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
    rows = []
    with rxcuda.Engine(driver=driver) as engine:
        device = engine.device.name
        for n in args.sizes:
            rows.append((n, measure(engine, n, code, args.repeats)))
            print(f"  {n} blocks done", file=sys.stderr, flush=True)
    print(table(device, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
