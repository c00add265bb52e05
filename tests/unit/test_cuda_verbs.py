"""The CUDA layer's named verbs (rxcuda/cuda/_stream, _memory, _modules, _device, _nvrtc): each makes the
driver call it names, on the driver it is given, and a refusal raises CudaError naming the call.

The driver verbs run on the null driver; NVRTC needs no GPU, so its verbs run for real here.
"""

from __future__ import annotations

import numpy as np
import pytest

from rxcuda.cuda import NullDriver, _memory, _modules, _nvrtc, _stream
from rxcuda.cuda._device import Device
from rxcuda.model._errors import CudaError


@pytest.fixture
def api():
    return NullDriver()


def test_stream_verbs_make_the_calls_they_name(api):
    s = _stream.create_stream(api=api)
    ev = _stream.create_event(timing=False, api=api)
    _stream.record_event(ev, s, api=api)
    _stream.wait_event(s, ev, api=api)
    _stream.synchronize(s, api=api)
    _stream.destroy_event(ev, api=api)
    _stream.destroy_stream(s, api=api)
    assert api.names() == ["cuStreamCreate", "cuEventCreate", "cuEventRecord", "cuStreamWaitEvent",
                           "cuStreamSynchronize", "cuEventDestroy", "cuStreamDestroy"]
    assert api.calls[0][1] == (api.CUstream_flags.CU_STREAM_NON_BLOCKING,)
    assert api.calls[1][1] == (api.CUevent_flags.CU_EVENT_DISABLE_TIMING,)
    assert api.leaks() == {}


def test_wait_stream_records_waits_and_releases_its_event(api):
    s, t = _stream.create_stream(api=api), _stream.create_stream(api=api)
    mark = len(api.calls)
    _stream.wait_stream(s, t, api=api)
    assert api.since(mark) == ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent", "cuEventDestroy"]
    record, wait, destroy = (args for _, args in api.calls[mark + 1:])
    event = record[0]
    assert record == (event, int(t)) and wait == (int(s), event, 0) and destroy == (event,)
    assert "event" not in api.leaks()


def test_wait_stream_releases_its_event_when_the_wait_fails(api):
    s, t = _stream.create_stream(api=api), _stream.create_stream(api=api)
    api.fail("cuStreamWaitEvent", "CUDA_ERROR_INVALID_HANDLE")
    with pytest.raises(CudaError, match="cuStreamWaitEvent"):
        _stream.wait_stream(s, t, api=api)
    assert "event" not in api.leaks()


@pytest.mark.parametrize("verb, call", [
    (lambda api: _stream.synchronize(1, api=api, what="reading a counter"), "cuStreamSynchronize"),
    (lambda api: _stream.create_stream(api=api), "cuStreamCreate"),
    (lambda api: _stream.destroy_stream(1, api=api), "cuStreamDestroy"),
    (lambda api: _stream.create_event(api=api), "cuEventCreate"),
    (lambda api: _stream.destroy_event(1, api=api), "cuEventDestroy"),
    (lambda api: _stream.record_event(1, 2, api=api), "cuEventRecord"),
    (lambda api: _stream.wait_event(1, 2, api=api), "cuStreamWaitEvent"),
    (lambda api: _memory.copy_htod_async(0x100, 0x200, 8, 1, api=api), "cuMemcpyHtoDAsync"),
    (lambda api: _memory.copy_dtod_async(0x100, 0x200, 8, 1, api=api), "cuMemcpyDtoDAsync"),
    (lambda api: _memory.set_bytes_async(0x100, 0, 8, 1, api=api), "cuMemsetD8Async"),
    (lambda api: _modules.max_active_blocks(1, 256, 0, api=api), "cuOccupancyMaxActiveBlocksPerMultiprocessor"),
])
def test_a_refused_verb_names_the_driver_call(api, verb, call):
    api.fail(call, "CUDA_ERROR_INVALID_VALUE")
    with pytest.raises(CudaError, match=f"{call}.*CUDA_ERROR_INVALID_VALUE"):
        verb(api)


def test_synchronize_says_why_it_waited(api):
    api.fail("cuStreamSynchronize", "CUDA_ERROR_ILLEGAL_ADDRESS")
    with pytest.raises(CudaError, match=r"cuStreamSynchronize \(reading a counter\)") as e:
        _stream.synchronize(1, api=api, what="reading a counter")
    assert e.value.code == 700


def test_memory_verbs_copy_what_they_are_given(api):
    host = np.arange(4, dtype=np.uint32)
    _memory.copy_htod_async(0x7F00_0000_0000, host.ctypes.data, host.nbytes, 5, api=api)
    _memory.copy_dtod_async(0x7F00_0000_1000, 0x7F00_0000_0000, host.nbytes, 5, api=api)
    _memory.copy_dtoh_async(host.ctypes.data, 0x7F00_0000_1000, host.nbytes, 5, api=api)
    assert host.tolist() == [0, 0, 0, 0]  # the null driver's device memory holds zeros
    host[:] = 7
    _memory.copy_dtoh(host.ctypes.data, 0x7F00_0000_1000, 4, api=api, what="batch counter")
    assert host.tolist() == [0, 7, 7, 7]  # only the 4 bytes asked for
    _memory.set_bytes_async(0x7F00_0000_1000, 0, 16, 5, api=api)
    assert api.calls == [
        ("cuMemcpyHtoDAsync", (0x7F00_0000_0000, 16, 5)),
        ("cuMemcpyDtoDAsync", (0x7F00_0000_1000, 0x7F00_0000_0000, 16, 5)),
        ("cuMemcpyDtoHAsync", (0x7F00_0000_1000, 16, 5)),
        ("cuMemcpyDtoH", (0x7F00_0000_1000, 4)),
        ("cuMemsetD8Async", (0x7F00_0000_1000, 0, 16, 5)),
    ]
    api.fail("cuMemcpyDtoH")
    with pytest.raises(CudaError, match=r"cuMemcpyDtoH \(batch counter\)"):
        _memory.copy_dtoh(host.ctypes.data, 0x7F00_0000_1000, 4, api=api, what="batch counter")


def test_device_verbs(api):
    dev = Device(0, api=api)
    mark = len(api.calls)
    assert dev.max_threads_per_sm() == 2048  # the null driver's SM
    assert _modules.max_active_blocks(1, 256, 0, api=api) == 8
    assert api.since(mark) == ["cuDeviceGetAttribute", "cuOccupancyMaxActiveBlocksPerMultiprocessor"]
    s = dev.create_stream()
    ev = dev.create_event(timing=False)
    assert api.since(mark)[-2:] == ["cuStreamCreate", "cuEventCreate"]
    _stream.destroy_event(ev, api=api)
    _stream.destroy_stream(s, api=api)
    dev.close()


# -- NVRTC (no GPU needed) ------------------------------------------------------------------------------------
GOOD = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }'
BAD = 'extern "C" __global__ void twice(float* x) { y = 1; }'


def test_nvrtc_version_and_architectures():
    major, minor = _nvrtc.version()
    assert major >= 12 and minor >= 0
    archs = _nvrtc.supported_archs()
    assert 90 in archs and list(archs) == sorted(archs)


def test_nvrtc_compiles_ptx_and_cubin():
    from cuda.core import ProgramOptions

    ptx, _log = _nvrtc.compile_ptx(GOOD, "twice.cu", [b"--gpu-architecture=compute_90"])
    assert b".entry twice" in ptx and not ptx.endswith(b"\0")
    cubin, _log = _nvrtc.compile_cubin(GOOD, ProgramOptions(arch="sm_90"))
    assert cubin[:4] == b"\x7fELF"
    image, _ = _nvrtc.compile_source(GOOD, "twice.cu", ProgramOptions(arch="sm_90"), "ptx")
    assert b".entry twice" in image


@pytest.mark.parametrize("target", ["ptx", "cubin"])
def test_nvrtc_rejection_carries_the_log(target):
    from cuda.core import ProgramOptions

    with pytest.raises(_nvrtc.NvrtcRejected, match=r'identifier "y" is undefined'):
        _nvrtc.compile_source(BAD, "bad.cu", ProgramOptions(name="bad.cu", arch="sm_90"), target)


def test_nvrtc_refuses_an_option_it_does_not_know_in_its_log():
    with pytest.raises(_nvrtc.NvrtcRejected, match="unrecognized option --no-such-option"):
        _nvrtc.compile_ptx(GOOD, "twice.cu", [b"--no-such-option"])
