"""Workers that crash for real on a GPU: two workers share one GPU (``num_gpus=0.5`` each), an ``ipc`` link,
frames through their clocks. SIGKILL, ``os._exit``, a segfault and host memory running out (the "oom" drill: SIGKILL
mid-frame while allocating) of the producer or the consumer are each one
error diagnostic naming it and no exception from any verb; the worker is back (from the standby, whose engine was
made on the GPU beforehand, or by Ray's restart) with the scale set and the input written while it was down; and
every frame after is exact against NumPy on fresh data. Needs Ray (on the GPU machine:
../shared/tools/device-prep.sh --ray brings it in two parts)."""

from __future__ import annotations

import pathlib
import sys
import time

import numpy as np
import pytest

import rxcuda

ray = pytest.importorskip("ray", reason="rxcuda.distributed runs on Ray: pip install 'rxcuda[ray]'")

from conftest import KERNELS  # noqa: E402
from test_distributed_gpu import exact_frames  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "unit"))
from test_distributed_faults import lost_context_drill  # noqa: E402

from rxcuda.distributed import Engine, FragmentDiagnostic, Worker, WorkerDownError  # noqa: E402

N = 1 << 20


@pytest.fixture(scope="module", params=[True, False], ids=["standby", "ray-restart"])
def pair(request):
    request.getfixturevalue("cluster")
    spec = Worker(num_gpus=0.5, max_restarts=10)
    with Engine({"a": spec, "b": spec}, standby=request.param) as dist:
        first = dist.add(rxcuda.Block.from_kernel(KERNELS / "scalar_mul.ptx", size=N, name="first", scale=1.5),
                         on="a")
        second = dist.add(rxcuda.Block.from_kernel(KERNELS / "scalar_mul.ptx", size=N, name="second", scale=2.0),
                          on="b")
        dist.connect(first["out"], second["x"], transport="ipc")
        dist.write(first["x"], np.ones(N, np.float32))
        dist.tick()
        assert dist.describe().stepping == {"a": "clock", "b": "clock"}
        yield dist, first, second, request.param


def _standby_ready(dist) -> None:
    deadline = time.time() + 120
    while dist._use_standby and time.time() < deadline:
        dist.tick()
        refs = [ref for _actor, ref in dist._standbys.values()]
        if refs and len(ray.wait(refs, num_returns=len(refs), timeout=0.05)[0]) == len(refs):
            return
    assert not dist._use_standby, "no standby within 120 s"


@pytest.mark.parametrize(("how", "victim"), [("kill", "b"), ("exit", "a"), ("segfault", "b"), ("kill", "a"),
                                            ("oom", "b"), ("oom", "a")])
def test_a_worker_that_crashes_on_the_gpu_is_back_and_its_frames_are_exact(pair, rng, how, victim):
    dist, first, second, standby = pair
    _standby_ready(dist)
    s1 = float(first.params["scale"].value)
    old = dist.where(victim)["pid"]
    diags: list[FragmentDiagnostic] = []
    sub = dist.diagnostics.subscribe(diags.append)
    try:
        if how == "oom":  # armed (waited for): the victim dies in its next step, mid-frame
            ray.get(dist.actor(victim).crash.remote(how))
        else:
            dist.actor(victim).crash.remote(how)
        s2 = float(rng.uniform(0.5, 3.0))
        x = rng.standard_normal(N).astype(np.float32)
        second.params["scale"].value = s2  # set and written while the worker is down: it gets both once back
        dist.write(first["x"], x)
        try:
            dist.read(second["out"])
        except WorkerDownError as e:
            assert e.worker == victim
        t0, deadline = time.time(), time.time() + 120
        while time.time() < deadline:
            f = dist.tick()
            if f.complete and dist.where(victim)["pid"] != old:
                break
        took = time.time() - t0
        assert f.complete, [str(d) for d in diags]
        errors = [d for d in diags if d.diagnostic.severity == "error"]
        assert [d.worker for d in errors] == [victim], [str(d) for d in diags]
        assert ("a standby process takes it over" in errors[0].diagnostic.message) is standby
        np.testing.assert_array_equal(dist.read(second["out"]), (x * np.float32(s1)) * np.float32(s2))
        exact_frames(dist, first, second, s1, s2, rng, f"after the {how} of {victim} ({took:.2f} s to come back)")
        a, b = dist.where("a"), dist.where("b")
        assert a["gpu"] == b["gpu"]  # the one GPU, in the standby too
    finally:
        sub.dispose()



@pytest.mark.gpu_fault
def test_a_worker_whose_kernel_loses_its_gpu_context_is_back_and_its_frames_are_exact(cluster, rng):
    """A real lost GPU context: the consumer's kernel writes far past its buffer for one frame's input (the drill
    of tests/unit/test_distributed_faults.py, there on CPU-device workers)."""
    lost_context_drill(Worker(num_gpus=0.5, max_restarts=10), N, KERNELS / "scalar_mul.ptx", rng)
