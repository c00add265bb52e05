"""Ray Direct Transport (RDT) between two Ray nodes on this machine: what each of Ray 2.60's tensor transports
does with one frame's bytes, beside Ray's object store, before rxcuda carries a link over any of them.

    python bench/rdt_probe.py [--mib 4] [--frames 50]

Two Ray nodes (``ray.cluster_utils.Cluster``, each declaring this machine's one GPU), an actor on each; per
transport, the producer's method returns ``--mib`` of float32 made from a seed (``@ray.method(tensor_transport=...)``
for RDT, a NumPy array for the object store) and the consumer's method takes it and checks it against NumPy's array
from the same seed; the median over ``--frames`` of that call pair, waited for. Rows:
- ``object store``: a NumPy array through the store (what rxcuda's ``host`` link across hosts uses);
- ``gloo``: a CPU torch tensor, the two actors in a Gloo collective group (``torch.distributed``);
- ``nccl``: a CUDA torch tensor, the two actors in an NCCL group: two ranks on one GPU, which NCCL refuses (the row
  says what it raised);
- ``nixl``: a CUDA torch tensor through NIXL (one-sided, no group), where the ``nixl`` package is installed;
- ``cuda_ipc``: a CUDA torch tensor through CUDA IPC, which Ray allows within one Ray node only (the row says what
  it raised across two).
A row that cannot run prints why. Needs torch (on the GPU machine; not on the CI machine, where it says so and
exits) and Ray; nothing of rxcuda is used.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

TRANSPORTS = ("object store", "gloo", "nccl", "nixl", "cuda_ipc")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=4.0)
    ap.add_argument("--frames", type=int, default=50)
    args = ap.parse_args()
    try:
        import numpy as np
        import ray
        import torch
    except ImportError as e:
        sys.exit(f"bench/rdt_probe.py needs Ray and torch (RDT carries torch tensors): {e}")
    from ray.cluster_utils import Cluster

    n = int(args.mib * (1 << 20)) // 4
    gpu = torch.cuda.is_available()
    card = torch.cuda.get_device_name(0) if gpu else "no GPU"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 1 if gpu else 0})
    cluster.add_node(num_cpus=4, num_gpus=1 if gpu else 0)
    try:
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        cluster.wait_for_nodes()
        head = ray.get_runtime_context().get_node_id()
        other = next(nd["NodeID"] for nd in ray.nodes() if nd["Alive"] and nd["NodeID"] != head)
        print(f"\nbench/rdt_probe.py — {args.mib:g} MiB a frame between two Ray nodes on one machine ({card}, Ray "
              f"{ray.__version__}, torch {torch.__version__}), median of {args.frames} frames, checked against NumPy:")
        print(f"{'transport':<14} {'us / frame':>11}  result")
        for transport in TRANSPORTS:
            try:
                us, result = _row(ray, np, transport, n, head, other, gpu, args.frames)
                print(f"{transport:<14} {us:>11.1f}  {result}", flush=True)
            except Exception as e:  # noqa: BLE001  (a transport that cannot run here: the row says why)
                text = " ".join(str(e).split())[:300]
                print(f"{transport:<14} {'-':>11}  cannot run here: {type(e).__name__}: {text}", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _row(ray, np, transport: str, n: int, head: str, other: str, gpu: bool, frames: int) -> tuple[float, str]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cuda = transport in ("nccl", "nixl", "cuda_ipc")
    if cuda and not gpu:
        raise RuntimeError("no GPU: this transport carries CUDA tensors")
    rdt = None if transport == "object store" else transport

    @ray.remote(num_cpus=0, num_gpus=0.5 if gpu else 0)
    class Side:
        def make(self, seed: int):
            x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
            if rdt is None:
                return x  # a NumPy array through the object store
            import torch

            t = torch.from_numpy(x)
            return t.cuda() if cuda else t

        if rdt is not None:  # the transport is fixed when the class is made
            make = ray.method(tensor_transport=rdt)(make)

        def take(self, got, seed: int) -> bool:
            arr = got.cpu().numpy() if hasattr(got, "cpu") else got
            return bool(np.array_equal(arr, np.random.default_rng(seed).standard_normal(n).astype(np.float32)))

    a = Side.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
    b = Side.options(scheduling_strategy=NodeAffinitySchedulingStrategy(other, soft=False)).remote()
    group = None
    try:
        if transport in ("gloo", "nccl"):
            from ray.experimental.collective import create_collective_group

            group = create_collective_group([a, b], backend=transport)
        def frame(seed: int) -> bool:
            return ray.get(b.take.remote(a.make.remote(seed), seed), timeout=60)

        for seed in range(5):  # warm: the group's first transfer, the actors' first calls
            if not frame(seed):
                raise AssertionError("the consumer's array differs from NumPy's")
        times, ok = [], True
        for seed in range(5, 5 + frames):
            t0 = time.perf_counter()
            ok = frame(seed) and ok
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6, "matches NumPy" if ok else "DIFFERS from NumPy"
    finally:
        if group is not None:
            from ray.experimental.collective import destroy_collective_group

            destroy_collective_group(group)
        for actor in (a, b):
            ray.kill(actor)


if __name__ == "__main__":
    main()
