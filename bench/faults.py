"""What surviving faults costs: rxcuda.IsolatedEngine (the GPU side in a supervised child process) beside the
in-process rxcuda.Engine, in one run, and what a fault or a hang costs the isolated one.

    python bench/faults.py [--frames 500] [--faults 5]
    python bench/faults.py --null      # the same on the null driver (no GPU: host costs and restarts only)

Prints one table with the card's name:
- frame time of a chain of 100 small kernels (tick, waited for), in-process and isolated;
- one parameter change: the setter on the user's thread, and what it adds to the next frame;
- a 4 MiB read (engine.read, to a new NumPy array; the isolated engine's comes back in shared memory its GPU
  process copied into), and one into an array of yours (``out=``: copied out of that memory);
- what a trial run (new code run once in the standby before the GPU process takes it) adds to a code change;
- fault -> next good frame (a kernel writing through a null pointer), and hang -> next good frame (a kernel that
  never returns, deadline 1 s), with their phases: from the frame's launch to the fault seen here (for a hang,
  the deadline), -> the standby serving the pipeline built in it (of which the build), -> the next good frame.
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
sys.path.insert(0, str(ROOT / "bench"))

from frame import _median_us  # noqa: E402  (bench/frame.py's timing loop)

import rxcuda  # noqa: E402
from rxcuda.distributed import _board, _procs  # noqa: E402

N_SMALL = 1 << 12
N_READ = 1 << 20  # 4 MiB of float32
BAD = ('extern "C" __global__ void bad(const float* x, float* out, int n) '
       "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = ((const float*)0)[i]; }")
SPIN = ('extern "C" __global__ void spin(const float* x, float* out, int n) '
        "{ volatile const float* v = x; while (v[0] == 0.0f) { } out[0] = v[0]; }")


def _chain(engine, n: int, size: int):
    blocks = [engine.add(rxcuda.Block.from_kernel("scalar_mul", size=size, name=f"m{i}", scale=1.0))
              for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        engine.connect(a["out"], b["x"])
    engine.write(blocks[0]["x"], np.random.default_rng().standard_normal(size).astype(np.float32))
    return blocks


def _costs(engine, frames: int) -> dict[str, float]:
    blocks = _chain(engine, 100, N_SMALL)
    engine.tick()
    out: dict[str, float] = {}
    out["frame"] = _median_us(engine.tick, frames)
    p = blocks[50].params["scale"]
    values = iter(np.random.default_rng().uniform(0.5, 1.5, 10_000_000).tolist())

    def setter() -> None:
        p.value = next(values)

    out["setter"] = _median_us(setter, frames * 10)

    def set_and_tick() -> None:
        p.value = next(values)
        engine.tick()

    out["change"] = _median_us(set_and_tick, frames) - out["frame"]
    for b in blocks:
        engine.remove(b)
    big = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=N_READ, name="big"))
    engine.write(big["x"], np.random.default_rng().standard_normal(N_READ).astype(np.float32))
    engine.tick()
    out["read"] = _median_us(lambda: engine.read(big["out"]), max(frames // 10, 20))
    into = np.empty(N_READ, np.float32)
    out["read_out"] = _median_us(lambda: engine.read(big["out"], out=into), max(frames // 10, 20))
    threads, _board.COPY_THREADS = _board.COPY_THREADS, 1  # (the isolated engine's copy out on one thread)
    try:
        out["read_out_1"] = _median_us(lambda: engine.read(big["out"], out=into), max(frames // 10, 20))
    finally:
        _board.COPY_THREADS = threads
    x = engine.read(big["x"])
    np.testing.assert_allclose(engine.read(big["out"]), x * np.float32(big.params["scale"].value), rtol=1e-6)
    engine.remove(big)
    return out


def _recover(engine, source: str, name: str, zeros: bool, faults: int) -> dict[str, list[float]]:
    """Fault ``faults`` times with the kernel ``source`` beside a good block; the phases of each recovery."""
    good = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=N_SMALL, name="good", scale=2.0))
    x = np.random.default_rng().standard_normal(N_SMALL).astype(np.float32)
    engine.write(good["x"], x)
    phases: dict[str, list[float]] = {"detect": [], "seen -> back": [], "build": [], "back -> good frame": [],
                                      "total": []}
    actor = _procs.actor_of(engine.actor("gpu"))
    for _ in range(faults):
        engine.wait_ready(60)
        while actor.standby is None or not actor.standby.ready.is_set():  # a warm spare, as in a long session
            time.sleep(0.05)
        time.sleep(1.0)  # the spare's prewarm
        assert engine.tick().state == "ok"
        bad = engine.add(rxcuda.Block.from_cuda(source, size=N_SMALL, name=name))
        engine.write(bad["x"], np.zeros(N_SMALL, np.float32) if zeros else x)
        before = len(engine.faults)
        t0 = time.perf_counter()
        while len(engine.faults) == before:
            engine.tick()
        engine.remove(bad)
        while engine.tick().state != "ok":
            pass
        f = engine.faults[-1]
        phases["detect"].append(f.seen_at - t0)
        phases["seen -> back"].append(f.back_s or 0.0)
        phases["build"].append(f.build_s or 0.0)
        phases["back -> good frame"].append((f.recovered_s or 0.0) - (f.back_s or 0.0))
        phases["total"].append(f.recovered_s or 0.0)
        print(f"  {name}: {f.kind}, build phases in the new process {engine._where['gpu'].get('build_phases')}")
        np.testing.assert_allclose(engine.read(good["out"]), x * np.float32(2.0), rtol=1e-6)
    engine.remove(good)
    return phases


SHIFT = ('extern "C" __global__ void scalar_mul(const float* x, float* out, float scale, int n) '
         "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] * scale + %s; }")


def _code_swaps(engine, swaps: int) -> float:
    """Median ms of a tick that takes new code (a Code-tier change) in a 10-block chain, the code alternating."""
    blocks = _chain(engine, 10, N_SMALL)
    engine.tick()
    codes = [rxcuda.compile_cuda(SHIFT % c) for c in ("0.0f", "1.0f")]
    times = []
    for i in range(swaps):
        if engine.trial:
            actor = _procs.actor_of(engine.actor("gpu"))
            while actor.standby is None or not actor.standby.ready.is_set():
                time.sleep(0.01)
        blocks[5].set_code("scalar_mul", codes[i % 2])
        t0 = time.perf_counter()
        assert engine.tick().state == "ok"
        times.append(time.perf_counter() - t0)
    for b in blocks:
        engine.remove(b)
    engine.tick()
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=500)
    ap.add_argument("--faults", type=int, default=5)
    ap.add_argument("--null", action="store_true", help="the null driver (no GPU)")
    args = ap.parse_args()
    if args.null:
        local = rxcuda.Engine(driver=rxcuda.cuda.NullDriver())
        card = "null driver"
    else:
        local = rxcuda.Engine()
        card = local.device.name
    try:
        base = _costs(local, args.frames)
    finally:
        local.close()
    iso = rxcuda.IsolatedEngine(null=args.null, deadline=1.0)
    try:
        mine = _costs(iso, args.frames)
        print(f"\n## rxcuda.IsolatedEngine beside rxcuda.Engine ({card})\n")
        print("| per frame | in-process Engine | IsolatedEngine | ratio |")
        print("|---|---:|---:|---:|")
        for key, label in (("frame", "100 kernels, tick (waited for)"), ("setter", "one parameter change: the setter"),
                           ("change", "one parameter change: added to the next frame"),
                           ("read", "a 4 MiB read"),
                           ("read_out", f"a 4 MiB read into out= (your array; the isolated engine copies it over "
                                        f"{_board.COPY_THREADS} thread{'s' if _board.COPY_THREADS != 1 else ''})"),
                           ("read_out_1", "a 4 MiB read into out=, copied on one thread")):
            print(f"| {label} | {base[key]:.2f} us | {mine[key]:.2f} us | {mine[key] / base[key]:.2f}x |")
        trial = _code_swaps(iso, 20)
        iso.trial = False
        untried = _code_swaps(iso, 20)
        iso.trial = True
        print(f"\n## New code in a 10-block chain, IsolatedEngine ({card}; median of 20 swaps)\n")
        print("| the tick that takes it | ms |")
        print("|---|---:|")
        print(f"| swapped in untried (trial=False) | {untried:.2f} |")
        print(f"| run once in the standby first (trial=True, the default) | {trial:.2f} |")
        print(f"| trial run added to a code change | {trial - untried:.2f} |")
        if args.null:
            return
        rows = (("fault (null pointer)", BAD, "bad", False), ("hang (deadline 1 s)", SPIN, "spin", True))
        print(f"\n## Recovery, IsolatedEngine ({card}; median of {args.faults}, ms)\n")
        print("| what | detect | seen -> new process built | of which its build | -> next good frame | "
              "fault seen -> good frame |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, src, name, zeros in rows:
            ph = _recover(iso, src, name, zeros, args.faults)
            med = {k: statistics.median(v) * 1e3 for k, v in ph.items()}
            print(f"| {label} | {med['detect']:.1f} | {med['seen -> back']:.1f} | {med['build']:.1f} "
                  f"| {med['back -> good frame']:.1f} | {med['total']:.1f} |")
        print(f"\nfaults survived in this run: {len(iso.faults)}, GPU processes replaced: {iso.restarts}")
    finally:
        iso.close()


if __name__ == "__main__":
    main()
