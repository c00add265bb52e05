"""Compile latency of run-time kernels: NVRTC first call vs warm, cache miss vs hit, composed kernels.

    python bench/compile.py [--repeat 30] [--arch sm_90]

Rows (medians over --repeat runs, each with a fresh source where a miss is measured):

* NVRTC first call in a fresh process (cubin; NVRTC's start-up included) - run in subprocesses
* NVRTC warm, small .cu -> cubin (a miss: compile + disk-cache write)
* composed kernel from scratch (trace + lower + NVRTC + cache write) - target < 20 ms on H100/H200
* first compile right after warm_up() has run in the background
* cache hits: in-process memo, disk (a new process's view), composed (trace + IR memo)
* with a GPU: request -> loaded function (memo hit + module load + get_kernel) - target < 1 ms

Works without a GPU (the load rows are then skipped). The table names the card (or says there is none).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL = """
extern "C" __global__ void scale(const float* x, float* out, float s, int n)
{{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s + {k}.0f;
}}
"""

FIRST_CALL = textwrap.dedent("""
    import sys, time
    from cuda.core import Program, ProgramOptions
    src = sys.argv[1]
    t0 = time.perf_counter()
    Program(src, "c++", options=ProgramOptions(arch=sys.argv[2])).compile("cubin")
    print(time.perf_counter() - t0)
""")


def card() -> tuple[str, object]:
    """(name of device 0 or why there is none, the cuda.core Device or None)."""
    try:
        from cuda.core import Device

        dev = Device(0)
        dev.set_current()
        return dev.name, dev
    except Exception as e:  # no driver / no device
        return f"no GPU ({type(e).__name__})", None


def timed(fn, repeat: int) -> list[float]:
    out = []
    for k in range(repeat):
        t0 = time.perf_counter()
        fn(k)
        out.append(time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=30, help="runs per row (default 30)")
    ap.add_argument("--fresh", type=int, default=3, help="fresh processes for the first-call row (default 3)")
    ap.add_argument("--arch", default=None, help="target architecture (default: the device's, else sm_90)")
    args = ap.parse_args(argv)

    from rxcuda.sources import _compose as rx
    from rxcuda.sources import _nvrtc as nv

    name, dev = card()
    arch = args.arch or nv.default_arch()
    tmp = Path(tempfile.mkdtemp(prefix="rxcuda-bench-"))
    compiler = nv.Compiler(tmp / "cache")
    nv.set_default_compiler(compiler)
    rows: list[tuple[str, list[float], str]] = []

    # NVRTC first call, in fresh processes (compile time only, imports excluded)
    firsts = []
    for k in range(args.fresh):
        out = subprocess.run([sys.executable, "-c", FIRST_CALL, SMALL.format(k=1000 + k), arch],
                             capture_output=True, text=True, check=True)
        firsts.append(float(out.stdout.strip()))
    rows.append(("NVRTC first call in a process (cubin)", firsts, ""))

    # warm_up in the background, then the first compile of this process
    t = nv.warm_up(arch)
    t.join()
    rows.append(("first compile after warm_up() (miss)",
                 timed(lambda k: nv.compile_cuda(SMALL.format(k=2000 + k), arch=arch), 1), ""))

    rows.append(("NVRTC warm, small .cu -> cubin (miss)",
                 timed(lambda k: nv.compile_cuda(SMALL.format(k=3000 + k), arch=arch), args.repeat), ""))

    def composed(k, arch=arch):
        kern = rx.compose(lambda x, out, a: out.__setitem__(rx.thread_index(), a * x[rx.thread_index()] + k),
                          params={"x": rx.In[rx.f32], "out": rx.Out[rx.f32], "a": rx.f32}, name="axpb")
        return kern.kernel_code(arch=arch)

    rows.append(("composed kernel from scratch (miss)", timed(lambda k: composed(4000 + k), args.repeat),
                 "< 20 ms"))

    # what NVRTC options do to a composed miss (NVRTC alone, cubin)
    from cuda.core import Program, ProgramOptions

    src = rx.compose(lambda x, out, a: out.__setitem__(rx.thread_index(), a * x[rx.thread_index()] + 12345),
                     params={"x": rx.In[rx.f32], "out": rx.Out[rx.f32], "a": rx.f32}, name="axpb").source
    variants = (("defaults", {}), ("-minimal", {"minimal": True}),
                ("-minimal -Ofast-compile=max", {"minimal": True, "ofast_compile": "max"}))
    for v, (label, extra) in enumerate(variants):
        # every compile a source never compiled before in this process: a repeated source compiles much
        # faster (seen: 6.6 ms instead of 55 ms on NVRTC 13.0), which once made -minimal look 8x faster
        def raw(k, extra=extra, v=v):
            Program(src.replace("12345", str(50_000 + 1000 * v + k)), "c++",
                    options=ProgramOptions(arch=arch, **extra)).compile("cubin")

        try:
            rows.append((f"  NVRTC only, composed, {label}", timed(raw, max(5, args.repeat // 3)), ""))
        except Exception as e:  # an option this NVRTC does not know
            print(f"(skipped NVRTC options {label}: {type(e).__name__})")

    nv.compile_cuda(SMALL.format(k=1), arch=arch)
    rows.append(("cache hit: memory (compile_cuda)",
                 timed(lambda k: nv.compile_cuda(SMALL.format(k=1), arch=arch), args.repeat), ""))

    def disk_hit(k):
        nv.Compiler(compiler.directory).compile_module(SMALL.format(k=1), arch=arch)

    rows.append(("cache hit: disk (a new process's view)", timed(disk_hit, args.repeat), ""))
    composed(1)
    rows.append(("cache hit: composed (trace + IR memo)", timed(lambda k: composed(1), args.repeat), ""))

    if dev is not None:
        from cuda.core import ObjectCode

        def load_memo(k):
            code = nv.compile_cuda(SMALL.format(k=1), arch=arch)
            ObjectCode.from_cubin(code.image).get_kernel(code.entry)

        def load_composed(k):
            code = composed(1)
            ObjectCode.from_cubin(code.image).get_kernel(code.entry)

        def load_disk(k):
            m = nv.Compiler(compiler.directory).compile_module(SMALL.format(k=1), arch=arch)
            ObjectCode.from_cubin(m.image).get_kernel("scale")

        rows.append(("request -> loaded function: memory hit", timed(load_memo, args.repeat), "< 1 ms"))
        rows.append(("request -> loaded function: composed hit", timed(load_composed, args.repeat), "< 1 ms"))
        rows.append(("request -> loaded function: disk hit", timed(load_disk, args.repeat), ""))

    stats = compiler.stats()
    maj, mnr = nv.nvrtc_version()
    try:
        from cuda.core import __version__ as core_version
    except ImportError:
        core_version = "?"
    print(f"\nbench/compile.py - card: {name}; arch {arch}; NVRTC {maj}.{mnr}; cuda.core {core_version}; "
          f"CPU: {platform.processor() or platform.machine()} ({os.cpu_count()} threads)")
    print(f"{'what':<44} {'median':>11} {'min':>11} {'runs':>5}  {'target':<8} ok")
    print("-" * 88)
    for label, times, target in rows:
        med = statistics.median(times)
        ok = ""
        if target:
            limit = float(target.split()[1]) * (1e-3 if target.endswith("ms") else 1.0)
            ok = "yes" if med < limit else "NO"
        print(f"{label:<44} {fmt(med):>11} {fmt(min(times)):>11} {len(times):>5}  {target:<8} {ok}")
    print(f"\ncompiler stats: {stats.memory_hits} memory hits, {stats.disk_hits} disk hits, {stats.misses} misses, "
          f"{stats.compile_seconds * 1e3:.0f} ms in NVRTC")
    return 0


def fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


if __name__ == "__main__":
    sys.exit(main())
