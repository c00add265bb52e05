"""rxcuda.IsolatedEngine over several device positions (``devices=[...]``, as rxcuda.Engine's): the GPU
process's engine has them, ``add(block, device=k)`` places a block there, and a fault in a block on position 1
is survived like any other (the frame reported, the pipeline rebuilt on its positions, exact frames after).
On the CPU device (``devices=["cpu", "cpu"]``), whose write past a buffer is an illegal address as a GPU's is;
on a GPU with ``devices=[0, 0]``: tests/gpu/test_faults_gpu.py."""

import time

import numpy as np
import pytest

import rxcuda
from rxcuda.distributed import IsolatedEngine

N = 4096
BAD = ('extern "C" __global__ void bad(const float* x, float* out, int n) '
       "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i + 100000000] = x[i]; }")


def _placement(iso) -> dict[str, int]:
    """Block name -> position, as the GPU process's engine holds the pipeline."""
    desc = iso._ray.get(iso.actor("gpu").describe.remote())
    return {b.desc.name: desc.placement.get(b.id, 0) for b in desc.blocks}


def _until_ok(iso, seconds=60.0):
    end = time.monotonic() + seconds
    while iso.tick().state != "ok":
        assert time.monotonic() < end, f"no good frame within {seconds} s: {iso.faults[-1:]}"
        time.sleep(0.005)


def _exact(iso, a, b, rng, frames=3):
    """Frames with fresh inputs and scales: position 0's block feeds position 1's, both read exact."""
    for _ in range(frames):
        x = rng.standard_normal(N).astype(np.float32)
        s0, s1 = (float(v) for v in rng.uniform(-4, 4, 2))
        iso.write(a["x"], x)
        a.params["scale"].value, b.params["scale"].value = s0, s1
        assert iso.tick().state == "ok"
        mid = x * np.float32(s0)
        np.testing.assert_array_equal(iso.read(a["out"]), mid)
        np.testing.assert_array_equal(iso.read(b["out"]), mid * np.float32(s1))


def test_a_fault_on_device_position_1_costs_a_frame_and_frames_resume_exact():
    rng = np.random.default_rng(1)
    diags = []
    with IsolatedEngine(devices=["cpu", "cpu"], deadline=30.0) as iso:
        iso.diagnostics.subscribe(diags.append)
        a = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="a"))
        b = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="b"), device=1)
        iso.connect(a["out"], b["x"])
        _exact(iso, a, b, rng)
        assert _placement(iso) == {"a": 0, "b": 1}
        # (PTX: on a machine with a GPU this process would compile a cubin, which the CPU device cannot run)
        oops = iso.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(BAD, target="ptx"), size=N, name="oops"),
                       device=1)
        iso.write(oops["x"], np.ones(N, np.float32))
        first = iso.pid
        assert iso.tick().state == "error"
        fault = iso.faults[-1]
        assert fault.kind == "fault" and "illegal address in kernel 'bad'" in fault.message
        errors = [d for d in diags if d.severity == "error"]
        assert len(errors) == 1 and f"frame {fault.frame} faulted" in errors[0].message
        iso.remove(oops)
        _until_ok(iso)
        assert iso.pid != first and iso.restarts == 1
        assert _placement(iso) == {"a": 0, "b": 1}  # rebuilt on its positions
        _exact(iso, a, b, rng)
        assert iso.faults[-1].recovered_s is not None


def test_regions_and_composites_go_to_their_position_as_a_whole():
    rng = np.random.default_rng(2)
    with IsolatedEngine(devices=["cpu", "cpu"], deadline=30.0) as iso:
        a = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="a", scale=1.5))
        body = rxcuda.Block.from_kernel("scalar_mul", size=N, name="body", scale=-2.0)
        loop = iso.add(rxcuda.For(3, [body], name="thrice"), device=1)
        iso.connect(a["out"], body["x"])
        x = rng.standard_normal(N).astype(np.float32)
        iso.write(a["x"], x)
        assert iso.tick().state == "ok"
        assert _placement(iso) == {"a": 0, "thrice": 1, "body": 1}
        np.testing.assert_array_equal(iso.read(body["out"]), x * np.float32(1.5) * np.float32(-2.0))
        iso.remove(loop)
        assert iso.tick().state == "ok"
        assert _placement(iso) == {"a": 0}


@pytest.mark.parametrize("kwargs, match", [
    ({"devices": []}, "non-empty list"),
    ({"devices": "cpu"}, "non-empty list"),
    ({"devices": [0, "cpu"]}, "one engine runs on one kind of device"),
    ({"devices": [0, -1]}, r"GPU ordinals \(ints >= 0\).*-1"),
    ({"devices": [0, True]}, r"GPU ordinals \(ints >= 0\).*True"),
    ({"devices": [0, 0], "device": 0}, "either device=0 or devices=.0, 0., not both"),
    ({"devices": ["cpu", "cpu"], "null": True}, "null driver, not the CPU device"),
])
def test_bad_devices_are_refused_with_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        IsolatedEngine(**kwargs)


def test_a_position_the_engine_does_not_have_is_refused():
    with IsolatedEngine(null=True, devices=[0, 0], deadline=5.0, standby=False) as iso:
        assert iso.devices == (0, 0)
        with pytest.raises(ValueError, match=r"device=2 is not one of this engine's devices: it has 2"):
            iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N), device=2)
        b = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, name="b"), device=1)
        iso.write(b["x"], np.ones(N, np.float32))
        assert iso.tick().state == "ok"
        assert _placement(iso) == {"b": 1}
    with IsolatedEngine(null=True, deadline=5.0, standby=False) as one, \
            pytest.raises(ValueError, match=r"device=1 is not one of this engine's devices: it has 1"):
        one.add(rxcuda.Block.from_kernel("scalar_mul", size=N), device=1)
