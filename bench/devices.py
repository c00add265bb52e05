"""One pipeline across devices: the cost of a connection between devices, pipelined throughput, host cost.

    python bench/devices.py [--devices 0 1] [--frames 300] [--stage-blocks 8] [--n 4194304]

Prints one table with the cards' names (``--devices 0 0``, the default on a machine with one GPU, runs two
"devices" on one GPU: the copy is then a device-to-device copy and pipelining cannot add throughput):

* bandwidth of a cross-device connection (the peer copy node of the reading device's graph, timed with events
  around that graph alone, its kernel cut to one element) against the raw ``cuMemcpyPeerAsync`` of the same
  bytes between the same buffers, and against a device-to-device copy on the reading device -- for 1, 16,
  64 and 256 MiB;
* frames per second of a 2-stage and a k-stage chain (k = the devices given, at least 2; each stage
  ``--stage-blocks`` scalar_mul blocks over ``--n`` floats) on one device, over the devices one frame at a
  time, and pipelined (``Engine(devices=..., pipelined=True)``), frames queued with ``tick(sync=False)``;
* frames per second of ``engine.run_batch`` on the 2-stage chain: one device (the GPU loops its graph)
  against two devices (each device's graph queued from the host per frame) and pipelined;
* the host's cost of one frame (``tick()`` of a one-block-per-device pipeline, waited for) against one device.

Targets on a host with several GPUs (issue 22): the connection at >= 90 % of cuMemcpyPeerAsync for large
buffers; a 2-stage pipelined chain >= 1.8x one device's frames per second (>= 0.9 k on k devices).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MIB = 1 << 20


def _events_us(drv, stream, fn, repeats: int = 20) -> float:
    """Median GPU time of ``fn()``'s work on ``stream``, between two events."""
    from rxcuda.cuda._driver import check

    start = check(drv.cuEventCreate(0), "cuEventCreate")
    end = check(drv.cuEventCreate(0), "cuEventCreate")
    times = []
    for i in range(repeats + 3):
        check(drv.cuEventRecord(start, stream), "cuEventRecord")
        fn()
        check(drv.cuEventRecord(end, stream), "cuEventRecord")
        check(drv.cuEventSynchronize(end), "cuEventSynchronize")
        if i >= 3:
            times.append(check(drv.cuEventElapsedTime(start, end), "cuEventElapsedTime") * 1e3)
    drv.cuEventDestroy(start)
    drv.cuEventDestroy(end)
    return statistics.median(times)


def bandwidth_rows(devices, code, sizes) -> list[tuple[str, str, str, str]]:
    return [_bandwidth(devices, code, nbytes) for nbytes in sizes]


def _bandwidth(devices, code, nbytes: int) -> tuple[str, str, str, str]:
    import numpy as np
    from cuda.bindings import driver as drv

    import rxcuda
    from rxcuda.cuda._driver import check
    from rxcuda.model._describe import PortRef

    n = nbytes // 4
    with rxcuda.Engine(devices=devices) as engine:
        a = engine.add(rxcuda.Block.from_kernel(code, size=n, name="producer"))
        b = engine.add(rxcuda.Block.from_kernel(code, size=n, name="consumer"), device=1)
        engine.connect(a["out"], b["x"])
        engine.write(a["x"], np.ones(n, np.float32))
        b.set(n=1)  # the consumer's kernel touches one element: its graph is the copy
        engine.tick()
        g = engine._rt.graph
        lanes = engine._rt.devices.lanes
        g1, lane1, lane0 = g.graphs[1], lanes[1], lanes[0]
        s1 = lane1.stream
        t_node = _events_us(drv, s1, lambda: check(drv.cuGraphLaunch(g1.exec, s1), "cuGraphLaunch"))
        src = g.pointers[g.plan.port_buffers[PortRef(a.id, "out")]]
        dst = g1.pointers[g1.plan.port_buffers[PortRef(b.id, "x")]]
        ctx0, ctx1 = lane0.device.context, lane1.device.context
        lane1.device.make_current()
        t_peer = _events_us(drv, s1, lambda: check(drv.cuMemcpyPeerAsync(dst, ctx1, src, ctx0, nbytes, s1),
                                                   "cuMemcpyPeerAsync"))
        scratch = lane1.pool.acquire(nbytes)
        t_d2d = _events_us(drv, s1, lambda: check(drv.cuMemcpyDtoDAsync(scratch.ptr, dst, nbytes, s1),
                                                  "cuMemcpyDtoDAsync"))
        lane1.pool.release(scratch)
        engine.device.make_current()
        route = engine.devices.routes[(0, 1)]
    gbs = [nbytes / t / 1e3 for t in (t_node, t_peer, t_d2d)]
    return (f"connection {nbytes // MIB} MiB ({route})", f"{gbs[0]:.1f} GB/s",
            f"{gbs[1]:.1f} GB/s ({gbs[0] / gbs[1]:.0%})", f"{gbs[2]:.1f} GB/s")


def _chain(engine, code, k: int, per_stage: int, n: int, on_devices: bool):
    import numpy as np

    import rxcuda

    prev = None
    first = None
    for stage in range(k):
        for j in range(per_stage):
            blk = rxcuda.Block.from_kernel(code, size=n, scale=1.0, name=f"s{stage}_{j}")
            blk = engine.add(blk, device=stage) if on_devices else engine.add(blk)
            if prev is not None:
                engine.connect(prev["out"], blk["x"])
            first = first or blk
            prev = blk
    engine.write(first["x"], np.ones(n, np.float32))
    engine.tick()


def _fps(engine, frames: int) -> float:
    for _ in range(10):
        engine.tick(sync=False)
    engine.tick()
    t0 = time.perf_counter()
    for _ in range(frames):
        engine.tick(sync=False)
    engine.tick()
    return (frames + 1) / (time.perf_counter() - t0)


def fps_rows(devices, code, ks, per_stage: int, n: int, frames: int) -> list[tuple[str, str, str, str]]:
    import rxcuda

    rows = []
    for k in ks:
        devs = (list(devices) * k)[:k] if len(devices) < k else list(devices[:k])
        with rxcuda.Engine(device=devs[0]) as one:
            _chain(one, code, k, per_stage, n, False)
            f_one = _fps(one, frames)
        with rxcuda.Engine(devices=devs) as spread:
            _chain(spread, code, k, per_stage, n, True)
            f_spread = _fps(spread, frames)
        with rxcuda.Engine(devices=devs, pipelined=True) as piped:
            _chain(piped, code, k, per_stage, n, True)
            f_piped = _fps(piped, frames)
            latency = piped.devices.latency
        rows.append((f"{k}-stage chain, fps (latency {latency} frames pipelined)", f"{f_one:,.0f} one device",
                     f"{f_spread:,.0f} ({f_spread / f_one:.2f}x) over {devs}",
                     f"{f_piped:,.0f} ({f_piped / f_one:.2f}x) pipelined"))
    return rows


def _batch_fps(engine, frames: int) -> float:
    engine.run_batch(10)
    t0 = time.perf_counter()
    engine.run_batch(frames)
    return frames / (time.perf_counter() - t0)


def batch_rows(devices, code, per_stage: int, n: int, frames: int) -> list[tuple[str, str, str, str]]:
    """``engine.run_batch(frames)`` of the 2-stage chain: one device (a GPU-driven loop of its graph) against
    two devices (each device's graph queued from the host per frame, no wait between frames) and pipelined."""
    import rxcuda

    devs = list(devices[:2])
    with rxcuda.Engine(device=devs[0]) as one:
        _chain(one, code, 2, per_stage, n, False)
        f_one = _batch_fps(one, frames)
    with rxcuda.Engine(devices=devs) as spread:
        _chain(spread, code, 2, per_stage, n, True)
        f_spread = _batch_fps(spread, frames)
    with rxcuda.Engine(devices=devs, pipelined=True) as piped:
        _chain(piped, code, 2, per_stage, n, True)
        f_piped = _batch_fps(piped, frames)
    return [(f"2-stage chain, run_batch({frames}) fps", f"{f_one:,.0f} one device (GPU loop)",
             f"{f_spread:,.0f} ({f_spread / f_one:.2f}x) over {devs}",
             f"{f_piped:,.0f} ({f_piped / f_one:.2f}x) pipelined")]


def host_rows(devices, code, frames: int) -> list[tuple[str, str, str, str]]:
    import numpy as np

    import rxcuda

    def per_frame(engine) -> float:
        for _ in range(50):
            engine.tick()
        runs = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(frames):
                engine.tick()
            runs.append((time.perf_counter_ns() - t0) / frames / 1e3)
        return statistics.median(runs)

    with rxcuda.Engine(device=devices[0]) as one:
        a = one.add(rxcuda.Block.from_kernel(code, size=1024, name="a"))
        b = one.add(rxcuda.Block.from_kernel(code, size=1024, name="b"))
        one.connect(a["out"], b["x"])
        one.write(a["x"], np.ones(1024, np.float32))
        t_one = per_frame(one)
    with rxcuda.Engine(devices=devices) as two:
        a = two.add(rxcuda.Block.from_kernel(code, size=1024, name="a"))
        b = two.add(rxcuda.Block.from_kernel(code, size=1024, name="b"), device=1)
        two.connect(a["out"], b["x"])
        two.write(a["x"], np.ones(1024, np.float32))
        t_two = per_frame(two)
    return [("host cost of a frame, tick() waited", f"{t_one:.1f} us one device", f"{t_two:.1f} us over two",
             f"+{t_two - t_one:.1f} us")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, nargs="+", default=None, help="GPU ordinals (default: all, or 0 0)")
    ap.add_argument("--frames", type=int, default=300, help="frames per fps run")
    ap.add_argument("--stage-blocks", type=int, default=8, help="scalar_mul blocks per stage")
    ap.add_argument("--n", type=int, default=1 << 22, help="floats per block")
    args = ap.parse_args(argv)

    import rxcuda
    from rxcuda.cuda._device import device_info

    ok, why = rxcuda.probe()
    if not ok:
        print(f"bench/devices.py needs a CUDA device: {why}")
        return 2
    cards = device_info().get("devices", [])
    devices = args.devices or ([c["ordinal"] for c in cards] if len(cards) > 1 else [0, 0])
    if len(devices) < 2:
        print("bench/devices.py compares two devices or more: give --devices 0 0 (one GPU twice) or 0 1")
        return 2
    code = rxcuda.load_kernel_file(ROOT / "kernels" / "scalar_mul.ptx")
    rows = bandwidth_rows(devices[:2], code, [MIB, 16 * MIB, 64 * MIB, 256 * MIB])
    ks = sorted({2, len(devices)})
    rows += fps_rows(devices, code, ks, args.stage_blocks, args.n, args.frames)
    rows += batch_rows(devices, code, args.stage_blocks, args.n, args.frames)
    rows += host_rows(devices[:2], code, max(args.frames, 500))
    names = ", ".join(f"{d}: {next((c['name'] for c in cards if c['ordinal'] == d), '?')}" for d in devices)
    print(f"\nbench/devices.py - devices {devices} ({names})")
    header = ("what", "rxcuda / one device", "anchor (ratio) / over devices", "anchor 2 / pipelined")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(4)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))
    print("\nanchors: the connection vs raw cuMemcpyPeerAsync of the same bytes (ratio) and vs a device-to-device "
          "copy; fps vs the same chain on one device; host cost vs one device")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
