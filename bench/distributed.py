"""Distributed: what a connection between two workers costs per frame, against a local connection and a plain Ray
actor round trip; frames per second of a 2-fragment pipeline against the same pipeline in one engine; and the
time from a worker's death to its fragment producing frames again.

    python bench/distributed.py [--frames 200] [--mib 4] [--stepping auto|ray] [--only frames,sweep,mps,deaths,store]

Each part prints its table when it is done (``--only`` picks the parts: a short GPU run takes ``--only deaths``).

Rows (each a median over ``--frames`` frames of ``tick()``, every frame waited for):
- one engine, in this process: two ``scalar_mul`` blocks connected (the local connection);
- one worker: the same two blocks in one Ray actor (its step per frame, no link: through its clock, named pipes
  and no Ray call, since every worker runs on this host; ``--stepping ray``: a Ray call per worker and frame);
- two workers, not connected: the same two blocks, one per worker, each with its own input (what a second
  worker costs without a link: on one GPU, two processes' contexts take turns);
- two workers, ``ipc``: one block each, the connection carried by CUDA IPC, both workers' steps in flight at once
  and meeting on the link's shared-memory board (on the null driver: the same handshake, the bytes in the board);
- two workers, ``host``: the same through Ray's object store (the consumer's step after the producer's);
- a plain Ray actor call that reduces a CuPy array on the GPU and reads the result back (the anchor, ~1.2 ms seen
  on an H200 host).
The link's cost per frame is the two-worker row minus the one-worker row (a second Ray step in the frame
included); the row under it is the host time the link's two ends themselves take in the workers (the copy into an
exported slot, its event and the board, the copy out; or the readback, the object store and the write), not
counting the consumer's wait for its producer's frame. Target: CUDA IPC adds <= 100 us a frame for 4 MiB. Then
frames per second under ``run()`` (frames in flight overlap the workers), and the time from the consumer's death
(``ray.kill``, SIGKILL, ``os._exit``, a segfault; on the null driver a lost context too) to its next complete frame
from a new process, split by phase: the death found by the driver, the new process up (Ray's restart; nothing with
a standby, up beforehand), the fragment built there, the driver seeing it back, the next frame; with a standby and
with Ray's restart (``standby=False``). The cost rows run without a standby process.
Without a GPU everything runs on the null driver (the table says so): Ray's and the host's costs, no GPU work.
The title says whether NVIDIA's Multi-Process Service serves the GPU: two workers on one GPU run at once under
MPS and take turns without it (start it with ``nvidia-cuda-mps-control -d`` to compare; docs/distributed.md).
Last, a clock's round trip alone: a record to another process and its answer back through the pipes.

Then the links at several sizes (``--sizes``, KiB; 64 KiB, 1 MiB, 4 MiB, 16 MiB by default), every result checked
against NumPy on random inputs (on a GPU):
- the ``host`` link on one host (the link's board, pinned in place in both processes: two DMA copies, no Ray call):
  what it adds a frame over one worker holding both blocks, its bytes over that time (GB/s), and the growth per byte
  between sizes (GB/s: target >= 5; and <= 1 ms added for 4 MiB);
- the same over Ray's object store: two Ray nodes started on this machine (``ray.cluster_utils.Cluster``, each
  declaring the one GPU), a worker on each, so the link crosses "hosts" (``--no-store`` leaves it out);
- the ``ipc`` link with ``Engine(share_gpu="off")``, ``"auto"`` (a private MPS daemon where two workers
  share a GPU), ``"mps"`` and ``"turns"`` (no MPS: the driver steps the two workers one after the other, the
  producer first) (a GPU only): one worker, two workers not connected, two workers linked, at ``--mib``.
Every measurement is warm (frames for at least ``WARM_S`` before it, and the sweep's first pipeline run once
before the sweep), and every part's header names the GPU.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KERNEL = ROOT / "kernels" / "scalar_mul.ptx"


WARM_S = 0.5  # each measurement's warm-up: frames for at least this long (and 5), so the row is measured warm


def _median_us(fn, frames: int) -> float:
    """Median seconds of ``fn`` over ``frames`` calls, in us, after a warm-up: builds, first copies, handle mapping,
    and long enough for the GPU's clocks and the workers' processes to settle (the first row of a run measured
    cold took 812 us a frame for what took 45 us warm)."""
    t_end, done = time.perf_counter() + WARM_S, 0
    while done < 5 or time.perf_counter() < t_end:
        fn()
        done += 1
    times = []
    for _ in range(frames):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _pipeline(dist, rxcuda, np, n: int, where: tuple[str, str], transport: str = "auto"):
    first = dist.add(rxcuda.Block.from_kernel(KERNEL, size=n, name="first", scale=1.5), on=where[0])
    second = dist.add(rxcuda.Block.from_kernel(KERNEL, size=n, name="second", scale=0.5), on=where[1])
    dist.connect(first["out"], second["x"], transport=transport)
    dist.write(first["x"], np.random.default_rng().standard_normal(n).astype(np.float32))
    return first, second


SECTIONS = ("frames", "sweep", "mps", "deaths", "store")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--mib", type=float, default=4.0, help="size of the connection's buffer")
    ap.add_argument("--stepping", choices=("auto", "ray"), default="auto",
                    help="auto: same-host workers stepped through their clocks; ray: a Ray call per worker and frame")
    ap.add_argument("--sizes", default="64,1024,4096,16384", help="link sizes to sweep, KiB, comma-separated")
    ap.add_argument("--no-store", action="store_true", help="leave out the two-node object-store sweep")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help=f"the parts to run, comma-separated, each printed when it is done: {', '.join(SECTIONS)} "
                         "(frames: the per-frame rows and frames per second; sweep: the host link over --sizes on "
                         "one host; mps: the ipc link with share_gpu off, auto, mps and turns, a GPU only; deaths: a "
                         "worker's death to its next frame; store: the host link between two Ray nodes)")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # each line out as it is printed (a run cut short keeps its parts)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    if not only or only - set(SECTIONS):
        ap.error(f"--only takes some of {', '.join(SECTIONS)} (got {args.only!r})")
    if args.no_store:
        only.discard("store")
    try:
        import ray
    except ImportError:
        sys.exit("bench/distributed.py runs on Ray, which is not installed: pip install '.[ray]' in rxcuda's checkout")
    import numpy as np

    import rxcuda
    from rxcuda.cuda import NullDriver
    from rxcuda.distributed import Engine as DistEngine
    from rxcuda.distributed import Worker

    def Engine(workers):  # noqa: N802  (the distributed engine, stepped as asked; no standby process meanwhile)
        return DistEngine(workers, stepping=args.stepping, standby=False)

    gpu, why = rxcuda.probe()
    card = "?"
    n = int(args.mib * (1 << 20)) // 4
    spec = Worker(num_gpus=0.5) if gpu else Worker(null=True)
    sizes = [int(s) << 10 for s in args.sizes.split(",")]
    ray.init(num_cpus=4, num_gpus=1 if gpu else 0, include_dashboard=False, log_to_driver=False)
    try:
        with rxcuda.Engine(driver=None if gpu else NullDriver()) as local:
            card = local.device.name if gpu else "null driver, no GPU"  # named in every part's header
            name = card if gpu else f"{card} ({why})"
            if gpu:  # several processes on one GPU: under MPS they run at once, else they take turns
                name += ", MPS on" if local.device.mps else ", MPS off: the workers' contexts take turns on the GPU"
            print(f"\nbench/distributed.py — per-frame time with sync, median of {args.frames} frames ({name}, "
                  f"{args.mib:g} MiB connection); parts: {', '.join(s for s in SECTIONS if s in only)}", flush=True)
            if "frames" in only:
                _frames_part(ray, Engine, rxcuda, np, gpu, spec, n, args, local, card)
        if "sweep" in only:
            _print_sweep({"host, one host (board)": _sweep(ray, Engine, rxcuda, np, gpu, spec, {}, sizes,
                                                            args.frames)}, gpu, card)
        if "mps" in only and gpu:
            _print_shared(_share_gpu_rows(DistEngine, rxcuda, np, n, args, spec), args, card)
        if "deaths" in only:
            _deaths_part(ray, DistEngine, Worker, rxcuda, np, gpu, spec, n, args, card)
    finally:
        ray.shutdown()
    if "store" in only:
        _print_sweep({"host, two Ray nodes (object store)": _two_nodes(ray, Engine, rxcuda, np, gpu, sizes,
                                                                      args.frames)}, gpu, card)


def _frames_part(ray, Engine, rxcuda, np, gpu, spec, n, args, local, card: str) -> None:  # noqa: N803
    """The per-frame rows, the links' costs and frames per second under run(), printed."""
    rows: list[tuple[str, float]] = []
    a = local.add(rxcuda.Block.from_kernel(KERNEL, size=n, name="first", scale=1.5))
    b = local.add(rxcuda.Block.from_kernel(KERNEL, size=n, name="second", scale=0.5))
    local.connect(a["out"], b["x"])
    local.write(a["x"], np.ones(n, np.float32))
    rows.append(("one engine, in this process (local connection)", _median_us(local.tick, args.frames)))
    with Engine({"a": spec}) as dist:
        _pipeline(dist, rxcuda, np, n, ("a", "a"))
        one_worker = _median_us(dist.tick, args.frames)
        step = dist.describe().stepping["a"]
        rows.append((f"one worker, both blocks ({step} step, no link)", one_worker))
    with Engine({"a": spec, "b": spec}) as dist:  # the same two workers and blocks, no connection
        for block, w, scale in (("first", "a", 1.5), ("second", "b", 0.5)):
            blk = dist.add(rxcuda.Block.from_kernel(KERNEL, size=n, name=block, scale=scale), on=w)
            dist.write(blk["x"], np.random.default_rng().standard_normal(n).astype(np.float32))
        unlinked = _median_us(dist.tick, args.frames)
        rows.append(("two workers, a block each, not connected", unlinked))
    link_cost = {}
    for transport in ("ipc", "host"):  # ipc on the null driver: the board's shared memory carries the bytes
        with Engine({"a": spec, "b": spec}) as dist:
            _pipeline(dist, rxcuda, np, n, ("a", "b"), transport)
            us = _median_us(dist.tick, args.frames)
            link_cost[transport] = us - one_worker
            rows.append((f"two workers, {transport} link", us))
            ends = [ray.get(dist.actor(w).stats.remote())["link_us"] for w in ("a", "b")]
            rows.append((f"  of which the {transport} link's two ends (host time in the workers)", sum(ends)))
    rows.append(("plain Ray actor call (GPU reduction + readback)" if gpu else "plain Ray actor call",
                 _actor_round_trip(ray, gpu, args.frames)))
    clock_us = _clock_round_trip(ray, args.frames)
    spec_fps = {}
    for label, where in (("one worker", ("a", "a")), ("two workers", ("a", "b"))):
        with Engine({"a": spec, "b": spec}) as dist:
            _pipeline(dist, rxcuda, np, n, where)
            dist.tick()
            count = [0]

            def on_frame(f, count=count) -> None:
                if f.worker == "a":  # one frame of the pipeline: worker a's part of it
                    count[0] += 1

            sub = dist.frames.subscribe(on_frame)
            running = dist.run(10_000)
            time.sleep(2.0)
            running.dispose()
            sub.dispose()
            spec_fps[label] = count[0] / 2.0
    print()
    width = max(len(r[0]) for r in rows)
    print(f"per frame ({card}, {args.mib:g} MiB):")
    print(f"{'what':<{width}}  {'us / frame':>11}")
    for label, us in rows:
        print(f"{label:<{width}}  {us:>11.1f}")
    print()
    for transport, us in link_cost.items():
        target = " (target <= 100 us for 4 MiB)" if transport == "ipc" and gpu else ""
        what = " through shared memory, null driver" if transport == "ipc" and not gpu else ""
        print(f"a cross-worker {transport} link{what} adds {us:.1f} us a frame (two workers minus one){target}")
        print(f"  the connection itself: {us + one_worker - unlinked:.1f} us a frame (two connected workers minus the "
              "same two not connected)")
    print(f"frames per second under run(): one worker {spec_fps['one worker']:.0f}, two workers "
          f"{spec_fps['two workers']:.0f} (frames in flight overlap the workers)")
    print(f"a clock's round trip (a record to another process and its answer, through named pipes): {clock_us:.1f} us; "
          f"frames stepped by {'clocks on one host' if args.stepping == 'auto' else 'Ray calls (--stepping ray)'}",
          flush=True)


def _deaths_part(ray, DistEngine, Worker, rxcuda, np, gpu, spec, n, args, card: str) -> None:  # noqa: N803
    """From a worker's death to its fragment's next frame, by kind of death and phase, printed."""
    print(f"\nfrom a worker's death to its fragment's next complete frame (worker b, the link's consumer; {card}), "
          "ms:")
    head = ("death", "how it comes back", "found", "process up", "built", "driver sees it", "next frame", "total")
    print("  ".join(f"{h:>{len(h) if i else 9}}" for i, h in enumerate(head)), flush=True)
    for standby in (True, False):
        keep = ("num_gpus", "num_cpus", "null", "cpu")
        respec = Worker(**{**{k: getattr(spec, k) for k in keep}, "max_restarts": 20})
        with DistEngine({"a": respec, "b": respec}, stepping=args.stepping, standby=standby) as dist:
            _pipeline(dist, rxcuda, np, n, ("a", "b"))
            dist.tick()
            for how in DEATHS + (() if gpu else ("context",)):
                ph = _death(ray, dist, how)
                cells = [f"{how:<9}", f"{'a standby' if standby else 'Ray restarts':>17}"]
                cells += [f"{ph[k] * 1e3:>{len(h)}.0f}" for k, h in zip(PHASES, head[2:], strict=True)]
                print("  ".join(cells), flush=True)


def _print_shared(shared: list, args, card: str) -> None:
    print(f"\nthe ipc link ({args.mib:g} MiB) with the workers' GPU shared ({card}), us / frame (results checked "
          "against NumPy; off: the default; auto chooses MPS for two workers on one GPU; turns: no MPS, the two "
          "workers stepped one after the other):")
    print(f"{'share_gpu':<10} {'one worker':>11} {'two, not linked':>16} {'two, ipc link':>14} "
          f"{'link adds':>10}  MPS")
    for mode, one, apart, linked, mps in shared:
        print(f"{mode:<10} {one:>11.1f} {apart:>16.1f} {linked:>14.1f} {linked - one:>10.1f}  {mps}", flush=True)


# ray.kill (the docs' drill), SIGKILL between frames, os._exit, a segfault, SIGKILL mid-frame while allocating (oom)
DEATHS = ("ray.kill", "kill", "exit", "segfault", "oom")
PHASES = ("found", "up", "built", "seen", "frame", "total")


def _death(ray, dist, how: str) -> dict[str, float]:
    """Kill worker b as ``how`` says and tick until its next complete frame from a new process; each phase's
    seconds: the death found by the driver, the new process up (0 for a standby: up before), the fragment built
    there, the driver seeing it back, the next complete frame; and the total."""
    deadline = time.time() + 60
    while dist._use_standby and time.time() < deadline:  # a standby up and warm, as it is once the engine runs
        refs = [ref for _actor, ref in dist._standbys.values()]
        if refs and len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) == len(refs):
            break
        dist.tick()
        time.sleep(0.01)
    for _ in range(5):
        dist.tick()
    killed, seen = dist.where("b")["pid"], len(dist._recoveries)
    t0 = time.time()
    if how == "ray.kill":
        ray.kill(dist.actor("b"), no_restart=False)
    elif how == "oom":  # armed (waited for): b dies in its next step, mid-frame
        ray.get(dist.actor("b").crash.remote(how))
    else:
        dist.actor("b").crash.remote(how)
    while not (dist.tick().complete and dist.where("b")["pid"] != killed):
        pass
    t1 = time.time()
    r = dist._recoveries[seen]
    return {"found": r["found"] - t0, "up": r["started"] - r["found"], "built": r["built"] - r["started"],
            "seen": r["back"] - r["built"], "frame": t1 - r["back"], "total": t1 - t0}


def _actor_round_trip(ray, gpu: bool, frames: int) -> float:
    @ray.remote(num_gpus=0.5 if gpu else 0, num_cpus=0)
    class Plain:
        def __init__(self):
            if gpu:
                import cupy

                self.x = cupy.ones(1 << 20, cupy.float32)

        def reduce(self):
            return float(self.x.sum()) if gpu else 0.0

    actor = Plain.remote()
    try:
        return _median_us(lambda: ray.get(actor.reduce.remote()), frames)
    finally:
        ray.kill(actor)


def _clock_round_trip(ray, frames: int) -> float:
    """Median time of one record through a clock's pipes to a Ray actor's frame thread (a step that does nothing)
    and its answer back: the wake-up cost both ways, without Ray."""
    from rxcuda.distributed import _clock

    @ray.remote(num_cpus=0)
    class Echo:
        def start(self, go, done, generation):
            import os

            from rxcuda.engine._records import Frame

            frame = Frame(0, 0.0, (), "ok", False, None, 1)
            self.hand = _clock.ClockHand(go, done, generation, lambda i: (frame, None), lambda messages: None)
            return os.getpid()

    actor = Echo.remote()
    clock = _clock.Clock("bench", "echo", 0)
    try:
        clock.pid = ray.get(actor.start.remote(clock.go_path, clock.done_path, clock.generation))
        index = [0]

        def trip() -> None:
            index[0] += 1
            clock.step(index[0])
            _clock.wait({"echo": clock}, index[0])

        return _median_us(trip, frames)
    finally:
        clock.close()
        ray.kill(actor)



def _checked(dist, np, gpu: bool, x, out) -> str:
    """Compare the pipeline's output with NumPy's (first scales by 1.5, second by 0.5) on a GPU; says what it did."""
    if not gpu:
        return "not checked (null driver)"
    np.testing.assert_allclose(dist.read(out), x * np.float32(0.75), rtol=1e-6)
    return "matches NumPy"


def _sweep(ray, Engine, rxcuda, np, gpu, spec, where: dict, sizes, frames) -> list[tuple]:  # noqa: N803
    """Per size: (bytes, one worker us, two workers over a host link us, the link's transport why, check). ``where``:
    worker -> Worker spec overrides (the two-node run pins a and b to nodes)."""
    rows = []
    _warm_workers(Engine, rxcuda, np, spec, where, sizes[0] // 4)
    for nbytes in sizes:
        n = nbytes // 4
        per = {}
        for label, placed in (("one", ("a", "a")), ("two", ("a", "b"))):
            with Engine({"a": where.get("a", spec), "b": where.get("b", spec)}) as dist:
                first, second = _pipeline(dist, rxcuda, np, n, placed, "host")
                x = np.random.default_rng(nbytes).standard_normal(n).astype(np.float32)
                dist.write(first["x"], x)
                per[label] = _median_us(dist.tick, frames)
                if label == "two":
                    (link,) = dist.describe().links
                    why = f"{link.transport} via {link.via}"
                    check = _checked(dist, np, gpu, x, second["out"])
        rows.append((nbytes, per["one"], per["two"], why, check))
    return rows


def _warm_workers(Engine, rxcuda, np, spec, where: dict, n: int) -> None:  # noqa: N803
    """Run the sweep's first pipeline once, unmeasured, for a second: the first engine of a run pays for Ray's
    worker processes starting beside it, first module loads and the GPU leaving its idle clocks."""
    with Engine({"a": where.get("a", spec), "b": where.get("b", spec)}) as dist:
        _pipeline(dist, rxcuda, np, n, ("a", "b"), "host")
        t_end = time.perf_counter() + 1.0
        while time.perf_counter() < t_end:
            dist.tick()


def _two_nodes(ray, Engine, rxcuda, np, gpu, sizes, frames) -> list[tuple]:  # noqa: N803
    """:func:`_sweep` over two Ray nodes on this machine (each declaring the one GPU), a worker on each: the link
    goes through Ray's object store."""
    from ray.cluster_utils import Cluster

    from rxcuda.distributed import Worker

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "num_gpus": 1 if gpu else 0})
    cluster.add_node(num_cpus=4, num_gpus=1 if gpu else 0)
    try:
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        cluster.wait_for_nodes()
        head = ray.get_runtime_context().get_node_id()
        other = next(nd["NodeID"] for nd in ray.nodes() if nd["Alive"] and nd["NodeID"] != head)
        kind = {"num_gpus": 0.5} if gpu else {"null": True}
        where = {"a": Worker(node=head, **kind), "b": Worker(node=other, **kind)}
        return _sweep(ray, Engine, rxcuda, np, gpu, where["a"], where, sizes, frames)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _print_sweep(sweep: dict, gpu: bool, card: str) -> None:
    for what, rows in sweep.items():
        print(f"\n{what}, {card}: what the link adds a frame over one worker holding both blocks (median us), "
              f"results {rows[0][4] if rows else ''}")
        print(f"{'bytes':>10} {'one worker':>11} {'two, linked':>12} {'link adds':>10} {'GB/s':>7} "
              f"{'growth GB/s':>12}  transport")
        last = None
        for nbytes, one, two, why, _check in rows:
            added = two - one
            rate = nbytes / added / 1e3 if added > 0 else float("inf")
            growth = ((nbytes - last[0]) / ((added - last[1]) * 1e3) if last and added > last[1] else float("nan"))
            print(f"{nbytes:>10} {one:>11.1f} {two:>12.1f} {added:>10.1f} {rate:>7.2f} {growth:>12.2f}  {why}")
            last = (nbytes, added)
        if gpu and rows:
            four = [r for r in rows if r[0] == 4 << 20]
            if four:
                print(f"  4 MiB adds {four[0][2] - four[0][1]:.1f} us a frame (target <= 1000 us on one host)")


def _share_gpu_rows(DistEngine, rxcuda, np, n: int, args, spec) -> list[tuple]:  # noqa: N803
    """(share_gpu, one worker us, two workers not connected us, two workers over an ipc link us, whether MPS served
    the workers' GPU) with ``share_gpu`` off, "auto", "mps" and "turns" (the default is off); the linked result
    checked against NumPy, and in turns, that the two workers took turns."""
    rows = []
    for mode in ("off", "auto", "mps", "turns"):
        def Engine(workers, mode=mode):  # noqa: N802
            return DistEngine(workers, stepping=args.stepping, standby=False, share_gpu=mode)

        with Engine({"a": spec}) as dist:
            _pipeline(dist, rxcuda, np, n, ("a", "a"))
            one = _median_us(dist.tick, args.frames)
        with Engine({"a": spec, "b": spec}) as dist:
            for block, w, scale in (("first", "a", 1.5), ("second", "b", 0.5)):
                blk = dist.add(rxcuda.Block.from_kernel(KERNEL, size=n, name=block, scale=scale), on=w)
                dist.write(blk["x"], np.random.default_rng().standard_normal(n).astype(np.float32))
            apart = _median_us(dist.tick, args.frames)
        with Engine({"a": spec, "b": spec}) as dist:
            first, second = _pipeline(dist, rxcuda, np, n, ("a", "b"), "ipc")
            x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
            dist.write(first["x"], x)
            linked = _median_us(dist.tick, args.frames)
            _checked(dist, np, True, x, second["out"])
            dist.tick()
            mps = "on" if dist.where("a").get("mps") else "off"
            if mode == "turns" and dist.where("b")["turns"] != ("a", "b"):
                mps += f" (no turns taken: {dist.where('b')['turns']})"
        rows.append((mode, one, apart, linked, mps))
    return rows

if __name__ == "__main__":
    main()
