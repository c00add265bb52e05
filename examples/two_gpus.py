"""Two GPUs, one pipeline: half of it on each device, the connection copied by the graphs themselves.

    python -m rxcuda.examples.two_gpus [frames]

(a + b) on device 0, then * scale and + c on device 1, checked against NumPy every frame while `scale` changes
(an exec-node update of device 1's graph only). On a machine with one GPU it says so and runs both halves
there, as two "devices" with their own graphs and streams; without a GPU (or with RXCUDA_DEVICE=cpu) it runs
them on the CPU device the same way, as two positions of it (docs/cpu.md). Then the same chain pipelined:
device 1 works on the previous frame while device 0 works on this one, and the outputs trail the inputs by the
latency it reports.
"""

import sys

import numpy as np

import rxcuda
from rxcuda.cuda._cpuchoice import cpu_by_default
from rxcuda.cuda._device import device_info

ok, why = rxcuda.probe()
frames = int(sys.argv[1]) if len(sys.argv) > 1 else 5
if cpu_by_default():  # no CUDA device, or RXCUDA_DEVICE=cpu: both halves on the CPU device (docs/cpu.md)
    devices: list = ["cpu", "cpu"]
    print(f"{f'no CUDA device ({why})' if not ok else 'RXCUDA_DEVICE=cpu'}: running on the CPU device, both halves "
          "on it as two devices")
elif not ok:
    sys.exit(f"rxcuda.examples.two_gpus runs on a CUDA device, and this machine has none: {why}")
else:
    cards = device_info().get("devices", [])
    devices = [0, 1] if len(cards) > 1 else [0, 0]
    if devices == [0, 0]:
        print(f"one GPU here ({cards[0]['name'] if cards else '?'}): both halves run on it, as two devices")
n = 1 << 20
rng = np.random.default_rng()
a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))

with rxcuda.Engine(devices=devices) as engine:
    add = engine.add(rxcuda.Block.from_kernel("vector_add", size=n))  # device 0 (the default)
    mul = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=3.0), device=1)
    shift = engine.add(rxcuda.Block.from_kernel("vector_add", size=n, name="shift"), device=1)
    engine.connect(add["out"], mul["x"])  # between the devices: a copy node in device 1's graph
    engine.connect(mul["out"], shift["a"])
    engine.write(add["a"], a)
    engine.write(add["b"], b)
    engine.write(shift["b"], c)
    for _ in range(frames):
        scale = float(rng.uniform(-4, 4))
        mul.params["scale"].value = scale
        frame = engine.tick()
        err = np.abs(engine.read(shift["out"]) - ((a + b) * np.float32(scale) + c)).max()
        print(f"frame {frame.index}: scale={scale:+.2f} tiers={frame.tiers} max error vs NumPy {err:.2e}")
        assert err < 1e-4, err
    report = engine.devices
    print(f"devices {report.ordinals} ({', '.join(report.names)}): copies go {report.routes[(0, 1)]}")

with rxcuda.Engine(devices=devices, pipelined=True) as engine:
    s1 = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=2.0, name="s1"))
    s2 = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=n, scale=-0.5, name="s2"), device=1)
    engine.connect(s1["out"], s2["x"])
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(frames)]
    checked = 0
    for t, x in enumerate(inputs):
        engine.write(s1["x"], x)
        engine.tick()
        lag = engine.devices.latency
        if t >= lag:
            err = np.abs(engine.read(s2["out"]) - inputs[t - lag] * np.float32(-1.0)).max()
            print(f"pipelined frame {t}: the output of frame {t - lag} (latency {lag}), max error vs NumPy {err:.2e}")
            assert err < 1e-5, err
            checked += 1
print(f"OK: {frames} frames over two devices and {checked} pipelined frames match NumPy")
