"""The isolated engine (rxcuda.IsolatedEngine) on the null driver: its GPU side in a child process that is
replaced after a lost context, a hang or a kill, with the last values, the inputs written and the last good
code; the standby process; code that faulted rolled back and quarantined. The same on a GPU, with kernels that
really fault: tests/gpu/test_faults_gpu.py."""

import os
import signal
import time

import numpy as np
import pytest

import rxcuda
from rxcuda.distributed import IsolatedEngine, _procs

N = 256
SHIFTED = ('extern "C" __global__ void scalar_mul(const float* x, float* out, float scale, int n) '
           '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] * scale + 1.0f; }')


def _running(engine):
    """A scalar_mul block built and run once (its first good frame: the last good code from then on)."""
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="mul"))
    engine.write(mul["x"], np.ones(N, np.float32))
    assert engine.tick().state == "ok"
    return mul


def _until_ok(engine, seconds=60.0):
    """Tick until a frame is good again; the frames seen on the way."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        f = engine.tick()
        seen.append(f)
        if f.state == "ok":
            return seen
        time.sleep(0.005)
    raise AssertionError(f"no good frame within {seconds} s: {seen[-3:]}")


@pytest.fixture
def engine(request, monkeypatch):
    """An isolated engine on the null driver; parametrized ``"mailbox"`` (indirectly), with the clock's ends spinning
    as on hosts of 8 cores or more, so that idle frames take its mailbox (x86-64 only: elsewhere its pipes)."""
    mailed = []
    if getattr(request, "param", "pipes") == "mailbox":
        from rxcuda.distributed import _clock

        monkeypatch.setattr(_clock, "SPIN_S", 300e-6)
        monkeypatch.setenv("RXCUDA_CLOCK_SPIN_US", "300")  # (the GPU processes' ends)
        mail = _clock.Clock.mail
        monkeypatch.setattr(_clock.Clock, "mail", lambda c, *a: (mailed.append(a[0]), mail(c, *a))[1])
    e = IsolatedEngine(null=True, deadline=1.0)
    yield e
    if mailed:  # the process the test ended with answers mailed frames too (a death or hang was seen in one)
        before = len(mailed)
        for _ in range(3):
            assert e.tick().state == "ok"
        assert len(mailed) == before + 3, "the frames after the test did not take the mailbox"
    e.close()
    if getattr(request, "param", "pipes") == "mailbox" and _clock._X86:
        assert mailed, "no frame took the mailbox"


BOTH = pytest.mark.parametrize("engine", ["pipes", "mailbox"], indirect=True)  # the clock's two ways for a frame


@BOTH
def test_a_lost_context_costs_a_frame_and_keeps_values_and_inputs(engine):
    diags = []
    engine.diagnostics.subscribe(diags.append)
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="mul"))
    x = np.random.default_rng().standard_normal(N).astype(np.float32)
    engine.write(mul["x"], x)
    assert engine.tick().state == "ok"
    mul.params["scale"].value = 3.5
    assert engine.tick().state == "ok"
    first = engine.pid
    engine._ray.get(engine.actor("gpu").inject.remote("cuStreamSynchronize"))
    engine._ray.get(engine.actor("gpu").inject.remote("cuGraphLaunch"))  # whichever the frame waits with
    frames = _until_ok(engine)
    assert frames[0].state == "error" and not frames[0].launched
    assert engine.pid != first and engine.restarts == 1
    fault = engine.faults[-1]
    assert fault.kind == "fault" and "CUDA_ERROR_ILLEGAL_ADDRESS" in fault.message
    assert fault.recovered_s is not None and fault.recovered_s > 0
    errors = [d for d in diags if d.severity == "error"]
    assert len(errors) == 1 and "faulted on the GPU" in errors[0].message
    assert f"frame {fault.frame}" in errors[0].message
    # what the user wrote survived: the rebuilt fragment has the last scale and the input is host-fed
    worker = engine.actor("gpu")
    desc = engine._ray.get(worker.describe.remote())
    assert desc.blocks[0].values["scale"] == 3.5
    assert desc.fed  # the input is written again (its numbers are checked on a GPU: tests/gpu/test_faults_gpu.py)
    mul.params["scale"].value = 1.5  # and it still takes changes
    assert engine.tick().state == "ok"
    assert engine._ray.get(worker.describe.remote()).blocks[0].values["scale"] == 1.5


@BOTH
def test_a_frame_past_its_deadline_is_a_hang_the_process_is_replaced(engine):
    _running(engine)
    first = engine.pid
    engine._ray.get(engine.actor("gpu").throttle.remote(30.0))  # every frame now takes 30 s: past the deadline
    t0 = time.monotonic()
    frames = _until_ok(engine)
    assert time.monotonic() - t0 < 20  # the deadline (1 s) and a restart, not the 30 s
    assert frames[0].state == "error"
    assert engine.faults[-1].kind == "hang" and engine.pid != first


@BOTH
def test_a_killed_process_is_a_crash_and_the_standby_takes_over(engine):
    _running(engine)
    actor = _procs.actor_of(engine.actor("gpu"))
    assert actor.standby is not None  # a spare, started beforehand
    spare = actor.standby.pid
    os.kill(engine.pid, signal.SIGKILL)
    _until_ok(engine)
    assert engine.pid == spare
    assert engine.faults[-1].kind == "crash" and "signal 9" in engine.faults[-1].message
    deadline = time.monotonic() + 30
    while actor.standby is None and time.monotonic() < deadline:  # a new spare is started for the next one
        time.sleep(0.05)
    assert actor.standby is not None and actor.standby.pid != spare


def test_code_that_faults_on_its_first_frame_is_rolled_back_and_quarantined(engine):
    diags = []
    engine.diagnostics.subscribe(diags.append)
    mul = _running(engine)
    good = mul.description.kernel("scalar_mul").code
    bad = rxcuda.compile_cuda(SHIFTED)
    engine._ray.get(engine.actor("gpu").inject.remote("cuStreamSynchronize"))  # the next frame faults ...
    engine._ray.get(engine.actor("gpu").inject.remote("cuGraphLaunch"))
    mul.set_code("scalar_mul", bad)  # ... the first one with the new code (swapped in place)
    _until_ok(engine)
    fault = engine.faults[-1]
    assert fault.rolled_back == (("mul.scalar_mul", bad.origin),)
    assert mul.description.kernel("scalar_mul").code.key == good.key  # back to the last good code
    assert any("Rolled back to the last good code" in d.message and d.subject == "mul" for d in diags)
    # the same code again is not taken: rolled back before it reaches the GPU process, with a diagnostic
    mul.set_code("scalar_mul", bad)
    assert engine.tick().state == "ok"
    assert mul.description.kernel("scalar_mul").code.key == good.key
    assert any("faulted before and is not taken again" in d.message for d in diags)


def test_the_same_fault_again_and_again_holds_the_frames_until_something_changes(engine):
    mul = _running(engine)
    for _ in range(3):
        engine.wait_ready()
        engine._ray.get(engine.actor("gpu").inject.remote("cuStreamSynchronize", times=1000))
        engine._ray.get(engine.actor("gpu").inject.remote("cuGraphLaunch", times=1000))
        for _ in range(200):
            if engine.tick().state == "error":
                break
    assert engine._held
    f = engine.tick()
    assert f.state == "idle" and not f.launched
    mul.params["scale"].value = 2.0  # a change: frames are tried again
    _until_ok(engine)


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="'deadline' must be a positive number"):
        IsolatedEngine(null=True, deadline=0)
    with pytest.raises(ValueError, match="'device' must be a GPU's index"):
        IsolatedEngine(null=True, device=-1)


def test_process_actors_answer_calls_and_report_how_a_process_ended():
    a = _procs.remote(dict).options(max_restarts=1, standby=False).remote(k=1)
    try:
        assert _procs.get(a.get.remote("k"), timeout=60) == 1
        with pytest.raises(_procs.RayTaskError) as e:
            _procs.get(a.pop.remote("x"), timeout=60)
        assert isinstance(e.value.as_instanceof_cause(), KeyError)
        pid = _procs.actor_of(a).pid()
        os.kill(pid, signal.SIGKILL)
        # the actor goes on in a new process (a restart is left), constructed with the same arguments; a call
        # that reached the old one as it died is refused as Ray refuses it (ActorUnavailableError: ask again)
        for _ in range(100):
            try:
                assert _procs.get(a.get.remote("k"), timeout=60) == 1
                break
            except _procs.ActorUnavailableError:
                time.sleep(0.05)
        assert _procs.actor_of(a).pid() != pid
        death = _procs.actor_of(a).deaths[-1]
        assert death["exit"] == -signal.SIGKILL
        os.kill(_procs.actor_of(a).pid(), signal.SIGKILL)  # no restart left: calls fail, saying how it ended
        time.sleep(0.5)
        with pytest.raises(_procs.RayActorError):
            _procs.get(a.get.remote("k"), timeout=60)
    finally:
        _procs.stop(a)


def _standby_ready(engine):
    actor = _procs.actor_of(engine.actor("gpu"))
    end = time.monotonic() + 60
    while (actor.standby is None or not actor.standby.ready.is_set()) and time.monotonic() < end:
        time.sleep(0.02)
    return actor



def test_new_code_that_faults_in_its_trial_run_never_reaches_the_running_graph(engine):
    diags = []
    engine.diagnostics.subscribe(diags.append)
    mul = _running(engine)
    good = mul.description.kernel("scalar_mul").code
    actor = _standby_ready(engine)
    spare = actor.standby.pid
    for call in ("cuStreamSynchronize", "cuGraphLaunch"):  # the standby's trial of the next code loses its context
        _procs.get(actor.call_standby("arm", (call,), {}), timeout=60)
    serving = engine.pid
    bad = rxcuda.compile_cuda(SHIFTED)
    mul.set_code("scalar_mul", bad)
    f = engine.tick()
    assert f.state == "ok" and f.launched  # no frame lost: the running graph never saw the code
    assert engine.pid == serving and engine.restarts == 0
    fault = engine.faults[-1]
    assert fault.kind == "trial" and fault.rolled_back == (("mul.scalar_mul", bad.origin),)
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in fault.message
    assert mul.description.kernel("scalar_mul").code.key == good.key
    assert [d for d in diags if d.severity == "error" and "trial run" in d.message]
    assert actor.trials and actor.trials[-1]["pid"] == spare and actor.trials[-1]["exit"] == 70
    _standby_ready(engine)  # a new spare for the next trial or restart
    assert actor.standby.pid != spare


def test_new_code_that_runs_clean_in_its_trial_is_swapped_in(engine):
    mul = _running(engine)
    _standby_ready(engine)
    serving = engine.pid
    new = rxcuda.compile_cuda(SHIFTED)
    mul.set_code("scalar_mul", new)
    assert engine.tick().state == "ok"
    assert engine.trial_s and engine.pid == serving and not engine.faults
    desc = engine._ray.get(engine.actor("gpu").describe.remote())
    assert desc.blocks[0].desc.kernel("scalar_mul").code.key == new.key  # the serving process runs it now


def test_regions_are_built_in_the_gpu_process_with_their_bodies(engine):
    from _pipeline import builder, kcode, ptr, scalar

    b = builder("check")
    k = b.add_kernel(kcode("flag", ptr("x"), ptr("flag", "out", "u32"), scalar("n", default=64)))
    b.input("x", k["x"])
    b.output("flag", k["flag"], count=1)
    check = engine.add(b.build())
    inner = rxcuda.Block.from_kernel("scalar_mul", size=N, name="inner")
    loop = rxcuda.While(check["flag"], [inner], max_iterations=7)
    engine.add(loop)
    engine.write(check["x"], np.ones(64, np.float32))
    engine.write(inner["x"], np.ones(N, np.float32))
    assert engine.tick().state == "ok"
    desc = engine._ray.get(engine.actor("gpu").describe.remote())
    (region,) = desc.regions
    names = {e.id: e.desc.name for e in desc.blocks}
    assert region.kind == "while" and [names[m] for m in region.members] == ["inner"]
    assert {e.desc.name: e.values.get("max_iterations") for e in desc.blocks}["while"] == 7
    engine.remove(loop)  # with its body
    assert engine.tick().state == "ok"
    desc = engine._ray.get(engine.actor("gpu").describe.remote())
    assert desc.regions == () and [e.desc.name for e in desc.blocks] == ["check"]
    assert set(engine._placement) == {check.id}


@pytest.mark.skipif(rxcuda.probe()[0], reason="a CUDA device is usable here")
@pytest.mark.skipif(rxcuda.cuda._driver.probe()[0], reason="a GPU is here: IsolatedEngine() runs on it")
def test_without_a_gpu_it_runs_on_the_cpu_device_unless_a_gpu_is_asked_for(monkeypatch):
    monkeypatch.delenv("RXCUDA_DEVICE", raising=False)
    with IsolatedEngine(standby=False) as iso:  # as rxcuda.Engine(): the CPU device where there is no GPU
        assert iso.device_index == "cpu"
        x = np.random.default_rng().standard_normal(N).astype(np.float32)
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, scale=-2.5))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"
        np.testing.assert_allclose(iso.read(mul["out"]), np.float32(-2.5) * x, rtol=1e-6)
    with pytest.raises(rxcuda.NoDeviceError, match=r"IsolatedEngine\(device='cpu'\) runs on the CPU device"):
        IsolatedEngine(device=0)
    monkeypatch.setenv("RXCUDA_DEVICE", "cuda")
    with pytest.raises(rxcuda.NoDeviceError, match=r"IsolatedEngine\(null=True\) on the null driver"):
        IsolatedEngine()


def test_a_first_build_that_cannot_be_made_raises_instead_of_idling():
    with IsolatedEngine(null=True) as engine:
        mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="mul"))
        engine.write(mul["x"], np.ones(N, np.float32))
        with pytest.raises(rxcuda.ValidationError):  # an input neither written nor connected: nothing runs
            other = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="other"))
            engine.tick()
        engine.remove(other)
        assert engine.tick().state == "ok"


def test_run_drives_frames_and_observers_see_them(engine):
    mul = _running(engine)
    frames, outs = [], []
    engine.frames.subscribe(frames.append)
    engine.observe(mul["out"], every=2).subscribe(outs.append)
    stop = engine.run(200)
    deadline = time.monotonic() + 30
    while len(frames) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    mul.params["scale"].value = 4.0  # taken by a frame while run() drives them
    time.sleep(0.1)
    stop.dispose()
    assert len(frames) >= 20 and {f.state for f in frames} == {"ok"}
    assert [f.index for f in frames] == sorted(f.index for f in frames)
    assert outs and all(o.shape == (N,) for o in outs)
    assert engine._ray.get(engine.actor("gpu").describe.remote()).blocks[0].values["scale"] == 4.0


def test_a_library_call_handed_a_too_small_buffer_is_refused_and_nothing_changes(engine):
    from rxcuda import libraries as lib

    mul = _running(engine)
    mm = engine.add(rxcuda.Block.from_call(lib.gemm(64, 64, 64), name="mm"))
    small = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=64, name="small"))
    described = engine.describe().pipeline.connections
    with pytest.raises(rxcuda.ValidationError, match=r"small\.out \(64 elements\) to mm\.a \(4096 elements\)"):
        engine.connect(small["out"], mm["a"])
    assert engine.describe().pipeline.connections == described
    engine.remove(small)
    engine.remove(mm)
    assert engine.tick().state == "ok" and mul.id in engine._placement


BAD = ('extern "C" __global__ void bad(const float* x, float* out, int n) '
       "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i + 100000000] = x[i]; }")


def test_on_the_cpu_device_a_write_past_a_buffer_costs_a_frame_and_the_numbers_come_back():
    """The whole path with real numbers and a real illegal address, no GPU: the CPU device (docs/cpu.md) in the
    child process catches the write past the buffer as a GPU would, the process ends, the standby takes over."""
    rng = np.random.default_rng()
    x = rng.standard_normal(4096).astype(np.float32)
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=4096, scale=3.0))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"
        np.testing.assert_allclose(iso.read(mul["out"]), 3 * x, rtol=1e-6)
        # (PTX: on a machine with a GPU this process would compile a cubin, which the CPU device cannot run)
        oops = iso.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(BAD, target="ptx"), size=4096))
        iso.write(oops["x"], x)
        first = iso.pid
        assert iso.tick().state == "error"
        fault = iso.faults[-1]
        assert fault.kind == "fault" and "illegal address in kernel 'bad'" in fault.message
        assert "bytes past the end of argument 1" in fault.message
        iso.remove(oops)
        _until_ok(iso)
        assert iso.pid != first
        x2 = rng.standard_normal(4096).astype(np.float32)
        iso.write(mul["x"], x2)
        mul.params["scale"].value = -1.5
        assert iso.tick().state == "ok"
        np.testing.assert_allclose(iso.read(mul["out"]), np.float32(-1.5) * x2, rtol=1e-6)


SPIN = ('extern "C" __global__ void spin(const float* x, float* out, int n) '
        "{ volatile const float* v = x; while (v[0] == 0.0f) { } out[0] = v[0]; }")


def test_on_the_cpu_device_a_kernel_that_never_returns_is_a_hang_and_frames_resume():
    x = np.random.default_rng().standard_normal(1024).astype(np.float32)
    with IsolatedEngine(device="cpu", deadline=1.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, scale=2.0))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"
        spin = iso.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(SPIN, target="ptx"), size=1024))
        iso.write(spin["x"], np.zeros(1024, np.float32))  # v[0] stays 0: the loop never ends
        t0 = time.monotonic()
        assert iso.tick().state == "error"
        assert time.monotonic() - t0 < 20  # the deadline and a kill, not forever
        assert iso.faults[-1].kind == "hang"
        iso.remove(spin)
        _until_ok(iso)
        np.testing.assert_allclose(iso.read(mul["out"]), 2 * x, rtol=1e-6)


def test_on_the_cpu_device_new_code_that_faults_is_caught_by_its_trial_and_costs_no_frame():
    bad_mul = ('extern "C" __global__ void scalar_mul(const float* x, float* out, float scale, int n) '
               "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i + 100000000] = x[i] * scale; }")
    x = np.random.default_rng().standard_normal(1024).astype(np.float32)
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, scale=2.0))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"
        good = mul.description.kernel("scalar_mul").code
        _standby_ready(iso)
        serving = iso.pid
        bad = rxcuda.compile_cuda(bad_mul, target="ptx")
        mul.set_code("scalar_mul", bad)
        f = iso.tick()
        assert f.state == "ok" and iso.pid == serving  # the running graph never saw it
        fault = iso.faults[-1]
        assert fault.kind == "trial" and "illegal address in kernel 'scalar_mul'" in fault.message
        assert mul.description.kernel("scalar_mul").code.key == good.key
        np.testing.assert_allclose(iso.read(mul["out"]), 2 * x, rtol=1e-6)


@pytest.mark.skipif(rxcuda.cuda._driver.probe()[0], reason="a GPU is here: tensor blocks compile cubins for it, "
                    "which the CPU device cannot run (the GPU's version: tests/gpu/test_faults_gpu.py)")
def test_on_the_cpu_device_a_tensor_block_survives_a_fault_and_its_retrace_is_tried_first():
    """A tensor program's block (rxcuda.tensor.block) in the isolated engine: exact before a neighbour's fault,
    rebuilt with its parameter after it, and a retrace (new code) tried in the standby before it runs."""
    import rxcuda.tensor as rt

    rng = np.random.default_rng()
    x = rng.standard_normal(1024).astype(np.float32)
    blk = rt.block(lambda x, s: rt.exp(x * s) + 1.0, x=rt.input((1024,), "f32"), s=0.5)
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        b = iso.add(blk)
        iso.write(b["x"], x)
        assert iso.tick().state == "ok"
        np.testing.assert_allclose(iso.read(b["out"]), np.exp(x * 0.5) + 1, rtol=1e-5)
        oops = iso.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(BAD, target="ptx"), size=1024))
        iso.connect(b["out"], oops["x"])
        assert iso.tick().state == "error" and "illegal address in kernel 'bad'" in iso.faults[-1].message
        iso.remove(oops)
        blk.params["s"].value = -0.25
        _until_ok(iso)
        np.testing.assert_allclose(iso.read(b["out"]), np.exp(x * -0.25) + 1, rtol=1e-5)
        _standby_ready(iso)
        assert blk.retrace(lambda x, s: rt.exp(x * s) + 2.0) is not None and blk.last_change == "code of k0"
        assert iso.tick().state == "ok" and len(iso.trial_s) == 1   # ran clean in the standby first
        np.testing.assert_allclose(iso.read(b["out"]), np.exp(x * -0.25) + 2, rtol=1e-5)


def test_with_spinning_ends_the_common_frame_goes_through_the_mailbox_and_stays_exact(monkeypatch):
    """On a host whose clock ends spin (8 cores or more; forced here), an idle engine's plain frame travels in the
    clock's shared page (no system call), a frame with a parameter change or a write in its pipe; both exact on the
    CPU device, through a fault and the process that replaces it."""
    from rxcuda.distributed import _clock

    monkeypatch.setattr(_clock, "SPIN_S", 300e-6)
    monkeypatch.setenv("RXCUDA_CLOCK_SPIN_US", "300")  # the GPU processes' ends spin too
    if not _clock._X86:
        pytest.skip("the mailbox is used on x86-64 only (its ordering argument is x86's)")
    rng = np.random.default_rng()
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        a = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, scale=2.0, name="a"))
        b = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, scale=3.0, name="b"))
        iso.connect(a["out"], b["x"])

        def frames(k):
            x = rng.standard_normal(N).astype(np.float32)
            iso.write(a["x"], x)  # (a write: that frame takes the pipe)
            for i in range(k):
                if i % 4 == 3:
                    b.params["scale"].value = float(rng.integers(-4, 5))  # (a change: the pipe)
                assert iso.tick().state == "ok", iso.faults[-1:]
            want = x * np.float32(2.0) * np.float32(b.params["scale"].value)
            np.testing.assert_allclose(iso.read(b["out"]), want, rtol=1e-6)

        for _ in range(3):
            frames(12)
        clock = iso._clocks["gpu"]
        assert clock.mailed >= 20, clock.mailed  # most frames were mailed
        oops = iso.add(rxcuda.Block.from_cuda(BAD, size=N))
        iso.write(oops["x"], np.ones(N, np.float32))
        assert iso.tick().state == "error"
        iso.remove(oops)
        _until_ok(iso)
        mailed = iso._clocks["gpu"].mailed  # the new process's clock
        for _ in range(3):
            frames(12)
        assert iso._clocks["gpu"].mailed > mailed
