"""The CPU device's targets (issue 40), each beside NumPy doing the same work in the same run.

    python bench/cpu.py [--size 1048576] [--frames 20]

Rows:

* a 10-block elementwise chain (scalar_mul, 2^20 f32 a frame) on ``Engine(device="cpu")`` beside NumPy doing the
  same 10 multiplications into preallocated arrays - target <= 3x NumPy
* one parameter change on the CPU device: the setter to the executable node's new values (host time) - <= 5 us
* hot reload of a ``.cu``: a changed source saved, to the first frame computed with the new code - <= 500 ms
* the quickstart pipeline (``make demo``) a frame, beside NumPy's ``(a + b) * s`` and the filter

Runs anywhere (no GPU needed); the numbers are this machine's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rxcuda  # noqa: E402

KERNELS = ROOT / "kernels"


def _median(f, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def chain(size: int, frames: int) -> tuple[float, float]:
    x = np.random.default_rng(1).standard_normal(size).astype(np.float32)
    with rxcuda.Engine(device="cpu") as engine:
        blocks = [engine.add(rxcuda.Block.from_kernel(KERNELS / "scalar_mul.ptx", size=size, scale=1.0001))
                  for _ in range(10)]
        for a, b in zip(blocks, blocks[1:], strict=False):
            engine.connect(a["out"], b["x"])
        engine.write(blocks[0]["x"], x)
        engine.tick()
        got = engine.read(blocks[-1]["out"])
        ref = x.copy()
        for _ in range(10):
            ref = ref * np.float32(1.0001)
        assert np.array_equal(got, ref), "the chain disagrees with NumPy"
        t_cpu = _median(engine.tick, frames)
    bufs = [np.empty_like(x) for _ in range(10)]
    s = np.float32(1.0001)

    def numpy_chain():
        np.multiply(x, s, out=bufs[0])
        for i in range(1, 10):
            np.multiply(bufs[i - 1], s, out=bufs[i])

    t_np = _median(numpy_chain, frames)
    return t_cpu, t_np


def parameter_change(repeat: int = 2000) -> float:
    with rxcuda.Engine(device="cpu") as engine:
        mul = engine.add(rxcuda.Block.from_kernel(KERNELS / "scalar_mul.ptx", size=1024, scale=1.0))
        engine.write(mul["x"], np.ones(1024, np.float32))
        engine.tick()
        assert engine.rebuilds == 1, "the pipeline did not build"
        prm = mul.params["scale"]
        times = []
        for i in range(repeat):
            t0 = time.perf_counter()
            prm.value = float(i % 7)
            engine._updater.apply_pending()  # (what tick() does first: the Parameters tier, no launch)
            times.append(time.perf_counter() - t0)
        engine.tick()
        assert engine.read(mul["out"])[0] == float((repeat - 1) % 7) and engine.rebuilds == 1
        return statistics.median(times)


SRC = ('extern "C" __global__ void k(const float* x, float* out, int n)'
       '{{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] * {k}.0f; }}')


def hot_reload(size: int = 1 << 16) -> float:
    x = np.ones(size, np.float32)
    with tempfile.TemporaryDirectory() as d, rxcuda.Engine(device="cpu") as engine:
        path = Path(d) / "k.cu"
        path.write_text(SRC.format(k=2))
        blk = engine.add(rxcuda.Block.from_cuda(path, size=size))
        engine.write(blk["x"], x)
        engine.watch(debounce=0.0)
        engine.tick()
        salt = int.from_bytes(os.urandom(2), "little") + 3  # a source no cache has seen
        t0 = time.perf_counter()
        path.write_text(SRC.format(k=salt))
        deadline = t0 + 10
        while time.perf_counter() < deadline:
            engine.tick()
            if engine.read(blk["out"])[0] == salt:
                return time.perf_counter() - t0
            time.sleep(0.002)
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--frames", type=int, default=20)
    args = ap.parse_args()
    print(f"CPU device, {os.cpu_count()} cores; {args.size} f32 elements")
    t_cpu, t_np = chain(args.size, args.frames)
    print("| what | CPU device | NumPy | ratio | target |\n|---|---|---|---|---|")
    print(f"| 10-block elementwise chain, a frame | {t_cpu * 1e3:.2f} ms | {t_np * 1e3:.2f} ms | "
          f"{t_cpu / t_np:.1f}x | <= 3x |")
    print(f"| one parameter change (setter to patched node) | {parameter_change() * 1e6:.2f} us | - | - | <= 5 us |")
    try:
        print(f"| hot reload of a .cu, save to new frame | {hot_reload() * 1e3:.0f} ms | - | - | <= 500 ms |")
    except Exception as e:  # (hot reload needs the file watcher)
        print(f"| hot reload of a .cu | not measured: {type(e).__name__}: {e} | - | - | <= 500 ms |")


if __name__ == "__main__":
    main()
