"""The live view's controls on a GPU, in process: a WebSocket client plays the page against
``engine.serve(params=...)``. A set from the page goes through ``block.set`` and the next frame's output is
the input times the new scale (NumPy, fresh random data); a set the public path refuses (a float beyond f32) and
one of a parameter the page does not show change nothing on the device."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from rxcuda import Block

aiohttp = pytest.importorskip("aiohttp")

N = 50_001  # not a multiple of the block size


async def _page(view, messages: list[dict]) -> list[dict]:
    """Say hello, send ``messages`` (each a set with an id), and return the answer (ack or error) to each."""
    origin = view.url.split("/?")[0].rstrip("/")
    answers: dict = {}
    async with aiohttp.ClientSession() as s, s.ws_connect(origin + "/ws", headers={"Origin": origin}) as ws:
        await ws.send_str(json.dumps({"type": "hello", "token": view.token or ""}))
        for m in messages:
            await ws.send_str(json.dumps(m))
        while len(answers) < len(messages):
            msg = await ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.TEXT, (msg.type, msg.data)
            m = json.loads(msg.data)
            if m["type"] in ("ack", "error"):
                answers[m["id"]] = m
    return [answers[m["id"]] for m in messages]


def test_a_page_set_reaches_the_gpu_and_refused_ones_change_nothing(engine, kernels, rng):
    x = (rng.standard_normal(N) + 0.5).astype(np.float32)
    mul = engine.add(Block.from_kernel(kernels / "scalar_mul.ptx", size=N, name="mul", scale=1.0))
    engine.write(mul["x"], x)
    engine.tick()
    np.testing.assert_allclose(engine.read(mul["out"]), x, rtol=1e-6)
    scale = float(np.float32(rng.uniform(0.5, 3.0)))
    with engine.serve(params=["mul.scale"]) as view:
        ok, too_big, hidden = asyncio.run(asyncio.wait_for(_page(view, [
            {"type": "set", "block": "mul", "param": "scale", "value": scale, "id": 1},
            {"type": "set", "block": "mul", "param": "scale", "value": 1e39, "id": 2},
            {"type": "set", "block": "mul", "param": "n", "value": 7, "id": 3},
        ]), 60))
    assert ok["type"] == "ack", ok
    assert too_big["type"] == "error" and "mul.scale (f32) takes a finite number" in too_big["message"], too_big
    assert hidden["type"] == "error" and hidden["message"].startswith("mul.n is not a control of this page")
    assert mul.params["scale"].value == scale and mul.params["n"].value == N
    engine.tick()  # the first frame with the new value
    np.testing.assert_allclose(engine.read(mul["out"]), x * np.float32(scale), rtol=1e-6)
