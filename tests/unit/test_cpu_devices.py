"""One pipeline over several positions of the CPU device (``Engine(devices=["cpu", "cpu"])``, docs/devices.md):
each position its own graph and stream, a connection between them a copy node of the reader's graph ordered by
events, as ``devices=[0, 0]`` on one GPU; checked against NumPy on fresh random inputs. Every tier on its own
position's graph, pipelined frames, run_batch with a delayed connection, the default where there is no GPU, and
what is refused (the null driver checks the engine's driver calls over devices: test_devices.py)."""

from __future__ import annotations

import numpy as np
import pytest

import rxcuda
from rxcuda import Block
from rxcuda.cuda._cpu import CpuDriver

N = 5000  # not a multiple of the block: the tail threads take the bounds branch
rng = np.random.default_rng()
HAS_GPU, WHY = rxcuda.probe()


def _f32(n: int = N) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def test_a_connection_across_positions_copies_real_numbers_and_a_new_scale_patches_position_1_only():
    api = CpuDriver()  # (given: its call counts tell what a parameter change did)
    a, b, c = _f32(), _f32(), _f32()
    with rxcuda.Engine(devices=["cpu", "cpu"], driver=api) as engine:
        add = engine.add(Block.from_kernel("vector_add", size=N))  # position 0
        mul = engine.add(Block.from_kernel("scalar_mul", size=N, scale=3.0), device=1)
        shift = engine.add(Block.from_kernel("vector_add", size=N, name="shift"), device=1)
        engine.connect(add["out"], mul["x"])  # across the positions: a copy node of position 1's graph
        engine.connect(mul["out"], shift["a"])
        engine.write(add["a"], a)
        engine.write(add["b"], b)
        engine.write(shift["b"], c)
        assert engine.tick().tiers == ("structure",)
        np.testing.assert_array_equal(engine.read(shift["out"]), (a + b) * np.float32(3.0) + c)
        np.testing.assert_array_equal(engine.read(add["out"]), a + b)  # the producer's own buffer, on position 0
        graphs = engine._rt.graph.graphs
        assert len(graphs) == 2 and graphs[0].exec != graphs[1].exec
        report = engine.devices
        assert report.ordinals == (0, 0) and report.names == ("CPU (rxcuda)", "CPU (rxcuda)")
        assert report.routes == {(0, 1): "local", (1, 0): "local"} and report.rebuilt == (0, 1)
        assert [d.message for d in engine.diagnostic_log if d.subject == "devices"] == [
            "copies from device 0 to device 1: a device-to-device copy (both are the CPU device, whose memory is the "
            "host's)"]
        for _ in range(3):
            scale = float(rng.uniform(-4, 4))
            updates, instantiated = api.count("cuGraphExecKernelNodeSetParams"), api.count("cuGraphInstantiate")
            mul.params["scale"].value = scale
            frame = engine.tick()
            assert frame.tiers == ("parameters",) and engine.rebuilds == 1
            # one exec-node update (mul's node, in position 1's graph), no graph made: both graphs still run
            assert api.count("cuGraphExecKernelNodeSetParams") == updates + 1
            assert api.count("cuGraphInstantiate") == instantiated and engine._rt.graph.graphs == graphs
            np.testing.assert_array_equal(engine.read(shift["out"]), (a + b) * np.float32(scale) + c)
        a2 = _f32()  # new data on position 0 reaches position 1 through the copy
        engine.write(add["a"], a2)
        engine.tick()
        np.testing.assert_array_equal(engine.read(shift["out"]), (a2 + b) * np.float32(scale) + c)


def test_new_code_on_position_1_is_swapped_into_its_graph_and_computes():
    a, b = _f32(), _f32()
    with rxcuda.Engine(devices=["cpu", "cpu"]) as engine:
        mul = engine.add(Block.from_kernel("scalar_mul", size=N, scale=0.5))
        combine = engine.add(Block.from_kernel("vector_add", size=N), device=1)
        engine.connect(mul["out"], combine["a"])
        engine.write(mul["x"], a)
        engine.write(combine["b"], b)
        engine.tick()
        np.testing.assert_array_equal(engine.read(combine["out"]), a * np.float32(0.5) + b)
        assert combine.set_code(None, rxcuda.load_kernel_file(rxcuda.kernels.path("vector_sub"))) == "code"
        assert engine.tick().tiers == ("code",) and engine.rebuilds == 1
        np.testing.assert_array_equal(engine.read(combine["out"]), a * np.float32(0.5) - b)


def test_pipelined_over_three_positions_each_output_trails_its_input_by_the_latency():
    with rxcuda.Engine(devices=["cpu"] * 3, pipelined=True) as engine:
        s1 = engine.add(Block.from_kernel("scalar_mul", size=N, scale=2.0, name="s1"))
        s2 = engine.add(Block.from_kernel("scalar_mul", size=N, scale=-0.5, name="s2"), device=1)
        s3 = engine.add(Block.from_kernel("scalar_mul", size=N, scale=3.0, name="s3"), device=2)
        engine.connect(s1["out"], s2["x"])
        engine.connect(s2["out"], s3["x"])
        inputs = [_f32() for _ in range(6)]
        for t, x in enumerate(inputs):
            engine.write(s1["x"], x)
            engine.tick()
            lag = engine.devices.latency
            assert lag == 2 and engine.devices.pipelined
            first = engine.read(s1["out"])  # position 0 works on this frame
            np.testing.assert_array_equal(first, x * np.float32(2.0))
            out = engine.read(s3["out"])
            if t < lag:  # the pipeline fills: zeros
                assert not out.any(), t
            else:
                want = inputs[t - lag] * np.float32(2.0) * np.float32(-0.5) * np.float32(3.0)
                np.testing.assert_array_equal(out, want, err_msg=f"frame {t}")


def test_run_batch_over_positions_with_a_delayed_connection_gives_what_that_many_ticks_give():
    x = _f32()
    with rxcuda.Engine(devices=["cpu", "cpu"], profile="per_block") as engine:
        mul = engine.add(Block.from_kernel("scalar_mul", size=N, scale=1.5))
        acc = engine.add(Block.from_kernel("vector_add", size=N), device=1)
        engine.connect(mul["out"], acc["b"])
        engine.connect(acc["out"], acc["a"], delay=1)  # acc adds 1.5 x every frame
        engine.write(mul["x"], x)
        frame = engine.run_batch(7)
        assert frame.frames == 7 and [frame.blocks.device(b) for b in frame.blocks] == [0, 1]
        want = np.zeros(N, np.float32)
        for _ in range(7):
            want = want + x * np.float32(1.5)
        np.testing.assert_array_equal(engine.read(acc["out"]), want)
        engine.tick()
        np.testing.assert_array_equal(engine.read(acc["out"]), want + x * np.float32(1.5))
        assert all(us is not None and us > 0 for us in engine.devices.gpu_us)  # each position's host time


def test_debug_runs_each_positions_nodes_one_by_one_with_the_same_numbers():
    a = _f32()
    with rxcuda.Engine(devices=["cpu", "cpu"], debug=True) as engine:
        first = engine.add(Block.from_kernel("scalar_mul", size=N, scale=2.0))
        second = engine.add(Block.from_kernel("scalar_mul", size=N, scale=-3.0, name="second"), device=1)
        engine.connect(first["out"], second["x"])
        engine.write(first["x"], a)
        engine.tick()
        np.testing.assert_array_equal(engine.read(second["out"]), a * np.float32(2.0) * np.float32(-3.0))


def test_devices_0_0_run_on_the_cpu_device_where_engines_default_to_it(monkeypatch):
    monkeypatch.setenv("RXCUDA_DEVICE", "cpu")  # as on a machine without a GPU (where it is the default)
    a = _f32()
    with rxcuda.Engine(devices=[0, 0]) as engine:
        assert engine.device.name == "CPU (rxcuda)" and isinstance(engine._rt.api, CpuDriver)
        first = engine.add(Block.from_kernel("scalar_mul", size=N, scale=4.0))
        second = engine.add(Block.from_kernel("scalar_mul", size=N, scale=0.25, name="second"), device=1)
        engine.connect(first["out"], second["x"])
        engine.write(first["x"], a)
        engine.tick()
        np.testing.assert_array_equal(engine.read(second["out"]), a * np.float32(4.0) * np.float32(0.25))
    with pytest.raises(ValueError, match=r"devices=\[0, 1\]: this engine runs on the CPU device \(RXCUDA_DEVICE=cpu\), "
                                         r"which is one device \(ordinal 0\), so it has no device 1: two positions on "
                                         r"it are devices=\['cpu', 'cpu'\] \(or \[0, 0\]\)"):
        rxcuda.Engine(devices=[0, 1])


@pytest.mark.skipif(HAS_GPU, reason="checks what a machine without a CUDA device does")
def test_without_a_gpu_devices_default_to_the_cpu_device_and_cuda_refuses(monkeypatch):
    monkeypatch.delenv("RXCUDA_DEVICE", raising=False)
    with rxcuda.Engine(devices=[0, 0]) as engine:
        assert engine.devices.names == ("CPU (rxcuda)", "CPU (rxcuda)")
    with pytest.raises(ValueError, match=r"runs on the CPU device \(no CUDA device here: .*\), which is one device"):
        rxcuda.Engine(devices=[0, 1])
    monkeypatch.setenv("RXCUDA_DEVICE", "cuda")
    with pytest.raises(rxcuda.NoDeviceError):
        rxcuda.Engine(devices=[0, 0])


def test_mixing_the_cpu_device_and_gpus_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"devices=\['cpu', 0\] mixes the CPU device and GPU ordinals, and one engine "
                                         r"runs on one kind of device: give devices=\['cpu', 'cpu'\] .* or GPU "
                                         r"ordinals, e.g. devices=\[0, 1\]"):
        rxcuda.Engine(devices=["cpu", 0])
    with pytest.raises(ValueError, match=r"device='cuda' and devices=\['cpu', 'cpu'\] name two kinds of device"):
        rxcuda.Engine(device="cuda", devices=["cpu", "cpu"])
    with pytest.raises(ValueError, match=r"give Engine either device=1 or devices=\['cpu', 'cpu'\], not both"):
        rxcuda.Engine(1, devices=["cpu", "cpu"])
    with pytest.raises(ValueError, match=r"devices takes GPU ordinals \(ints >= 0\), or 'cpu' .*got 'tpu'"):
        rxcuda.Engine(devices=[0, "tpu"], driver=CpuDriver())
    with pytest.raises(ValueError, match=r"runs on the CPU device, which is one device \(ordinal 0\), so it has no "
                                         r"device 2"):
        rxcuda.Engine(devices=[0, 2], driver=CpuDriver())
    with pytest.raises(ValueError, match=r"the CPU device is one device \(got devices=2\): an engine's positions on it "
                                         r"are Engine\(devices=\['cpu', 'cpu'\]\)"):
        CpuDriver(devices=2)


def test_a_peer_copy_on_the_cpu_device_copies_real_bytes_and_refuses_a_range_past_an_allocation():
    from rxcuda.cuda._driver import check

    api = CpuDriver()
    ctx = check(api.cuDevicePrimaryCtxRetain(check(api.cuDeviceGet(0), "cuDeviceGet")), "retain")
    x = _f32(1000)
    src, dst = check(api.cuMemAlloc(x.nbytes), "alloc"), check(api.cuMemAlloc(x.nbytes), "alloc")
    check(api.cuMemcpyHtoD(src, x.ctypes.data, x.nbytes), "HtoD")
    check(api.cuMemcpyPeerAsync(dst, ctx, src, ctx, x.nbytes, 0), "cuMemcpyPeerAsync")
    back = np.zeros_like(x)
    check(api.cuMemcpyDtoH(back.ctypes.data, dst, x.nbytes), "DtoH")
    np.testing.assert_array_equal(back, x)
    assert check(api.cuDeviceCanAccessPeer(0, 0), "cuDeviceCanAccessPeer") == 0  # a device is not its own peer
    with pytest.raises(rxcuda.CudaError, match="CUDA_ERROR_INVALID_VALUE.*not inside one allocation"):
        api.cuMemcpyPeerAsync(dst, ctx, src, ctx, x.nbytes + 4, 0)
