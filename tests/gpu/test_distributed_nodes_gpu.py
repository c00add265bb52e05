"""A ``host`` link between two Ray nodes started on this one GPU host (``ray.cluster_utils.Cluster``, each node
declaring the one GPU): the link crosses "hosts", so its bytes go through a pinned ring and Ray's object store, and
its consumer's step runs after its producer's; the results exact against NumPy on fresh random inputs every frame.
What this machine cannot run: NCCL or NIXL between actors (Ray Direct Transport) needs two GPUs and torch on the
workers (and NIXL its own package). Needs Ray (../shared/tools/device-prep.sh --ray)."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda

ray = pytest.importorskip("ray", reason="rxcuda.distributed runs on Ray: pip install '.[ray]'")

from rxcuda.distributed import Engine, Worker  # noqa: E402

LINK = "first.out -> second.x"


@pytest.fixture(scope="module")
def nodes():
    if ray.is_initialized():
        pytest.skip("a Ray cluster runs already in this process; this module starts its own of two nodes")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1})
    cluster.add_node(num_cpus=2, num_gpus=1)
    try:
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        cluster.wait_for_nodes()
        head = ray.get_runtime_context().get_node_id()
        yield head, next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.parametrize("n", [(64 << 10) // 4, (4 << 20) // 4 + 5])
def test_a_host_link_across_nodes_goes_through_the_object_store_exact_every_frame(nodes, kernels, rng, n):
    head, other = nodes
    s1, s2 = (float(v) for v in rng.uniform(0.5, 3.0, 2))
    with Engine({"a": Worker(num_gpus=0.5, node=head), "b": Worker(num_gpus=0.5, node=other)}) as dist:
        first = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=n, name="first", scale=s1),
                         on="a")
        second = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=n, name="second", scale=s2),
                          on="b")
        dist.connect(first["out"], second["x"])  # auto: GPU workers on two nodes
        (link,) = dist.describe().links
        assert (link.transport, link.via) == ("host", "store")
        assert "Ray Direct Transport" in dist.describe().transports(why=True)[LINK]
        got: list[np.ndarray] = []
        dist.observe(second["out"]).subscribe(got.append)
        inputs = []
        for _ in range(10):
            x = rng.standard_normal(n).astype(np.float32)
            inputs.append(x)
            dist.write(first["x"], x)
            assert dist.tick().complete
        for _ in range(6):  # frames in flight: the pinned ring's slots come round while Ray holds earlier ones
            dist._submit()
        dist._drain(0)
        assert len(got) == 16
        for i, (x, out) in enumerate(zip(inputs + [inputs[-1]] * 6, got, strict=True)):
            np.testing.assert_array_equal(out, (x * np.float32(s1)) * np.float32(s2), err_msg=f"frame {i}")
        assert ray.get(dist.actor("b").stats.remote())["skipped"] == {}
