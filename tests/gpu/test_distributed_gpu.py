"""Two workers on one GPU (``num_gpus=0.5`` each, two processes) exchange frames through CUDA IPC: the results
against NumPy on fresh random inputs every frame, and parameter changes on remote blocks reaching their graphs as
hot updates. Needs Ray (on the GPU machine: ../shared/tools/device-prep.sh --ray brings it in two parts)."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda

ray = pytest.importorskip("ray", reason="rxcuda.distributed runs on Ray: pip install '.[ray]'")

from rxcuda.distributed import Engine, Worker  # noqa: E402

N = 1 << 20  # 4 MiB of f32 a frame
LINK = "first.out -> second.x"


@pytest.fixture
def pair(cluster, kernels, rng):
    s1, s2 = (float(v) for v in rng.uniform(0.5, 3.0, 2))
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}) as dist:
        first = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="first", scale=s1),
                         on="a")
        second = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="second", scale=s2),
                          on="b")
        dist.connect(first["out"], second["x"])
        yield dist, first, second, s1, s2


def test_two_workers_on_one_gpu_exchange_frames_through_cuda_ipc(pair, rng):
    dist, first, second, s1, s2 = pair
    assert dist.describe().transports() == {LINK: "ipc"}
    assert dist.describe().stepping == {"a": "clock", "b": "clock"}  # one host: frames through the clocks' pipes
    assert dist.where("a")["pid"] != dist.where("b")["pid"]  # two processes
    got: list[np.ndarray] = []
    dist.observe(second["out"]).subscribe(got.append)
    inputs = []
    for _ in range(4):
        x = rng.standard_normal(N).astype(np.float32)  # fresh data each frame: a stale frame would show
        inputs.append(x)
        dist.write(first["x"], x)
        frame = dist.tick()
        assert frame.complete
    assert len(got) == 4
    for x, out in zip(inputs, got, strict=True):
        np.testing.assert_allclose(out, x * np.float32(s1) * np.float32(s2), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dist.read(second["out"]), inputs[-1] * np.float32(s1) * np.float32(s2),
                               rtol=1e-6, atol=1e-6)
    assert ray.get(dist.actor("b").stats.remote())["received"][LINK] == 4
    assert all(ray.get(dist.actor(w).stats.remote())["clock_frames"] >= 4 for w in ("a", "b"))


def test_frames_stepped_by_ray_calls_give_the_same_numbers(cluster, kernels, rng):
    s1, s2 = (float(v) for v in rng.uniform(0.5, 3.0, 2))
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}, stepping="ray") as dist:
        first = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="first", scale=s1), on="a")
        second = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="second", scale=s2),
                          on="b")
        dist.connect(first["out"], second["x"])
        assert dist.describe().stepping == {"a": "ray", "b": "ray"}
        got: list[np.ndarray] = []
        dist.observe(second["out"]).subscribe(got.append)
        inputs = [rng.standard_normal(N).astype(np.float32) for _ in range(6)]
        for x in inputs:
            dist.write(first["x"], x)
            assert dist.tick().complete
        for i, (x, out) in enumerate(zip(inputs, got, strict=True)):
            np.testing.assert_array_equal(out, (x * np.float32(s1)) * np.float32(s2), err_msg=f"frame {i}")
        assert ray.get(dist.actor("a").stats.remote())["clock_frames"] == 0


def test_a_parameter_change_on_a_remote_block_is_a_hot_update_of_its_graph(pair, rng):
    dist, first, second, s1, s2 = pair
    x = rng.standard_normal(N).astype(np.float32)
    dist.write(first["x"], x)
    dist.tick()
    rebuilds = {w: ray.get(dist.actor(w).stats.remote())["rebuilds"] for w in ("a", "b")}
    k2 = float(rng.uniform(-3.0, -0.5))
    second.params["scale"].value = k2
    frame = dist.tick()
    assert frame.fragments["b"].tiers == (rxcuda.Tier.PARAMETERS,) and frame.fragments["a"].tiers == ()
    np.testing.assert_allclose(dist.read(second["out"]), x * np.float32(s1) * np.float32(k2), rtol=1e-6, atol=1e-6)
    k1 = float(rng.uniform(0.1, 0.9))
    dist.set(first, scale=k1)  # upstream of the link: the new value flows through IPC the same frame
    frame = dist.tick()
    assert frame.fragments["a"].tiers == (rxcuda.Tier.PARAMETERS,)
    np.testing.assert_allclose(dist.read(second["out"]), x * np.float32(k1) * np.float32(k2), rtol=1e-6, atol=1e-6)
    assert {w: ray.get(dist.actor(w).stats.remote())["rebuilds"] for w in ("a", "b")} == rebuilds  # no rebuild


def test_a_host_link_between_gpu_workers_gives_the_same_numbers(cluster, kernels, rng):
    s1, s2 = (float(v) for v in rng.uniform(0.5, 3.0, 2))
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}) as dist:
        first = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="first", scale=s1),
                         on="a")
        second = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="second", scale=s2),
                          on="b")
        dist.connect(first["out"], second["x"], transport="host")
        assert dist.describe().transports() == {LINK: "host"}
        x = rng.standard_normal(N).astype(np.float32)
        dist.write(first["x"], x)
        dist.tick()
        np.testing.assert_allclose(dist.read(second["out"]), x * np.float32(s1) * np.float32(s2), rtol=1e-6,
                                   atol=1e-6)


def test_close_frees_the_workers_gpu_memory(cluster, kernels):
    import cupy

    free_before, _ = cupy.cuda.runtime.memGetInfo()
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}) as dist:
        first = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N * 16, name="first"), on="a")
        second = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N * 16, name="second"), on="b")
        dist.connect(first["out"], second["x"])
        dist.write(first["x"], np.ones(N * 16, np.float32))
        dist.tick()
    import time

    deadline = time.time() + 20
    while time.time() < deadline:
        free_after, _ = cupy.cuda.runtime.memGetInfo()
        if free_after >= free_before - (64 << 20):  # the workers' contexts and 64 MiB buffers are gone
            break
        time.sleep(0.5)
    assert free_after >= free_before - (64 << 20)


def test_new_code_on_a_remote_block_is_swapped_in_place_and_computes(cluster, kernels, rng):
    s1 = float(rng.uniform(0.5, 3.0))
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}) as dist:
        first = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="first", scale=s1),
                         on="a")
        comb = dist.add(rxcuda.Block.from_kernel(kernels / "vector_add.ptx", size=N, name="comb"), on="b")
        dist.connect(first["out"], comb["a"])  # through CUDA IPC
        x = rng.standard_normal(N).astype(np.float32)
        y = rng.standard_normal(N).astype(np.float32)
        dist.write(first["x"], x)
        dist.write(comb["b"], y)
        dist.tick()
        np.testing.assert_allclose(dist.read(comb["out"]), x * np.float32(s1) + y, rtol=1e-6, atol=1e-6)
        rebuilds = ray.get(dist.actor("b").stats.remote())["rebuilds"]
        comb.set_code(None, kernels / "vector_sub.ptx")  # same parameters, other arithmetic
        frame = dist.tick()
        assert frame.fragments["b"].tiers == (rxcuda.Tier.CODE,)
        np.testing.assert_allclose(dist.read(comb["out"]), x * np.float32(s1) - y, rtol=1e-6, atol=1e-6)
        assert ray.get(dist.actor("b").stats.remote())["rebuilds"] == rebuilds


def test_many_frames_through_an_ipc_link_with_both_steps_in_flight_are_exact_every_frame(pair, rng):
    """Both workers' steps of a frame are submitted at once and meet on the link's board: every frame's output is
    its own input's, never a stale or a later slot's (fresh random inputs each frame, exact against NumPy)."""
    dist, first, second, s1, s2 = pair
    got: list[np.ndarray] = []
    dist.observe(second["out"]).subscribe(got.append)
    diags: list = []
    dist.diagnostics.subscribe(diags.append)
    inputs = []
    for _ in range(40):
        x = rng.standard_normal(N).astype(np.float32)
        inputs.append(x)
        dist.write(first["x"], x)
        frame = dist.tick()
        assert frame.complete, (frame, diags)
    assert len(got) == len(inputs)
    for i, (x, out) in enumerate(zip(inputs, got, strict=True)):
        np.testing.assert_array_equal(out, (x * np.float32(s1)) * np.float32(s2), err_msg=f"frame {i}")
    stats = ray.get(dist.actor("b").stats.remote())
    assert stats["received"][LINK] == 40 and stats["skipped"] == {}


def test_frames_under_run_through_an_ipc_link_pair_each_output_with_its_own_input(pair, rng):
    """Under run() up to max_in_flight frames overlap, both workers' steps of each in flight together: each frame's
    output (worker b) is exactly its own frame's input (worker a, observed the same frame) times both scales."""
    import time

    from reactivex.subject import Subject

    dist, first, second, s1, s2 = pair
    xs: list[np.ndarray] = []
    outs: list[np.ndarray] = []
    dist.observe(first["x"]).subscribe(xs.append)
    dist.observe(second["out"]).subscribe(outs.append)
    source = Subject()
    dist.feed(first["x"], source)
    dist.tick()
    pool = [rng.standard_normal(N).astype(np.float32) for _ in range(32)]  # made before: feeding is then quick
    running = dist.run(1000)
    deadline = time.time() + 30
    k = 0
    while len(outs) < 60 and time.time() < deadline:
        source.on_next(pool[k % len(pool)])  # a fresh input for whichever frame comes next
        k += 1
        time.sleep(0.002)
    running.dispose()
    assert len(outs) >= 60 and len(xs) == len(outs)
    assert len({x.tobytes() for x in xs}) > 10  # the inputs did change from frame to frame
    for i, (x, out) in enumerate(zip(xs, outs, strict=True)):
        np.testing.assert_array_equal(out, (x * np.float32(s1)) * np.float32(s2), err_msg=f"frame {i}")
    assert ray.get(dist.actor("b").stats.remote())["skipped"] == {}


def test_a_restarted_producer_is_mapped_again_through_its_new_board_and_frames_are_exact(pair, rng):
    """The producer's process ends mid-run; Ray restarts it, it exports new slots on a new board, and the consumer
    (never restarted) maps them: the frames after are exact again."""
    import time

    dist, first, second, s1, s2 = pair
    x = rng.standard_normal(N).astype(np.float32)
    dist.write(first["x"], x)
    dist.tick()
    b_pid = dist.where("b")["pid"]
    infos: list = []
    dist.diagnostics.subscribe(lambda d: infos.append(d) if d.diagnostic.severity == "info" else None)
    dist.actor("a").crash.remote()
    deadline = time.time() + 120
    while time.time() < deadline:
        if dist.tick().complete and infos:
            break
        time.sleep(0.05)
    assert infos and dist.where("b")["pid"] == b_pid
    exact_frames(dist, first, second, s1, s2, rng, "after the restart")


def exact_frames(dist, first, second, s1: float, s2: float, rng, when: str, frames: int = 5) -> None:
    """``frames`` frames on fresh inputs, each ``second.out`` exactly ``x * s1 * s2`` (a stale frame would show)."""
    for i in range(frames):
        x = rng.standard_normal(N).astype(np.float32)
        dist.write(first["x"], x)
        assert dist.tick().complete
        np.testing.assert_array_equal(dist.read(second["out"]), (x * np.float32(s1)) * np.float32(s2),
                                      err_msg=f"frame {i} {when}")


def test_workers_sharing_one_gpu_know_it_and_are_told_about_mps_once(cluster, kernels, rng):
    from rxcuda.cuda._device import Device

    here = Device(0)
    placement: list = []
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}, share_gpu="off") as dist:  # no daemon
        dist.diagnostics.subscribe(lambda d: placement.append(d) if d.diagnostic.subject == "placement" and
                                   d.severity == "warning" else None)
        first = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="first", scale=2.0), on="a")
        second = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="second", scale=0.5),
                          on="b")
        dist.connect(first["out"], second["x"])
        x = rng.standard_normal(N).astype(np.float32)
        dist.write(first["x"], x)
        for _ in range(3):
            assert dist.tick().complete
        np.testing.assert_allclose(dist.read(second["out"]), x, rtol=1e-6, atol=1e-6)
        a, b = dist.where("a"), dist.where("b")
        assert a["gpu"] == b["gpu"] == here.uuid and len(a["gpu"]) == 32  # one GPU, the same UUID in each process
        assert a["mps"] is b["mps"] is here.mps
        if here.mps:
            assert placement == []
        else:  # said once, as a warning from the driver, with the fix
            (d,) = placement
            assert d.worker == "driver" and d.severity == "warning"
            message = d.diagnostic.message
            assert "'a', 'b' share one GPU" in message and "nvidia-cuda-mps-control -d" in message
