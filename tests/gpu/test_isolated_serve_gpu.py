"""The live page of an isolated engine on a GPU (``IsolatedEngine.serve()``): a kernel that really faults (a read
through a null pointer) ends the GPU process; the page, served from this process, stays connected on the same
socket, shows the fault's diagnostic and the frames of the new process, and a parameter set from the page reaches
the GPU process before and after (checked against NumPy). The same on the CPU device runs in CI:
tests/unit/test_isolated_serve.py.

Marked ``gpu_fault`` (run last): tests/gpu/test_faults_gpu.py says why."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest

import rxcuda

aiohttp = pytest.importorskip("aiohttp")

pytestmark = pytest.mark.gpu_fault

N = 1 << 16
NULL = ('extern "C" __global__ void bad(const float* x, float* out, int n) '
        "{ size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) out[i] = ((const float*)0)[i]; }")


class Page:
    def __init__(self, ws):
        self.ws, self.seen = ws, []

    async def send(self, msg: dict) -> None:
        await self.ws.send_str(json.dumps(msg))

    async def until(self, kind: str, pred=lambda m: True, timeout: float = 10.0) -> dict:
        for m in self.seen:
            if m["type"] == kind and pred(m):
                return m
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            msg = await self.ws.receive(timeout=left)
            assert msg.type == aiohttp.WSMsgType.TEXT, f"the socket ended: {msg.type}"
            m = json.loads(msg.data)
            self.seen.append(m)
            if m["type"] == kind and pred(m):
                return m
        raise AssertionError(f"no {kind} within {timeout} s; saw {[m['type'] for m in self.seen][-20:]}")


async def _tick(iso):
    return await asyncio.get_running_loop().run_in_executor(None, iso.tick)


def test_the_page_stays_connected_through_a_gpu_fault_and_sets_parameters_in_the_gpu_process():
    x = np.random.default_rng().standard_normal(N).astype(np.float32)
    with rxcuda.IsolatedEngine(deadline=5.0) as iso:
        mul = iso.add(rxcuda.Block.from_kernel("scalar_mul", size=N, scale=3.0, name="mul"))
        iso.write(mul["x"], x)
        assert iso.tick().state == "ok"

        async def go(view):
            origin = view.url.split("/?")[0].rstrip("/")
            async with aiohttp.ClientSession() as s:
                page = Page(await s.ws_connect(origin + "/ws", headers={"Origin": origin}))
                await page.send({"type": "hello", "token": ""})
                hello = await page.until("hello")
                assert hello["engine"]["measured"] is True and f"in process {iso.pid}" in hello["engine"]["device"]
                await page.send({"type": "set", "block": "mul", "param": "scale", "value": 1.5, "id": 1})
                await page.until("ack")
                await _tick(iso)
                np.testing.assert_allclose(iso.read(mul["out"]), np.float32(1.5) * x, rtol=1e-6)
                status = await page.until("status", lambda m: m["memory"]["bytes_reserved"] is not None)
                assert status["memory"]["bytes_reserved"] > 0 and status["rebuilds"] is None  # the GPU process's

                first = iso.pid
                oops = iso.add(rxcuda.Block.from_cuda(NULL, size=N))
                iso.write(oops["x"], x)
                faulted = await _tick(iso)
                assert faulted.state == "error"
                err = await page.until("diagnostic", lambda m: m["severity"] == "error")
                assert err["frame"] == faulted.index and "faulted on the GPU" in err["message"]
                iso.remove(oops)
                end = time.monotonic() + 60
                while (good := await _tick(iso)).state != "ok":
                    assert time.monotonic() < end, "no good frame within 60 s"
                assert iso.pid != first
                await page.until("frames", lambda m: any(f[0] == good.index and f[1] is not None
                                                         for f in m["frames"]))
                await page.send({"type": "ping"})  # the same socket, never closed
                await page.until("pong")
                np.testing.assert_allclose(iso.read(mul["out"]), np.float32(1.5) * x, rtol=1e-6)
                await page.send({"type": "set", "block": "mul", "param": "scale", "value": -4.0, "id": 2})
                await page.until("ack", lambda m: m["id"] == 2)
                await _tick(iso)
                np.testing.assert_allclose(iso.read(mul["out"]), np.float32(-4.0) * x, rtol=1e-6)

        with iso.serve() as view:
            asyncio.run(asyncio.wait_for(go(view), 120))
