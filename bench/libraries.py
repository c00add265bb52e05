"""Library calls: captured-and-launched CUDA graph vs the same call made eagerly (nvmath bindings, CuPy).

For a GEMM and an FFT at a small and a large size, prints per-call times (GPU time from CUDA events over
a batch of launches, and host time per call) for

- ``graph``: the rxcuda call captured once into a graph, as a child-graph node of a parent graph, launched
  with ``cuGraphLaunch`` (what the engine does every frame);
- ``nvmath``: the very same ``record`` function issued eagerly on a stream (same handle, same workspace);
- ``cupy``: ``cupy.matmul(out=...)`` / ``cupy.fft.fft``;

then the cost of one recapture (capture + ``cuGraphExecChildGraphNodeSetParams``). One run; ratios are
indicative. The engine pipeline rows (kernel -> GEMM -> kernel -> FFT per frame) come with the engine.

    python bench/libraries.py                 # default sizes
    python bench/libraries.py --repeat 200 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

SIZES = {
    "gemm": {"small": 128, "large": 4096},  # n x n x n, f32
    "fft": {"small": (1024, 1), "large": (1 << 20, 16)},  # (length, batch), c64
}


def parse(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=100, help="launches per timing batch (default 100)")
    ap.add_argument("--sizes", default="small,large", help="comma list of: small, large (default both)")
    ap.add_argument("--ops", default="gemm,fft,engine,pipeline",
                    help="comma list of: gemm, fft (captured call vs eager), engine (the call as an engine block), "
                         "pipeline (kernel -> GEMM -> kernel -> FFT per frame); default all")
    ap.add_argument("--tf32", action="store_true", help="let the f32 GEMM use TF32 tensor cores")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    ap.add_argument("--libs", action="store_true", help="print which CUDA libraries nvmath loads, then exit")
    return ap.parse_args(argv)


def show_libs(ordinal: int) -> None:
    """Versions of the libraries behind nvmath's bindings and the files they were loaded from."""
    from rxcuda.cuda._device import Device

    Device(ordinal)  # its primary context, current on this thread
    import nvmath
    from nvmath.bindings import cublas, cufft, curand, cusolver, cusparse

    print("nvmath", nvmath.__version__)
    h = cublas.create()
    print("cublas", cublas.get_version(h))
    cublas.destroy(h)
    h = cusparse.create()
    print("cusparse", cusparse.get_version(h))
    cusparse.destroy(h)
    print("cufft", cufft.get_version(), "curand", curand.get_version(), "cusolver", cusolver.get_version())
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if any(k in line for k in ("libcu", "libnvrtc", "libnvJit"))})
    print("\n".join(paths))


class Bench:
    def __init__(self, ordinal: int, repeat: int):
        import cupy as cp
        from cuda.bindings import driver as drv

        from rxcuda.cuda._device import Device

        self.cp, self.drv = cp, drv
        self.dev = Device(ordinal)  # the primary context, current on this thread, as the engine makes it
        self.ordinal = ordinal
        self.repeat = repeat
        self.stream = cp.cuda.Stream(non_blocking=True)

    def ok(self, result):
        err, *rest = result
        if err != self.drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(repr(err))
        return rest[0] if len(rest) == 1 else (tuple(rest) or None)

    def time(self, fn, warmup: int = 3) -> tuple[float, float]:
        """(GPU us per call from events, host us per call) over ``repeat`` calls on the stream."""
        cp = self.cp
        for _ in range(warmup):
            fn()
        self.stream.synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        start.record(self.stream)
        for _ in range(self.repeat):
            fn()
        end.record(self.stream)
        host = (time.perf_counter() - t0) / self.repeat
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) * 1e3 / self.repeat, host * 1e6

    def capture(self, spec, args):
        drv = self.drv
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        if getattr(spec, "prepare", None) is not None:
            spec.prepare(args)  # host work that must precede the capture (cuRAND re-seeding)
        self.ok(drv.cuStreamBeginCapture(self.stream.ptr, mode))
        try:
            spec.record(args)
        finally:
            graph = self.ok(drv.cuStreamEndCapture(self.stream.ptr))
        return graph

    def graph_of(self, spec, args):
        """(parent exec, child node, child graph, parent graph) with the call as a child-graph node."""
        drv = self.drv
        child = self.capture(spec, args)
        parent = self.ok(drv.cuGraphCreate(0))
        node = self.ok(drv.cuGraphAddChildGraphNode(parent, None, 0, child))
        exe = self.ok(drv.cuGraphInstantiate(parent, 0))
        return exe, node, child, parent

    def run_call(self, label, spec, arrays, cupy_fn):
        from rxcuda.model._describe import CaptureArgs

        cp, drv = self.cp, self.drv
        state = spec.setup(self.ordinal)
        slots = {n: cp.asarray([p.default], dtype="float32" if p.dtype == "f32" else "float64")
                 for n in spec.device_scalars for p in spec.params if p.name == n}  # fmt: skip
        ptrs = {n: a.data.ptr for n, a in arrays.items()} | {n: s.data.ptr for n, s in slots.items()}
        values = {p.name: p.default for p in spec.params if not p.is_pointer and p.name not in spec.device_scalars}
        args = CaptureArgs(stream=self.stream.ptr, pointers=ptrs, values=values, state=state)
        cp.cuda.Device().synchronize()
        rows = []
        try:
            exe, node, child, parent = self.graph_of(spec, args)
            g_gpu, g_host = self.time(lambda: self.ok(drv.cuGraphLaunch(exe, self.stream.ptr)))
            e_gpu, e_host = self.time(lambda: spec.record(args))
            with self.stream:
                c_gpu, c_host = self.time(cupy_fn)
            t0 = time.perf_counter()
            n_recap = 20
            for _ in range(n_recap):
                new = self.capture(spec, args)
                self.ok(drv.cuGraphExecChildGraphNodeSetParams(exe, node, new))
                self.ok(drv.cuGraphDestroy(child))
                child = new
            recap = (time.perf_counter() - t0) / n_recap * 1e6
            self.stream.synchronize()
            rows.append(dict(call=label, method="graph", gpu_us=g_gpu, host_us=g_host, ratio=1.0))
            rows.append(dict(call=label, method="nvmath eager", gpu_us=e_gpu, host_us=e_host, ratio=e_gpu / g_gpu))
            rows.append(dict(call=label, method="cupy eager", gpu_us=c_gpu, host_us=c_host, ratio=c_gpu / g_gpu))
            rows.append(
                dict(call=label, method="recapture+setparams", gpu_us=float("nan"), host_us=recap, ratio=float("nan"))
            )
            self.ok(drv.cuGraphExecDestroy(exe))
            self.ok(drv.cuGraphDestroy(parent))
            self.ok(drv.cuGraphDestroy(child))
        finally:
            spec.teardown(state)
        return rows


def bench_gemm(b: Bench, size: str, tf32: bool):
    import numpy as np

    from rxcuda import libraries as lib

    cp = b.cp
    n = SIZES["gemm"][size]
    rng = np.random.default_rng()
    a = cp.asarray(rng.standard_normal((n, n), np.float32))
    bb = cp.asarray(rng.standard_normal((n, n), np.float32))
    c = cp.empty((n, n), np.float32)
    spec = lib.gemm(n, n, n, tf32=tf32)
    return b.run_call(f"gemm f32 {n}^3", spec, {"a": a, "b": bb, "c": c}, lambda: cp.matmul(a, bb, out=c))


def bench_fft(b: Bench, size: str, tf32: bool):
    import numpy as np

    from rxcuda import libraries as lib

    cp = b.cp
    n, batch = SIZES["fft"][size]
    rng = np.random.default_rng()
    x = cp.asarray((rng.standard_normal((batch, n)) + 1j * rng.standard_normal((batch, n))).astype(np.complex64))
    y = cp.empty_like(x)
    spec = lib.fft(n, batch=batch, norm=None)  # raw transform, as cupy.fft.fft forward
    return b.run_call(f"fft c64 {n} x{batch}", spec, {"x": x, "y": y}, lambda: cp.fft.fft(x, axis=-1))


def bench_engine(b: Bench, size: str, tf32: bool):
    """The same GEMM / FFT as one-block pipelines inside the engine's graph: GPU time per frame."""
    import numpy as np

    import rxcuda
    from rxcuda import libraries as lib

    rows = []
    rng = np.random.default_rng()
    n = SIZES["gemm"][size]
    fn, batch = SIZES["fft"][size]
    cases = [
        (f"gemm f32 {n}^3", lib.gemm(n, n, n, tf32=tf32),
         {"a": rng.standard_normal(n * n).astype(np.float32), "b": rng.standard_normal(n * n).astype(np.float32)}),
        (f"fft c64 {fn} x{batch}", lib.fft(fn, batch=batch, norm=None),
         {"x": (rng.standard_normal(fn * batch) + 1j * rng.standard_normal(fn * batch)).astype(np.complex64)}),
    ]
    with rxcuda.Engine(timing=True) as engine:  # Frame.gpu_us needs the frame's events
        for label, spec, inputs in cases:
            blk = engine.add(rxcuda.Block.from_call(spec))
            for name, arr in inputs.items():
                engine.write(blk[name], arr)
            frames = []
            sub = engine.frames.subscribe(frames.append)
            for _ in range(5):
                engine.tick()
            frames.clear()
            for _ in range(max(b.repeat // 5, 10)):
                engine.tick()
            sub.dispose()
            gpu = sorted(f.gpu_us for f in frames)[len(frames) // 2]
            host = sorted(f.host_us for f in frames)[len(frames) // 2]
            rows.append(dict(call=label, method="engine frame", gpu_us=gpu, host_us=host, ratio=float("nan")))
            engine.remove(blk)
            engine.tick()
    return rows


def bench_pipeline(b: Bench, size: str, tf32: bool):
    """kernel -> GEMM -> kernel -> FFT per frame: engine.tick() vs the same calls launched eagerly."""
    import pathlib

    import numpy as np

    import rxcuda
    from rxcuda import libraries as lib
    from rxcuda.model._describe import CaptureArgs

    cp, drv = b.cp, b.drv
    m = 64 if size == "small" else 1024
    kernels = pathlib.Path(__file__).resolve().parents[1] / "kernels"
    rng = np.random.default_rng()
    a = rng.standard_normal(m * m).astype(np.float32)
    bm = rng.standard_normal(m * m).astype(np.float32)
    gemm, fft = lib.gemm(m, m, m, tf32=tf32), lib.rfft(m, batch=m, norm=None)
    with rxcuda.Engine() as engine:
        pre = engine.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=m * m, scale=2.0, name="pre"))
        mm = engine.add(rxcuda.Block.from_call(gemm))
        post = engine.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=m * m, scale=3.0, name="post"))
        ff = engine.add(rxcuda.Block.from_call(fft))
        engine.connect(pre["out"], mm["a"])
        engine.connect(mm["c"], post["x"])
        engine.connect(post["out"], ff["x"])
        engine.write(pre["x"], a)
        engine.write(mm["b"], bm)
        engine.tick()
        want = np.fft.rfft(((2 * a.reshape(m, m).astype(np.float64)) @ bm.reshape(m, m)) * 3, axis=1)
        got = engine.read(ff["y"]).reshape(m, m // 2 + 1)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err < 1e-3, f"pipeline result is wrong (relative error {err:.2e})"
        t_engine = _median_us(engine.tick, b.repeat)

    # eager: the same four calls issued one by one (kernels through cuLaunchKernel, library calls through
    # the same record functions on a stream), then a sync, every frame
    code = rxcuda.load_kernel_file(kernels / "scalar_mul.ptx")
    mod = b.ok(drv.cuModuleLoadData(code.image + b"\0"))
    fn = b.ok(drv.cuModuleGetFunction(mod, b"scalar_mul"))
    x, t1, c, t2 = (cp.asarray(a), cp.empty(m * m, np.float32), cp.empty(m * m, np.float32),
                    cp.empty(m * m, np.float32))
    bb = cp.asarray(bm)
    y = cp.empty(m * (m // 2 + 1), np.complex64)
    st_g, st_f = gemm.setup(b.ordinal), fft.setup(b.ordinal)
    alpha = cp.asarray([1.0], np.float32)
    s = b.stream.ptr
    ga = CaptureArgs(s, {"a": t1.data.ptr, "b": bb.data.ptr, "c": c.data.ptr, "alpha": alpha.data.ptr}, {}, st_g)
    fa = CaptureArgs(s, {"x": t2.data.ptr, "y": y.data.ptr}, {}, st_f)
    grid = (m * m + 255) // 256
    pa = [np.array([p1, p2], np.uint64) for p1, p2 in ((x.data.ptr, t1.data.ptr), (c.data.ptr, t2.data.ptr))]
    sc = [np.array([2.0], np.float32), np.array([3.0], np.float32)]
    nn = np.array([m * m], np.int32)
    argv = [np.array([p.ctypes.data, p.ctypes.data + 8, k.ctypes.data, nn.ctypes.data], np.uint64)
            for p, k in zip(pa, sc, strict=True)]

    def eager():
        drv.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, s, int(argv[0].ctypes.data), 0)
        gemm.record(ga)
        drv.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, s, int(argv[1].ctypes.data), 0)
        fft.record(fa)
        drv.cuStreamSynchronize(s)

    eager()
    got = cp.asnumpy(y).reshape(m, m // 2 + 1)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3, "eager pipeline result is wrong"
    t_eager = _median_us(eager, b.repeat)
    xs, bs = cp.asarray(a).reshape(m, m), cp.asarray(bm).reshape(m, m)

    def cupy_eager():
        with b.stream:
            cp.fft.rfft(cp.matmul(xs * 2, bs) * 3, axis=1)
        b.stream.synchronize()

    t_cupy = _median_us(cupy_eager, b.repeat)
    gemm.teardown(st_g)
    fft.teardown(st_f)
    b.ok(drv.cuModuleUnload(mod))
    label = f"pipeline {m}x{m}"
    return [dict(call=label, method="engine tick+sync", gpu_us=float("nan"), host_us=t_engine, ratio=1.0),
            dict(call=label, method="eager +sync", gpu_us=float("nan"), host_us=t_eager, ratio=t_eager / t_engine),
            dict(call=label, method="cupy eager +sync", gpu_us=float("nan"), host_us=t_cupy, ratio=t_cupy / t_engine)]


def _median_us(fn, n: int) -> float:
    for _ in range(10):
        fn()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(runs)[2]


def table(rows) -> str:
    head = f"{'call':<22} {'method':<21} {'GPU us/call':>12} {'host us/call':>13} {'ratio to graph':>17}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = "" if r["ratio"] != r["ratio"] else f"{r['ratio']:.3f}"
        gpu = "" if r["gpu_us"] != r["gpu_us"] else f"{r['gpu_us']:.1f}"
        lines.append(f"{r['call']:<22} {r['method']:<21} {gpu:>12} {r['host_us']:>13.1f} {ratio:>17}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    ops = [o for o in args.ops.split(",") if o]
    for s in sizes:
        if s not in ("small", "large"):
            print(f"unknown size {s!r}; use small and/or large", file=sys.stderr)
            return 2
    for o in ops:
        if o not in ("gemm", "fft", "engine", "pipeline"):
            print(f"unknown op {o!r}; use gemm, fft, engine, pipeline", file=sys.stderr)
            return 2
    if args.libs:
        show_libs(args.device)
        return 0
    b = Bench(args.device, args.repeat)
    rows = []
    for op in ops:
        for size in sizes:
            rows += {"gemm": bench_gemm, "fft": bench_fft, "engine": bench_engine,
                     "pipeline": bench_pipeline}[op](b, size, args.tf32)
    print(f"device: {b.dev.name} — {args.repeat} launches per batch, one run")
    print(table(rows))
    print("ratio: GPU time over the captured graph's (call rows); host time per frame over the engine's "
          "(pipeline rows). Targets: large calls within 3 % of eager; the small pipeline >= 2x faster than eager.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": b.dev.name, "repeat": args.repeat, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
