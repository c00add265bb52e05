"""Known surprises, one test each: what rxcuda does that a new user may not expect, and what to do instead.

Each test runs the real behaviour on the GPU with fresh random data and checks the numbers against NumPy,
so it fails when the behaviour changes (then update its docstring, the README and this file together).
Covered elsewhere and not repeated here: a kernel that faults (an illegal address) loses the CUDA context
for the whole process -- ``tick()`` raises ``rxcuda.DeviceLostError`` saying to restart the process, later
engines on that GPU say the same, ``close()`` never raises
(``tests/gpu/test_interop_gpu.py::test_a_faulting_kernel_loses_the_context_clearly``).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from conftest import gpu_subprocess_env
from reactivex import operators as ops
from reactivex.subject import Subject

import rxcuda
from rxcuda import Block

cp = pytest.importorskip("cupy")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def rand(rng, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def scaled(engine, kernels, rng, n: int, scale: float = 2.0):
    """A running ``scalar_mul`` block (out = x * scale) with host data written to ``x``; returns (block, x)."""
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=scale))
    x = rand(rng, n)
    engine.write(mul["x"], x)
    assert engine.tick().state == "ok"
    return mul, x


def run_python(script: str, *args: str) -> subprocess.CompletedProcess:
    """A fresh interpreter (its own CUDA context, nothing imported yet) from the repository root."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd=ROOT, env=gpu_subprocess_env(),
                          capture_output=True, text=True, timeout=300)


# -- views: device memory the engine keeps writing -----------------------------------------------------------
def test_engine_array_is_a_view_that_changes_with_the_next_frame(engine, kernels, rng):
    """Surprise: ``engine.array(port)`` is not a snapshot. It is a zero-copy CuPy view of the port's device
    buffer, so the next frame overwrites what it shows.

    Do: ``engine.array(port).copy()`` (a device copy) or ``engine.read(port)`` (a NumPy copy) to keep a
    frame's result."""
    n = 10_007
    mul, x1 = scaled(engine, kernels, rng, n, scale=2.0)
    view = engine.array(mul["out"])
    kept = view.copy()
    np.testing.assert_allclose(cp.asnumpy(view), x1 * 2, rtol=1e-6)
    x2 = rand(rng, n)
    engine.write(mul["x"], x2)
    engine.tick()
    np.testing.assert_allclose(cp.asnumpy(view), x2 * 2, rtol=1e-6)  # the same memory, the new frame
    np.testing.assert_allclose(cp.asnumpy(kept), x1 * 2, rtol=1e-6)  # the copy kept the old one
    assert view.data.ptr == engine.array(mul["out"]).data.ptr


def test_observe_cupy_of_synced_frames_emits_views_valid_until_the_next_frame(engine, kernels, rng):
    """Surprise: ``engine.observe(port, kind="cupy")`` emits, for frames that were waited for (the default
    ``sync=True``), a zero-copy view of the port's buffer: an item kept past its frame shows later frames'
    data. With ``tick(sync=False)`` the item is a device copy instead (ordered after the frame on the
    engine's stream), so what you get depends on how the frame was run.

    Do: copy in the subscriber (``.pipe(ops.map(lambda a: a.copy()))``) when items outlive their frame, or
    observe ``kind="numpy"`` (a host copy per item)."""
    n = 4099
    mul, x1 = scaled(engine, kernels, rng, n, scale=3.0)
    views, copies = [], []
    engine.observe(mul["out"], kind="cupy").subscribe(views.append)
    engine.observe(mul["out"], kind="cupy").pipe(ops.map(lambda a: a.copy())).subscribe(copies.append)
    engine.tick()
    np.testing.assert_allclose(cp.asnumpy(views[0]), x1 * 3, rtol=1e-6)
    x2 = rand(rng, n)
    engine.write(mul["x"], x2)
    engine.tick()
    assert len(views) == len(copies) == 2
    assert views[0].data.ptr == views[1].data.ptr == engine.array(mul["out"]).data.ptr
    np.testing.assert_allclose(cp.asnumpy(views[0]), x2 * 3, rtol=1e-6)  # the first item changed under us
    np.testing.assert_allclose(cp.asnumpy(copies[0]), x1 * 3, rtol=1e-6)  # copied in time
    np.testing.assert_allclose(cp.asnumpy(copies[1]), x2 * 3, rtol=1e-6)
    # an unsynced frame: the item is a copy of this frame's output, not the port's buffer
    x3 = rand(rng, n)
    engine.write(mul["x"], x3)
    engine.tick(sync=False)
    engine.synchronize()  # the copy was queued on the engine's (non-blocking) stream
    assert len(views) == 3 and views[2].data.ptr != engine.array(mul["out"]).data.ptr
    np.testing.assert_allclose(cp.asnumpy(views[2]), x3 * 3, rtol=1e-6)


# -- parameters ------------------------------------------------------------------------------------------
def test_parameter_values_set_between_two_frames_coalesce(engine, kernels, rng):
    """Surprise: parameter values are not a queue. Setting ``scale`` to 1, 2 and 3 before one tick folds
    into one update: only 3 reaches the GPU; no frame ever computes with 1 or 2. (``engine.changes`` still
    sees every value; the same holds for values from ``param.bind(observable)``.)

    Do: tick after each value when every value must produce a frame."""
    n = 2048
    mul, x = scaled(engine, kernels, rng, n, scale=0.5)
    changes, updates = [], []
    engine.changes.subscribe(changes.append)
    engine.updates.subscribe(updates.append)
    for v in (1.0, 2.0, 3.0):
        mul.set(scale=v)
    frame = engine.tick()
    assert frame.tiers == ("parameters",)
    np.testing.assert_allclose(engine.read(mul["out"]), x * 3, rtol=1e-6)
    assert [c.value for c in changes] == [1.0, 2.0, 3.0]
    assert len(updates) == 1 and updates[0].events == 3  # three changes, one update applied
    outs = []
    for v in (1.0, 2.0):  # a frame per value
        mul.set(scale=v)
        engine.tick()
        outs.append(engine.read(mul["out"]))
    np.testing.assert_allclose(outs[0], x * 1, rtol=1e-6)
    np.testing.assert_allclose(outs[1], x * 2, rtol=1e-6)


# -- threads ---------------------------------------------------------------------------------------------
def test_run_owns_the_frames_tick_elsewhere_raises_and_reads_go_to_the_engine_thread(engine, kernels, rng):
    """Surprise: while ``engine.run(...)`` drives the frames, ``engine.tick()`` from any other thread raises
    RuntimeError, but ``engine.read`` / ``write`` / ``array`` from another thread do not: they are queued
    to the engine's thread and run between two frames, so they wait for a frame in progress (a slow
    ``engine.frames`` subscriber delays them too).

    Do: dispose the ``run()`` disposable before ticking yourself; keep subscribers short (hop threads with
    ``observe_on``)."""
    n = 1000
    mul, x = scaled(engine, kernels, rng, n, scale=2.0)
    clock = Subject()
    in_frame, release = threading.Event(), threading.Event()
    frame_threads = []

    def slow_subscriber(frame) -> None:
        frame_threads.append(threading.current_thread())
        in_frame.set()
        release.wait(30)

    sub = engine.frames.subscribe(slow_subscriber)
    running = engine.run(clock)
    try:
        with pytest.raises(RuntimeError, match=r"engine.run\(...\) drives the frames on its own thread"):
            engine.tick()
        clock.on_next(0)
        assert in_frame.wait(30), "the engine thread did not start a frame"
        got = {}
        reader = threading.Thread(target=lambda: got.setdefault("out", engine.read(mul["out"])))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive()  # queued behind the frame in progress, not run on the reader's thread
        release.set()
        reader.join(30)
        assert not reader.is_alive()
        np.testing.assert_allclose(got["out"], x * 2, rtol=1e-6)
        x2 = rand(rng, n)
        engine.write(mul["x"], x2)  # from this (non-engine) thread: routed as well
        np.testing.assert_allclose(engine.read(mul["out"]), x * 2, rtol=1e-6)  # no frame ran since
    finally:
        release.set()
        running.dispose()
        sub.dispose()
    assert frame_threads and all(t is not threading.current_thread() for t in frame_threads)
    engine.tick()  # run() disposed: this thread may tick again
    np.testing.assert_allclose(engine.read(mul["out"]), x2 * 2, rtol=1e-6)


def test_run_sets_the_interpreters_switch_interval_until_disposed(engine, kernels, rng):
    """Surprise: ``engine.run()`` changes a process-wide setting: ``sys.setswitchinterval(0.0002)`` (CPython's
    default is 0.005 s) while it runs, so that Python threads producing values cannot hold the GIL for 5 ms
    each time the engine thread needs it. Every thread of the process runs with it; disposing restores the
    value found when ``run()`` started.

    Do: ``engine.run(..., switch_interval=None)`` to leave the interpreter alone, or another value."""
    n = 512
    mul, x = scaled(engine, kernels, rng, n, scale=4.0)
    original = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        seen = []
        engine.frames.subscribe(lambda f: seen.append(sys.getswitchinterval()))
        clock = Subject()
        running = engine.run(clock)
        try:
            assert sys.getswitchinterval() == pytest.approx(0.0002)
            clock.on_next(0)  # one frame on the engine thread
            np.testing.assert_allclose(engine.read(mul["out"]), x * 4, rtol=1e-6)
        finally:
            running.dispose()  # waits for the frame in progress, then restores the interval
        assert seen and seen[0] == pytest.approx(0.0002)  # the engine thread's frame ran with it
        assert sys.getswitchinterval() == pytest.approx(0.005)
        running = engine.run(Subject(), switch_interval=None)
        try:
            assert sys.getswitchinterval() == pytest.approx(0.005)
        finally:
            running.dispose()
    finally:
        sys.setswitchinterval(original)


# -- kernel files ------------------------------------------------------------------------------------------
def test_a_ptx_without_sidecar_has_untyped_pointer_ports_named_arg0(engine, kernels, rng, tmp_path):
    """Surprise: PTX says how many bytes a parameter takes, not what it is. Without its JSON sidecar,
    ``scalar_mul.ptx`` (``const float* x, float* out, float scale, int n``) loads with ports ``arg0`` and
    ``arg1``: 64-bit values that may be pointers (a ``.u64`` cannot be told from a ``long long``), typed
    nothing, read and written by the kernel (``inout``, so both are outputs: nothing is an input). ``n``
    is ``arg3``, a ``u32`` (nvcc writes ``int`` as ``.u32``) defaulting to 0, not to the size: as loaded,
    the kernel does nothing. An untyped port's own buffer holds ``size`` bytes, not elements.

    Do: keep the sidecar beside the kernel (``rxcuda kernels build`` writes one from the ``.cu``), or
    compile the ``.cu`` with ``rxcuda.compile_cuda``. Without one: bind device arrays and set every
    scalar."""
    n = 5000
    shutil.copy(kernels / "scalar_mul.ptx", tmp_path / "scalar_mul.ptx")  # no scalar_mul.json beside it
    bare = Block.from_kernel(tmp_path / "scalar_mul.ptx", size=n)
    assert [p.name for p in bare.outputs] == ["arg0", "arg1"] and bare.inputs == ()
    assert [p.spec.dtype for p in bare.outputs] == [None, None]
    assert {k: (p.dtype, p.value) for k, p in bare.params.items()} == {"arg2": ("f32", 0.0), "arg3": ("u32", 0)}
    typed = Block.from_kernel(kernels / "scalar_mul.ptx", size=n)  # the sidecar names and types everything
    assert [(p.name, p.spec.dtype) for p in typed.inputs + typed.outputs] == [("x", "f32"), ("out", "f32")]
    assert typed.params["n"].value == n

    engine.add(bare)
    x = cp.asarray(rand(rng, n))
    out = cp.full(n, np.nan, cp.float32)
    engine.bind(bare["arg0"], x)
    engine.bind(bare["arg1"], out)
    engine.tick()
    assert bool(cp.isnan(out).all())  # n = 0: no element was computed
    bare.set(arg2=2.5, arg3=n)
    assert engine.tick().tiers == ("parameters",)
    np.testing.assert_allclose(cp.asnumpy(out), cp.asnumpy(x) * 2.5, rtol=1e-6)


# -- data in ---------------------------------------------------------------------------------------------
def test_bind_copies_a_numpy_array_and_writing_makes_an_input_host_fed(engine, kernels, rng):
    """Surprise: ``engine.bind(port, numpy_array)`` does not bind: a host array cannot be device memory, so it
    is a ``write`` -- copied once into the port's own buffer. Changing the NumPy array afterwards changes
    nothing, and the port is not bound (``unbind`` refuses). Writing makes the input host-fed: it keeps the
    last data written for every later frame (later writes are plain copies, no rebuild). A CuPy (DLPack,
    ``__cuda_array_interface__``) array is bound zero-copy: the kernel reads it in place every frame.

    Do: ``engine.write(port, a)`` again after changing a NumPy array; for data that changes every frame,
    bind a device array (and ``engine.wait(stream)`` after your own work on it) or ``engine.feed``."""
    n = 3001
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0))
    host = rand(rng, n)
    first = host.copy()
    engine.bind(mul["x"], host)
    assert engine.tick().tiers == ("structure",)
    rebuilds = engine.rebuilds
    host *= -5.0  # not seen: the engine holds a copy
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), first * 2, rtol=1e-6)
    with pytest.raises(rxcuda.ValidationError, match="is not bound"):
        engine.unbind(mul["x"])
    engine.write(mul["x"], host)  # a host-fed input: a copy, no rebuild
    assert engine.tick().tiers == ()
    engine.tick()  # no write: the frame reads the data written last
    np.testing.assert_allclose(engine.read(mul["out"]), host * 2, rtol=1e-6)
    assert engine.rebuilds == rebuilds

    dev = cp.asarray(rand(rng, n))
    engine.bind(mul["x"], dev)  # a device array: zero-copy
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), cp.asnumpy(dev) * 2, rtol=1e-6)
    dev *= 3.0  # on CuPy's stream: order the next frame after it
    engine.wait(cp.cuda.get_current_stream())
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), cp.asnumpy(dev) * 2, rtol=1e-6)


# -- processes -------------------------------------------------------------------------------------------
FAULT = """
import sys
import numpy as np
import rxcuda

src = 'extern "C" __global__ void bad(float* x, int n) { ((float*)0x10)[threadIdx.x] = 1.0f; }'
engine = rxcuda.Engine(debug=sys.argv[1] == "debug")
good = engine.add(rxcuda.Block.from_kernel("kernels/scalar_mul.ptx", size=32, name="good"))
engine.write(good["x"], np.ones(32, np.float32))
engine.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(src), size=32, name="bad"))
try:
    engine.tick()
except rxcuda.DeviceLostError as e:
    print("KERNELS", ",".join(sorted(e.kernels)))
    print("MESSAGE", str(e).replace("\\n", " "))
engine.close()
"""


@pytest.mark.gpu_fault
@pytest.mark.parametrize("mode", ["graph", "debug"])
def test_a_fault_in_a_graph_names_every_kernel_of_the_frame(mode):
    """Surprise: a kernel that faults inside the frame's CUDA graph cannot be told from the others: the
    graph runs as one launch and the error surfaces at the frame's sync, so ``DeviceLostError`` lists every
    kernel of the frame. (That the context is then lost for the whole process is shown in
    ``tests/gpu/test_interop_gpu.py::test_a_faulting_kernel_loses_the_context_clearly``.)

    Do: reproduce with ``rxcuda.Engine(debug=True)``, which runs the frame's nodes one by one, waiting after
    each, and names the one that faulted. Each run needs a fresh process: the first fault is sticky."""
    out = run_python(FAULT, mode)
    assert "Traceback" not in out.stderr, out.stdout + out.stderr
    if mode == "graph":
        assert "KERNELS bad/bad,good/scalar_mul" in out.stdout, out.stdout + out.stderr
        assert "Engine(debug=True) runs them one by one" in out.stdout, out.stdout
    else:
        assert "KERNELS bad/bad\n" in out.stdout, out.stdout + out.stderr
        assert "the fault came from bad/bad" in out.stdout, out.stdout


COMPILE_AFTER_ENGINE = """
import sys
import numpy as np
import rxcuda

assert "cuda.core" not in sys.modules, "imported before Engine(): this run would not test the first import"
n = 1 << 12
rng = np.random.default_rng()
x = rng.standard_normal(n).astype(np.float32)
engine = rxcuda.Engine()  # imports cuda.core on this thread (a watcher thread may compile later)
mul = engine.add(rxcuda.Block.from_kernel("kernels/scalar_mul.ptx", size=n, scale=2.0))
engine.write(mul["x"], x)
engine.tick()
code = rxcuda.compile_cuda(
    'extern "C" __global__ void shift(const float* x, float* out, float c, int n)'
    ' { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] + c; }')
shift = engine.add(rxcuda.Block.from_kernel(code, size=n, c=0.25))
engine.connect(mul["out"], shift["x"])
engine.tick()
np.testing.assert_allclose(engine.read(shift["out"]), x * 2 + 0.25, rtol=1e-6)
engine.close()
print("OK")
"""


def test_compiling_right_after_engine_works_in_a_fresh_process():
    """Surprise (CUDA Python, not rxcuda): cuda.core's first import is not thread-safe -- it rebuilds its own
    module while importing, and a second thread importing it at that moment sees it half-built
    (``ImportError: cannot import name 'ProgramOptions' from 'cuda.core.cu13'``). ``Engine()`` imports
    cuda.core on the caller's thread (the hot-reload watcher compiles on its own thread); compiling right
    after ``Engine()`` is safe (issue 8 #2). Pytest hides the race (it imports cuda.core while collecting),
    hence fresh processes, several at once.

    Do: in your own threaded code, import ``cuda.core`` on the main thread before starting threads that use
    it."""
    procs = [subprocess.Popen([sys.executable, "-c", COMPILE_AFTER_ENGINE], cwd=ROOT, env=gpu_subprocess_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and out.strip() == "OK", err[-3000:]
        assert "ImportError" not in err
