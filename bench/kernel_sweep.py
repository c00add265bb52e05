"""Sweep the tensor code generator's tuning (rxcuda/tensor/_codegen.py ``Tuning``) on a GPU: issue 13.

    python3 bench/kernel_sweep.py [--reps 20] [--only 0,3,7]

For each candidate tuning (``CANDIDATES``), the generated C++ kernels (NVRTC; the factory's PTX path is turned
off, so what runs is ``_codegen.generate``'s code) of each workload (``WORKLOADS``: softmax, layernorm, ``x + 0``
and ``x * 1.0001 + 0.0001`` over 4096x4096 float32, softmax over 4096x1024 and 1024x16384) are timed by CUDA
events on the backend's stream: the median of ``--reps`` runs, each on a fresh input array (made outside the
clock), after a warm-up run. A spin kernel queued before the first event keeps the GPU busy while the host
prepares the launch, so the time is the device's alone; the reference is CuPy's ``y[...] = x`` of the same
shape, timed the same way on the same stream. Every result is checked against NumPy on a few rows (a fast
wrong kernel shows as WRONG and never wins).

Prints one markdown table (device microseconds and percent of the copy's device time; higher is better), then
the best tuning per workload and overall (the geometric mean of the percentages), and the ``TUNING = Tuning(...)``
line that makes the winner the default in ``rxcuda/tensor/_codegen.py``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import math
import os
import pathlib
import statistics
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rxcuda.tensor._codegen import Tuning  # noqa: E402  (no GPU needed to import)

#: (name, shape): each workload's program is in ``_program``; the copy reference is of the same shape
WORKLOADS = [
    ("softmax 4096x4096", (4096, 4096)),
    ("layernorm 4096x4096", (4096, 4096)),
    ("x + 0 4096x4096", (4096, 4096)),
    ("x * 1.0001 + 0.0001 4096x4096", (4096, 4096)),
    ("softmax 4096x1024", (4096, 1024)),
    ("softmax 1024x16384", (1024, 16384)),
]

#: the candidates: the default first, then one or two knobs moved at a time (elementwise knobs do not change the
#: row kernels and row knobs do not change the elementwise ones, so each workload sees its own sweep)
CANDIDATES = [
    Tuning(),
    # elementwise
    Tuning(ew_vector=False),
    Tuning(ew_unroll=1),
    Tuning(ew_unroll=2),
    Tuning(ew_unroll=8),
    Tuning(ew_threads=128),
    Tuning(ew_threads=512),
    Tuning(ew_threads=512, ew_unroll=2),
    Tuning(ew_max_blocks=132 * 8),
    Tuning(ew_max_blocks=132 * 16, ew_unroll=2),
    # cache hints (both kinds of kernels)
    Tuning(loads="ldg"),
    Tuning(loads="ldcs"),
    Tuning(stores="stcs"),
    Tuning(loads="ldcs", stores="stcs"),
    # register rows
    Tuning(row_elems=8),
    Tuning(row_elems=4),
    Tuning(row_elems=32),
    Tuning(row_min_threads=128),
    Tuning(row_block_threads=256),
    Tuning(row_block_threads=512),
    Tuning(row_occupancy=1536),
    Tuning(late_loads=True),
    Tuning(late_loads=True, row_occupancy=1024),
    Tuning(row_elems=8, late_loads=True),
    Tuning(row_elems=8, late_loads=True, row_occupancy=1536),
    Tuning(row_elems=8, row_occupancy=1536),
    Tuning(row_elems=4, row_occupancy=2048),
    Tuning(row_elems=8, loads="ldg", stores="stcs"),
]

SPIN_NS = 400_000  # the spin kernel's time: longer than the host needs to launch a repeat of a program


def _program(name: str, rt, x, gamma=None, beta=None):
    """The traced (lazy) program of workload ``name`` over the device array ``x``."""
    t = rt.asarray(x)
    if name.startswith("softmax"):
        return rt.softmax(t, axis=-1)
    if name.startswith("layernorm"):
        d = t - t.mean(-1, keepdims=True)
        return d / rt.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * rt.asarray(gamma) + rt.asarray(beta)
    if name.startswith("x + 0"):
        return t + 0
    return t * 1.0001 + 0.0001


def _reference(name: str, a: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """NumPy's answer (float64) for rows ``a`` of the input."""
    a = a.astype(np.float64)
    if name.startswith("softmax"):
        e = np.exp(a - a.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    if name.startswith("layernorm"):
        d = a - a.mean(-1, keepdims=True)
        return d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * gamma + beta
    if name.startswith("x + 0"):
        return a
    return a * np.float32(1.0001) + np.float32(0.0001)


def use(tuning: Tuning) -> None:
    """Make ``tuning`` the generator's and forget every kernel and program made with another one."""
    import rxcuda.tensor as rt
    from rxcuda.tensor import _codegen, _cuda

    _codegen.set_tuning(tuning)
    _cuda.FACTORY._kernels.clear()  # keyed on the IR only: kernels of the previous tuning would be served
    rt._PROGRAMS.clear()  # runnable programs hold their loaded kernels
    rt.clear_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated candidate indices (default: all)")
    args = ap.parse_args()
    try:
        import cupy as cp

        n_dev = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no CuPy, no driver, no device: all mean the same here
        sys.exit(f"bench/kernel_sweep.py needs a CUDA device (and CuPy): {type(e).__name__}: {e}")
    if n_dev < 1:
        sys.exit("bench/kernel_sweep.py needs a CUDA device: none found")
    import rxcuda.tensor as rt
    from rxcuda.sources._nvrtc import compile_cuda
    from rxcuda.tensor import _codegen, _cuda

    started = time.perf_counter()
    if hasattr(_cuda.FACTORY, "ptx"):
        _cuda.FACTORY.ptx = False  # time the C++ generator's kernels, not the PTX emitter's
    candidates = CANDIDATES if not args.only else [CANDIDATES[int(i)] for i in args.only.split(",")]
    card = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rng = np.random.default_rng(13)
    stream = _cuda.backend(rt.asarray(cp.ones(1)).node).stream
    spin = cp.RawKernel(r"""
extern "C" __global__ void rx_spin(unsigned long long ns)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}""", "rx_spin")
    shapes = sorted({shape for _, shape in WORKLOADS})
    pools = {s: [cp.asarray(rng.standard_normal(s).astype(np.float32)) for _ in range(3)] for s in shapes}
    params = {s[1]: (rng.standard_normal(s[1]).astype(np.float32), rng.standard_normal(s[1]).astype(np.float32))
              for s in shapes}
    dparams = {n: (cp.asarray(g), cp.asarray(b)) for n, (g, b) in params.items()}
    host_late = []  # runs where the host took longer than the spin (their time includes host latency)

    def timed(prepare, shape) -> float:
        """Median device microseconds of ``prepare(x)()`` (``x`` a fresh array of ``shape``; ``prepare`` outside
        the clock, e.g. tracing), warm-up excluded."""
        pool = pools[shape]
        times = []
        for i in range(args.reps + 1):
            x = pool[i % len(pool)] + 0  # a new array each run: the result cache cannot answer
            run = prepare(x)
            cp.cuda.Device().synchronize()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            with stream:  # the GPU waits on this while the host launches the run
                spin((1,), (1,), (np.uint64(SPIN_NS),))
            e0.record(stream)
            h0 = time.perf_counter()
            run()
            host = time.perf_counter() - h0
            e1.record(stream)
            e1.synchronize()
            if i:
                times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
                if host * 1e9 > SPIN_NS * 0.8:
                    host_late.append(host)
        return statistics.median(times)

    def copy(x):
        def run():
            with stream:
                y = cp.empty_like(x)
                y[...] = x

        return run

    copies = {s: timed(copy, s) for s in shapes}

    def traced(name, shape):
        g, b = dparams[shape[1]]
        return lambda x: _program(name, rt, x, g, b).cupy  # traced outside the clock; evaluated in it

    def check(name, shape, tuning) -> str:
        """'' if workload ``name`` under ``tuning`` (made now) agrees with NumPy on a few rows, else why not."""
        x = pools[shape][0]
        g, b = dparams[shape[1]]
        try:
            out = _program(name, rt, x, g, b).cupy()
        except Exception as e:  # noqa: BLE001 - a kernel that does not compile or launch: say so, go on
            return f"{type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
        rows = sorted({0, 1, shape[0] // 2 + 1, shape[0] - 1})
        got = cp.asnumpy(out[rows])
        want = _reference(name, cp.asnumpy(x[rows]), *params[shape[1]])
        sources = [k.source for k in _cuda.FACTORY._kernels.values()]
        if not sources or not all(f"// tuning: {tuning.changes()}\n" in s for s in sources):
            return "not the generated C++ of this tuning"
        if name.startswith("x + 0") and not np.array_equal(got, want.astype(np.float32)):
            return "x + 0 is not x"
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
            return f"max error {np.max(np.abs(got - want)):.3g}"
        return ""

    # compile every candidate's kernels on threads first (NVRTC's memo then answers the factory): the IRs are
    # those the default tuning's run makes
    use(candidates[0])
    for name, shape in WORKLOADS:
        check(name, shape, candidates[0])
    irs = list(_cuda.FACTORY._kernels)
    sources = []
    for tuning in candidates[1:]:
        _codegen.set_tuning(tuning)
        sources += [_codegen.generate(ir) for ir in irs]

    def precompile(source: str) -> None:
        with contextlib.suppress(Exception):  # the sweep's own run reports a failure as WRONG
            compile_cuda(source, entry=_codegen.ENTRY, name=f"{_codegen.ENTRY}.cu")

    with concurrent.futures.ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as ex:
        list(ex.map(precompile, dict.fromkeys(sources)))
    compiled_s = time.perf_counter() - started

    results: list[list[tuple[float | None, str]]] = []  # per candidate, per workload: (us, problem)
    for tuning in candidates:
        use(tuning)
        row = []
        for name, shape in WORKLOADS:
            why = check(name, shape, tuning)  # also the warm-up: compiles (memo) and loads the kernel
            us = timed(traced(name, shape), shape) if not why else None
            row.append((us, why))
        results.append(row)

    # -- report ------------------------------------------------------------------------------------------------
    def pct(us, shape):
        return copies[shape] / us * 100

    print(f"# rxcuda tensor kernel sweep on {card}: device time, median of {args.reps} (% of the copy's time)\n")
    print("copy (CuPy `y[...] = x`): " + ", ".join(
        f"{s[0]}x{s[1]} {copies[s]:.1f} us = {2 * math.prod(s) * 4 / copies[s] / 1e3:.0f} GB/s" for s in shapes))
    print()
    print("| # | tuning | " + " | ".join(name for name, _ in WORKLOADS) + " | geomean |")
    print("|---|---|" + "---|" * (len(WORKLOADS) + 1))
    scores = []
    for k, (tuning, row) in enumerate(zip(candidates, results, strict=True)):
        cells, ok = [], []
        for (us, why), (_, shape) in zip(row, WORKLOADS, strict=True):
            if us is None:
                cells.append(f"WRONG: {why}")
            else:
                cells.append(f"{us:.1f} ({pct(us, shape):.0f} %)")
                ok.append(pct(us, shape))
        score = math.exp(sum(map(math.log, ok)) / len(ok)) if len(ok) == len(WORKLOADS) else None
        scores.append(score)
        mean = "-" if score is None else f"{score:.1f} %"
        print(f"| {k} | {tuning.changes()} | " + " | ".join(cells) + f" | {mean} |")
    print("\nbest per workload:")
    for w, (name, shape) in enumerate(WORKLOADS):
        timed_ok = [(results[k][w][0], k) for k in range(len(candidates)) if results[k][w][0] is not None]
        if timed_ok:
            us, k = min(timed_ok)
            print(f"- {name}: #{k} {candidates[k].changes()}: {us:.1f} us = {pct(us, shape):.0f} % of the copy "
                  f"(#0: {results[0][w][0] or float('nan'):.1f} us)")
    valid = [(s, k) for k, s in enumerate(scores) if s is not None]
    if valid:
        s, k = max(valid)
        best = candidates[k]
        print(f"\nbest overall (geometric mean of % of copy): #{k} {best.changes()}: {s:.1f} %")
        line = f"TUNING = Tuning({'' if best.changes() == 'default' else best.changes()})"
        print(f"to make it the default, write this line for `TUNING = Tuning()` in rxcuda/tensor/_codegen.py: {line}")
    wrong = sum(us is None for row in results for us, _ in row)
    print(f"\n{len(candidates)} candidates x {len(WORKLOADS)} workloads, {wrong} wrong; "
          f"compiling {compiled_s:.0f} s, all {time.perf_counter() - started:.0f} s")
    if host_late:
        print(f"note: {len(host_late)} runs launched later than the spin ({SPIN_NS / 1e3:.0f} us) covers "
              f"(host up to {max(host_late) * 1e6:.0f} us): their times include host latency")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
