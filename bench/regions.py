"""Regions and GPU-driven frames against the host deciding, and memory reuse by liveness.

    python bench/regions.py [--reps 30]

Prints, with the card's name:
1. A loop of K passes of a small kernel, decided on the device (a `While` region: one graph launch per frame)
   against the host deciding each pass (launch the body graph, copy the flag into pinned memory,
   synchronize, decide), written with raw cuda.bindings calls and as a cuda.core user writes it
   (GraphBuilder, Graph.launch, Buffer.copy_to, Stream.sync), K = 10, 100, 1000.
2. K frames per host launch (`engine.run_batch(K)`) against `tick()` per frame for a 10-kernel frame: wall,
   GPU (events) and host (wall - GPU) microseconds per frame.
3. Memory reuse: bytes allocated and saved for a 100-block chain and the three examples' pipelines.
"""

from __future__ import annotations

import argparse
import ctypes
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N = 4096
SRC = r"""
extern "C" __global__ void work(const float* x, /*inout*/ float* y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * 0.5f + x[i];
}
extern "C" __global__ void step(const float* x, float* y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * 0.5f + 1.0f;
}
extern "C" __global__ void reset(unsigned* c) { *c = 0; }
// the pass's work and its flag in one kernel (as a solver step that also reports convergence)
extern "C" __global__ void workcount(const float* x, /*inout*/ float* y, /*inout*/ unsigned* c, unsigned* go,
                                     unsigned k, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] * 0.5f + x[i];
    if (i == 0) { unsigned v = *c + 1; *c = v; *go = v < k; }
}
extern "C" __global__ void count(/*inout*/ unsigned* c, unsigned* go, unsigned k) {
    unsigned v = *c + 1; *c = v; *go = v < k;
}
"""


def _blocks(rx, codes):
    work = rx.Block.from_kernel(codes["work"], size=N, name="work")
    reset = rx.BlockBuilder("reset", size=1)
    k = reset.add_kernel(codes["reset"], threads=1)
    reset.output("c", k["c"], count=1)
    reset = reset.build()
    count = rx.BlockBuilder("count", size=1)
    k = count.add_kernel(codes["count"], threads=1)
    count.input("c", k["c"], count=1)
    count.output("go", k["go"], count=1)
    count.scalar("k", k["k"], default=1)
    return work, reset, count.build()


def loop_table(rx, codes, reps: int) -> list[str]:
    from cuda.bindings import driver as drv

    from rxcuda.cuda._driver import check

    rows = []
    with rx.Engine() as engine:
        work, reset, count = _blocks(rx, codes)
        engine.add(reset)
        engine.add(rx.While(count["go"], [work, count], max_iterations=1 << 20))
        engine.connect(reset["c"], count["c"])
        engine.write(work["x"], np.random.default_rng().standard_normal(N).astype(np.float32))
        engine.tick()
        # the host-decided loop: the same two kernels as one graph; per pass launch, copy the flag, wait, decide
        rt = engine._rt
        stream = rt.stream
        plan = rt.graph.plan
        go_ptr = rt.graph.pointers[plan.port_buffers[(count.id, "go")]]
        c_ptr = rt.graph.pointers[plan.port_buffers[(reset.id, "c")]]
        pinned = check(drv.cuMemHostAlloc(4, 0), "cuMemHostAlloc")
        flag = np.ctypeslib.as_array((ctypes.c_uint32 * 1).from_address(int(pinned)))

        def body_graph():
            """The pass as a graph of its two kernels, with the engine's current arguments (k included)."""
            g = check(drv.cuGraphCreate(0), "cuGraphCreate")
            nodes = rt.graph.nodes
            a = check(drv.cuGraphAddKernelNode(g, [], 0, nodes[plan.kernel_nodes[(work.id, "work")]].params),
                      "cuGraphAddKernelNode")
            check(drv.cuGraphAddKernelNode(g, [a], 1, nodes[plan.kernel_nodes[(count.id, "count")]].params),
                  "cuGraphAddKernelNode")
            return g, check(drv.cuGraphInstantiate(g, 0), "cuGraphInstantiate")

        for k in (10, 100, 1000):
            count.params["k"].value = k
            engine.tick()
            assert int(engine.read(count["c"])[0]) == k
            device = _median(lambda: engine.tick(), reps)
            g, body = body_graph()

            def host_loop(body=body) -> int:
                check(drv.cuMemsetD32Async(c_ptr, 0, 1, stream), "cuMemsetD32Async")
                passes = 0
                while True:
                    check(drv.cuGraphLaunch(body, stream), "cuGraphLaunch")
                    check(drv.cuMemcpyDtoHAsync(pinned, go_ptr, 4, stream), "cuMemcpyDtoHAsync")
                    check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
                    passes += 1
                    if not flag[0]:
                        return passes

            assert host_loop() == k
            host = _median(host_loop, reps)
            core = _core_loop(codes, k, reps)
            core_cells = (f"{core:.1f} | {core / device:.1f}x" if isinstance(core, float) else f"({core}) | ")
            rows.append(f"| {k} | {device:.1f} | {host:.1f} | {host / device:.1f}x | {core_cells} |")
            check(drv.cuGraphExecDestroy(body), "cuGraphExecDestroy")
            check(drv.cuGraphDestroy(g), "cuGraphDestroy")
        check(drv.cuMemFreeHost(pinned), "cuMemFreeHost")
    return rows


def anatomy_rows(rx, codes, reps: int, k: int = 100) -> list[str]:
    """Device time per pass of a loop by what the pass holds: where the per-pass cost comes from."""
    rows = []
    x = np.random.default_rng().standard_normal(N).astype(np.float32)
    with rx.Engine() as engine:  # While: two kernels (work, then the flag), then the step kernel reads the flag
        work, reset, count = _blocks(rx, codes)
        count.params["k"].value = k
        engine.add(reset)
        engine.add(rx.While(count["go"], [work, count], max_iterations=1 << 20))
        engine.connect(reset["c"], count["c"])
        engine.write(work["x"], x)
        engine.tick()
        rows.append(("While: work kernel -> flag kernel -> step", _median(engine.tick, reps) / k))
    with rx.Engine() as engine:  # While: one kernel does the work and writes the flag
        b = rx.BlockBuilder("wc", size=N)
        kk = b.add_kernel(codes["workcount"])
        b.input("x", kk["x"])
        b.output("y", kk["y"])
        b.input("c", kk["c"], count=1)
        b.output("go", kk["go"], count=1)
        b.scalar("k", kk["k"], default=k)
        b.scalar("n", kk["n"], default=N)
        wc = b.build()
        _, reset, _ = _blocks(rx, codes)
        engine.add(reset)
        engine.add(rx.While(wc["go"], [wc], max_iterations=1 << 20))
        engine.connect(reset["c"], wc["c"])
        engine.write(wc["x"], x)
        engine.tick()
        assert int(engine.read(wc["c"])[0]) == k
        rows.append(("While: one kernel (work + flag) -> step", _median(engine.tick, reps) / k))
    with rx.Engine() as engine:  # For: the step only counts and runs beside the body
        work = rx.Block.from_kernel(codes["work"], size=N, name="work")
        engine.add(rx.For(k, [work]))
        engine.write(work["x"], x)
        engine.tick()
        rows.append(("For: one kernel, step beside it", _median(engine.tick, reps) / k))
    return [f"| {what} | {us:.2f} |" for what, us in rows]


def _core_loop(codes, k: int, reps: int):
    """The host-decided loop as a cuda.core user writes it: a GraphBuilder-captured body (the same two
    kernels), Graph.launch, Buffer.copy_to into pinned memory, Stream.sync, decide. Median us, or why not."""
    try:
        from cuda.core import Device, LaunchConfig, LegacyPinnedMemoryResource, ObjectCode, launch
    except ImportError as e:
        return f"cuda.core: {e}"
    try:
        dev = Device()
        dev.set_current()
        s = dev.create_stream()
        obj = ObjectCode.from_cubin(codes["work"].image)
        work, count, reset = (obj.get_kernel(name) for name in ("work", "count", "reset"))
        mr = dev.memory_resource
        x, y, c, go = (mr.allocate(n, stream=s) for n in (4 * N, 4 * N, 4, 4))
        host = LegacyPinnedMemoryResource().allocate(4)
        flag = np.ctypeslib.as_array((ctypes.c_uint32 * 1).from_address(int(host.handle)))
        gb = s.create_graph_builder()
        gb.begin_building()
        launch(gb, LaunchConfig(grid=(N + 255) // 256, block=256), work, x, y, np.uint32(N))
        launch(gb, LaunchConfig(grid=1, block=1), count, c, go, np.uint32(k))
        gb.end_building()
        graph = gb.complete()
        one = LaunchConfig(grid=1, block=1)

        def loop() -> int:
            launch(s, one, reset, c)
            passes = 0
            while True:
                graph.launch(s)
                go.copy_to(host, stream=s)
                s.sync()
                passes += 1
                if not flag[0]:
                    return passes

        assert loop() == k
        t = _median(loop, reps)
        graph.close()
        return t
    except Exception as e:  # report, never hide: the row says what failed
        return f"cuda.core: {type(e).__name__}: {e}"[:90]


def batch_table(rx, codes, reps: int) -> list[str]:
    rows = []
    with rx.Engine(timing=True) as engine:
        blocks = [rx.Block.from_kernel(codes["work"], size=N, name=f"k{i}") for i in range(10)]
        for b in blocks:
            engine.add(b)
        engine.write(blocks[0]["x"], np.random.default_rng().standard_normal(N).astype(np.float32))
        for a, b in zip(blocks, blocks[1:], strict=False):
            engine.connect(a["y"], b["x"])
        engine.tick()
        ticks = []
        for _ in range(reps * 10):
            t0 = time.perf_counter_ns()
            f = engine.tick()
            ticks.append(((time.perf_counter_ns() - t0) / 1e3, f.gpu_us))
        wall = statistics.median(t for t, _ in ticks)
        gpu = statistics.median(g for _, g in ticks)
        rows.append(f"| tick() per frame | 1 | {wall:.2f} | {gpu:.2f} | {max(wall - gpu, 0):.2f} |")
        for k in (10, 100, 1000):
            engine.run_batch(k)
            runs = []
            for _ in range(max(reps // (1 + k // 100), 3)):
                t0 = time.perf_counter_ns()
                f = engine.run_batch(k)
                runs.append(((time.perf_counter_ns() - t0) / 1e3, f.gpu_us))
                assert f.frames == k
            wall_b = statistics.median(t for t, _ in runs)
            gpu_b = statistics.median(g for _, g in runs)
            rows.append(f"| run_batch({k}) | {k} | {wall_b / k:.3f} | {gpu_b / k:.2f} | "
                        f"{max(wall_b - gpu_b, 0) / k:.3f} |")
    return rows


def memory_rows(rx, codes) -> list[str]:
    rows = []
    with rx.Engine() as engine:
        blocks = [rx.Block.from_kernel(codes["step"], size=N, name=f"c{i}") for i in range(100)]
        for b in blocks:
            engine.add(b)
        engine.write(blocks[0]["x"], np.ones(N, np.float32))
        for a, b in zip(blocks, blocks[1:], strict=False):
            engine.connect(a["y"], b["x"])
        engine.tick()
        want = np.ones(N, np.float32)
        for _ in blocks:
            want = want * np.float32(0.5) + np.float32(1.0)
        np.testing.assert_array_equal(engine.read(blocks[-1]["y"]), want)
        s = engine.stats
        rows.append(f"| 100-block chain ({N} f32 per port) | {s.buffers} | {s.allocations} | {s.bytes_allocated} | "
                    f"{s.bytes_unshared} | {s.bytes_saved} |")
    for ex in ("particles", "solver", "peaks"):
        path = ROOT / "examples" / f"{ex}.py"
        if not path.exists():
            continue
        out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("memory:")), None)
        if line is None:
            rows.append(f"| examples/{ex}.py | (no memory line; exit {out.returncode}) | | | | |")
            continue
        f = dict(part.split("=") for part in line.split()[1:])
        rows.append(f"| examples/{ex}.py | {f['buffers']} | {f['allocations']} | {f['allocated']} | "
                    f"{f['without_reuse']} | {f['saved']} |")
    return rows


def _median(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        runs.append((time.perf_counter_ns() - t0) / 1e3)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    import rxcuda as rx

    ok, why = rx.probe()
    if not ok:
        sys.exit(f"bench/regions.py needs a CUDA device: {why}")
    codes = {e: rx.compile_cuda(SRC, entry=e) for e in ("work", "step", "reset", "count", "workcount")}
    with rx.Engine() as e:
        card = e.device.name
    print(f"# bench/regions.py on {card}")
    print("\n## A loop of K passes: decided on the device (While region) vs by the host each pass")
    print("| K | While region, us/frame | host loop (cuda.bindings), us | host / device | "
          "host loop (cuda.core), us | cuda.core / device |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in loop_table(rx, codes, args.reps):
        print(row)
    print("\n## Device time per pass, by what the pass holds (K = 100; one tick, with its launch, / K)")
    print("| pass | us per pass |")
    print("|---|---:|")
    for row in anatomy_rows(rx, codes, args.reps):
        print(row)
    print("\n## K frames per host launch vs tick() per frame (10-kernel frame; us per frame)")
    print("| how | frames per launch | wall | GPU | host (wall - GPU) |")
    print("|---|---:|---:|---:|---:|")
    for row in batch_table(rx, codes, args.reps):
        print(row)
    print("\n## Memory reuse by liveness (bytes)")
    print("| pipeline | buffers | allocations | allocated | without reuse | saved |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in memory_rows(rx, codes):
        print(row)


if __name__ == "__main__":
    main()
