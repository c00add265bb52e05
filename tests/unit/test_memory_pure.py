"""The pure parts of the memory layer: size classes, pool bookkeeping errors, array-interface parsing."""

from __future__ import annotations

import numpy as np
import pytest

from rxcuda.cuda._memory import BufferPool, DeviceBuffer, resolve_device_array, size_class

SIZES = list(range(1, 5000)) + [2**k + d for k in range(12, 34, 3) for d in (-1, 0, 1)]


def test_minimum_class_is_256_bytes():
    assert {size_class(n) for n in (1, 4, 100, 256)} == {256}


def test_class_is_never_smaller_than_the_request():
    assert all(size_class(n) >= n for n in SIZES)


def test_classes_are_monotone():
    classes = [size_class(n) for n in sorted(SIZES)]
    assert classes == sorted(classes)


def test_slack_is_at_most_25_percent_above_256_bytes():
    worst = max((size_class(n) - n) / n for n in SIZES if n > 256)
    assert worst <= 0.25


def test_a_class_fits_its_own_size_exactly():
    for n in SIZES:
        c = size_class(n)
        assert size_class(c) == c


def test_four_classes_per_power_of_two():
    classes = {size_class(n) for n in range(4097, 8193)}
    assert sorted(classes) == [5120, 6144, 7168, 8192]


@pytest.mark.parametrize(("n", "cls"), [(257, 320), (1000, 1024), (1025, 1280), (3 << 20, 3 << 20)])
def test_known_classes(n, cls):
    assert size_class(n) == cls


def test_pool_refuses_empty_requests():
    with pytest.raises(ValueError, match=r"'nbytes' must be positive \(got 0\)"):
        BufferPool().acquire(0)


def test_pool_refuses_foreign_buffers():
    pool = BufferPool()
    with pytest.raises(ValueError, match="does not belong to this pool or was released twice"):
        pool.release(DeviceBuffer(0x1000, 64))
    assert pool.stats.in_use == 0 and pool.stats.allocations == 0


def test_host_array_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"NumPy array lives in host memory; use engine\.write\(port, array\)"):
        resolve_device_array(np.zeros(4, np.float32))


def test_an_object_that_is_no_array_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"list is not a device array .*engine\.write\(port, array\)"):
        resolve_device_array([1.0, 2.0])


class _Cai:
    def __init__(self, ptr: int, shape: tuple, typestr: str = "<f4", strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3,
                                         "strides": strides}


def test_on_the_cpu_device_an_array_in_its_memory_resolves_from_its_array_interface():
    """The CPU device's memory is host memory cuda.core cannot inspect: its own allocations (a GL buffer's host copy
    among them) resolve from ``__cuda_array_interface__`` as it stands; anything else is refused naming the fix."""
    from rxcuda.cuda._cpu import CpuDriver

    api = CpuDriver()
    _, ptr = api.cuMemAlloc(64)
    ext = resolve_device_array(_Cai(int(ptr), (4, 4)), api=api)
    assert (ext.ptr, ext.dtype, ext.count, ext.shape, ext.device) == (int(ptr), "f32", 16, (4, 4), 0)
    with pytest.raises(TypeError, match=r"68 bytes at 0x[0-9a-f]+ are not memory of the CPU device"):
        resolve_device_array(_Cai(int(ptr), (17,)), api=api)  # past its end
    outside = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match=r"not memory of the CPU device .*engine\.write\(port, array\)"):
        resolve_device_array(_Cai(outside.ctypes.data, (4,)), api=api)
    with pytest.raises(TypeError, match=r"not C-contiguous"):
        resolve_device_array(_Cai(int(ptr), (4, 2), strides=(16, 8)), api=api)
    assert resolve_device_array(_Cai(int(ptr), (4, 4), strides=(16, 4)), api=api).count == 16  # C order, spelt out
    with pytest.raises(TypeError, match=r"list has none: use engine\.write\(port, array\)"):
        resolve_device_array([1.0], api=api)
    api.cuMemFree(ptr)


def test_small_buffers_come_from_a_few_slabs_and_zero_in_a_few_memsets():
    from rxcuda.cuda import NullDriver

    api = NullDriver()
    pool = BufferPool(api)
    bufs = [pool.acquire(4096) for _ in range(1000)]  # 4 MiB of small buffers
    assert api.count("cuMemAlloc") <= 8  # 64 KiB, 128 KiB, ... 2 MiB slabs
    assert len({b.ptr for b in bufs}) == 1000 and all(b.ptr % 256 == 0 for b in bufs)
    spans = sorted((b.ptr, b.ptr + b.capacity) for b in bufs)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False))  # no overlap
    pool.zero(bufs, stream=7)
    memsets = [args for name, args in api.calls if name == "cuMemsetD8Async"]
    assert len(memsets) == api.count("cuMemAlloc")  # one per slab: the buffers of a slab are adjacent
    assert sum(m[2] for m in memsets) == 1000 * 4096
    # never one range over two allocations, even where the driver placed them side by side
    for start, _value, count, _stream in memsets:
        assert any(base <= start and start + count <= base + size for base, size in pool.slabs), hex(start)
    big = pool.acquire(1 << 20)
    assert api.count("cuMemAlloc") == len(memsets) + 1  # a large buffer has its own allocation
    for b in bufs:
        pool.release(b)
    again = pool.acquire(4096)
    assert again.ptr in {b.ptr for b in bufs} and pool.stats.reuses == 1
    pool.release(big)
    pool.release(again)
    pool.close()
    assert api.leaks() == {} and pool.stats.bytes_reserved == 0
