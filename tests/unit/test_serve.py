"""The live view's server (rxcuda/view/_serve.py) on the null driver: HTTP routes, the WebSocket protocol of
rxcuda/view/PROTOCOL.md, throttling, validation of every kind of bad message, Origin/Host/token checks, and
parameter ranges (min/max/step). A real server on port 0; aiohttp's client plays the page."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import threading
import time

import numpy as np
import pytest

aiohttp = pytest.importorskip("aiohttp")

import rxcuda  # noqa: E402
from rxcuda import Block, BlockBuilder, Composite  # noqa: E402
from rxcuda.cuda import NullDriver  # noqa: E402
from rxcuda.view import _serve  # noqa: E402
from rxcuda.view._collect import layered_layout  # noqa: E402

N = 64


def served_pipeline():
    """An engine on the null driver with an adder feeding a scalar_mul, both inputs written: what the live view
    tests serve (test_serve_controls uses it too)."""
    e = rxcuda.Engine(driver=NullDriver())
    add = e.add(Block.from_kernel("vector_add", size=N))
    mul = e.add(Block.from_kernel("scalar_mul", size=N, scale=1.0, ranges={"scale": (0, 10, 0.5)}))
    e.connect(add["out"], mul["x"])
    e.write(add["a"], np.ones(N, np.float32))
    e.write(add["b"], np.ones(N, np.float32))
    yield e
    e.close()


@pytest.fixture
def engine():
    yield from served_pipeline()


@pytest.fixture
def view(engine):
    with engine.serve() as v:
        yield v


def origin(view) -> str:
    return view.url.split("/?")[0].rstrip("/")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


class Page:
    """A WebSocket client playing the page."""

    def __init__(self, ws):
        self.ws = ws
        self.seen: list[dict] = []

    async def send(self, msg) -> None:
        await self.ws.send_str(msg if isinstance(msg, str) else json.dumps(msg))

    async def next(self, kind: str | None = None, timeout: float = 5.0) -> dict:
        """The next message (of ``kind``), skipping others."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {kind or 'message'} within {timeout} s; saw {[m['type'] for m in self.seen]}")
            msg = await self.ws.receive(timeout=left)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise AssertionError(f"socket ended: {msg.type} {msg.data} {msg.extra}")
            m = json.loads(msg.data)
            self.seen.append(m)
            if kind is None or m["type"] == kind:
                return m

    async def until(self, kind: str, pred, timeout: float = 5.0) -> dict:
        """The next message of ``kind`` for which ``pred(message)`` holds."""
        end = time.monotonic() + timeout
        while not pred(m := await self.next(kind, max(0.01, end - time.monotonic()))):
            pass
        return m

    async def collect(self, seconds: float) -> list[dict]:
        out = []
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                msg = await self.ws.receive(timeout=left)
            except TimeoutError:
                break
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            out.append(json.loads(msg.data))
        return out


async def open_page(session, view, *, hello=True, token=None) -> Page:
    ws = await session.ws_connect(origin(view) + "/ws", headers={"Origin": origin(view)})
    page = Page(ws)
    if hello:
        await page.send({"type": "hello", "token": token if token is not None else (view.token or "")})
        assert (await page.next())["type"] == "hello"
        await page.next("status")  # after graph and params: what a page gets on connect
    return page


# -- HTTP ---------------------------------------------------------------------------------------------------
@pytest.fixture
def static(tmp_path, monkeypatch):
    (tmp_path / "index.html").write_text("<!doctype html><title>rxcuda</title>")
    (tmp_path / "app.js").write_text("console.log(1)")
    monkeypatch.setattr(_serve, "STATIC", tmp_path)
    return tmp_path


def test_routes_serve_the_page_and_its_assets_only(view, static):
    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.get(view.url) as r:
                assert r.status == 200 and "rxcuda" in await r.text()
                assert r.headers["X-Frame-Options"] == "DENY" and r.headers["Referrer-Policy"] == "no-referrer"
            async with s.get(origin(view) + "/static/app.js") as r:
                assert r.status == 200 and await r.text() == "console.log(1)"
            async with s.get(origin(view) + "/static/missing.js") as r:
                assert r.status == 404
            async with s.get(origin(view) + "/static/%2e%2e/%2e%2e/pyproject.toml") as r:
                assert r.status == 404  # nothing outside the static folder
            async with s.get(origin(view) + "/nothing") as r:
                assert r.status == 404
            async with s.get(view.url, headers={"Host": f"evil.example:{view.port}"}) as r:
                assert r.status == 403 and "local address" in await r.text()  # DNS rebinding

    run(go())


def test_the_shipped_page_is_served(view):
    if not (_serve.STATIC / "index.html").is_file():
        pytest.skip("rxcuda/view/static/index.html is not there yet")

    async def go():
        async with aiohttp.ClientSession() as s, s.get(view.url) as r:
            assert r.status == 200 and "html" in r.headers["Content-Type"]

    run(go())


@pytest.mark.parametrize("headers", [{}, {"Origin": "http://evil.example"}, {"Origin": "null"}])
def test_a_websocket_from_another_origin_is_refused(view, headers):
    async def go():
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                await s.ws_connect(origin(view) + "/ws", headers=headers)
            assert e.value.status == 403

    run(go())


# -- the protocol -------------------------------------------------------------------------------------------
def test_hello_sends_engine_graph_params_and_status(engine, view):
    engine.tick()

    async def go():
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view, hello=False)
            await page.send({"type": "hello", "token": ""})
            hello = await page.next()
            assert hello == {"type": "hello", "version": 1, "engine": {
                "device": engine.device.name, "profile": "none", "frame": 1,
                "measured": False, "unmeasured": NullDriver.unmeasured}}  # the null driver measures nothing
            graph, params, status = await page.next(), await page.next(), await page.next()
            assert [graph["type"], params["type"], status["type"]] == ["graph", "params", "status"]
            blocks = {b["name"]: b for b in graph["blocks"]}
            mul = blocks["scalar_mul"]
            assert mul["state"] == "ok" and mul["kind"] == "block" and mul["region"] is None
            assert {"name": "x", "direction": "in", "dtype": "f32", "shape": [N]} in mul["ports"]
            assert {"name": "scale", "dtype": "f32", "value": 1.0, "min": 0.0, "max": 10.0, "step": 0.5} \
                in mul["params"]
            n = next(p for p in mul["params"] if p["name"] == "n")
            assert (n["min"], n["max"], n["step"]) == (None, None, None)
            assert graph["links"] == [{"src": ["vector_add", "out"], "dst": ["scalar_mul", "x"], "dtype": "f32",
                                       "shape": [N], "bytes": 4 * N, "delay": 0}]
            assert graph["layout"]["vector_add"][0] < graph["layout"]["scalar_mul"][0]
            assert params["values"] == {"vector_add.n": N, "scalar_mul.scale": 1.0, "scalar_mul.n": N}
            assert status["rebuilds"] == 1 and status["memory"]["bytes_reserved"] > 0
            assert all(len(c) == 3 for c in status["memory"]["by_class"]) and "buffers" in status["stats"]
            await page.send({"type": "ping"})
            assert (await page.next("pong")) == {"type": "pong"}

    run(go())


def test_a_set_from_one_page_is_a_plain_parameter_set_seen_by_every_page(engine, view):
    engine.tick()
    events = []
    engine.parameter_changes.subscribe(events.append)
    mul = engine.blocks[1]

    async def go():
        async with aiohttp.ClientSession() as s:
            a, b = await open_page(s, view), await open_page(s, view)
            await a.send({"type": "set", "block": "scalar_mul", "param": "scale", "value": 2.5, "id": "m1"})
            assert (await a.next("ack")) == {"type": "ack", "id": "m1", "frame": 1}
            assert mul.params["scale"].value == 2.5 and len(events) == 1
            for page in (a, b):
                assert (await page.next("params"))["values"] == {"scalar_mul.scale": 2.5}
            frame = engine.tick()
            assert frame.tiers == ("parameters",)  # the next frame, through a hot update
            for page in (a, b):
                got = await page.until("frames", lambda m: m["frames"][-1][0] == 2)
                assert [2, "parameters"] in got["marks"]
            # a change made in Python (or by a bound stream) moves the slider on every page
            mul.params["scale"].value = 7.0
            for page in (a, b):
                assert (await page.next("params"))["values"] == {"scalar_mul.scale": 7.0}
            # an integer box: JavaScript's 12.0 is 12
            await a.send({"type": "set", "block": "scalar_mul", "param": "n", "value": 12.0})
            assert (await a.next("params"))["values"] == {"scalar_mul.n": 12}

    run(go())


def test_frames_are_batched_with_marks_and_fps(engine, view):
    async def go():
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            for _ in range(5):
                engine.tick()
            frames: list = []
            marks: list = []
            while len(frames) < 5:
                m = await page.next("frames")
                frames += m["frames"]
                marks += m["marks"]
                assert set(m) == {"type", "frames", "fps", "marks", "blocks"}
            assert [f[0] for f in frames] == [1, 2, 3, 4, 5]
            assert all(f[1] > 0 and f[2] is None for f in frames)  # no profiling: no GPU time
            assert marks == [[1, "structure"]]

    run(go())


def test_diagnostics_arrive_linked_to_their_block(engine, view):
    engine.tick()
    mul = engine.blocks[1]

    async def go():
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            engine._warn("scalar_mul", "something to look at", mul)
            d = await page.next("diagnostic")
            assert d == {"type": "diagnostic", "severity": "warning", "subject": "scalar_mul",
                         "message": "something to look at", "frame": 1, "block": "scalar_mul"}

    run(go())


def test_previews_sample_a_port_as_line_or_histogram(engine, view):
    running = engine.run(120)
    try:
        async def go():
            async with aiohttp.ClientSession() as s:
                page = await open_page(s, view)
                await page.send({"type": "preview", "block": "scalar_mul", "port": "out", "kind": "line"})
                p = await page.next("preview")
                assert (p["block"], p["port"], p["kind"], p["count"], p["stride"]) == ("scalar_mul", "out", "line",
                                                                                       N, 1)
                assert len(p["data"]) == N and isinstance(p["frame"], int)
                await page.send({"type": "preview", "block": "scalar_mul", "port": "out", "kind": "hist"})
                while (p := await page.next("preview"))["kind"] != "hist":
                    pass
                assert len(p["data"]["edges"]) == 33 and sum(p["data"]["counts"]) == N
                await page.send({"type": "unpreview", "block": "scalar_mul", "port": "out"})
                await asyncio.sleep(0.3)
                later = await page.collect(0.8)
                assert later and not [m for m in later if m["type"] == "preview"]

        run(go())
    finally:
        running.dispose()


def test_sample_strides_long_ports_and_nulls_non_finite_values():
    m = _serve.sample("b", "p", "line", 1, np.arange(10_000, dtype=np.float32))
    assert m["stride"] == 20 and m["data"][:2] == [0.0, 20.0] and len(m["data"]) == 500
    assert _serve.sample("b", "p", "line", 1, np.array([1.0, np.nan, np.inf]))["data"] == [1.0, None, None]
    vec = np.zeros(4, dtype=[("x", "f4"), ("y", "f4")])
    vec["x"] = 3
    assert _serve.sample("b", "p", "line", 1, vec)["data"] == [3.0] * 4
    assert _serve.dumps({"v": float("nan")}) == '{"v":null}'


# -- validation: every kind of bad message is refused, with a message, and changes nothing ---------------------
BAD = [
    ("not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"kind": "set"}', "unknown message type None"),
    ('{"type": "shutdown"}', "unknown message type 'shutdown'"),
    ('{"type": "set", "block": "scalar_mul", "param": "scale"}', "missing: value"),
    ('{"type": "set", "block": "scalar_mul", "param": "scale", "value": 1, "code": "x"}', "not code"),
    ('{"type": "set", "block": 3, "param": "scale", "value": 1}', "'block' must be a name"),
    ('{"type": "set", "block": "nope", "param": "scale", "value": 1}', "no block 'nope' in this engine"),
    ('{"type": "set", "block": "scalar_mul", "param": "nope", "value": 1}', "has no parameter 'nope'"),
    ('{"type": "set", "block": "scalar_mul", "param": "scale", "value": "2"}', "takes a number"),
    ('{"type": "set", "block": "scalar_mul", "param": "scale", "value": true}', "takes a number"),
    ('{"type": "set", "block": "scalar_mul", "param": "scale", "value": NaN}', "not a number the live view takes"),
    ('{"type": "set", "block": "scalar_mul", "param": "scale", "value": 11}', "must be within [0.0, 10.0]"),
    ('{"type": "set", "block": "scalar_mul", "param": "scale", "value": -1e400}', "takes a finite number"),
    ('{"type": "set", "block": "scalar_mul", "param": "n", "value": 2.5}', "takes a whole number (got 2.5)"),
    ('{"type": "set", "block": "scalar_mul", "param": "n", "value": 99999999999}', "must be within"),
    ('{"type": "preview", "block": "scalar_mul", "port": "nope"}', "has no port 'nope'"),
    ('{"type": "preview", "block": "scalar_mul", "port": "out", "kind": "pie"}', "line or hist"),
    ('{"type": "unpreview", "block": "nope", "port": "out"}', "no block 'nope'"),
    ('{"type": "set", "block": "scalar_mul", "param": "scale", "value": 1, "pad": "' + "x" * 5000 + '"}',
     "message too long"),
]


@pytest.mark.parametrize(("text", "says"), BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_a_bad_message_is_refused_with_a_message_and_changes_nothing(engine, view, text, says):
    events = []
    engine.parameter_changes.subscribe(events.append)
    before = {b.name: b.values() for b in engine.blocks}

    async def go():
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            await page.send(text)
            err = await page.next("error")
            assert says in err["message"], err["message"]
            await page.send({"type": "ping"})  # the socket stays open
            await page.next("pong")

    run(go())
    assert events == [] and {b.name: b.values() for b in engine.blocks} == before


def test_messages_before_hello_and_binary_ones_are_refused(engine, view):
    async def go():
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view, hello=False)
            await page.send({"type": "set", "block": "scalar_mul", "param": "scale", "value": 2})
            assert "send hello first" in (await page.next("error"))["message"]
            await page.ws.send_bytes(b"\x00\x01")
            assert "not binary" in (await page.next("error"))["message"]

    run(go())
    assert engine.blocks[1].params["scale"].value == 1.0


def test_the_message_rate_is_limited(view):
    async def go():
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            for _ in range(_serve.RATE + 300):
                await page.send({"type": "ping"})
            got = await page.collect(1.0)
            pongs = sum(1 for m in got if m["type"] == "pong")
            errors = [m["message"] for m in got if m["type"] == "error"]
            assert _serve.RATE - 5 <= pongs < _serve.RATE + 250  # the bucket (the hello took one), plus refills
            assert errors and "too many messages" in errors[0] and len(errors) <= 2

    run(go())


def test_a_burst_of_parameter_events_is_throttled_and_ends_with_the_last_value(engine, view):
    mul = engine.blocks[1]

    async def go():
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            await page.collect(0.2)  # what the hello sent
            t0 = time.monotonic()

            def burst():
                for i in range(10_000):
                    mul.params["scale"].value = (i % 20) * 0.5

            th = threading.Thread(target=burst)
            th.start()
            got = await page.collect(1.5)
            th.join()
            elapsed = time.monotonic() - t0
            params = [m for m in got if m["type"] == "params"]
            limit = elapsed / _serve.INTERVAL + 2
            print(f"10000 parameter events in a burst -> {len(params)} params messages in {elapsed:.2f} s "
                  f"(limit {limit:.0f}); last value {params[-1]['values']}")
            assert 1 <= len(params) <= limit
            assert params[-1]["values"]["scalar_mul.scale"] == (9_999 % 20) * 0.5
            # and every kind of message keeps to the rate
            kinds: dict[str, int] = {}
            for m in got:
                kinds[m["type"]] = kinds.get(m["type"], 0) + 1
            assert all(n <= limit for n in kinds.values()), kinds

    run(go())


# -- tokens and binding ---------------------------------------------------------------------------------------
def _free_host() -> str:
    """A non-local address of this machine to bind to (0.0.0.0 when there is none)."""
    return "0.0.0.0"


def test_a_non_local_bind_needs_the_token_on_the_page_and_the_socket(engine, static, caplog):
    with caplog.at_level(logging.WARNING, logger="rxcuda.view"), engine.serve(host=_free_host()) as view:
        assert view.token and len(view.token) >= 24 and f"?token={view.token}" in view.url
        assert sum(view.token in r.getMessage() for r in caplog.records) == 1  # shown once
        base = f"http://127.0.0.1:{view.port}"

        async def go():
            async with aiohttp.ClientSession() as s:
                async with s.get(base + "/") as r:
                    assert r.status == 403 and "token" in await r.text()
                async with s.get(base + "/?token=wrong-token-123") as r:
                    assert r.status == 403
                async with s.get(f"{base}/?token={view.token}") as r:
                    assert r.status == 200
                ws = await s.ws_connect(base + "/ws", headers={"Origin": base})
                await ws.send_str(json.dumps({"type": "hello", "token": "wrong-token-123"}))
                err = json.loads((await ws.receive()).data)
                assert err["type"] == "error" and "token" in err["message"]
                closing = await ws.receive()
                assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED) and ws.close_code == 4403
                ws = await s.ws_connect(base + "/ws", headers={"Origin": base})
                await ws.send_str(json.dumps({"type": "set", "block": "scalar_mul", "param": "scale", "value": 3}))
                assert "hello first" in json.loads((await ws.receive()).data)["message"]
                await ws.send_str(json.dumps({"type": "hello", "token": view.token}))
                assert json.loads((await ws.receive()).data)["type"] == "hello"
                await ws.close()

        run(go())


def test_a_token_on_a_local_bind_is_enforced_too(engine):
    with engine.serve(token="secret-token-42") as view:
        assert view.url.endswith("/?token=secret-token-42")

        async def go():
            async with aiohttp.ClientSession() as s:
                page = await open_page(s, view, hello=False)
                await page.send({"type": "hello", "token": ""})
                assert "token" in (await page.next("error"))["message"]

        run(go())


@pytest.mark.parametrize(("kwargs", "error", "says"), [
    ({"port": -1}, ValueError, "0 (any free port) to 65535"),
    ({"port": True}, ValueError, "0 (any free port) to 65535"),
    ({"host": ""}, TypeError, "interface address"),
    ({"token": "short"}, ValueError, "at least 8 printable characters"),
])
def test_bad_serve_arguments_are_refused(engine, kwargs, error, says):
    with pytest.raises(error, match=says.replace("(", r"\(").replace(")", r"\)")):
        engine.serve(**kwargs)


def test_a_taken_port_and_a_closed_engine_are_refused(engine):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(rxcuda.LiveViewError, match="cannot listen on 127.0.0.1"):
            engine.serve(port=taken.getsockname()[1])
    with pytest.raises(TypeError, match="use engine.serve"):
        rxcuda.view.serve("engine")
    closed = rxcuda.Engine(driver=NullDriver())
    closed.close()
    with pytest.raises(rxcuda.EngineClosedError, match="serve a running engine"):
        closed.serve()


def test_dispose_and_engine_close_stop_the_server(engine):
    view = engine.serve()

    async def go():
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            assert view.pages == 1
            await asyncio.get_running_loop().run_in_executor(None, engine.close)  # closes the view too
            while True:
                msg = await page.ws.receive(timeout=5)
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
            assert view.closed
            with pytest.raises(aiohttp.ClientConnectorError):
                await s.get(view.url)

    run(go())
    view.dispose()  # idempotent
    assert "closed" in repr(view)


# -- the graph: composites, delays, layout --------------------------------------------------------------------
def test_graph_marks_composites_and_delayed_links():
    with rxcuda.Engine(driver=NullDriver()) as engine:
        smooth = Composite("smooth")
        first = smooth.add(Block.from_kernel("kernels/scalar_mul.ptx", size=N, name="first"))
        second = smooth.add(Block.from_kernel("kernels/scalar_mul.ptx", size=N, name="second"))
        smooth.connect(first["out"], second["x"])
        smooth.expose("x", first["x"])
        inst = engine.add(smooth)
        acc = engine.add(Block.from_kernel("kernels/vector_add.ptx", size=N, name="acc"))
        engine.connect(acc["out"], acc["a"], delay=1)
        engine.connect(acc["out"], inst["x"])
        from rxcuda.view._collect import graph_message

        g = graph_message(engine)
        blocks = {b["name"]: b for b in g["blocks"]}
        assert blocks["smooth/first"]["composite"] == "smooth" and blocks["acc"]["composite"] is None
        delayed = [lk for lk in g["links"] if lk["delay"]]
        assert delayed == [{"src": ["acc", "out"], "dst": ["acc", "a"], "dtype": "f32", "shape": [N],
                            "bytes": 4 * N, "delay": 1}]
        x = {n: pos[0] for n, pos in g["layout"].items()}
        assert x["acc"] < x["smooth/first"] < x["smooth/second"]  # the delayed self-loop does not count
        assert g["width"] >= max(x.values()) and g["height"] > 0


def test_layered_layout_survives_a_cycle():
    pos, _, _ = layered_layout(["a", "b"], [("a", "b"), ("b", "a")])
    assert set(pos) == {"a", "b"}


# -- parameter ranges -------------------------------------------------------------------------------------------
def test_ranges_from_kernel_are_enforced_on_every_set():
    mul = Block.from_kernel("scalar_mul", size=N, scale=1.0, ranges={"scale": (0, 10)})
    prm = mul.params["scale"]
    assert (prm.min, prm.max, prm.step) == (0.0, 10.0, None)
    with pytest.raises(ValueError, match=r"scalar_mul.scale \(f32\) must be within \[0.0, 10.0\]"):
        prm.value = 10.5
    assert prm.value == 1.0
    prm.value = 10
    with pytest.raises(ValueError, match="must be within"):
        mul.set(scale=-1)


@pytest.mark.parametrize(("ranges", "error", "says"), [
    ({"scale": (5, 1)}, ValueError, "'min' 5.0 is above 'max' 1.0"),
    ({"scale": (0, 0.5)}, ValueError, "the default 1.0 lies outside"),
    ({"scale": (0, 2, 0)}, ValueError, "'step' must be above 0"),
    ({"scale": (0, "x")}, ValueError, "'max' must be a finite number"),
    ({"n": (0, 10.5)}, ValueError, "'max' 10.5 is not an integer"),
    ({"scale": 3}, TypeError, r"ranges\['scale'\] must be \(min, max\)"),
    ({"nope": (0, 1)}, TypeError, "unknown parameter"),
])
def test_bad_ranges_are_refused(ranges, error, says):
    with pytest.raises(error, match=says):
        Block.from_kernel("scalar_mul", size=N, scale=1.0, ranges=ranges)


def test_builder_scalar_takes_a_range():
    from rxcuda.sources._files import load_kernel_file

    b = BlockBuilder("mul", size=N)
    k = b.add_kernel(load_kernel_file("kernels/scalar_mul.ptx"))
    b.input("x", k["x"])
    b.output("out", k["out"])
    b.scalar("scale", k["scale"], default=2.0, min=-4, max=4, step=0.25)
    b.scalar("n", k["n"], default="size", min=1)
    blk = b.build()
    assert (blk.params["scale"].min, blk.params["scale"].max, blk.params["scale"].step) == (-4.0, 4.0, 0.25)
    with pytest.raises(ValueError, match="must be within"):
        blk.params["n"].value = 0


def test_sidecar_min_max_step(tmp_path):
    for ext in (".ptx", ".json"):
        shutil.copy(f"kernels/scalar_mul{ext}", tmp_path / f"scalar_mul{ext}")
    side = json.loads((tmp_path / "scalar_mul.json").read_text())
    for p in side["params"]:
        if p["name"] == "scale":
            p.update({"min": -1, "max": 1, "step": 0.1, "default": 0.5})
    (tmp_path / "scalar_mul.json").write_text(json.dumps(side))
    blk = Block.from_kernel(tmp_path / "scalar_mul.ptx", size=N)
    assert (blk.params["scale"].min, blk.params["scale"].max, blk.params["scale"].step) == (-1.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="must be within"):
        blk.params["scale"].value = 2
    wider = Block.from_kernel(tmp_path / "scalar_mul.ptx", size=N, ranges={"scale": (-5, 5)})
    assert (wider.params["scale"].min, wider.params["scale"].step) == (-5.0, 0.1)  # the sidecar's step stays
    for p in side["params"]:
        if p["name"] == "scale":
            p["min"] = 2
    (tmp_path / "scalar_mul.json").write_text(json.dumps(side))
    from rxcuda import KernelFileError

    with pytest.raises(KernelFileError, match="'min' 2.0 is above 'max' 1.0"):
        Block.from_kernel(tmp_path / "scalar_mul.ptx", size=N)
    for p in side["params"]:
        if p["name"] == "x":
            p["min"] = 0
        if p["name"] == "scale":
            p["min"] = -1
    (tmp_path / "scalar_mul.json").write_text(json.dumps(side))
    with pytest.raises(KernelFileError, match="a pointer takes no 'min'"):
        Block.from_kernel(tmp_path / "scalar_mul.ptx", size=N)


# -- rxcuda demo --serve ----------------------------------------------------------------------------------------
def test_demo_plan_serve_runs_the_planned_pipeline_on_the_null_driver(capsys):
    from rxcuda import _cli

    assert _cli.main(["demo", "--plan", "--serve", "--seconds", "0.3", "--size", "256"]) == 0
    out = capsys.readouterr().out
    assert "live view: http://127.0.0.1:" in out and "null driver" in out and "served" in out


def test_demo_serve_runs_isolated_by_default_and_in_process_on_request(capsys):
    """Where people watch and edit live, the pipeline runs in an IsolatedEngine (here on the CPU device: real
    numbers, a child process); --in-process serves from rxcuda.Engine, which profiles."""
    from rxcuda import _cli

    assert _cli.main(["demo", "--serve", "--seconds", "1.5", "--size", "256"]) == 0
    out = capsys.readouterr().out
    assert "in a child process" in out and "live view: http://127.0.0.1:" in out, out
    served = int(out.split("served ")[1].split()[0])
    assert served > 0, out
    assert _cli.main(["demo", "--serve", "--in-process", "--profile", "none", "--seconds", "0.5", "--size",
                      "256"]) == 0
    out = capsys.readouterr().out
    assert "child process" not in out and int(out.split("served ")[1].split()[0]) > 0, out


def test_demo_serve_refuses_profile_without_in_process(capsys):
    from rxcuda import _cli

    assert _cli.main(["demo", "--serve", "--profile", "per_block", "--seconds", "0.1"]) != 0
    err = capsys.readouterr().err
    assert "--profile needs --in-process" in err and "add --in-process" in err, err


@pytest.mark.parametrize(("argv", "says"), [
    (["--port", "70000"], "must be a port number, 0 to 65535"),
    (["--seconds", "0"], "must be a positive number of seconds"),
])
def test_demo_serve_refuses_bad_arguments(capsys, argv, says):
    from rxcuda import _cli

    with pytest.raises(SystemExit) as e:
        _cli.main(["demo", "--plan", "--serve", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err
