"""The CUDA layer's named verbs on a real GPU: copies, memsets, stream ordering, occupancy, and a kernel
compiled by the NVRTC verbs, each checked against NumPy on fresh random data."""

import numpy as np
import pytest

from rxcuda.cuda import _launch, _memory, _modules, _stream
from rxcuda.cuda._device import Device
from rxcuda.cuda._memory import BufferPool
from rxcuda.cuda._modules import ModuleCache
from rxcuda.model._describe import Launch
from rxcuda.sources._nvrtc import compile_cuda

TWICE = ('extern "C" __global__ void twice(float* x, unsigned n) {\n'
         '  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n'
         '  if (i < n) x[i] = 2.0f * x[i] + 1.0f;\n'
         '}\n')


@pytest.fixture
def gpu():
    """(device, stream, pool) on GPU 0; released afterwards."""
    dev = Device(0)
    stream = _stream.create_stream()
    pool = BufferPool()
    try:
        yield dev, stream, pool
    finally:
        pool.close()
        _stream.destroy_stream(stream)
        dev.close()


def test_copies_round_trip_random_data(gpu, rng):
    _dev, stream, pool = gpu
    x = rng.standard_normal(1 << 16).astype(np.float32)
    a, b = pool.acquire(x.nbytes), pool.acquire(x.nbytes)
    _memory.copy_htod_async(a.ptr, x.ctypes.data, x.nbytes, stream)
    _memory.copy_dtod_async(b.ptr, a.ptr, x.nbytes, stream)
    out = np.zeros_like(x)
    _memory.copy_dtoh_async(out.ctypes.data, b.ptr, x.nbytes, stream)
    _stream.synchronize(stream)
    np.testing.assert_array_equal(out, x)


def test_set_bytes_clears_only_what_it_is_asked_to(gpu, rng):
    _dev, stream, pool = gpu
    x = rng.standard_normal(4096).astype(np.float32) + 3.0  # no zeros to begin with
    a = pool.acquire(x.nbytes)
    _memory.copy_htod_async(a.ptr, x.ctypes.data, x.nbytes, stream)
    _memory.set_bytes_async(a.ptr, 0, x.nbytes // 2, stream)
    _stream.synchronize(stream)
    out = np.zeros_like(x)
    _memory.copy_dtoh(out.ctypes.data, a.ptr, x.nbytes, what="the test buffer")
    expected = x.copy()
    expected[: x.size // 2] = 0.0
    np.testing.assert_array_equal(out, expected)


def test_wait_stream_orders_one_stream_after_another(gpu, rng):
    _dev, stream, pool = gpu
    other = _stream.create_stream()
    try:
        for _ in range(3):  # fresh data each round: a missed wait would show the previous round's values
            x = rng.standard_normal(1 << 20).astype(np.float32)
            a, b = pool.acquire(x.nbytes), pool.acquire(x.nbytes)
            _memory.copy_htod_async(a.ptr, x.ctypes.data, x.nbytes, other)
            _stream.wait_stream(stream, other)
            _memory.copy_dtod_async(b.ptr, a.ptr, x.nbytes, stream)
            out = np.zeros_like(x)
            _memory.copy_dtoh_async(out.ctypes.data, b.ptr, x.nbytes, stream)
            _stream.synchronize(stream)
            np.testing.assert_array_equal(out, x)
            pool.release(a)
            pool.release(b)
    finally:
        _stream.synchronize(other)
        _stream.destroy_stream(other)


def test_an_event_recorded_and_waited_for(gpu, rng):
    _dev, stream, pool = gpu
    other = _stream.create_stream()
    event = _stream.create_event(timing=False)
    try:
        x = rng.standard_normal(1 << 18).astype(np.float32)
        a = pool.acquire(x.nbytes)
        _memory.copy_htod_async(a.ptr, x.ctypes.data, x.nbytes, other)
        _stream.record_event(event, other)
        _stream.wait_event(stream, event)
        out = np.zeros_like(x)
        _memory.copy_dtoh_async(out.ctypes.data, a.ptr, x.nbytes, stream)
        _stream.synchronize(stream)
        np.testing.assert_array_equal(out, x)
    finally:
        _stream.synchronize(other)
        _stream.destroy_event(event)
        _stream.destroy_stream(other)


def test_a_kernel_compiled_through_nvrtc_runs_and_has_an_occupancy(gpu, rng):
    dev, stream, pool = gpu
    code = compile_cuda(TWICE, name="twice.cu")
    modules = ModuleCache()
    try:
        function = modules.load(code).function
        n = 10_000
        x = rng.standard_normal(n).astype(np.float32)
        a = pool.acquire(x.nbytes)
        _memory.copy_htod_async(a.ptr, x.ctypes.data, x.nbytes, stream)
        _launch.launch_kernel(function, Launch(grid=(-(-n // 256),), block=(256,)), int(stream),
                              code.signature.params, [a.ptr, n])
        out = np.zeros_like(x)
        _memory.copy_dtoh_async(out.ctypes.data, a.ptr, x.nbytes, stream)
        _stream.synchronize(stream)
        np.testing.assert_allclose(out, 2.0 * x + 1.0, rtol=1e-6)
        per_sm = dev.max_threads_per_sm()
        assert per_sm >= 1024
        blocks = _modules.max_active_blocks(function, 256, 0)
        assert 1 <= blocks <= per_sm // 256
    finally:
        modules.close()


def test_a_gpu_is_found_by_its_uuid():
    from rxcuda.cuda._device import ordinal_of
    from rxcuda.model._errors import NoDeviceError

    dev = Device(0)
    try:
        assert ordinal_of(dev.uuid) == 0
        with pytest.raises(NoDeviceError, match="no GPU with UUID 00 is visible to this process"):
            ordinal_of("00")
    finally:
        dev.close()
