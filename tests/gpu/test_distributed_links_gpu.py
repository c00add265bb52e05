"""Links at the hardware's pace on one GPU host (two workers, ``num_gpus=0.5`` each): the ``host`` link through the
link's pinned shared-memory board (no Ray call, DMA copies) at several sizes, frame by frame and under ``run()``
with frames in flight, the ``ipc`` link under a private MPS daemon (``share_gpu="mps"``, and the default
``"auto"``, which chooses it for two workers on one GPU), and with the two workers stepped in turns
(``share_gpu="turns"``: no MPS, the consumer stepped once the producer answered), every result
exact against NumPy on fresh random inputs. Needs Ray (../shared/tools/device-prep.sh --ray)."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

import rxcuda

ray = pytest.importorskip("ray", reason="rxcuda.distributed runs on Ray: pip install '.[ray]'")

from reactivex.subject import Subject  # noqa: E402

from rxcuda.distributed import Engine, Worker  # noqa: E402

LINK = "first.out -> second.x"


def _linked(dist, kernels, n: int, transport: str, s1: float, s2: float):
    first = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=n, name="first", scale=s1), on="a")
    second = dist.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=n, name="second", scale=s2), on="b")
    dist.connect(first["out"], second["x"], transport=transport)
    return first, second


def _frames_exact(dist, first, second, s1, s2, rng, n: int, frames: int) -> None:
    got: list[np.ndarray] = []
    sub = dist.observe(second["out"]).subscribe(got.append)
    inputs = []
    for _ in range(frames):
        x = rng.standard_normal(n).astype(np.float32)  # fresh data each frame: a stale frame would show
        inputs.append(x)
        dist.write(first["x"], x)
        assert dist.tick().complete
    sub.dispose()
    assert len(got) == frames
    for i, (x, out) in enumerate(zip(inputs, got, strict=True)):
        np.testing.assert_array_equal(out, (x * np.float32(s1)) * np.float32(s2), err_msg=f"frame {i}")


@pytest.mark.parametrize("n", [(64 << 10) // 4, (4 << 20) // 4, (16 << 20) // 4 + 3])
def test_a_host_link_on_one_host_meets_on_its_pinned_board_and_is_exact_every_frame(cluster, kernels, rng, n):
    s1, s2 = (float(v) for v in rng.uniform(0.5, 3.0, 2))
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}) as dist:
        first, second = _linked(dist, kernels, n, "host", s1, s2)
        (link,) = dist.describe().links
        assert (link.transport, link.via) == ("host", "board")
        assert dist.describe().stepping == {"a": "clock", "b": "clock"}  # no Ray call a frame
        _frames_exact(dist, first, second, s1, s2, rng, n, 12)
        stats = ray.get(dist.actor("b").stats.remote())
        assert stats["received"][LINK] == 12 and stats["skipped"] == {}


def test_frames_under_run_through_a_host_link_pair_each_output_with_its_own_input(cluster, kernels, rng):
    """Under run() frames overlap (the producer computes frame N+1 while the consumer copies frame N in from the
    board's ring): each output is exactly its own frame's input times both scales."""
    n = (4 << 20) // 4
    s1, s2 = (float(v) for v in rng.uniform(0.5, 3.0, 2))
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}) as dist:
        first, second = _linked(dist, kernels, n, "host", s1, s2)
        xs: list[np.ndarray] = []
        outs: list[np.ndarray] = []
        dist.observe(first["x"]).subscribe(xs.append)
        dist.observe(second["out"]).subscribe(outs.append)
        source = Subject()
        dist.feed(first["x"], source)
        dist.tick()
        pool = [rng.standard_normal(n).astype(np.float32) for _ in range(32)]
        running = dist.run(1000)
        deadline, k = time.time() + 30, 0
        while len(outs) < 60 and time.time() < deadline:
            source.on_next(pool[k % len(pool)])
            k += 1
            time.sleep(0.002)
        running.dispose()
        assert len(outs) >= 60 and len(xs) == len(outs)
        assert len({x.tobytes() for x in xs}) > 10
        for i, (x, out) in enumerate(zip(xs, outs, strict=True)):
            np.testing.assert_array_equal(out, (x * np.float32(s1)) * np.float32(s2), err_msg=f"frame {i}")
        assert ray.get(dist.actor("b").stats.remote())["skipped"] == {}


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="nvidia-cuda-mps-control is not here")
@pytest.mark.skipif(bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), reason="MPS is set up already (the user's)")
def test_share_gpu_mps_runs_the_workers_under_a_private_daemon_exactly_and_close_stops_it(cluster, kernels, rng):
    n = (4 << 20) // 4
    s1, s2 = (float(v) for v in rng.uniform(0.5, 3.0, 2))
    placement: list = []
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}, share_gpu="mps") as dist:
        root = os.path.dirname(dist._share.env["CUDA_MPS_PIPE_DIRECTORY"])
        dist.diagnostics.subscribe(lambda d: placement.append(d) if d.diagnostic.subject == "placement" else None)
        first, second = _linked(dist, kernels, n, "ipc", s1, s2)
        _frames_exact(dist, first, second, s1, s2, rng, n, 20)
        assert dist.where("a")["mps"] is True and dist.where("b")["mps"] is True  # both its clients
        assert [d.severity for d in placement] == ["info"]  # what was chosen; no warning of a GPU shared without MPS
    assert not os.path.exists(root)  # the daemon told quit, its folder removed


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="nvidia-cuda-mps-control is not here")
@pytest.mark.skipif(bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), reason="MPS is set up already (the user's)")
def test_share_gpu_auto_runs_two_workers_placed_on_one_gpu_under_a_private_daemon_and_one_worker_without(cluster,
                                                                                                         kernels, rng):
    n = (4 << 20) // 4
    s1, s2 = (float(v) for v in rng.uniform(0.5, 3.0, 2))
    placement: list = []
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}, share_gpu="auto") as dist:
        dist.diagnostics.subscribe(lambda d: placement.append(d) if d.diagnostic.subject == "placement" else None)
        assert dist.where("a")["gpus"] == dist.where("b")["gpus"]  # Ray put both on one GPU
        root = os.path.dirname(dist._share.env["CUDA_MPS_PIPE_DIRECTORY"])
        first, second = _linked(dist, kernels, n, "ipc", s1, s2)
        _frames_exact(dist, first, second, s1, s2, rng, n, 20)
        assert dist.where("a")["share_gpu"] == "mps" and dist.where("a")["mps"] is dist.where("b")["mps"] is True
        assert dist.describe().share_gpu.startswith("share_gpu='auto' -> mps: workers 'a', 'b' share a GPU")
        (said,) = placement  # one info, no warning
        assert said.severity == "info" and said.message == dist.describe().share_gpu
    assert not os.path.exists(root)
    with Engine({"a": Worker(num_gpus=0.5)}, share_gpu="auto") as one:  # nothing shared: no daemon
        k = one.add(rxcuda.Block.from_kernel(kernels / "scalar_mul.ptx", size=n, name="k", scale=s1), on="a")
        x = rng.standard_normal(n).astype(np.float32)
        one.write(k["x"], x)
        assert one.tick().complete
        np.testing.assert_array_equal(one.read(k["out"]), x * np.float32(s1))
        assert one.where("a")["share_gpu"] == "off" and one.where("a")["mps"] is False and one._share.env == {}


@pytest.mark.skipif(bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), reason="MPS is set up already (the user's)")
@pytest.mark.parametrize("stepping", ["auto", "ray"])
def test_share_gpu_turns_steps_two_workers_on_one_gpu_one_after_the_other_exactly_without_mps(cluster, kernels, rng,
                                                                                              stepping):
    """Two workers on the one GPU without MPS, stepped in turns over a 4 MiB ``ipc`` link: the consumer is stepped
    once the producer answered (its frame and its copy into the exported slot done: the consumer's stream wait on
    the producer's event is satisfied already), so it never waits on the board; every frame exact."""
    n = (4 << 20) // 4
    s1, s2 = (float(v) for v in rng.uniform(0.5, 3.0, 2))
    placement: list = []
    with Engine({"a": Worker(num_gpus=0.5), "b": Worker(num_gpus=0.5)}, share_gpu="turns", stepping=stepping) as dist:
        dist.diagnostics.subscribe(lambda d: placement.append(d) if d.diagnostic.subject == "placement" else None)
        first, second = _linked(dist, kernels, n, "ipc", s1, s2)
        _frames_exact(dist, first, second, s1, s2, rng, n, 20)
        assert dist.where("a")["gpu"] == dist.where("b")["gpu"] and dist.where("a")["mps"] is False
        assert dist.where("a")["share_gpu"] == "turns" and dist.where("b")["turns"] == ("a", "b")
        assert dist.describe().share_gpu.startswith("share_gpu='turns' -> turns") and dist._share.env.get(
            "CUDA_MPS_PIPE_DIRECTORY") is None
        assert [d.severity for d in placement] == ["info"]  # what was chosen; no warning of a GPU shared without MPS
        stats = ray.get(dist.actor("b").stats.remote())
        assert stats["received"][LINK] == 20 and stats["skipped"] == {} and stats["waited"] == 0
