"""Faults survived in one session: an IsolatedEngine (its GPU side in a supervised child process) meets kernels
that really fault or never finish, one after another in this one process, and after each recovery its frames
are exact again (checked against NumPy on fresh random inputs). The same logic on the null driver runs in CI:
tests/unit/test_isolated.py.

Marked ``gpu_fault`` (run last): a fault anywhere on the GPU can leave CUDA-OpenGL interop on the machine
broken until the GPU is reset (tests/gpu/conftest.py), whatever process it happened in."""

import pathlib
import time

import numpy as np
import pytest

import rxcuda
from rxcuda.distributed import _procs

pytestmark = pytest.mark.gpu_fault

N = 1 << 16
FAR = "((size_t)1 << 44)"  # 16 TiB past: never mapped

FAULTS = {
    "write past a buffer": f"out[i + {FAR} / 4] = x[i];",
    "read far past a buffer": f"out[i] = x[i + {FAR} / 4];",
    "null pointer": "out[i] = ((const float*)0)[i];",
    "misaligned vector access": ("float4 v = *(const float4*)((const char*)x + 4 + 16 * i); "
                                 "out[i] = v.x + v.y + v.z + v.w;"),  # every lane used: one vector load
    "trap": "if (i == 7) __trap(); out[i] = x[i];",
    "device assert": 'if (i == 3) __assertfail("x[i] < 0", "probe.cu", 1, "bad", 1); out[i] = x[i];',  # NVRTC's
}


def _source(body: str, name: str = "bad") -> str:
    return (f'extern "C" __global__ void {name}(const float* x, float* out, int n) '
            "{ size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) { " + body + " } }")


@pytest.fixture(scope="module")
def session():
    """One engine for every fault, as a user's session would have: a good block that must keep computing."""
    engine = rxcuda.IsolatedEngine(deadline=2.0)
    good = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="good"))
    diags: list = []
    engine.diagnostics.subscribe(diags.append)
    yield engine, good, diags
    engine.close()


def _until_ok(engine, seconds=60.0):
    end = time.monotonic() + seconds
    seen = []
    while time.monotonic() < end:
        f = engine.tick()
        seen.append(f)
        if f.state == "ok":
            return seen
        time.sleep(0.002)
    raise AssertionError(f"no good frame within {seconds} s: {seen[-3:]}; faults {engine.faults[-2:]}")


def _exact(engine, good, frames=3):
    """A few frames with fresh random inputs and a fresh scale: each one exact against NumPy, read into a new
    array and into the caller's (both through the GPU process's page-locked shared memory)."""
    rng = np.random.default_rng()
    out = np.full(N, np.nan, np.float32)
    for _ in range(frames):
        x = rng.standard_normal(N).astype(np.float32)
        scale = float(rng.uniform(-4, 4))
        engine.write(good["x"], x)
        good.params["scale"].value = scale
        f = engine.tick()
        assert f.state == "ok", (f, engine.faults[-1:])
        np.testing.assert_allclose(engine.read(good["out"]), x * np.float32(scale), rtol=1e-6)
        assert engine.read(good["out"], out=out) is out
        np.testing.assert_allclose(out, x * np.float32(scale), rtol=1e-6)


def _fault_then_exact(session, block, expect_kind="fault"):
    engine, good, diags = session
    before = len(engine.faults)
    pid = engine.pid
    seen = []
    end = time.monotonic() + 60
    while len(engine.faults) == before and time.monotonic() < end:  # until the fault (or the hang) is seen
        seen.append(engine.tick())
    if block is not None:  # the user takes the faulting block out (a rolled back code needs nothing)
        engine.remove(block)
    seen += _until_ok(engine)
    assert len(engine.faults) == before + 1, engine.faults[before:]
    fault = engine.faults[-1]
    assert fault.kind == expect_kind, fault
    assert any(f.state == "error" for f in seen)
    assert engine.pid != pid
    errors = [d for d in diags if d.severity == "error" and f"frame {fault.frame} " in d.message]
    assert len(errors) == 1, errors
    _exact(engine, good)
    return fault


def test_the_session_starts_exact(session):
    engine, good, _ = session
    _exact(engine, good)


@pytest.mark.parametrize("case", list(FAULTS))
def test_a_faulting_kernel_costs_frames_not_the_session(session, case):
    engine, good, _ = session
    bad = engine.add(rxcuda.Block.from_cuda(_source(FAULTS[case]), size=N, name="bad"))
    engine.write(bad["x"], np.random.default_rng().standard_normal(N).astype(np.float32))
    fault = _fault_then_exact(session, bad)
    assert "lost" in fault.message and "bad/bad" in fault.message  # the CUDA error and the frame's kernels
    assert fault.recovered_s is not None


def test_a_kernel_that_never_returns_is_a_hang(session):
    engine, good, _ = session
    src = ('extern "C" __global__ void spin(const float* x, float* out, int n) '
           "{ volatile const float* v = x; while (v[0] == 0.0f) { } out[0] = v[0]; }")
    spin = engine.add(rxcuda.Block.from_cuda(src, size=N, name="spin"))
    engine.write(spin["x"], np.zeros(N, np.float32))
    t0 = time.monotonic()
    fault = _fault_then_exact(session, spin, "hang")
    assert time.monotonic() - t0 < engine.deadline + 30
    assert fault.recovered_s is not None


def test_a_kernel_that_faults_only_on_frame_100(session):
    engine, good, _ = session
    late = engine.add(rxcuda.Block.from_cuda(_source(f"out[i] = x[i]; if (x[0] > 0.5f) out[i + {FAR} / 4] = 1;",
                                                     "late"), size=N, name="late"))
    zeros = np.zeros(N, np.float32)
    engine.write(late["x"], zeros)
    for _ in range(99):
        assert engine.tick().state == "ok"
    trigger = zeros.copy()
    trigger[0] = 1.0
    engine.write(late["x"], trigger)  # frame 100 faults: the data says so
    _fault_then_exact(session, late)


BAD_MUL = ('extern "C" __global__ void scalar_mul(const float* x, float* out, float scale, int n) '
           f"{{ size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) out[i + {FAR} / 4] = x[i]; }}")


def _standby_ready(engine):
    actor = _procs.actor_of(engine.actor("gpu"))
    end = time.monotonic() + 60
    while (actor.standby is None or not actor.standby.ready.is_set()) and time.monotonic() < end:
        time.sleep(0.02)
    time.sleep(1.0)  # its prewarm (a first build and frame)


def test_code_that_faults_in_its_trial_run_costs_no_frame(session):
    engine, good, diags = session
    last_good = good.description.kernel("scalar_mul").code
    _standby_ready(engine)
    serving, before = engine.pid, len(engine.faults)
    bad = rxcuda.compile_cuda(BAD_MUL)
    good.set_code("scalar_mul", bad)  # tried in the standby first: it faults there
    f = engine.tick()
    assert f.state == "ok" and f.launched
    assert engine.pid == serving and len(engine.faults) == before + 1
    fault = engine.faults[-1]
    assert fault.kind == "trial" and fault.rolled_back == (("good.scalar_mul", bad.origin),)
    assert good.description.kernel("scalar_mul").code.key == last_good.key
    _exact(engine, good)
    assert engine.pid == serving


def test_code_that_faults_live_is_rolled_back_and_the_last_good_code_runs(session):
    engine, good, diags = session
    last_good = good.description.kernel("scalar_mul").code
    engine.trial = False  # straight into the running graph, as without a standby
    try:
        bad = rxcuda.compile_cuda(BAD_MUL.replace("out[i + ", "out[1 + i + "))  # another code than the trial's
        good.set_code("scalar_mul", bad)  # swapped in place in the GPU process: its first frame faults
        _fault_then_exact(session, None)
        assert engine.faults[-1].rolled_back == (("good.scalar_mul", bad.origin),)
        assert good.description.kernel("scalar_mul").code.key == last_good.key
        good.set_code("scalar_mul", bad)  # the same code again: not taken, no new fault
        before = len(engine.faults)
        _exact(engine, good)
        assert len(engine.faults) == before
        assert any("faulted before and is not taken again" in d.message for d in diags)
    finally:
        engine.trial = True


def test_a_hot_reloaded_cu_that_faults_on_its_first_frame_costs_no_frame(session, tmp_path):
    engine, good, diags = session
    path = pathlib.Path(tmp_path) / "shift.cu"
    ok = ('extern "C" __global__ void shift(const float* x, float* out, float c, int n) '
          "{ size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] + c; }")
    path.write_text(ok)
    shift = engine.add(rxcuda.Block.from_cuda(str(path), size=N, name="shift", c=1.5))
    x = np.random.default_rng().standard_normal(N).astype(np.float32)
    engine.write(shift["x"], x)
    stop = engine.watch()
    try:
        assert engine.tick().state == "ok"
        np.testing.assert_allclose(engine.read(shift["out"]), x + np.float32(1.5), rtol=1e-6)
        _standby_ready(engine)
        serving, before = engine.pid, len(engine.faults)
        path.write_text(ok.replace("out[i] = x[i] + c;", f"out[i + {FAR} / 4] = x[i] + c;"))  # saved: it faults
        states = []
        end = time.monotonic() + 30
        while len(engine.faults) == before and time.monotonic() < end:  # the watcher reloads, the trial faults
            states.append(engine.tick().state)
            time.sleep(0.01)
        assert len(engine.faults) == before + 1
        assert engine.faults[-1].kind == "trial"
        assert engine.faults[-1].rolled_back == (("shift.shift", str(path)),)
        assert set(states) == {"ok"} and engine.pid == serving  # not one frame lost
        assert engine.tick().state == "ok"
        np.testing.assert_allclose(engine.read(shift["out"]), x + np.float32(1.5), rtol=1e-6)  # last good code
        _exact(engine, good)
    finally:
        stop.dispose()
        engine.remove(shift)


COMPARE = r"""
extern "C" __global__ void compare(const float* v, unsigned* flag, float level) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *flag = v[0] > level;
}
extern "C" __global__ void affine(const float* x, float* out, float c, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * c + 1.0f;
}
"""


def _compare(name: str):
    b = rxcuda.BlockBuilder(name, size=N)
    k = b.add_kernel(rxcuda.compile_cuda(COMPARE, entry="compare"), threads=1)
    b.input("v", k["v"])
    b.output("flag", k["flag"], count=1)
    b.scalar("level", k["level"], default=0.0)
    return b.build()


def test_a_fault_inside_a_region_body(session):
    engine, good, _ = session
    cmp = engine.add(_compare("cmp"))
    engine.write(cmp["v"], np.ones(N, np.float32))  # the flag is set: the body runs
    bad = rxcuda.Block.from_cuda(_source(FAULTS["null pointer"]), size=N, name="inbody")
    gate = engine.add(rxcuda.If(cmp["flag"], [bad]))
    engine.write(bad["x"], np.ones(N, np.float32))
    fault = _fault_then_exact(session, gate)
    assert "inbody/bad" in fault.message
    engine.remove(cmp)
    _exact(engine, good)


def test_a_while_whose_condition_never_clears_is_a_hang_that_names_the_loop(session):
    engine, good, diags = session
    cmp = _compare("forever")
    step = rxcuda.Block.from_kernel(rxcuda.compile_cuda(COMPARE, entry="affine"), size=N, name="step", c=1.0)
    loop = engine.add(rxcuda.While(cmp["flag"], [step, cmp], name="loop"))  # 1,000,000 passes: past the deadline
    engine.write(cmp["v"], np.ones(N, np.float32))  # v never changes: the flag never clears
    engine.write(step["x"], np.ones(N, np.float32))
    fault = _fault_then_exact(session, loop, "hang")
    message = next(d.message for d in reversed(diags) if f"frame {fault.frame} " in d.message)
    assert "While 'loop' (at most 1000000 passes)" in message


def test_a_while_that_reaches_its_bound_within_the_deadline_is_a_warning_that_names_it(session):
    engine, good, diags = session
    cmp = _compare("bounded")
    step = rxcuda.Block.from_kernel(rxcuda.compile_cuda(COMPARE, entry="affine"), size=N, name="bstep", c=2.0)
    loop = engine.add(rxcuda.While(cmp["flag"], [step, cmp], max_iterations=50, name="capped"))
    engine.write(cmp["v"], np.ones(N, np.float32))  # v never changes: the flag never clears, 50 passes a frame
    x = np.random.default_rng().standard_normal(N).astype(np.float32)
    engine.write(step["x"], x)
    before, faults = len(diags), len(engine.faults)
    for _ in range(4):
        assert engine.tick().state == "ok"
    np.testing.assert_allclose(engine.read(step["out"]), x * np.float32(2.0) + np.float32(1.0), rtol=1e-6)
    warned = [d for d in diags[before:] if d.severity == "warning" and "max_iterations" in d.message]
    assert len(warned) == 1, warned  # once, not once a frame
    assert "While 'capped'" in warned[0].message and "all its 50 passes" in warned[0].message
    assert "fix the condition that never clears: bounded.flag" in warned[0].message
    assert len(engine.faults) == faults  # a warning, not a fault
    engine.remove(loop)
    _exact(engine, good)


def _gemm(engine, m=64):
    """A gemm block with fresh random operands written; returns it and the product it must compute."""
    from rxcuda import libraries as lib

    mm = engine.add(rxcuda.Block.from_call(lib.gemm(m, m, m), name="mm"))
    rng = np.random.default_rng()
    a, b = (rng.standard_normal((m, m)).astype(np.float32) for _ in range(2))
    engine.write(mm["a"], a)
    engine.write(mm["b"], b)
    return mm, a @ b


def test_a_library_call_runs_isolated(session):
    engine, good, _ = session
    mm, want = _gemm(engine)
    assert engine.tick().state == "ok"
    np.testing.assert_allclose(engine.read(mm["c"]).reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    engine.remove(mm)
    _exact(engine, good)


def test_a_library_call_handed_a_too_small_buffer_is_refused(session):
    engine, good, _ = session
    mm, want = _gemm(engine)
    m = want.shape[0]
    small = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=m, name="small"))
    engine.write(small["x"], np.ones(m, np.float32))
    before = len(engine.faults)
    with pytest.raises(rxcuda.ValidationError, match="sizes differ"):  # refused before it can run
        engine.connect(small["out"], mm["a"])
    assert engine.tick().state == "ok"  # (a structural change is built before a frame: outputs are new until then)
    np.testing.assert_allclose(engine.read(mm["c"]).reshape(want.shape), want, rtol=1e-4, atol=1e-4)
    assert len(engine.faults) == before
    engine.remove(small)
    engine.remove(mm)
    _exact(engine, good)


def test_a_tensor_block_survives_a_fault_and_its_retrace_is_tried_first(session):
    """A tensor program's block (a cuBLAS GEMM and a fused kernel) in the session: exact, rebuilt after a
    neighbour's fault, and a retrace (new code) runs in the standby before the running graph takes it. (Tensor
    programs check their shapes when traced: what they meet in a session is a fault beside them.)"""
    import rxcuda.tensor as rt

    engine, good, _ = session
    m = 64
    rng = np.random.default_rng()
    x, w = (rng.standard_normal((m, m)).astype(np.float32) for _ in range(2))
    layer = rt.block(lambda x, w, s: rt.maximum(x @ w, 0) * s, x=rt.input((m, m), "f32"), w=rt.input((m, m), "f32"),
                     s=2.0)
    blk = engine.add(layer)
    engine.write(blk["x"], x)
    engine.write(blk["w"], w)
    assert engine.tick().state == "ok"
    np.testing.assert_allclose(engine.read(blk["out"]).reshape(m, m), np.maximum(x @ w, 0) * 2, rtol=1e-4, atol=1e-4)
    bad = engine.add(rxcuda.Block.from_cuda(_source(FAULTS["null pointer"]), size=N))
    engine.write(bad["x"], np.ones(N, np.float32))
    _fault_then_exact(session, bad)
    layer.params["s"].value = -0.5
    assert engine.tick().state == "ok"
    np.testing.assert_allclose(engine.read(blk["out"]).reshape(m, m), np.maximum(x @ w, 0) * -0.5, rtol=1e-4,
                               atol=1e-4)
    _standby_ready(engine)
    tried = len(engine.trial_s)
    layer.retrace(lambda x, w, s: rt.maximum(x @ w, 0) * s + 1.0)
    assert layer.last_change.startswith("code of"), layer.last_change
    assert engine.tick().state == "ok" and len(engine.trial_s) == tried + 1
    np.testing.assert_allclose(engine.read(blk["out"]).reshape(m, m), np.maximum(x @ w, 0) * -0.5 + 1, rtol=1e-4,
                               atol=1e-4)
    engine.remove(blk)
    _exact(engine, good)


def test_a_fault_on_device_position_1():
    """``devices=[0, 0]``: the GPU process's engine has two positions on one GPU (each its own graph and stream);
    a kernel that faults in a block on position 1 costs frames like any other, the pipeline is rebuilt on its
    positions, and the frames of both positions are exact after each fault. (Its own engine beside the session's,
    in this process; on the CPU device, ``devices=["cpu", "cpu"]``: tests/unit/test_isolated_devices.py.)"""
    engine = rxcuda.IsolatedEngine(devices=[0, 0], deadline=2.0)
    try:
        good0 = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="good0"))
        good1 = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="good1"), device=1)
        diags: list = []
        engine.diagnostics.subscribe(diags.append)
        for g in (good0, good1):
            engine.write(g["x"], np.zeros(N, np.float32))
        _exact(engine, good0)
        _exact(engine, good1)
        for case in ("write past a buffer", "null pointer", "trap"):
            bad = engine.add(rxcuda.Block.from_cuda(_source(FAULTS[case]), size=N, name="bad"), device=1)
            engine.write(bad["x"], np.random.default_rng().standard_normal(N).astype(np.float32))
            fault = _fault_then_exact((engine, good1, diags), bad)  # position 1's frames exact after it
            assert "lost" in fault.message and fault.recovered_s is not None
            _exact(engine, good0)  # and position 0's
        desc = engine._ray.get(engine.actor("gpu").describe.remote())
        assert {b.desc.name: desc.placement.get(b.id, 0) for b in desc.blocks} == {"good0": 0, "good1": 1}
        assert engine.restarts == 3
    finally:
        engine.close()
