"""Distributed: the host cost of a link's two ends and of the driver's frame, on the null driver (no GPU needed).

    python bench/link_ends.py [--frames 2000] [--ray-frames 500]

1. The ends of an ``ipc`` link as a GPU worker runs them (``device_slots=True``: the CUDA IPC calls, recorded by the
   null driver, no bytes moving): a producer and a consumer ``FragmentHost`` in this process, stepped in turn;
   each worker's ``stats()["link_us"]`` (median host time a frame spends in its link ends, waits excluded) and the
   same for a ``host`` link (readback, write) for comparison.
2. The driver's frame on a local Ray cluster of null-driver workers: ``tick()`` of one worker holding both blocks
   against two workers (one block each, an ``ipc`` link through shared memory) and, of that, the driver's own
   host time submitting the steps (``submit``: a frame is ``tick()`` = submit, then one ``ray.get`` of every
   step's report and publishing them).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N = 1 << 20  # 4 MiB of float32


def _split(transport: str, gpus: bool):
    import numpy as np

    import rxcuda
    from rxcuda.cuda import NullDriver
    from rxcuda.distributed import Worker, split
    from rxcuda.distributed._placement import check_workers
    from rxcuda.lowlevel import PortRef

    model = rxcuda.Engine(driver=NullDriver())
    first = model.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="first"))
    second = model.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="second"))
    model.connect(first["out"], second["x"])
    model.write(first["x"], np.zeros(N, np.float32))
    spec = Worker(num_gpus=0.5) if gpus else Worker(null=True)
    s = split(model.describe(), {first.id: "a", second.id: "b"}, check_workers({"a": spec, "b": spec}),
              nodes={"a": "n1", "b": "n1"},
              transports={(PortRef(first.id, "out"), PortRef(second.id, "x")): transport})
    model.close()
    return s


def ends(frames: int) -> list[tuple[str, float, float]]:
    from rxcuda.distributed._worker import FragmentHost

    rows = []
    for label, transport, slots in (("ipc (CUDA IPC calls, recorded)", "ipc", True),
                                    ("host (readback, write)", "host", False)):
        s = _split(transport, gpus=slots)
        session = uuid.uuid4().hex[:12]
        a = FragmentHost("a", null=True, session=session, device_slots=slots)
        b = FragmentHost("b", null=True, session=session, device_slots=slots)
        a.build(s.fragments["a"], {})
        b.build(s.fragments["b"], {})
        try:
            for i in range(1, frames + 1):
                out, _ = a.step(i, {}, {}, {})
                b.step(i, {}, {}, {}, out or None)
            rows.append((label, a.stats()["link_us"], b.stats()["link_us"]))
        finally:
            b.close()
            a.close()
    return rows


def driver(frames: int) -> list[tuple[str, float, float]]:
    import numpy as np
    import ray

    import rxcuda
    from rxcuda.distributed import Engine, Worker

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for label, where in (("one worker, both blocks", ("a", "a")), ("two workers, ipc link", ("a", "b"))):
            with Engine({"a": Worker(null=True), "b": Worker(null=True)}) as dist:
                n = 1024
                first = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=n, name="first"), on=where[0])
                second = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=n, name="second"), on=where[1])
                dist.connect(first["out"], second["x"], transport="ipc" if where[0] != where[1] else "auto")
                dist.write(first["x"], np.ones(n, np.float32))
                for _ in range(20):
                    dist.tick()
                ticks, submits = [], []
                for _ in range(frames):  # tick() is _submit() then _drain(0): timed apart
                    t0 = time.perf_counter()
                    dist._submit()
                    t1 = time.perf_counter()
                    dist._drain(0)
                    ticks.append(time.perf_counter() - t0)
                    submits.append(t1 - t0)
                rows.append((label, statistics.median(ticks) * 1e6, statistics.median(submits) * 1e6))
    finally:
        ray.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--ray-frames", type=int, default=500, help="0: skip the Ray part")
    args = ap.parse_args()
    print(f"\nbench/link_ends.py — null driver, median of {args.frames} frames, 4 MiB link\n")
    print(f"{'link ends (host time in the worker, us / frame)':<48} {'producer':>9} {'consumer':>9}")
    for label, p, c in ends(args.frames):
        print(f"{label:<48} {p:>9.1f} {c:>9.1f}")
    if args.ray_frames:
        print(f"\n{'driver, local Ray (us / frame)':<48} {'tick()':>9} {'submit':>9}")
        for label, tick, submit in driver(args.ray_frames):
            print(f"{label:<48} {tick:>9.1f} {submit:>9.1f}")


if __name__ == "__main__":
    main()
