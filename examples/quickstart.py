"""Quickstart: two shipped kernels, connected, launched as one CUDA graph per frame.

    python -m rxcuda.examples.quickstart

(A + B) * scale, with `scale` changed between frames (a hot update: no rebuild), checked against NumPy.
"""


import numpy as np

import rxcuda

ok, why = rxcuda.probe()
if not ok:  # the same pipeline on the CPU device (docs/cpu.md): Engine() picks it where there is no GPU
    print(f"no CUDA device ({why}): running on the CPU device")

n = 1 << 20
rng = np.random.default_rng()
a = rng.standard_normal(n).astype(np.float32)
b = rng.standard_normal(n).astype(np.float32)

with rxcuda.Engine() as engine:
    add = engine.add(rxcuda.Block.from_kernel("vector_add", size=n))
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=3.0))
    engine.connect(add["out"], mul["x"])  # the intermediate buffer is the engine's
    engine.write(add["a"], a)
    engine.write(add["b"], b)

    for scale in (3.0, 0.5, -2.0):
        mul.params["scale"].value = scale
        frame = engine.tick()
        out = engine.read(mul["out"])
        err = np.abs(out - (a + b) * np.float32(scale)).max()
        print(f"frame {frame.index}: scale={scale:+.1f} tiers={frame.tiers} host {frame.host_us:.0f} us, "
              f"max error vs NumPy {err:.2e}")
    print(engine)
