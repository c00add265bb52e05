"""Workers that crash for real, on a local Ray cluster whose workers run the CPU device (real numbers) or the null
driver: SIGKILL between frames, ``os._exit``, a segfault, host memory running out (the "oom" drill: mid-frame, the
worker allocates and touches host memory and is killed by SIGKILL, as the OOM killer does), a lost GPU context (the
launch made to fail with CUDA_ERROR_ILLEGAL_ADDRESS, a sticky error) and an exception in the frame thread; every
one in every combination of stepping (clocks, Ray calls) and link (``ipc``, ``host``). Each is one error diagnostic
naming the worker; no Ray exception reaches the caller of ``tick``, ``read``, ``write``, ``set``, ``bind``,
``observe`` or ``close`` (a read of a port on a worker that is down raises WorkerDownError); the other worker's
frames go on; the worker is back (a standby takes it over, or Ray restarts it) with its fragment, the parameter
values set and the inputs written while it was down; and frames are exact against NumPy again.

The matrix: one engine per stepping (CPU-device workers, started once for the module) whose producer feeds the
consumer over both links at once (first -> second over ``ipc``, first -> third over ``host``), and every death in
each, of the producer and of the consumer in turn: every (death, stepping, link) is drilled."""

from __future__ import annotations

import time

import numpy as np
import pytest
from _ray import cluster, ray  # noqa: E402, F401  (the local cluster; skips this module without Ray)
from reactivex.subject import Subject

import rxcuda
from rxcuda.distributed import Engine, FragmentDiagnostic, Worker, WorkerDownError  # noqa: E402
from rxcuda.lowlevel import PortRef

PTX = "scalar_mul"
N = 512
S1 = 2.0  # first's scale
S3 = 3.0  # third's scale
LINK = "first.out -> second.x"
LINKS = {"ipc": LINK, "host": "first.out -> third.x"}  # the matrix engines' links, by transport
DEATHS = ("kill", "exit", "segfault", "oom", "context", "frame")
STEPPINGS = ("auto", "ray")
# every death under each stepping, the producer (a) and the consumer (b) in turn: each death hits both
CASES = [(stepping, how, "ab"[(i + j) % 2], "off") for j, stepping in enumerate(STEPPINGS)
         for i, how in enumerate(DEATHS)]
# a part of it again with a and b (one CPU device) stepped in turns (share_gpu="turns"): each death, each stepping
CASES += [("auto", "kill", "a", "turns"), ("auto", "context", "b", "turns"), ("auto", "frame", "a", "turns"),
          ("ray", "exit", "b", "turns"), ("ray", "segfault", "a", "turns"), ("ray", "oom", "b", "turns")]


def _linked(transport: str = "ipc", cpu: bool = False, **kw) -> tuple[Engine, rxcuda.Block, rxcuda.Block]:
    """Two workers (the null driver, or the CPU device where ``cpu``), first (on a, scale S1) -> second (on b)
    over ``transport``, one frame run."""
    spec = Worker(null=not cpu, cpu=cpu, max_restarts=kw.pop("max_restarts", 3))
    engine = Engine({"a": spec, "b": spec}, **kw)
    first = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="first", scale=S1), on="a")
    second = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="second"), on="b")
    engine.connect(first["out"], second["x"], transport=transport)
    engine.write(first["x"], np.ones(N, np.float32))
    engine.tick()
    return engine, first, second


@pytest.fixture(scope="module")
def engines():
    made: dict[tuple, tuple] = {}
    yield made
    for engine, *_ in made.values():
        engine.close()


def _engine(engines, stepping: str, share_gpu: str = "off"):
    """The matrix engine of ``stepping`` (and ``share_gpu``): _linked's over ``ipc``, and first -> third (on b) over
    ``host``."""
    if (stepping, share_gpu) not in engines:
        engine, first, second = _linked("ipc", cpu=True, stepping=stepping, max_restarts=10, share_gpu=share_gpu)
        third = engine.add(rxcuda.Block.from_kernel(PTX, size=N, name="third", scale=S3), on="b")
        engine.connect(first["out"], third["x"], transport="host")
        assert engine.describe().transports() == {LINKS["ipc"]: "ipc", LINKS["host"]: "host"}
        engines[stepping, share_gpu] = (engine, first, second, third)
    return engines[stepping, share_gpu]


def _standby_ready(engine) -> None:
    """Tick until the standby is up (its engine made): a death then takes the standby's path."""
    deadline = time.time() + 60
    while time.time() < deadline:
        engine.tick()
        refs = [ref for _actor, ref in engine._standbys.values()]
        if refs and ray.wait(refs, num_returns=len(refs), timeout=0.05)[0] == refs:
            return
    raise AssertionError("no standby within 60 s")


def _verbs_while_down(engine, first, second, scale: float, x: np.ndarray, seen: list) -> object:
    """Every verb a user may call right after the death: none raises Ray's errors. Returns the observe
    subscription."""
    try:
        engine.read(second["out"])
    except WorkerDownError as e:
        assert "is restarting" in str(e)
    second.params["scale"].value = scale - 1.0
    engine.set(second, scale=scale - 0.5)
    source = Subject()
    binding = engine.bind(second.params["scale"], source)
    source.on_next(scale)  # the latest value: it reaches the worker once it is back
    binding.dispose()
    engine.write(first["x"], x)
    return engine.observe(second["out"]).subscribe(seen.append)


def _exact(engine, first, second, third, x: np.ndarray, scale: float, when: str) -> None:
    """second.out (over the ipc link) exactly ``x * S1 * scale``, third.out (over the host link) ``x * S1 * S3``."""
    y = x * np.float32(S1)
    np.testing.assert_array_equal(engine.read(second["out"]), y * np.float32(scale), err_msg=f"ipc link, {when}")
    np.testing.assert_array_equal(engine.read(third["out"]), y * np.float32(S3), err_msg=f"host link, {when}")


def _exact_frames(engine, first, second, third, scale: float, when: str, frames: int = 3) -> None:
    """``frames`` frames on fresh inputs, each exact (a stale one would show)."""
    rng = np.random.default_rng()
    for i in range(frames):
        x = rng.standard_normal(N).astype(np.float32)
        engine.write(first["x"], x)
        assert engine.tick().complete
        _exact(engine, first, second, third, x, scale, f"frame {i} {when}")


@pytest.mark.parametrize(("stepping", "how", "victim", "share_gpu"), CASES,
                         ids=[f"{s}-{h}-{v}" + ("-turns" if t == "turns" else "") for s, h, v, t in CASES])
def test_a_worker_that_crashes_is_one_diagnostic_and_is_back_with_its_fragment_values_and_inputs(
        engines, stepping, how, victim, share_gpu):
    engine, first, second, third = _engine(engines, stepping, share_gpu)
    assert engine.describe().stepping == {"a": "clock" if stepping == "auto" else "ray", "b": stepping.replace(
        "auto", "clock")}
    assert engine.where("a")["share_gpu"] == share_gpu
    other = "a" if victim == "b" else "b"
    _standby_ready(engine)
    old_pid = engine.where(victim)["pid"]
    diags: list[FragmentDiagnostic] = []
    sub = engine.diagnostics.subscribe(diags.append)
    rng = np.random.default_rng()
    scale = float(rng.integers(2, 1000))
    x = rng.standard_normal(N).astype(np.float32)
    seen: list = []
    ray.get(engine.actor(victim).crash.remote(how)) if how in ("frame", "context", "oom") else \
        engine.actor(victim).crash.remote(how)
    watching = None
    try:
        watching = _verbs_while_down(engine, first, second, scale, x, seen)
        frames, deadline = [], time.time() + 60
        while time.time() < deadline:
            f = engine.tick()
            frames.append(f)
            back = how == "frame" or any(d.diagnostic.severity == "info" for d in diags)
            if back and f.complete and len(frames) > 1:
                break
        assert frames[-1].complete, [str(d) for d in diags]
        if other == "a":  # the producer goes on (a consumer fed by a dead producer skips those frames)
            assert all(f.fragments.get("a") is not None for f in frames), [str(d) for d in diags]
        errors = [d for d in diags if d.diagnostic.severity == "error"]
        assert [d.worker for d in errors] == [victim], [str(d) for d in diags]
        if how == "frame":  # the process lives on: its step failed, nothing restarts
            assert "failed a frame" in errors[0].diagnostic.message and "fault drill" in errors[0].diagnostic.message
            assert engine.where(victim)["pid"] == old_pid
        else:
            assert f"worker '{victim}' died" in errors[0].diagnostic.message
            assert "a standby process takes it over" in errors[0].diagnostic.message
            infos = [d for d in diags if d.diagnostic.severity == "info"]
            assert [d.worker for d in infos] == [victim] and f"worker '{victim}' is back" in infos[0].diagnostic.message
            assert engine.where(victim)["pid"] != old_pid
        for _ in range(3):
            assert engine.tick().complete
        assert ray.get(engine.actor("b").describe.remote()).blocks[0].values["scale"] == scale
        np.testing.assert_array_equal(engine._writes[PortRef(first.id, "x")], x)  # what a rebuild replays
        # the input written and the value set while it was down
        _exact(engine, first, second, third, x, scale, f"after the {how} of {victim}")
        _exact_frames(engine, first, second, third, scale, f"after the {how} of {victim}")
        assert engine.where("b")["turns"] == (("a", "b") if share_gpu == "turns" else ())  # in turns again
        assert len(seen) >= 3  # observed since the death: the frames after it came back
        stats = ray.get(engine.actor("b").stats.remote())
        assert stats["state"] == "ok"
        received = {link: stats["received"].get(link, 0) for link in LINKS.values()}
        engine.tick()
        now = ray.get(engine.actor("b").stats.remote())["received"]
        assert {link: now[link] for link in LINKS.values()} == {k: v + 1 for k, v in received.items()}  # both carry
    finally:
        sub.dispose()
        if watching is not None:
            watching.dispose()


def test_without_a_standby_ray_restarts_the_worker_and_a_read_meanwhile_names_it():
    engine, first, second = _linked(standby=False)
    try:
        old_pid = engine.where("b")["pid"]
        diags: list[FragmentDiagnostic] = []
        engine.diagnostics.subscribe(diags.append)
        engine.actor("b").crash.remote("kill")
        time.sleep(0.2)
        with pytest.raises(WorkerDownError, match="worker 'b' is restarting") as got:
            engine.read(second["out"])
        assert got.value.worker == "b"
        deadline = time.time() + 60
        while time.time() < deadline:
            f = engine.tick()
            if f.complete and any(d.diagnostic.severity == "info" for d in diags):
                break
            time.sleep(0.02)
        assert f.complete, [str(d) for d in diags]
        assert "Ray restarts it" in [d for d in diags if d.diagnostic.severity == "error"][0].diagnostic.message
        assert engine.where("b")["pid"] != old_pid and not engine._standbys
        assert engine.read(second["out"]).shape == (N,)
    finally:
        engine.close()


def _alive(pid: int) -> bool:
    from rxcuda.distributed._board import _alive as alive

    return alive(pid)


def test_a_read_after_a_death_between_frames_then_close_raise_nothing_but_worker_down_and_leave_no_process():
    engine, first, second = _linked()
    _standby_ready(engine)
    pids = [engine.where(w)["pid"] for w in ("a", "b")] + [ray.get(ref) for _a, ref in engine._standbys.values()]
    engine.actor("b").crash.remote("kill")
    time.sleep(0.2)  # between frames: the driver learns of it from the read
    with pytest.raises(WorkerDownError, match="worker 'b' is restarting") as got:
        engine.read(second["out"])
    assert got.value.worker == "b"
    engine.tick()
    engine.close()  # while the standby builds b's fragment
    deadline = time.time() + 30
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)]


def test_a_worker_that_dies_again_before_a_new_standby_is_up_is_restarted_by_ray():
    """The standby that took b over dies too, before the next standby is up: Ray restarts that process, which
    makes its engine and takes b's name again, and builds the fragment."""
    engine, first, second = _linked()
    try:
        _standby_ready(engine)
        diags: list[FragmentDiagnostic] = []
        engine.diagnostics.subscribe(diags.append)

        def back_after(how: str, count: int) -> None:
            deadline = time.time() + 60
            while time.time() < deadline:
                f = engine.tick()
                if f.complete and sum(d.diagnostic.severity == "info" for d in diags) == count:
                    return
            raise AssertionError(f"not back after {how}: {[str(d) for d in diags]}")

        engine.actor("b").crash.remote("kill")
        back_after("the first death", 1)
        second.params["scale"].value = 4.0
        engine.actor("b").crash.remote("exit")  # the standby's process, before a new standby is up
        back_after("the second death", 2)
        died = [d.diagnostic.message for d in diags if d.diagnostic.severity == "error"]
        assert len(died) == 2 and "a standby process takes it over" in died[0] and "Ray restarts it" in died[1]
        assert ray.get(engine.actor("b").describe.remote()).blocks[0].values["scale"] == 4.0
        assert engine.tick().complete
    finally:
        engine.close()


def test_the_standby_after_a_death_starts_from_the_engines_actor_class_not_a_new_one(monkeypatch):
    """A new Ray actor class is exported to the cluster on its first actor (Ray disassembles its code: ~200 ms on
    the driver); made again for each new standby, that sat between a worker's return and its next frame."""
    engine, first, second = _linked()
    try:
        _standby_ready(engine)
        made: list = []
        real = ray.remote
        monkeypatch.setattr(ray, "remote", lambda *a, **kw: made.append(a) or real(*a, **kw))
        old = engine.where("b")["pid"]
        engine.actor("b").crash.remote("kill")
        deadline = time.time() + 60
        while time.time() < deadline and not (engine.tick().complete and engine.where("b")["pid"] != old):
            pass
        assert engine.where("b")["pid"] != old
        deadline = time.time() + 60
        while time.time() < deadline and not engine._standbys:  # the next standby, started once b is back
            engine.tick()
        assert engine._standbys and made == []
        assert engine.tick().complete
    finally:
        engine.close()


FAR = "((size_t)1 << 44)"  # 16 TiB past its buffer: never mapped
POISON = 1e6  # x[0] above it makes the consumer's kernel write far past its buffer: a real fault on the GPU


def lost_context_drill(spec: Worker, n: int, kernel, rng) -> None:
    """A real lost GPU context in a worker: the consumer's kernel writes far past its buffer when its input's
    first value is above POISON (one frame's input does; the next one written does not). The worker's process
    ends (its CUDA errors are sticky; the CPU device's checked accesses report the write as a GPU's illegal
    address, with the same end), one error diagnostic names it, the standby takes it over with the input last
    written, and frames are exact against NumPy again; the producer's frames went on meanwhile. ``spec``: the
    two workers' (CPU device here, a shared GPU in tests/gpu/test_distributed_faults_gpu.py), ``n`` elements,
    ``kernel`` the producer's scalar_mul."""
    src = ('extern "C" __global__ void guarded(const float* x, float* out, int n) { size_t i = blockIdx.x * '
           "(size_t)blockDim.x + threadIdx.x; if (i < n) { out[i] = x[i] * 2.0f; if (x[0] > " + f"{POISON:.1f}f) "
           f"out[i + {FAR} / 4] = 1.0f; }} }}")
    with Engine({"a": spec, "b": spec}) as dist:
        first = dist.add(rxcuda.Block.from_kernel(kernel, size=n, name="first", scale=1.5), on="a")
        second = dist.add(rxcuda.Block.from_cuda(src, size=n, name="second"), on="b")
        dist.connect(first["out"], second["x"], transport="ipc")
        dist.write(first["x"], np.ones(n, np.float32))
        for _ in range(3):
            assert dist.tick().complete
        _standby_ready(dist)
        old = dist.where("b")["pid"]
        diags: list[FragmentDiagnostic] = []
        sub = dist.diagnostics.subscribe(diags.append)
        try:
            poisoned = np.ones(n, np.float32)
            poisoned[0] = 2 * POISON
            dist.write(first["x"], poisoned)
            dist.tick()
            x = rng.standard_normal(n).astype(np.float32)
            dist.write(first["x"], x)  # the input the worker is back with (the poisoned one is not replayed)
            frames, deadline = [], time.time() + 120
            while time.time() < deadline:
                f = dist.tick()
                frames.append(f)
                if f.complete and dist.where("b")["pid"] != old:
                    break
            assert f.complete and dist.where("b")["pid"] != old, [str(d) for d in diags]
            assert all(fr.fragments.get("a") is not None for fr in frames), "the producer's frames stopped"
            errors = [d for d in diags if d.diagnostic.severity == "error"]
            assert [d.worker for d in errors] == ["b"], [str(d) for d in diags]
            assert "worker 'b' died" in errors[0].diagnostic.message, errors[0].diagnostic.message
            np.testing.assert_array_equal(dist.read(second["out"]), (x * np.float32(1.5)) * np.float32(2.0))
            for i in range(5):
                x = rng.standard_normal(n).astype(np.float32)
                dist.write(first["x"], x)
                assert dist.tick().complete
                np.testing.assert_array_equal(dist.read(second["out"]), (x * np.float32(1.5)) * np.float32(2.0),
                                              err_msg=f"frame {i} after the lost context")
        finally:
            sub.dispose()


def test_a_worker_whose_kernel_faults_loses_its_context_and_is_back_with_exact_frames():
    lost_context_drill(Worker(cpu=True, max_restarts=10), N, PTX, np.random.default_rng())
