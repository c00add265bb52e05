"""Hot reload: edit a kernel while the pipeline runs; the next frames use the new code.

    python -m rxcuda.examples.hot_reload [seconds]

Writes a small CUDA C++ kernel, forces.cu, into a fresh temporary folder (removed when the example ends),
runs it at 30 frames per second and prints the output every half second. Open the forces.cu it names in
your editor, change the formula (say `k * x[i]` to `k * x[i] * x[i]`) and save: the kernel is recompiled
off the engine thread and swapped into the running graph. Save a typo and you get one diagnostic with the
compiler's line; the old kernel keeps running. Save a kernel that faults (say `out[i + 100000000] = ...`) and
the session survives: the pipeline runs in an IsolatedEngine (docs/faults.md), whose GPU side is a child
process: the new code is tried there first, refused with one diagnostic, and the last good code keeps running.
"""

import contextlib
import pathlib
import sys
import tempfile
import time

import numpy as np
import reactivex

import rxcuda

ok, why = rxcuda.probe()
if not ok:  # the same pipeline on the CPU device (docs/cpu.md): IsolatedEngine() picks it where there is no GPU
    print(f"no CUDA device ({why}): running on the CPU device")

SOURCE = '''// forces.cu: edit me while rxcuda.examples.hot_reload runs
extern "C" __global__ void forces(const float* x, float* out, float k, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = k * x[i];
}
'''

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
n = 8
x = np.arange(1, n + 1, dtype=np.float32)

# where people edit code live, the isolated engine: a kernel that faults costs frames, not this process
with tempfile.TemporaryDirectory(prefix="rxcuda-hot-reload-") as folder, rxcuda.IsolatedEngine() as engine:
    path = pathlib.Path(folder) / "forces.cu"
    path.write_text(SOURCE)
    blk = engine.add(rxcuda.Block.from_kernel(path, size=n, k=2.0))
    engine.write(blk["x"], x)
    engine.diagnostics.subscribe(lambda d: print(f"[{d.severity}] {d.subject}: {d.message}"))
    swapped = f"new code for {blk.name}: swapped in place"
    engine.frames.subscribe(lambda f: rxcuda.Tier.CODE in f.tiers and print(swapped))
    engine.observe(blk["out"], every=15).subscribe(lambda arr: print("out =", np.round(arr, 2)))
    watching = engine.watch()
    running = engine.run(reactivex.interval(1 / 30))
    print(f"edit and save {path} (running for {seconds:.0f} s, Ctrl-C to stop)")
    with contextlib.suppress(KeyboardInterrupt):
        time.sleep(seconds)
    running.dispose()
    watching.dispose()
