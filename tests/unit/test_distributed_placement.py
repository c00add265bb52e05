"""Placement, pure (no Ray): workers and their validation, a pipeline cut into fragments, links and their
transports, and every placement problem reported at once."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda.cuda import NullDriver
from rxcuda.distributed import Fragment, Worker, split
from rxcuda.distributed._dot import distributed_dot
from rxcuda.distributed._placement import check_worker, check_workers
from rxcuda.distributed._records import DistributedDescription
from rxcuda.lowlevel import PortRef

PTX = "scalar_mul"


# -- workers -------------------------------------------------------------------------------------------------
def test_a_worker_asks_ray_for_a_gpu_share_cpus_and_restarts():
    opts = Worker(num_gpus=0.5, num_cpus=1, max_restarts=2).ray_options()
    assert opts == {"num_gpus": 0.5, "num_cpus": 1, "max_restarts": 2, "max_task_retries": 0}
    assert Worker(null=True).ray_options()["num_gpus"] == 0  # the null driver needs no GPU


def test_a_worker_is_placed_on_a_node_by_ip_or_by_node_id():
    assert Worker(node="10.0.0.7").ray_options()["resources"] == {"node:10.0.0.7": 0.001}
    assert Worker(node="ab12" * 14).ray_options()["node_id"] == "ab12" * 14


@pytest.mark.parametrize("kwargs, match", [
    ({"num_gpus": 0}, r"num_gpus=0\) has no GPU for its Engine; give num_gpus above 0"),
    ({"num_gpus": 2}, r"'num_gpus' must be a number from 0 to 1 \(got 2\): a worker holds one Engine on one GPU"),
    ({"num_gpus": "1"}, r"'num_gpus' must be a number from 0 to 1"),
    ({"num_cpus": -1}, r"'num_cpus' must be a non-negative number \(got -1\)"),
    ({"max_restarts": -2}, r"'max_restarts' must be a non-negative number"),
    ({"node": ""}, r"'node' must be a Ray node id or a node's IP address"),
    ({"null": True, "cpu": True}, r"a worker runs the null driver or the CPU device, not both"),
])
def test_a_bad_worker_is_refused_naming_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Worker(**kwargs)


def test_a_cpu_device_worker_asks_ray_for_no_gpu_and_its_links_go_through_the_board():
    from rxcuda.distributed._placement import _transport, route

    cpu, gpu = Worker(cpu=True), Worker()
    assert cpu.gpuless and Worker(null=True).gpuless and not gpu.gpuless
    assert cpu.ray_options()["num_gpus"] == 0 and Worker(num_gpus=0, cpu=True).ray_options()["num_gpus"] == 0
    assert _transport("auto", cpu, cpu, "n", "n") == ("host", "")
    assert _transport("ipc", cpu, cpu, "n", "n") == ("ipc", "")
    assert "one has none (the null driver or the CPU device); use transport='host'" in _transport(
        "ipc", cpu, gpu, "n", "n")[1]
    assert route("ipc", "ipc", cpu, cpu, "n", "n") == (
        "board", "asked for; workers without a GPU: the bytes in the board's shared memory")


def test_workers_by_count_names_or_mapping():
    assert list(check_workers(2)) == ["w0", "w1"]
    assert list(check_workers(["cam", "gpu-farm"])) == ["cam", "gpu-farm"]
    mapping = check_workers({"a": Worker(null=True)})
    assert mapping["a"].null


@pytest.mark.parametrize("workers, error, match", [
    (0, ValueError, r"'workers' must be at least 1 \(got 0\)"),
    (True, TypeError, r"'workers' takes a count, names, or a mapping"),
    (["a", "a"], ValueError, r"worker 'a' is named twice"),
    (["a b"], ValueError, r"a worker's name is a non-empty str of letters"),
    ({"a": 1}, TypeError, r"workers\['a'\] must be a rxcuda.distributed.Worker \(got int\)"),
    ([], ValueError, r"'workers' names no worker"),
    (3.5, TypeError, r"got float"),
])
def test_bad_workers_are_refused(workers, error, match):
    with pytest.raises(error, match=match):
        check_workers(workers)


def test_an_unknown_worker_is_named_with_a_did_you_mean():
    with pytest.raises(rxcuda.ValidationError, match=r"no worker named 'gpu1' \(workers: gpu0, cam\); did you mean "
                                                      r"'gpu0'\?"):
        check_worker("gpu1", check_workers(["gpu0", "cam"]))


# -- splitting a pipeline --------------------------------------------------------------------------------------
@pytest.fixture
def chain():
    """first (a) -> second (b) -> third (b), first.x written by the user; described by a local null engine."""
    engine = rxcuda.Engine(driver=NullDriver())
    first = engine.add(rxcuda.Block.from_kernel(PTX, size=256, name="first"))
    second = engine.add(rxcuda.Block.from_kernel(PTX, size=256, name="second"))
    third = engine.add(rxcuda.Block.from_kernel(PTX, size=256, name="third"))
    engine.connect(first["out"], second["x"])
    engine.connect(second["out"], third["x"])
    engine.write(first["x"], np.ones(256, np.float32))
    first.params["scale"].value = 4.0
    yield engine, first, second, third
    engine.close()


def test_each_worker_gets_its_blocks_inner_connections_and_fed_inputs(chain):
    engine, first, second, third = chain
    workers = check_workers({"a": Worker(null=True), "b": Worker(null=True)})
    s = split(engine.describe(), {first.id: "a", second.id: "b", third.id: "b"}, workers)
    a, b = s.fragments["a"], s.fragments["b"]
    assert isinstance(a, Fragment) and a.block_names == ("first",) and b.block_names == ("second", "third")
    assert a.description.blocks[0].values["scale"] == 4.0  # the values travel with the description
    assert [(c.src.port, c.dst.port) for c in b.description.connections] == [("out", "x")]
    assert a.description.connections == ()
    assert PortRef(first.id, "x") in a.description.fed  # written by the user
    assert PortRef(second.id, "x") in b.description.fed  # fed by the link
    assert PortRef(first.id, "out") in a.description.kept  # exported: never shares its memory
    (link,) = s.links
    assert (link.src_worker, link.dst_worker, link.transport, link.nbytes) == ("a", "b", "host", 1024)
    assert link.label == "first.out -> second.x"
    assert a.exports == (link,) and b.imports == (link,) and s.order == ("a", "b")


def test_transport_auto_is_ipc_between_gpu_workers_of_one_host_and_host_otherwise(chain):
    engine, first, second, third = chain
    gpus = check_workers({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)})
    placement = {first.id: "a", second.id: "b", third.id: "b"}
    assert split(engine.describe(), placement, gpus, nodes={"a": "n1", "b": "n1"}).links[0].transport == "ipc"
    assert split(engine.describe(), placement, gpus, nodes={"a": "n1", "b": "n2"}).links[0].transport == "host"
    asked = {(PortRef(first.id, "out"), PortRef(second.id, "x")): "host"}
    assert split(engine.describe(), placement, gpus, nodes={"a": "n1", "b": "n1"},
                 transports=asked).links[0].transport == "host"


def test_each_link_says_where_its_ends_meet_and_why_its_transport_was_chosen(chain):
    engine, first, second, third = chain
    gpus = check_workers({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)})
    nulls = check_workers({"a": Worker(null=True), "b": Worker(null=True)})
    placement = {first.id: "a", second.id: "b", third.id: "b"}
    asked = {(PortRef(first.id, "out"), PortRef(second.id, "x")): "host"}

    def link(workers, nodes, **kw):
        ln = split(engine.describe(), placement, workers, nodes=nodes, **kw).links[0]
        return ln.transport, ln.via, ln.why

    one, two = {"a": "n1", "b": "n1"}, {"a": "n1", "b": "n2"}
    assert link(gpus, one) == ("ipc", "board", "both workers on GPUs of one host: CUDA IPC")
    assert link(gpus, one, transports=asked) == (
        "host", "board", "asked for; one host: through a shared-memory board, pinned, no Ray call")
    assert link(nulls, one)[:2] == ("host", "board") and link(nulls, one)[2].startswith("a worker runs without a GPU")
    assert link(nulls, two)[:2] == ("host", "store")
    transport, via, why = link(gpus, two)
    assert (transport, via) == ("host", "store") and "Ray offers no GPU transport between actors here" in why
    _, _, why = link(gpus, two, offered=("NCCL", "GLOO"))
    assert "Ray offers NCCL between GPU actors (Ray Direct Transport); rxcuda does not carry links over it yet" in why


@pytest.mark.parametrize("workers, nodes, match", [
    ({"a": Worker(null=True), "b": Worker(num_gpus=1)}, {"a": "n", "b": "n"},
     r"first.out -> second.x: CUDA IPC needs both workers on a GPU, and one has none \(the null driver or the CPU "
     r"device\); use "
     r"transport='host'"),
    ({"a": Worker(), "b": Worker()}, {"a": "n1", "b": "n2"},
     r"CUDA IPC works between processes of one host, and these workers run on different nodes"),
])
def test_ipc_asked_where_it_cannot_work_is_refused(chain, workers, nodes, match):
    engine, first, second, third = chain
    asked = {(PortRef(first.id, "out"), PortRef(second.id, "x")): "ipc"}
    with pytest.raises(rxcuda.ValidationError, match=match):
        split(engine.describe(), {first.id: "a", second.id: "b", third.id: "b"}, check_workers(workers),
              nodes=nodes, transports=asked)


def test_an_unknown_transport_is_refused(chain):
    engine, first, second, third = chain
    asked = {(PortRef(first.id, "out"), PortRef(second.id, "x")): "tcp"}
    with pytest.raises(rxcuda.ValidationError, match=r"transport must be one of auto, ipc, host \(got 'tcp'\)"):
        split(engine.describe(), {first.id: "a", second.id: "b", third.id: "b"}, check_workers(["a", "b"]),
              transports=asked)


def test_every_placement_problem_is_reported_at_once(chain):
    engine, first, second, third = chain
    with pytest.raises(rxcuda.ValidationError) as info:
        split(engine.describe(), {first.id: "a", second.id: "zz"}, check_workers(["a", "b"]))
    text = str(info.value)
    assert text.startswith("2 placement problems:")
    assert "block 'second' is placed on worker 'zz', which is not one of a, b" in text
    assert "block 'third' is placed on no worker; add it with engine.add(block, on=...)" in text
    assert info.value.subject == "placement"


def test_a_delayed_connection_across_workers_is_refused():
    with rxcuda.Engine(driver=NullDriver()) as engine:
        acc = engine.add(rxcuda.Block.from_kernel("vector_add", size=64, name="acc"))
        other = engine.add(rxcuda.Block.from_kernel(PTX, size=64, name="other"))
        engine.connect(acc["out"], other["x"])
        engine.connect(other["out"], acc["a"], delay=1)
        engine.write(acc["b"], np.ones(64, np.float32))
        with pytest.raises(rxcuda.ValidationError, match=r"other.out -> acc.a is a delayed connection between "
                                                          r"workers 'b' and 'a'; a delay lives in one graph"):
            split(engine.describe(), {acc.id: "a", other.id: "b"}, check_workers(["a", "b"]))
        # on one worker the same pipeline is fine
        assert split(engine.describe(), {acc.id: "a", other.id: "a"}, check_workers(["a", "b"])).links == ()


def test_links_that_go_round_a_circle_of_workers_are_refused():
    with rxcuda.Engine(driver=NullDriver()) as engine:
        b1, b2, b3 = (engine.add(rxcuda.Block.from_kernel(PTX, size=64, name=f"s{i}")) for i in range(3))
        engine.connect(b1["out"], b2["x"])
        engine.connect(b2["out"], b3["x"])
        engine.write(b1["x"], np.ones(64, np.float32))
        with pytest.raises(rxcuda.ValidationError, match=r"the links between workers form a circle \(a -> b -> a\)"):
            split(engine.describe(), {b1.id: "a", b2.id: "b", b3.id: "a"}, check_workers(["a", "b"]))
        order = split(engine.describe(), {b1.id: "b", b2.id: "a", b3.id: "a"}, check_workers(["a", "b"])).order
        assert order == ("b", "a")  # producers first, whatever the order the workers were named in


def test_the_picture_shows_workers_as_clusters_and_links_with_their_transport(chain):
    engine, first, second, third = chain
    workers = check_workers({"a": Worker(null=True), "b": Worker(num_gpus=0.5)})
    placement = {first.id: "a", second.id: "b", third.id: "b"}
    s = split(engine.describe(), placement, workers)
    text = distributed_dot(DistributedDescription(engine.describe(), placement, workers, s.links))
    assert 'label="worker a (null driver)"' in text and 'label="worker b (0.5 GPU)"' in text
    assert f'b{first.id} -> b{second.id} [label="out -> x\\nhost (1 KiB a frame)", penwidth=2.5' in text
    assert f'b{second.id} -> b{third.id} [label="out -> x"];' in text


def test_the_distributed_names_are_documented_and_import_without_ray_started():
    import inspect

    import rxcuda.distributed as dist

    assert [n for n in dist.__all__ if not inspect.getdoc(getattr(dist, n))] == []
    assert all(getattr(dist, n).__module__.startswith("rxcuda.distributed._") for n in dist.__all__)
    assert "Engine" in dist.__all__ and "Worker" in dist.__all__
