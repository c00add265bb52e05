"""Probe: does another graph shape cut the device time of a ``While``/``For`` pass?

    python bench/region_passes.py [--passes 2000] [--ks 1 2 4 8] [--n 1024]

A ``For`` region today is one WHILE conditional node whose body holds the user's kernels and the step kernel
that counts down and sets the node's handle; the driver relaunches the body for every pass (~5.7 us of device
time on an H200, whatever the body holds). The shape tried here unrolls the body k times inside the WHILE:

    init(h_while, counter, n)
    WHILE h_while {
        clear(h_while)                        # rx_cond_set(h_while, NULL, invert=1): 0 unless the last copy says on
        body; step(h_if2, counter)            # counts down; h_if2 = counter > 0
        IF h_if2 { body; step(h_if3, counter)
            IF h_if3 { ... body; step(h_while, counter) } }   # the last copy decides on another round
    }

so a loop can stop after any copy (n need not be a multiple of k) and the driver relaunches the WHILE body once
per k passes. Each copy after the first sits under one more nested IF. For reference the table also shows k
unguarded copies per round (correct only when k divides n; the cost of the body alone without the IFs), and
rxcuda's own ``For(..., unroll=k)`` (the same shape, rxcuda/plan/_regions.py) timed through ``tick()``.

Every shape runs the same body: the shipped ``kernels/scalar_mul.ptx`` scaling a vector in place, with the
condition kernels rxcuda ships (``rxcuda/cuda/_conditions.fatbin``), so the probe needs no toolkit. Results are
checked against NumPy (the same float32 multiplications, on fresh random data) for pass counts that are not
multiples of k. Device time per pass is the slope of the graph's event-timed device time between two pass
counts (launch overheads cancel). Prints one table (k, us per pass, ratio to the plain WHILE) with the card's
name; exits non-zero with a message naming the shape when the driver refuses a graph or a result is wrong.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


class Refused(RuntimeError):
    """The driver refused a graph shape (or a result was wrong): the probe stops and says which."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=2000, help="passes of the timed loops (the slope's far end)")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8], help="unroll factors (1: today's shape)")
    ap.add_argument("--n", type=int, default=1024, help="elements the body kernel scales")
    ap.add_argument("--repeats", type=int, default=15, help="timed launches per point (median)")
    ap.add_argument("--dry-run", action="store_true",
                    help="build every shape on rxcuda's null driver (no GPU): checks the probe, measures nothing")
    args = ap.parse_args(argv)
    try:
        if args.dry_run:
            sys.path.insert(0, str(ROOT))
            from rxcuda.cuda import NullDriver

            drv = NullDriver()
        else:
            from cuda.bindings import driver as drv
    except ImportError as e:
        print(f"bench/region_passes.py needs cuda-python with a CUDA device: {e}")
        return 2
    try:
        return _run(drv, args)
    except Refused as e:
        print(f"\nbench/region_passes.py: {e}", file=sys.stderr)
        return 1


def _run(drv, args) -> int:
    def check(result, what):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise Refused(f"{what} failed: {err.name if hasattr(err, 'name') else err}")
        return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)

    try:
        check(drv.cuInit(0), "cuInit")
        count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    except Exception as e:  # no driver library (pathfinder's error), or cuInit refused
        print(f"bench/region_passes.py needs a CUDA device: {e}")
        return 2
    if not count:
        print("bench/region_passes.py needs a CUDA device (none found)")
        return 2
    dev = check(drv.cuDeviceGet(0), "cuDeviceGet")
    name = check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName").split(b"\0")[0].decode()
    ctx = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    version = check(drv.cuDriverGetVersion(), "cuDriverGetVersion")
    stream = check(drv.cuStreamCreate(0), "cuStreamCreate")
    ptx = (ROOT / "kernels" / "scalar_mul.ptx").read_bytes() + b"\0"
    mod = check(drv.cuModuleLoadData(ptx), "cuModuleLoadData(scalar_mul.ptx)")
    mul = check(drv.cuModuleGetFunction(mod, b"scalar_mul"), "cuModuleGetFunction(scalar_mul)")
    fat = (ROOT / "rxcuda" / "cuda" / "_conditions.fatbin").read_bytes()
    cmod = check(drv.cuModuleLoadData(fat), "cuModuleLoadData(_conditions.fatbin)")
    cond_set = check(drv.cuModuleGetFunction(cmod, b"rx_cond_set"), "rx_cond_set")
    loop_init = check(drv.cuModuleGetFunction(cmod, b"rx_loop_init"), "rx_loop_init")
    loop_step = check(drv.cuModuleGetFunction(cmod, b"rx_loop_step"), "rx_loop_step")
    n = args.n
    scale = np.float32(1.0001)
    x = int(check(drv.cuMemAlloc(4 * n), "cuMemAlloc"))
    counter = int(check(drv.cuMemAlloc(8), "cuMemAlloc"))
    ev0 = check(drv.cuEventCreate(0), "cuEventCreate")
    ev1 = check(drv.cuEventCreate(0), "cuEventCreate")
    keep: list = []  # argument storage the graphs point into: alive as long as they are
    T = drv.CUgraphConditionalNodeType

    def args_of(*vals) -> int:
        """Kernel arguments as 8-byte slots plus the pointer array the driver reads; returns its address."""
        words = np.zeros(max(len(vals), 1), np.uint64)
        for i, v in enumerate(vals):
            if isinstance(v, (float, np.floating)):
                words[i:i + 1].view(np.float32)[0] = v
            else:
                words[i] = int(v)
        ptrs = np.arange(len(vals), dtype=np.uint64) * np.uint64(8) + np.uint64(words.ctypes.data)
        keep.extend((words, ptrs))
        return int(ptrs.ctypes.data)

    def kernel(graph, deps, func, argp, grid=1, block=1, what="kernel"):
        p = drv.CUDA_KERNEL_NODE_PARAMS()
        p.func = func
        p.gridDimX, p.gridDimY, p.gridDimZ = grid, 1, 1
        p.blockDimX, p.blockDimY, p.blockDimZ = block, 1, 1
        p.sharedMemBytes = 0
        p.kernelParams = argp
        keep.append(p)
        return check(drv.cuGraphAddKernelNode(graph, deps, len(deps), p), f"cuGraphAddKernelNode ({what})"), p

    def handle(top, what):
        """A conditional handle of the top-level graph ``top`` (a node in it or in any body may use it)."""
        return check(drv.cuGraphConditionalHandleCreate(top, ctx, 0, 0), f"cuGraphConditionalHandleCreate ({what})")

    def conditional(h, graph, deps, kind, what):
        params = drv.CUgraphNodeParams()
        params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = h
        params.conditional.type = kind
        params.conditional.size = 1
        params.conditional.ctx = ctx
        node = check(drv.cuGraphAddNode(graph, deps, None, len(deps), params), f"cuGraphAddNode ({what})")
        bodies = getattr(drv, "conditional_bodies", None)  # the null driver hands its body graphs out this way
        return node, h, bodies(node)[0] if bodies is not None else params.conditional.phGraph_out[0]

    def body(graph, deps):
        return kernel(graph, deps, mul, args_of(x, x, float(scale), n), (n + 255) // 256, 256, "body")[0]

    def build(k: int, guarded: bool):
        """(executable graph, init node, its params, rounds per pass count): the loop shape for ``k``."""
        what = f"k={k}" + ("" if guarded else " unguarded")
        g = check(drv.cuGraphCreate(0), "cuGraphCreate")
        init_args = np.zeros(6, np.uint64)  # (handle, counter, n, flag, size, invert): n is set per run
        init_ptrs = np.arange(6, dtype=np.uint64) * np.uint64(8) + np.uint64(init_args.ctypes.data)
        keep.extend((init_args, init_ptrs))
        init, init_p = kernel(g, [], loop_init, int(init_ptrs.ctypes.data), what=f"{what}: init")
        h_while = handle(g, what)
        _, _, wbody = conditional(h_while, g, [init], T.CU_GRAPH_COND_TYPE_WHILE, f"{what}: WHILE")
        init_args[:] = (int(h_while), counter, 0, 0, 4, 0)
        if not guarded or k == 1:  # k copies in a row, one step per round
            last = []
            for _ in range(k):
                last = [body(wbody, last)]
            kernel(wbody, last, loop_step, args_of(int(h_while), counter, 0, 4, 0), what=f"{what}: step")
        else:
            clear = kernel(wbody, [], cond_set, args_of(int(h_while), 0, 4, 1), what=f"{what}: clear")[0]
            level = wbody
            deps = [clear]
            for i in range(k):
                b = body(level, deps if i == 0 else [])
                if i == k - 1:
                    kernel(level, [b], loop_step, args_of(int(h_while), counter, 0, 4, 0), what=f"{what}: last step")
                    break
                h_if = handle(g, what)
                step = kernel(level, [b], loop_step, args_of(int(h_if), counter, 0, 4, 0),
                              what=f"{what}: step {i + 1}")[0]
                try:  # the IF reads the handle the step just set: it runs after it
                    _, _, inner = conditional(h_if, level, [step], T.CU_GRAPH_COND_TYPE_IF, f"{what}: IF {i + 2}")
                except Refused as e:
                    raise Refused(f"{e}: the driver refuses an IF node nested {i + 1} deep in a WHILE body "
                                  f"(shape k={k}); rerun with smaller --ks") from None
                level = inner
        try:
            ge = check(drv.cuGraphInstantiate(g, 0), f"cuGraphInstantiate ({what})")
        except Refused as e:
            raise Refused(f"{e}: the driver refuses the loop shape {what}") from None
        return ge, init, init_p, init_args

    def run(shape, passes: int, timed: bool = False) -> float:
        ge, init, init_p, init_args = shape
        init_args[2] = passes
        check(drv.cuGraphExecKernelNodeSetParams(ge, init, init_p), "cuGraphExecKernelNodeSetParams (init)")
        if timed:
            check(drv.cuEventRecord(ev0, stream), "cuEventRecord")
        check(drv.cuGraphLaunch(ge, stream), "cuGraphLaunch")
        if timed:
            check(drv.cuEventRecord(ev1, stream), "cuEventRecord")
        check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return check(drv.cuEventElapsedTime(ev0, ev1), "cuEventElapsedTime") * 1e3 if timed else 0.0

    rng = np.random.default_rng()

    def verify(shape, count: int, what: str, per_count: int = 1) -> None:
        """Run ``count`` rounds of the loop counter (``per_count`` body passes each) on fresh data; compare."""
        passes = count * per_count
        host = rng.standard_normal(n).astype(np.float32)
        check(drv.cuMemcpyHtoD(x, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
        run(shape, count)
        got = np.empty(n, np.float32)
        check(drv.cuMemcpyDtoH(got.ctypes.data, x, got.nbytes), "cuMemcpyDtoH")
        want = host.copy()
        for _ in range(passes):
            want *= scale
        if not np.allclose(got, want, rtol=1e-6, atol=0):
            err = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)))
            raise Refused(f"shape {what} computed a wrong result for {passes} passes (largest relative error "
                          f"{err:.3g}): the shape is not correct on this driver")

    def per_pass_us(shape, lo: int, hi: int) -> float:
        for _ in range(3):
            run(shape, hi)
        t_lo = statistics.median(run(shape, lo, timed=True) for _ in range(args.repeats))
        t_hi = statistics.median(run(shape, hi, timed=True) for _ in range(args.repeats))
        return (t_hi - t_lo) / (hi - lo)

    def measure(k: int) -> tuple:
        """(us per pass, us per pass of k unguarded copies or None) of the raw shapes for ``k``."""
        shape = build(k, guarded=True)
        for passes in sorted({1, k - 1, k, k + 1, 2 * k + 1, 37} - {0}):  # stops after every copy position
            verify(shape, passes, f"k={k}")
        lo = max(args.passes // 10, 2 * k)
        if args.passes <= lo:
            raise Refused(f"--passes must be above {lo} for k={k} (got {args.passes})")
        us = per_pass_us(shape, lo, args.passes)
        free = None
        if k > 1:  # the body alone, k copies per round: the floor the IFs are measured against
            bare = build(k, guarded=False)
            for rounds in (1, 3):  # its step counts rounds of k passes
                verify(bare, rounds, f"k={k} unguarded", per_count=k)
            free = per_pass_us(bare, max(lo // k, 1), max(args.passes // k, lo // k + 1)) / k
        return us, free

    if args.dry_run:
        for k in args.ks:
            build(k, guarded=True)
            added = drv.count("cuGraphAddKernelNode") + drv.count("cuGraphAddNode")
            print(f"k={k}: built ({added} nodes added so far), instantiated")
            if k > 1:
                build(k, guarded=False)
        print("dry run on the null driver: every shape was built; nothing was measured")
        return 0
    rows, refused = [], []
    for k in args.ks:
        if k < 1:
            raise Refused(f"--ks takes unroll factors >= 1 (got {k})")
        try:
            us, free = measure(k)
        except Refused as e:  # say so in the table, measure the other shapes, exit non-zero at the end
            refused.append(str(e))
            rows.append((k, None, None, "refused"))
            continue
        rows.append((k, us, free, _engine_per_pass(k, n, args.passes)))
    base = next((us for k, us, *_ in rows if k == 1 and us), None)
    driver = f"{version // 1000}.{version % 1000 // 10}"
    print(f"\nbench/region_passes.py — device time per For pass ({name}, driver {driver}, body: scalar_mul on {n} "
          f"elements, slope between about {max(args.passes // 10, 2)} and {args.passes} passes)\n")
    hdr = (f"{'k':>3} | {'us per pass':>11} | {'ratio to k=1':>12} | {'k copies, no IFs (floor) us':>27} | "
           f"{'engine For(unroll=k) us':>23}")
    print(hdr)
    print("-" * len(hdr))
    for k, us, free, eng in rows:
        if us is None:
            print(f"{k:>3} | {'refused':>11} | {'-':>12} | {'-':>27} | {'-':>23}")
            continue
        ratio = f"{us / base:12.3f}" if base else f"{'-':>12}"
        eng_s = eng if isinstance(eng, str) else f"{eng:.3f}"
        print(f"{k:>3} | {us:>11.3f} | {ratio} | {('-' if free is None else f'{free:.3f}'):>27} | {eng_s:>23}")
    print("\nk=1 is today's shape (one WHILE body per pass). Every shape was checked against NumPy at pass counts "
          "that stop after each copy.\n'engine' is rxcuda's own For(..., unroll=k) around the same kernel: tick() "
          "wall time per pass (host cost cancels in the slope).\nIf a k > 1 row is clearly below k=1, "
          "While(..., unroll=k) / For(..., unroll=k) pays on this card.")
    if refused:
        print("\n" + "\n".join(f"bench/region_passes.py: {m}" for m in refused), file=sys.stderr)
        return 1
    return 0


def _engine_per_pass(k: int, n: int, passes: int) -> float | str:
    """tick() wall time per pass of rxcuda's ``For(..., unroll=k)`` running scalar_mul (checked against NumPy),
    as the slope between two pass counts; a message instead when the engine fails."""
    sys.path.insert(0, str(ROOT))
    import rxcuda

    lo, hi = max(passes // 10, 2 * k), passes
    try:
        with rxcuda.Engine() as engine:
            code = rxcuda.load_kernel_file(ROOT / "kernels" / "scalar_mul.ptx")
            body = rxcuda.Block.from_kernel(code, size=n, scale=1.5, name="body")
            loop = engine.add(rxcuda.For(lo, [body], unroll=k))
            x = np.random.default_rng().standard_normal(n).astype(np.float32)
            engine.write(body["x"], x)
            engine.tick()
            if not np.allclose(engine.read(body["out"]), x * np.float32(1.5), rtol=1e-6):
                return "WRONG result"

            def per_tick(count: int) -> float:
                loop.params["n"].value = count
                engine.tick()
                runs = []
                for _ in range(15):
                    t0 = time.perf_counter_ns()
                    engine.tick()
                    runs.append((time.perf_counter_ns() - t0) / 1e3)
                return statistics.median(runs)

            t_lo, t_hi = per_tick(lo), per_tick(hi)
            state = engine.tick().state
            if state != "ok":
                return f"engine state {state}"
            return (t_hi - t_lo) / (hi - lo)
    except Exception as e:  # the engine's own shape refused or failed: the table says so
        return f"failed: {type(e).__name__}"


if __name__ == "__main__":
    raise SystemExit(main())
