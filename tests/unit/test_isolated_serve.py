"""The live page of an isolated engine (``IsolatedEngine.serve()``, rxcuda/distributed/_isoview.py) on the CPU
device, whose kernels really run and really fault (a write past a buffer ends the child process as an illegal
address ends a GPU's): the page shows the engine's frames and parameters, sets parameters through
``IsolatedEngine.set`` (the numbers checked against NumPy), and stays connected through a fault and the child's
replacement, showing the error diagnostic, the rollback and good frames again. aiohttp's client plays the page
(helpers from test_serve)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

aiohttp = pytest.importorskip("aiohttp")

from test_isolated import BAD  # noqa: E402
from test_serve import open_page, run  # noqa: E402

import rxcuda  # noqa: E402
from rxcuda.distributed import IsolatedEngine  # noqa: E402

N = 4096
BAD_MUL = ('extern "C" __global__ void scalar_mul(const float* x, float* out, float scale, int n) '
           "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i + 100000000] = x[i] * scale; }")


async def tick(iso, frames: int = 1):
    """``frames`` ticks on another thread (the page's client runs on this loop); the last Frame."""
    loop = asyncio.get_running_loop()
    f = None
    for _ in range(frames):
        f = await loop.run_in_executor(None, iso.tick)
    return f


async def until_ok(iso, seconds: float = 60.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        f = await tick(iso)
        if f.state == "ok":
            return f
        await asyncio.sleep(0.005)
    raise AssertionError(f"no good frame within {seconds} s")


async def shown(page, kind: str, pred, timeout: float = 5.0, since: int = 0) -> dict:
    """The first message of ``kind`` for which ``pred`` holds, among those the page got already from the
    ``since``-th on (waiting for another kind skips them) or the next ones."""
    for m in page.seen[since:]:
        if m["type"] == kind and pred(m):
            return m
    return await page.until(kind, pred, timeout)


def frames_seen(page) -> dict[int, list]:
    """Frame index -> [index, host_us, gpu_us, seen_s] of every frames message the page got so far."""
    return {f[0]: f for m in page.seen if m["type"] == "frames" for f in m["frames"]}


def test_the_page_shows_the_engine_survives_a_fault_and_sets_parameters_in_the_child():
    rng = np.random.default_rng()
    x = rng.standard_normal(N).astype(np.float32)
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, scale=3.0, name="mul"))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"
        ticked = []
        iso.frames.subscribe(ticked.append)

        async def go(view):
            async with aiohttp.ClientSession() as s:
                page = await open_page(s, view)
                hello = page.seen[0]["engine"]
                assert hello["measured"] is True and hello["frame"] == 1
                assert hello["device"] == f"the CPU device, in process {iso.pid} (isolated)"
                graph = next(m for m in page.seen if m["type"] == "graph")
                assert [(b["name"], b["state"]) for b in graph["blocks"]] == [("mul", "ok")]
                assert [p["value"] for p in graph["blocks"][0]["params"]] == [3.0, N]
                params = next(m for m in page.seen if m["type"] == "params")
                assert params["values"] == {"mul.scale": 3.0, "mul.n": N}
                status = next(m for m in page.seen if m["type"] == "status")
                assert status["rebuilds"] is None and status["memory"]["by_class"] == []
                assert "append counters" in status["unmeasured"]
                assert f"GPU side in process {iso.pid}" in status["stats"]

                # the page's frames are the engine's: each index with the GPU process's host time
                await tick(iso, 3)
                await shown(page, "frames", lambda m: m["frames"] and m["frames"][-1][0] == 4)
                got = frames_seen(page)
                assert [got[f.index][:3] for f in ticked] == [[f.index, round(f.host_us, 2), None] for f in ticked]

                # a parameter set from the page reaches the GPU process, through IsolatedEngine.set
                await page.send({"type": "set", "block": "mul", "param": "scale", "value": 2.5, "id": 7})
                assert (await page.next("ack"))["id"] == 7
                await shown(page, "params", lambda m: m["values"].get("mul.scale") == 2.5)
                assert mul.params["scale"].value == 2.5
                await tick(iso)
                np.testing.assert_allclose(iso.read(mul["out"]), np.float32(2.5) * x, rtol=1e-6)

                # a real fault: a kernel writing past its buffer ends the GPU process
                first = iso.pid
                oops = iso.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(BAD, target="ptx"), size=N))
                iso.write(oops["x"], x)
                faulted = await tick(iso)
                assert faulted.state == "error"
                err = await shown(page, "diagnostic", lambda m: m["severity"] == "error")
                assert err["frame"] == faulted.index and "illegal address in kernel 'bad'" in err["message"]
                assert "faulted on the GPU" in err["message"]
                # the frame no process finished has no time (not a zero)
                await shown(page, "frames", lambda m: any(f[0] == faulted.index for f in m["frames"]))
                assert frames_seen(page)[faulted.index][1:3] == [None, None]

                # the standby takes over; the page, still connected, sees good frames again
                iso.remove(oops)
                mark = len(page.seen)
                good = await until_ok(iso)
                assert iso.pid != first and iso.restarts == 1
                back = await shown(page, "diagnostic", lambda m: m["severity"] == "info")
                assert "is back" in back["message"]
                await shown(page, "frames", lambda m: any(f[0] == good.index for f in m["frames"]))
                assert frames_seen(page)[good.index][:3] == [good.index, round(good.host_us, 2), None]
                graph = await shown(page, "graph", lambda m: [b["name"] for b in m["blocks"]] == ["mul"], since=mark)
                assert graph["blocks"][0]["state"] == "ok"
                await page.send({"type": "ping"})
                await page.next("pong")

                # the value set from the page survived the replacement, and a new one still reaches the child
                np.testing.assert_allclose(iso.read(mul["out"]), np.float32(2.5) * x, rtol=1e-6)
                await page.send({"type": "set", "block": "mul", "param": "scale", "value": -1.25, "id": 8})
                await page.next("ack")
                await tick(iso)
                np.testing.assert_allclose(iso.read(mul["out"]), np.float32(-1.25) * x, rtol=1e-6)
                status = await shown(page, "status", lambda m: "1 process replaced" in m["stats"], timeout=10)
                assert f"in process {iso.pid}" in status["stats"] and "1 fault survived" in status["stats"]
                assert f"last fault: frame {faulted.index} (fault)" in status["stats"]

                # a page that connects now gets the same pipeline, served by the new process
                again = await open_page(s, view)
                assert again.seen[0]["engine"]["device"] == f"the CPU device, in process {iso.pid} (isolated)"
                assert next(m for m in again.seen if m["type"] == "params")["values"]["mul.scale"] == -1.25

        with iso.serve() as view:
            run(go(view))


def test_code_that_faults_is_shown_rolled_back_on_its_block_and_clears_with_good_frames():
    x = np.random.default_rng().standard_normal(1024).astype(np.float32)
    with IsolatedEngine(device="cpu", deadline=30.0, trial=False) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, scale=2.0, name="mul"))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"
        good = mul.description.kernel("scalar_mul").code

        async def go(view):
            async with aiohttp.ClientSession() as s:
                page = await open_page(s, view)
                bad = rxcuda.compile_cuda(BAD_MUL, target="ptx")
                mul.set_code("scalar_mul", bad)
                faulted = await tick(iso)
                assert faulted.state == "error"
                err = await shown(page, "diagnostic", lambda m: m["severity"] == "error")
                assert err["block"] == "mul" and "Rolled back to the last good code" in err["message"]
                assert "illegal address in kernel 'scalar_mul'" in err["message"]
                graph = await shown(page, "graph", lambda m: m["blocks"][0]["state"] == "error")
                assert "Rolled back" in graph["blocks"][0]["message"]
                mark = len(page.seen)
                assert mul.description.kernel("scalar_mul").code.key == good.key
                await until_ok(iso)
                await tick(iso)
                cleared = await shown(page, "graph", lambda m: m["blocks"][0]["state"] == "ok", 10, mark)
                assert cleared["blocks"][0]["message"] == ""
                np.testing.assert_allclose(iso.read(mul["out"]), 2 * x, rtol=1e-6)

        with iso.serve() as view:
            run(go(view))


def test_the_page_stops_when_the_isolated_engine_closes_and_a_closed_one_is_refused():
    iso = IsolatedEngine(null=True)
    mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=64, name="mul"))
    iso.write(mul["x"], np.ones(64, np.float32))
    iso.tick()
    view = iso.serve()
    assert view.url.startswith("http://127.0.0.1:")

    async def hello():
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            about = page.seen[0]["engine"]
            assert about["measured"] is False and "null driver" in about["unmeasured"]

    run(hello())
    iso.close()
    view._stopped.wait(10)
    assert view.closed
    with pytest.raises(rxcuda.EngineClosedError):
        iso.serve()


def _smooth():
    smooth = rxcuda.Composite("smooth")
    first = smooth.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, name="first"))
    second = smooth.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, name="second"))
    smooth.connect(first["out"], second["x"])
    smooth.expose("x", first["x"])
    smooth.expose("y", second["out"])
    smooth.expose_parameter("gain", first.params["scale"], second.params["scale"], value=0.5)
    return smooth


def test_a_composite_runs_in_the_gpu_process_its_parameters_and_the_page_set_it_and_it_survives_a_fault():
    x = np.random.default_rng().standard_normal(1024).astype(np.float32)
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        inst = iso.add(_smooth())
        assert isinstance(inst, rxcuda.CompositeInstance) and [b.name for b in inst.blocks] == ["smooth/first",
                                                                                               "smooth/second"]
        iso.write(inst["x"], x)
        assert iso.tick().state == "ok"
        np.testing.assert_allclose(iso.read(inst["y"]), x * np.float32(0.5) * np.float32(0.5), rtol=1e-6)
        inst.params["gain"].value = 3.0  # sets both inner blocks' scale, shipped with the next frame
        iso.tick()
        np.testing.assert_allclose(iso.read(inst["y"]), x * np.float32(9.0), rtol=1e-6)

        async def go(view):
            async with aiohttp.ClientSession() as s:
                page = await open_page(s, view)
                graph = next(m for m in page.seen if m["type"] == "graph")
                assert [(b["name"], b["composite"]) for b in graph["blocks"]] == [("smooth/first", "smooth"),
                                                                                   ("smooth/second", "smooth")]
                await page.send({"type": "set", "block": "smooth/second", "param": "scale", "value": -2.0, "id": 1})
                await page.next("ack")
                # a real fault in a block beside the instance; the instance comes back with its values
                oops = iso.add(rxcuda.Block.from_kernel(rxcuda.compile_cuda(BAD, target="ptx"), size=N))
                iso.write(oops["x"], np.ones(N, np.float32))
                assert (await tick(iso)).state == "error"
                await shown(page, "diagnostic", lambda m: m["severity"] == "error")
                iso.remove(oops)
                await until_ok(iso)
                np.testing.assert_allclose(iso.read(inst["y"]), x * np.float32(3.0) * np.float32(-2.0), rtol=1e-6)

        with iso.serve(params=[inst]) as view:
            run(go(view))
        iso.remove(inst)  # with every block inside
        assert iso._placement == {} and iso._writes == {}
        other = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, scale=4.0, name="other"))
        iso.write(other["x"], x)
        assert iso.tick().state == "ok"
        np.testing.assert_allclose(iso.read(other["out"]), 4 * x, rtol=1e-6)


def test_a_preview_on_the_page_shows_the_gpu_process_output():
    x = np.arange(1024, dtype=np.float32) - 512
    with IsolatedEngine(device="cpu", deadline=30.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=1024, scale=-2.0, name="mul"))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"

        async def go(view):
            async with aiohttp.ClientSession() as s:
                page = await open_page(s, view)
                await page.send({"type": "preview", "block": "mul", "port": "out", "kind": "line"})
                await asyncio.sleep(0.2)  # the server observes the port (off its loop)
                await tick(iso, 8)  # the port is read every 4th frame
                m = await shown(page, "preview", lambda m: m["block"] == "mul", timeout=10)
                assert m["count"] == 1024 and m["stride"] == 2 and m["frame"] <= iso._index
                assert m["data"] == (np.float32(-2.0) * x)[::2].tolist()

        with iso.serve() as view:
            run(go(view))
