"""A Ray cluster of two nodes on this machine (``ray.cluster_utils.Cluster``, each node declaring one GPU that its
workers' engines run as rxcuda's CPU device: ``RXCUDA_DEVICE=cpu``, docs/cpu.md): the transport each link gets, and
why, between workers of one node and of two; frames through Ray's object store and through a shared-memory board,
their numbers checked against NumPy every frame."""

from __future__ import annotations

import os

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="rxcuda.distributed runs on Ray: pip install '.[ray]'")

import rxcuda  # noqa: E402
from rxcuda.distributed import Engine, Worker  # noqa: E402

N = 4096


@pytest.fixture(scope="module")
def nodes():
    if ray.is_initialized():
        pytest.skip("a Ray cluster runs already in this process; this module starts its own of two nodes")
    from ray.cluster_utils import Cluster

    before = os.environ.get("RXCUDA_DEVICE")
    os.environ["RXCUDA_DEVICE"] = "cpu"  # the nodes' processes, and so their workers, inherit it
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1})
        cluster.add_node(num_cpus=1, num_gpus=1)
    finally:
        if before is None:
            del os.environ["RXCUDA_DEVICE"]
        else:
            os.environ["RXCUDA_DEVICE"] = before
    try:
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        cluster.wait_for_nodes()
        head = ray.get_runtime_context().get_node_id()
        other = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head)
        yield head, other
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_links_across_nodes_go_through_the_object_store_and_on_one_node_through_a_board_exact(nodes):
    head, other = nodes
    spec = {"a": Worker(num_gpus=0.5, node=head), "b": Worker(num_gpus=0.5, node=other),
            "c": Worker(num_gpus=0.5, node=other)}
    with Engine(spec, standby=False) as dist:
        first = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="first", scale=1.5), on="a")
        second = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="second", scale=0.5), on="b")
        third = dist.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="third", scale=-2.0), on="c")
        dist.connect(first["out"], second["x"])  # GPU workers on two nodes: auto
        dist.connect(second["out"], third["x"], transport="host")  # one node (CPU devices do not export memory)
        why = dist.describe().transports(why=True)
        assert why["first.out -> second.x"].startswith("host: different hosts: through Ray's object store")
        assert "Ray Direct Transport" in why["first.out -> second.x"]  # offered or not, and why it is not used
        assert why["second.out -> third.x"] == ("host: asked for; one host: through a shared-memory board, pinned, "
                                                "no Ray call")
        assert {ln.label: ln.via for ln in dist.describe().links} == {"first.out -> second.x": "store",
                                                                      "second.out -> third.x": "board"}
        assert dist.describe().stepping == {"a": "ray", "b": "ray", "c": "ray"}  # across hosts: Ray calls
        rng = np.random.default_rng(5)
        for _ in range(4):
            x = rng.standard_normal(N).astype(np.float32)
            dist.write(first["x"], x)
            assert dist.tick().complete
            np.testing.assert_allclose(dist.read(third["out"]), x * 1.5 * 0.5 * -2.0, rtol=1e-6)
        for _ in range(6):  # frames in flight under run(): the ends stay in order, every frame exact
            dist._submit()
        dist._drain(0)
        np.testing.assert_allclose(dist.read(third["out"]), x * -1.5, rtol=1e-6)
        stats = {w: ray.get(dist.actor(w).stats.remote()) for w in "bc"}
        assert stats["b"]["received"] == {"first.out -> second.x": 10} and stats["b"]["skipped"] == {}
        assert stats["c"]["received"] == {"second.out -> third.x": 10} and stats["c"]["skipped"] == {}
