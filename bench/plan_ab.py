"""plan() of a 1000-block chain, this checkout against another one, interleaved in ONE process.

    python bench/plan_ab.py --base ../rxcuda-1dc1fcb [--blocks 1000] [--pairs 40] [--null] [--cold]

Separate processes on a shared GPU host differ by up to 2x in their host speed, so two commits' ``plan()`` rows
from two runs of bench/scale.py say little. Here the other checkout's ``rxcuda`` is imported as ``rxcuda_base``
(copied to a temporary folder under that name; its imports are relative), both engines are built in
bench/scale.py's sequence (declare by code and by path, first tick, five +1/-1 block edits), and ``plan()`` of each
pipeline's description runs in alternating pairs, each after a collection with the cycle collector paused.
Prints both medians and the median of the per-pair ratios. ``--null``: both on the null driver (no GPU needed).

``--cold``: instead of plan(), each pair builds a fresh engine of each checkout in turn and times, as
bench/scale.py does, its first tick (the cold build: plan, load, allocate, build, instantiate, launch, and the wait
for the frame), then one block added at the end and connected, then removed (each with its tick and frame).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def _build(lib, kernels: Path, n: int, null: bool):
    import numpy as np

    driver = None
    if null:
        import importlib

        driver = importlib.import_module(lib.__name__ + ".cuda").NullDriver()
    engine = lib.Engine(driver=driver)
    ptx = str(kernels / "scalar_mul.ptx")
    code = lib.load_kernel_file(ptx)
    size = 1 << 16
    blocks = [lib.Block.from_kernel(code, size=size, scale=1.0, name=f"m{i}") for i in range(n)]
    [lib.Block.from_kernel(ptx, size=size, scale=1.0, name=f"p{i}") for i in range(n)]
    for b in blocks:
        engine.add(b)
    for s, d in zip(blocks, blocks[1:], strict=False):
        engine.connect(s["out"], d["x"])
    engine.write(blocks[0]["x"], np.ones(size, np.float32))
    engine.tick()
    for _ in range(5):
        extra = lib.Block.from_kernel(code, size=size, scale=1.0, name="extra")
        engine.add(extra)
        engine.connect(blocks[-1]["out"], extra["x"])
        engine.tick()
        engine.remove(extra)
        engine.tick()
    return engine, engine.describe()


def _timed(lib, desc) -> float:
    from scale import _ms, _start  # bench/scale.py's timer: after a collection, the cycle collector paused

    t0 = _start()
    lib.plan(desc)
    return _ms(t0)


def _cold(lib, kernels: Path, n: int, null: bool) -> tuple[float, float, float]:
    """A fresh engine's first tick, +1 block and -1 block (ms), each with the wait for its frame."""
    import numpy as np
    from scale import _ms, _start, _tick_ok

    driver = None
    if null:
        import importlib

        driver = importlib.import_module(lib.__name__ + ".cuda").NullDriver()
    engine = lib.Engine(driver=driver)
    try:
        code = lib.load_kernel_file(str(kernels / "scalar_mul.ptx"))
        blocks = [engine.add(lib.Block.from_kernel(code, size=1024, scale=1.0, name=f"m{i}")) for i in range(n)]
        for s, d in zip(blocks, blocks[1:], strict=False):
            engine.connect(s["out"], d["x"])
        engine.write(blocks[0]["x"], np.ones(1024, np.float32))
        t0 = _start()
        _tick_ok(engine)
        engine.synchronize()
        first = _ms(t0)
        extra = lib.Block.from_kernel(code, size=1024, scale=1.0, name="extra")
        t0 = _start()
        engine.add(extra)
        engine.connect(blocks[-1]["out"], extra["x"])
        _tick_ok(engine)
        engine.synchronize()
        plus = _ms(t0)
        t0 = _start()
        engine.remove(extra)
        _tick_ok(engine)
        engine.synchronize()
        minus = _ms(t0)
    finally:
        engine.close()
    return first, plus, minus


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path,
                    help="the other checkout (a folder holding rxcuda/ and kernels/)")
    ap.add_argument("--blocks", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--null", action="store_true", help="both on the null driver")
    ap.add_argument("--cold", action="store_true",
                    help="fresh engines' first tick, +1 and -1 block instead of plan() (see above)")
    args = ap.parse_args(argv)
    if not (args.base / "rxcuda" / "__init__.py").is_file():
        ap.error(f"--base {args.base} holds no rxcuda/ package; give the root of another checkout")
    tmp = tempfile.mkdtemp(prefix="plan_ab_")
    try:
        shutil.copytree(args.base / "rxcuda", Path(tmp) / "rxcuda_base")
        # beside it what a checkout's rxcuda finds its rxcuda.kernels and rxcuda.examples in (rxcuda/__init__.py)
        for part in ("kernels", "examples", "pyproject.toml"):
            src = args.base / part
            if src.is_dir():
                shutil.copytree(src, Path(tmp) / part)
            elif src.is_file():
                shutil.copy(src, Path(tmp) / part)
        sys.path.insert(0, str(ROOT))
        sys.path.insert(0, tmp)
        import rxcuda_base

        import rxcuda

        if args.cold:
            return _cold_pairs(rxcuda_base, rxcuda, args)
        base_engine, base_desc = _build(rxcuda_base, args.base / "kernels", args.blocks, args.null)
        new_engine, new_desc = _build(rxcuda, ROOT / "kernels", args.blocks, args.null)
        times: dict[str, list[float]] = {"base": [], "new": []}
        sides = [("base", rxcuda_base, base_desc), ("new", rxcuda, new_desc)]
        for i in range(args.pairs):
            for side, lib, desc in sides[:: 1 if i % 2 == 0 else -1]:
                times[side].append(_timed(lib, desc))
        new_engine.close()
        base_engine.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mb, mn = statistics.median(times["base"]), statistics.median(times["new"])
    ratio = statistics.median(n / b for b, n in zip(times["base"], times["new"], strict=True))
    where = "null driver" if args.null else "device"
    print(f"plan() of {args.blocks} blocks, {where}, {args.pairs} interleaved pairs in one process: base median "
          f"{mb:.2f} ms, this checkout {mn:.2f} ms ({100 * (mn / mb - 1):+.1f} %); per-pair ratio median {ratio:.3f}")
    return 0


def _cold_pairs(base, new, args) -> int:
    rows: dict[str, list[tuple[float, float, float]]] = {"base": [], "new": []}
    sides = [("base", base, args.base / "kernels"), ("new", new, ROOT / "kernels")]
    for i in range(args.pairs):
        for side, lib, kernels in sides[:: 1 if i % 2 == 0 else -1]:
            rows[side].append(_cold(lib, kernels, args.blocks, args.null))
    where = "null driver" if args.null else "device"
    print(f"{args.blocks} blocks, {where}, {args.pairs} interleaved pairs of fresh engines in one process (ms, medians;"
          " ratio: median of the per-pair ratios)")
    print(f"{'':12s} | {'base':>8s} | {'this':>8s} | {'ratio':>6s}")
    for j, what in enumerate(("first tick", "+1 block", "-1 block")):
        b = [r[j] for r in rows["base"]]
        n = [r[j] for r in rows["new"]]
        ratio = statistics.median(y / x for x, y in zip(b, n, strict=True))
        print(f"{what:12s} | {statistics.median(b):8.2f} | {statistics.median(n):8.2f} | {ratio:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
