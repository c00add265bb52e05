"""Reads of an rxcuda.IsolatedEngine on the CPU device, checked byte for byte against NumPy: every size (1
element, odd sizes, sizes either side of the slab threshold), dtypes (scalars, vectors), ``out=`` with its
checks, append outputs (none appended, some), arrays that come back in shared memory (slabs) and stay the user's
while held, and reads across a fault that replaces the GPU process. (The GPU side of the same reads:
tests/gpu/test_faults_gpu.py; their cost: bench/faults.py.)"""

import gc
import mmap
import os
import threading
import time

import numpy as np
import pytest

import rxcuda
from rxcuda.distributed import IsolatedEngine, _board, _readback

COPY = ('extern "C" __global__ void cp(const %s* x, %s* out, int n) '
        "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i]; }")
# (C type, the host array a port of it reads as: NumPy dtype, lanes)
TYPES = {"double": (np.float64, ()), "unsigned short": (np.uint16, ()), "signed char": (np.int8, ()),
         "float4": (np.float32, (4,)), "int2": (np.int32, (2,))}
SIZES = (1, 7, 4097, 16385, 65537, 262147)  # 16385 float32: just past the 64 KiB of a slab; 262147 float4: 4 MiB
BAD = ('extern "C" __global__ void bad(const float* x, float* out, int n) '
       "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i + 100000000] = x[i]; }")


def _random(rng, dtype, shape):
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


def _ptx(src: str):
    # (PTX: on a machine with a GPU this process would compile a cubin, which the CPU device cannot run)
    return rxcuda.compile_cuda(src, target="ptx")


def _slab(a: np.ndarray) -> bool:
    """Whether ``a`` is memory of a slab (a shared-memory mapping), not an array of its own."""
    base = a
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


@pytest.fixture(scope="module")
def iso():
    with IsolatedEngine(device="cpu", deadline=30.0) as e:
        yield e


def test_reads_are_exact_for_every_size_and_dtype(iso):
    rng = np.random.default_rng(7)
    kernels = {t: _ptx(COPY % (t, t)) for t in TYPES}
    cases = []  # (block, what it holds)
    for n in SIZES:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=2.0, name=f"mul{n}"))
        x = _random(rng, np.float32, (n,))
        iso.write(mul["x"], x)
        cases.append((mul, x, 2 * x))
        for t, (dtype, lanes) in TYPES.items():
            if n > 65537 and t != "float4":
                continue  # (the largest size once, as the 4 MiB vector)
            b = iso.add(rxcuda.Block.from_kernel(kernels[t], size=n, name=f"cp{n}_{t.replace(' ', '_')}"))
            v = _random(rng, dtype, (n, *lanes))
            iso.write(b["x"], v)
            cases.append((b, v, v))
    assert iso.tick().state == "ok"
    for b, x, want in cases:
        for _ in range(3):  # the first read learns the size; the next ones of 64 KiB or more land in a slab
            got = iso.read(b["out"])
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes(), b.name
        assert _slab(got) == (want.nbytes >= _readback.ZERO_COPY_MIN), b.name
        assert iso.read(b["x"]).tobytes() == x.tobytes()
        out = np.full_like(want, 3)
        assert iso.read(b["out"], out=out) is out and out.tobytes() == want.tobytes()
    for b, _x, _want in cases:
        iso.remove(b)


def test_a_large_read_is_yours_while_you_hold_it(iso):
    """Arrays that come back in slabs are never written again while held: more held than a port has slabs,
    the reads after them are copied, and every array keeps its frame's numbers."""
    n = 100_003
    mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=1.0, name="held"))
    rng = np.random.default_rng(11)
    held, wanted = [], []
    for k in range(_readback.SLABS_PER_PORT + 3):
        x = rng.standard_normal(n).astype(np.float32)
        iso.write(mul["x"], x)
        mul.params["scale"].value = float(k + 1)
        assert iso.tick().state == "ok"
        held.append(iso.read(mul["out"]))
        wanted.append(x * np.float32(k + 1))
    for got, want in zip(held, wanted, strict=True):
        np.testing.assert_array_equal(got, want)
    assert sum(map(_slab, held)) == _readback.SLABS_PER_PORT  # (the first read is copied: it learns the size)
    held[2][:] = -1.0  # the user's to write
    np.testing.assert_array_equal(held[3], wanted[3])
    files = {s.path for s in iso._slabs._ports[next(iter(r for r in iso._slabs._ports if r.port == "out"
                                                             and r.block == mul.id))]}
    del held
    gc.collect()
    for _ in range(10):  # dropped: the same slabs come round again, no new ones
        assert _slab(iso.read(mul["out"]))
    assert {s.path for slabs in iso._slabs._ports.values() for s in slabs} == files
    kept = iso.read(mul["out"])
    iso.remove(mul)
    assert not any(os.path.exists(p) for p in files)  # a removed block's slabs are gone
    np.testing.assert_array_equal(kept, wanted[-1])  # and an array of one stays valid


def test_arrays_read_from_several_threads_are_whole_frames_and_never_change(iso):
    """Two threads read a large port while a third ticks frames with new scales: each array is one frame's value,
    whole, and stays as it was returned while its reader holds it (no other read is offered its slab)."""
    n = 100_003
    mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=1.0, name="threads"))
    x = np.random.default_rng(13).standard_normal(n).astype(np.float32)
    iso.write(mul["x"], x)
    assert iso.tick().state == "ok"
    scales = [float(k) for k in range(1, 9)]
    problems: list[str] = []

    def reader():
        kept: list = []  # (array, its copy when returned), the last three held
        for _ in range(25):
            a = iso.read(mul["out"])
            if not any(np.array_equal(a, x * np.float32(s)) for s in scales):
                problems.append("an array that is no frame's value")
            kept.append((a, a.copy()))
            if len(kept) > 3:
                old, then = kept.pop(0)
                if not np.array_equal(old, then):
                    problems.append("an array changed while held")

    def ticker():
        for s in scales[1:]:
            mul.params["scale"].value = s
            iso.tick()

    threads = [threading.Thread(target=reader), threading.Thread(target=reader), threading.Thread(target=ticker)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not problems, problems[:3]
    iso.remove(mul)


def test_read_into_out_checks_it_as_the_engine_does(iso):
    mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=70_001, scale=2.0, name="outs"))
    x = np.random.default_rng(3).standard_normal(70_001).astype(np.float32)
    iso.write(mul["x"], x)
    assert iso.tick().state == "ok"
    for bad in (np.empty(70_001, np.float64), np.empty(70_000, np.float32), np.empty(140_002, np.float32)[::2],
                np.empty(70_001, np.float32).reshape(1, -1)):
        with pytest.raises(ValueError, match=r"read\(\.\.\., out=\.\.\.\) needs a writable C-contiguous"):
            iso.read(mul["out"], out=bad)
    ro = np.empty(70_001, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        iso.read(mul["out"], out=ro)
    out = np.empty(70_001, np.float32)
    assert iso.read(mul["out"], out=out) is out
    np.testing.assert_array_equal(out, 2 * x)
    iso.remove(mul)


def test_append_outputs_read_none_and_some(iso):
    n = 100_001
    a = iso.add(rxcuda.Block.from_kernel("append_above", size=n, name="above"))
    x = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    iso.write(a["values"], x)
    a.set(threshold=100.0)
    assert iso.tick().state == "ok"
    got = iso.read(a["out"])
    assert got.shape == (0,) and got.dtype == np.float32
    a.set(threshold=-0.5)
    assert iso.tick().state == "ok"
    for _ in range(2):
        got = iso.read(a["out"])
        np.testing.assert_array_equal(np.sort(got), np.sort(x[x > -0.5]))
    iso.remove(a)


def test_reads_come_back_exact_across_a_fault_and_held_arrays_stay():
    n = 300_001
    rng = np.random.default_rng(9)
    x = rng.standard_normal(n).astype(np.float32)
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=3.0, name="mul"))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"
        iso.read(mul["out"])
        before = iso.read(mul["out"])
        assert _slab(before)
        oops = iso.add(rxcuda.Block.from_kernel(_ptx(BAD), size=n))
        iso.write(oops["x"], x)
        first = iso.pid
        assert iso.tick().state == "error" and iso.faults[-1].kind == "fault"
        iso.remove(oops)
        np.testing.assert_array_equal(before, np.float32(3.0) * x)
        end = time.monotonic() + 60
        while iso.tick().state != "ok":  # "idle" while the standby takes over
            assert time.monotonic() < end, "no good frame within 60 s of the fault"
            time.sleep(0.005)
        assert iso.pid != first
        x2 = rng.standard_normal(n).astype(np.float32)
        iso.write(mul["x"], x2)
        mul.params["scale"].value = -1.5
        assert iso.tick().state == "ok"
        for _ in range(3):  # the new process maps the slabs anew
            after = iso.read(mul["out"])
            np.testing.assert_array_equal(after, np.float32(-1.5) * x2)
        assert _slab(after)
        out = np.empty(n, np.float32)
        np.testing.assert_array_equal(iso.read(mul["out"], out=out), np.float32(-1.5) * x2)
        np.testing.assert_array_equal(before, np.float32(3.0) * x)  # held through the fault: untouched
    np.testing.assert_array_equal(after, np.float32(-1.5) * x2)  # and valid after the engine closed


@pytest.mark.parametrize("nbytes", [1 << 20, (1 << 20) + 4, 5_000_012, 4 << 20])
def test_a_large_host_copy_split_over_threads_is_exact(monkeypatch, nbytes):
    monkeypatch.setattr(_board, "COPY_THREADS", 4)
    rng = np.random.default_rng(nbytes)
    src = rng.integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    assert _board.copy_into(dst, src) is dst
    assert dst.tobytes() == src.tobytes()
    vec = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4")])  # a structured dtype, 12-byte items
    src = np.frombuffer(rng.bytes(nbytes // 12 * 12), vec)
    dst = np.zeros_like(src)
    assert _board.copy_into(dst, src).tobytes() == src.tobytes()


def test_reads_copied_over_threads_are_exact(iso, monkeypatch):
    monkeypatch.setattr(_board, "COPY_THREADS", 3)
    n = 1_000_003
    mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=-3.0, name="threaded"))
    x = np.random.default_rng(17).standard_normal(n).astype(np.float32)
    iso.write(mul["x"], x)
    assert iso.tick().state == "ok"
    out = np.zeros(n, np.float32)
    assert iso.read(mul["out"], out=out) is out
    np.testing.assert_array_equal(out, np.float32(-3.0) * x)
    held = [iso.read(mul["out"]) for _ in range(_readback.SLABS_PER_PORT + 2)]  # the last ones copied
    for a in held:
        np.testing.assert_array_equal(a, np.float32(-3.0) * x)
    iso.remove(mul)
