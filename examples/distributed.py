"""Two fragments of one pipeline on two Ray workers, the connection between them carried every frame.

`camera` scales a frame, `filter` scales it again; the link between them is CUDA IPC when both workers share a
GPU host.

    pip install '.[ray]'
    python -m rxcuda.examples.distributed [frames]

It starts a local Ray cluster. With a GPU each worker takes half of it; without one the workers run on the CPU
device (docs/cpu.md; `RXCUDA_DEVICE=cpu`, which the workers inherit), each taking half of a GPU Ray is told the
machine has. Either way the output is checked against NumPy every frame. To use a cluster you already run, set
RAY_ADDRESS (`RAY_ADDRESS=auto` for the one `ray start` made on this machine).
"""

import os
import sys

import numpy as np

import rxcuda

try:
    import ray

    ray.init  # noqa: B018 - without Ray, a folder named ray (Ray leaves one in the temp folder) imports as an empty
    # namespace package: that is no Ray either
except (ImportError, AttributeError):
    sys.exit("rxcuda.examples.distributed runs on Ray, which is not installed: pip install '.[ray]' from a checkout "
             "of rxcuda (docs/getting-started.md#install)")

from rxcuda.distributed import Engine, Worker

frames = int(sys.argv[1]) if len(sys.argv) > 1 else 10
n = 1 << 20
gpu, why = rxcuda.probe()
if not gpu:
    print(f"no CUDA device ({why}): the workers run on the CPU device")
    os.environ["RXCUDA_DEVICE"] = "cpu"  # before Ray starts: its worker processes inherit it

if os.environ.get("RAY_ADDRESS"):  # a cluster you run: its resources
    ray.init(include_dashboard=False, log_to_driver=False)
else:  # a new local cluster, even where another one runs on this machine (Ray would join that one otherwise)
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)  # (no GPU: a count)
spec = Worker(num_gpus=0.5)
rng = np.random.default_rng()
try:
    with Engine({"camera": spec, "filter": spec}) as dist:
        dist.diagnostics.subscribe(print)  # every worker's diagnostics, tagged with the worker
        gain = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=n, name="gain", scale=2.0),
                        on="camera")
        level = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=n, name="level", scale=0.5),
                         on="filter")
        # CUDA IPC between GPU workers of one host; the CPU device's memory is its process's: a host link
        dist.connect(gain["out"], level["x"], transport="auto" if gpu else "host")
        print("links:", dist.describe().transports())
        worst = 0.0
        for k in range(frames):
            x = rng.standard_normal(n).astype(np.float32)
            dist.write(gain["x"], x)
            level.params["scale"].value = 0.5 + 0.1 * k  # on the filter worker: a hot update next frame
            frame = dist.tick()
            expected = x * np.float32(2.0) * np.float32(0.5 + 0.1 * k)
            worst = max(worst, float(np.abs(dist.read(level["out"]) - expected).max()))
        tiers = {w: f.tiers for w, f in frame.fragments.items()}
        print(f"{frames} frames on workers {', '.join(dist.workers)}; last frame's tiers {tiers}")
        print(f"max error vs NumPy {worst:.2e}")
finally:
    ray.shutdown()
