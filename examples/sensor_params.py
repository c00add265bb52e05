"""Parameters from an Rx stream: a simulated noisy sensor drives a GPU pipeline at 60 frames per second.

    python -m rxcuda.examples.sensor_params [seconds]

The sensor emits ~500 noisy readings a second on its own thread. Ordinary RxPY operators smooth it
(an exponential moving average) and keep only every 5th value; the result is bound to the `scale`
parameter of a saxpy block (y_out = scale * x + y). The engine runs on its own thread from a 60 Hz
clock; the output port is an Observable we sample twice a second and print.
"""

import math
import sys
import time

import numpy as np
import reactivex
from reactivex import operators as ops

import rxcuda

ok, why = rxcuda.probe()
if not ok:  # the same pipeline on the CPU device (docs/cpu.md): Engine() picks it where there is no GPU
    print(f"no CUDA device ({why}): running on the CPU device")

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
n = 1 << 18
rng = np.random.default_rng()
x = np.ones(n, np.float32)
y = np.zeros(n, np.float32)

# a slow sine plus noise, as a sensor would report it
sensor = reactivex.interval(0.002).pipe(
    ops.map(lambda i: math.sin(i * 0.004) + rng.normal(0, 0.3)),
)
smoothed = sensor.pipe(
    ops.scan(lambda avg, v: 0.95 * avg + 0.05 * v, 0.0),  # exponential moving average
    ops.buffer_with_count(5),  # keep every 5th smoothed value
    ops.map(lambda values: values[-1]),
)

with rxcuda.Engine() as engine:
    blk = engine.add(rxcuda.Block.from_kernel("saxpy", size=n, a=0.0))
    engine.write(blk["x"], x)
    engine.write(blk["y"], y)
    blk.params["a"].bind(smoothed)
    # every 30th frame (twice a second at 60 Hz), as a NumPy array read back asynchronously
    out = engine.observe(blk["y_out"], every=30).subscribe(
        lambda arr: print(f"GPU mean {arr.mean():+.3f}   (parameter a = {blk.params['a'].value:+.3f})"))
    running = engine.run(reactivex.interval(1 / 60))
    time.sleep(seconds)
    running.dispose()
    out.dispose()
    print(f"{engine.frame} frames; last frame {engine.last_frame.host_us:.0f} us on the host")
