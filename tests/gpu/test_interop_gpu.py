"""Arrays and streams from other libraries: intake through StridedMemoryView, stream ordering at bind and
feed, engine.stream / engine.wait, and a rebind reaching every consumer (issue 8 #1, #6, #7)."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda import Block
from rxcuda.cuda._memory import resolve_device_array

cp = pytest.importorskip("cupy")


def test_cupy_arrays_resolve_zero_copy(engine):
    a = cp.arange(32, dtype=cp.float32).reshape(4, 8)
    ext = resolve_device_array(a)
    assert (ext.ptr, ext.dtype, ext.count, ext.shape) == (a.data.ptr, "f32", 32, (4, 8))
    assert ext.owner is a
    assert resolve_device_array(cp.zeros(4, cp.complex64)).dtype == "c64"


def test_non_contiguous_device_array_is_refused(engine):
    with pytest.raises(TypeError, match="not C-contiguous; pass a contiguous copy"):
        resolve_device_array(cp.zeros((8, 8), cp.float32)[:, ::2])


def test_unsupported_element_type_is_refused(engine):
    with pytest.raises(ValueError, match="unsupported dtype bool"):
        resolve_device_array(cp.zeros(4, cp.bool_))


def _slow_producer(stream, n):
    """Queue a long kernel on ``stream`` that finally writes 1..n into an array (so a reader that does not
    wait for the stream sees the poison instead)."""
    spin = cp.RawKernel(r'''
    extern "C" __global__ void spin_then_fill(float* x, int n, long long cycles) {
        long long t0 = clock64();
        while (clock64() - t0 < cycles) {}
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] = (float)(i + 1);
    }''', "spin_then_fill")
    with stream:
        x = cp.full(n, -7.0, cp.float32)
        spin((n // 256 + 1,), (256,), (x, np.int32(n), np.int64(200_000_000)))  # ~0.1 s
    return x


def test_bind_orders_the_frame_after_the_producers_stream(engine, kernels):
    n = 1 << 12
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0))
    engine.write(mul["x"], np.ones(n, np.float32))
    engine.tick()
    producer = cp.cuda.Stream(non_blocking=True)
    x = _slow_producer(producer, n)
    # the CuPy array's interface names `producer` as its stream: the engine waits on it (an event)
    with producer:
        engine.bind(mul["x"], x)
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), 2 * np.arange(1, n + 1, dtype=np.float32))


def test_wait_orders_later_work_on_a_bound_array(engine, kernels):
    n = 1 << 12
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=3.0))
    x = cp.zeros(n, cp.float32)
    engine.bind(mul["x"], x)
    engine.tick()
    producer = cp.cuda.Stream(non_blocking=True)
    spin = _slow_producer(producer, n)
    with producer:
        x[:] = spin  # queued after the slow kernel on `producer`
    engine.wait(producer)
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), 3 * np.arange(1, n + 1, dtype=np.float32))


def test_engine_stream_orders_user_work_after_frames(engine, kernels, rng):
    n = 1 << 14
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=4.0))
    x = rng.standard_normal(n).astype(np.float32)
    engine.write(mul["x"], x)
    s = engine.stream
    assert s.__cuda_stream__() == (0, s.handle) and int(s) == s.handle
    engine.tick(sync=False)
    with cp.cuda.Stream.from_external(s):
        doubled = engine.array(mul["out"]) * 2  # queued after the frame on the engine's stream
    cp.cuda.Stream.from_external(s).synchronize()
    np.testing.assert_allclose(cp.asnumpy(doubled), x * 8, rtol=1e-6)


def test_feed_of_a_device_array_waits_for_its_stream(engine, kernels):
    import reactivex
    from reactivex.subject import Subject

    n = 1 << 12
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=1.0))
    src = Subject()
    engine.feed(mul["x"], src)
    producer = cp.cuda.Stream(non_blocking=True)
    with producer:
        x = _slow_producer(producer, n)
        src.on_next(x)
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), np.arange(1, n + 1, dtype=np.float32))
    assert reactivex  # imported for the feed's Observable protocol


class _ReadOnly:
    """A CuPy array's interface with the read-only flag set (CAI v3 ``data: (ptr, True)``)."""

    def __init__(self, a):
        cai = dict(a.__cuda_array_interface__)
        cai["data"] = (cai["data"][0], True)
        self.__cuda_array_interface__ = cai
        self._a = a


def test_read_only_array_is_refused_for_an_output_and_taken_as_an_input(engine, kernels):
    n = 256
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=n, scale=2.0))
    with pytest.raises(rxcuda.ValidationError, match="scalar_mul.out is written by the pipeline, but the array is "
                                                     "read-only"):
        engine.bind(mul["out"], _ReadOnly(cp.zeros(n, cp.float32)))
    x = cp.arange(n, dtype=cp.float32)
    engine.bind(mul["x"], _ReadOnly(x))
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), 2 * np.arange(n, dtype=np.float32))


def test_rebind_reaches_kernel_and_memset_nodes(engine, kernels, rng):
    n = 1 << 10
    above = engine.add(Block.from_kernel(kernels / "append_above.ptx", size=n, threshold=0.0))
    vals = cp.asarray(rng.standard_normal(n).astype(np.float32))
    engine.bind(above["values"], vals)
    out1 = cp.full(n, -1.0, cp.float32)
    engine.bind(above["out"], out1)
    engine.tick()
    rebuilds = engine.rebuilds
    out2 = cp.full(n, -1.0, cp.float32)
    engine.bind(above["out"], out2)  # a warm rebind of the data buffer
    frame = engine.tick()
    assert frame.tiers == ("parameters",) and engine.rebuilds == rebuilds
    expected = np.sort(cp.asnumpy(vals)[cp.asnumpy(vals) > 0])
    assert engine.count(above["out"]) == expected.size
    np.testing.assert_array_equal(np.sort(cp.asnumpy(out2)[: expected.size]), expected)


@pytest.mark.gpu_fault
def test_a_faulting_kernel_loses_the_context_clearly(tmp_path):
    """A kernel that writes through a bad pointer: tick raises DeviceLostError naming the fix, close() does
    not raise. Run in a subprocess: the sticky error would poison every later test in this process."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent('''
        import numpy as np, rxcuda
        src = 'extern "C" __global__ void bad(float* x, int n) { ((float*)0x10)[threadIdx.x] = 1.0f; }'
        engine = rxcuda.Engine()
        b = engine.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(src), size=32))
        try:
            engine.tick()
        except rxcuda.DeviceLostError as e:
            print("LOST", "restart the process" in str(e), "bad" in str(e))
        try:
            engine.tick()
        except rxcuda.DeviceLostError:
            print("STILL")
        engine.close()
        print("CLOSED")
        other = None
        try:
            other = rxcuda.Engine()
            b2 = other.add(rxcuda.Block.from_kernel("kernels/scalar_mul.ptx", size=32))
            other.write(b2["x"], np.ones(32, np.float32))
            other.tick()
            print("OTHER-OK")
        except rxcuda.CudaError as e:
            print("OTHER", type(e).__name__)
        finally:
            if other is not None:
                other.close()
    ''')
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120)
    assert "LOST True True" in out.stdout, out.stdout + out.stderr
    assert "STILL" in out.stdout and "CLOSED" in out.stdout, out.stdout + out.stderr
    assert "OTHER DeviceLostError" in out.stdout, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert rxcuda  # the module under test
