"""Bandwidth of composed (generated) kernels vs the device's copy ceiling, and fused vs unfused chains.

    python bench/generated.py [--n 67108864] [--repeat 20] [--chain 8]

Rows, each timed with CUDA events over --repeat back-to-back launches on one stream:

* device-to-device copy (cudaMemcpyAsync): the ceiling, bytes read + written per second
* a composed copy, a composed saxpy (2 in, 1 out) and a fused chain of --chain elementwise operations
  (1 in, 1 out), with their bandwidth as a share of the copy ceiling (target: >= 85 %)
* the same chain unfused: one composed kernel per operation, each reading and writing the whole array

Needs a CUDA device (prints why not, and exits 1, without one); --help works anywhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1 << 26, help="elements per array (default 2**26 float32)")
    ap.add_argument("--repeat", type=int, default=20, help="launches per measurement (default 20)")
    ap.add_argument("--chain", type=int, default=8, help="operations in the chain (default 8)")
    args = ap.parse_args(argv)

    try:
        from cuda.core import Device

        dev = Device(0)
        dev.set_current()
    except Exception as e:
        print(f"bench/generated.py needs a CUDA device: {type(e).__name__}: {e}")
        return 1

    import cupy as cp
    import numpy as np
    from cuda.core import EventOptions, LaunchConfig, ObjectCode, launch

    import rxcuda.sources._compose as rx
    from rxcuda.sources._compose import f32

    arch = "sm_" + "".join(str(v) for v in dev.compute_capability)
    stream = dev.create_stream()
    n = args.n
    try:
        timing = EventOptions(timing_enabled=True)
    except TypeError:  # older cuda.core spelling
        timing = EventOptions(enable_timing=True)

    def loaded(kernel, options=None):
        code = kernel.kernel_code(arch=arch, options=options)
        return code, ObjectCode.from_cubin(code.image).get_kernel(code.entry)

    def launcher(kernel, items=None, options=None, **arrays_and_scalars):
        """A function that launches ``kernel`` over n elements, ``items`` per thread (default: the
        kernel's own advice)."""
        code, fn = loaded(kernel, options)
        threads = kernel.launch_threads(n) if items is None else -(-n // items)
        values = []
        for p in code.signature.params:
            if p.is_pointer:
                values.append(arrays_and_scalars[p.name].data.ptr)
            elif p.name == kernel.ir.size_param:
                values.append(np.int64(n))
            else:
                values.append(np.float32(arrays_and_scalars.get(p.name, p.default)))
        config = LaunchConfig(grid=-(-threads // code.block_size), block=code.block_size)
        return lambda: launch(stream, config, fn, *values)

    def timed(step) -> float:
        """Seconds per call of ``step`` (which enqueues work on the stream)."""
        step()
        stream.sync()
        start = stream.record(options=timing)
        for _ in range(args.repeat):
            step()
        end = stream.record(options=timing)
        end.sync()
        return (end - start) * 1e-3 / args.repeat

    rng = np.random.default_rng()
    x = cp.asarray(rng.uniform(0.5, 2.0, n).astype(np.float32))
    y = cp.asarray(rng.uniform(0.5, 2.0, n).astype(np.float32))
    out = cp.empty_like(x)
    tmp = cp.empty_like(x)
    cp.cuda.Device().synchronize()
    nbytes = x.nbytes

    def memcpy():
        cp.cuda.runtime.memcpyAsync(out.data.ptr, x.data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                    int(stream.handle))

    copy_k = rx.elementwise(lambda v: v * 1, x=rx.In[f32], name="copy")
    saxpy = rx.elementwise(lambda a, b, s: s * a + b, a=rx.In[f32], b=rx.In[f32], s=f32, name="saxpy")
    ops = [
        lambda v: v * 1.0001 + 0.5,
        lambda v: rx.tanh(v),
        lambda v: v * v * 0.25 + v,
        lambda v: rx.sqrt(rx.abs(v) + 1.0),
    ]
    chain = [ops[k % len(ops)] for k in range(args.chain)]

    def fused_fn(v):
        for op in chain:
            v = op(v)
        return v

    fused = rx.elementwise(fused_fn, x=rx.In[f32], name="fused_chain")
    unfused = [rx.elementwise(op, x=rx.In[f32], name=f"op{k}") for k, op in enumerate(chain)]
    assert fused.source.count("__global__") == 1

    rows = []
    t_copy = timed(memcpy)
    rows.append(("device-to-device copy (ceiling)", t_copy, 2 * nbytes))
    rows.append(("composed copy: out = x", timed(launcher(copy_k, x=x, out=out)), 2 * nbytes))
    rows.append(("composed saxpy: out = s*a + b", timed(launcher(saxpy, a=x, b=y, out=out, s=1.5)), 3 * nbytes))
    run_fused = launcher(fused, x=x, out=out)
    t_fused = timed(run_fused)
    rows.append((f"fused chain of {args.chain} ops (1 kernel)", t_fused, 2 * nbytes))
    steps = []
    src = x
    for k, kern in enumerate(unfused):
        dst = out if k == len(unfused) - 1 else (tmp if k % 2 == 0 else y)
        steps.append(launcher(kern, x=src, out=dst))
        src = dst

    def run_unfused():
        for s in steps:
            s()

    t_unfused = timed(run_unfused)
    rows.append((f"unfused chain: {args.chain} kernels", t_unfused, 2 * nbytes * args.chain))
    try:
        fast = {"ofast_compile": "max"}
        rows.append(("saxpy, NVRTC -Ofast-compile=max", timed(launcher(saxpy, None, fast, a=x, b=y, out=out, s=1.5)),
                     3 * nbytes))
        rows.append(("fused chain, NVRTC -Ofast-compile=max", timed(launcher(fused, None, fast, x=x, out=out)),
                     2 * nbytes))
    except Exception as e:  # an NVRTC without the option
        print(f"(skipped -Ofast-compile rows: {type(e).__name__}: {e})")
    sweep = []
    for items in (1, 2, 4, 8):
        ck = rx.elementwise(lambda v: v * 1, x=rx.In[f32], name="copy", items_per_thread=items)
        sk = rx.elementwise(lambda a, b, s: s * a + b, a=rx.In[f32], b=rx.In[f32], s=f32, name="saxpy",
                            items_per_thread=items)
        fk = rx.elementwise(fused_fn, x=rx.In[f32], name="fused_chain", items_per_thread=items)
        sweep.append((items, timed(launcher(ck, x=x, out=out)), timed(launcher(sk, a=x, b=y, out=out, s=1.5)),
                      timed(launcher(fk, x=x, out=out))))

    # same results, fused or not
    run_fused()
    stream.sync()
    fused_out = out.get()
    run_unfused()
    stream.sync()
    same = np.allclose(fused_out, out.get(), rtol=1e-6, atol=1e-6)

    ceiling = 2 * nbytes / t_copy
    print(f"\nbench/generated.py - card: {dev.name}; n = {n:,} float32 ({nbytes / 2**20:.0f} MiB per array); "
          f"{args.repeat} launches per row")
    print(f"{'what':<40} {'time/launch':>12} {'GB/s':>8} {'% of copy':>10}")
    print("-" * 74)
    for label, t, moved in rows:
        bw = moved / t
        print(f"{label:<40} {t * 1e3:>9.3f} ms {bw / 1e9:>8.0f} {100 * bw / ceiling:>9.1f} %")
    print(f"\nitems_per_thread (default {fused.items_per_thread}; launched for n / items threads) -> % of copy")
    print(f"{'items/thread':<14} {'copy':>8} {'saxpy':>8} {'chain':>8}")
    for items, t1, t2, t3 in sweep:
        print(f"{items:<14} {100 * 2 * nbytes / t1 / ceiling:>7.1f}% {100 * 3 * nbytes / t2 / ceiling:>7.1f}% "
              f"{100 * 2 * nbytes / t3 / ceiling:>7.1f}%")
    print(f"\nfused vs unfused chain: {t_unfused / t_fused:.2f}x faster (results equal: {same}); "
          f"fused chain at {100 * (2 * nbytes / t_fused) / ceiling:.1f} % of the copy ceiling (target >= 85 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
