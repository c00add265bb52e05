"""What each profiling level costs a frame.

    python bench/profiling.py [--frames 300]

Frame time (tick with its wait, median of runs) of a 100-kernel chain at every level, against level `none`
with no subscriber at all, for the chain as 100 one-kernel blocks and as 10 blocks of 10 kernels; and
`per_kernel` on a chain of 20 kernels of 50 us each. One table per pipeline, with the card's name.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SRC = r"""
extern "C" __global__ void step(const float* x, float* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * 0.5f + 1.0f;
}
extern "C" __global__ void spin(const float* x, float* out, unsigned long long ns, unsigned n) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + 1.0f;
}
"""
N = 4096
LEVELS = ("none", "summary", "per_block", "per_kernel", "deep", "deep_sync")


def chain(rx, engine, code, blocks: int, per_block: int, **scalars):
    made = []
    for b in range(blocks):
        bb = rx.BlockBuilder(f"b{b}", size=N)
        ks = [bb.add_kernel(code, name=f"k{i}") for i in range(per_block)]
        bb.input("x", ks[0]["x"])
        for k1, k2 in zip(ks, ks[1:], strict=False):
            bb.connect(k1["out"], k2["x"])
        bb.output("out", ks[-1]["out"])
        for k in ks:
            bb.scalar(f"n_{k.name}", k["n"], default=N)
            for name, value in scalars.items():
                bb.scalar(f"{name}_{k.name}", k[name], default=value)
        made.append(engine.add(bb.build()))
    engine.write(made[0]["x"], np.ones(N, np.float32))
    for a, b in zip(made, made[1:], strict=False):
        engine.connect(a["out"], b["x"])


def frame_us(engine, frames: int) -> float:
    for _ in range(20):
        engine.tick()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(frames):
            engine.tick()
        runs.append((time.perf_counter_ns() - t0) / frames / 1e3)
    return statistics.median(runs)


def table(rx, title: str, build, frames: int, levels=LEVELS) -> None:
    with rx.Engine() as engine:
        build(engine)
        engine.tick()
        results = {}
        for level in levels:  # alternate through the levels twice; keep each level's better median
            results[level] = []
        for _ in range(2):
            for level in levels:
                engine.profile = level
                engine.tick()
                results[level].append(frame_us(engine, frames if level != "deep_sync" else max(frames // 10, 10)))
        base = min(results["none"])
        print(f"\n## {title}")
        print("| level | frame us | vs none |")
        print("|---|---:|---:|")
        for level in levels:
            t = min(results[level])
            print(f"| {level} | {t:.1f} | {(t / base - 1) * 100:+.1f} % |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300)
    args = ap.parse_args()
    import rxcuda as rx

    ok, why = rx.probe()
    if not ok:
        sys.exit(f"bench/profiling.py needs a CUDA device: {why}")
    code = {e: rx.compile_cuda(SRC, entry=e) for e in ("step", "spin")}
    with rx.Engine() as e:
        card = e.device.name
    print(f"# bench/profiling.py on {card}: frame time (tick with its wait) by profiling level")
    table(rx, "100 kernels: 100 blocks of one kernel", lambda e: chain(rx, e, code["step"], 100, 1), args.frames)
    table(rx, "100 kernels: 10 blocks of 10 kernels", lambda e: chain(rx, e, code["step"], 10, 10), args.frames)
    table(rx, "20 kernels of 50 us: 20 blocks of one kernel",
          lambda e: chain(rx, e, code["spin"], 20, 1, ns=50_000), max(args.frames // 10, 20),
          levels=("none", "summary", "per_block", "per_kernel"))


if __name__ == "__main__":
    main()
