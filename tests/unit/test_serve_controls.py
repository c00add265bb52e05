"""The live view's controls on the null driver: a page sets parameters only through the public path
(``block.set``) and gets its refusals worded for a web page, ``engine.serve(params=...)`` limits what a page
shows and may set, a message over the socket's limit gets an error before the socket closes, and
``view.wait(seconds)`` keeps a script serving. aiohttp's client plays the page (helpers from test_serve)."""

from __future__ import annotations

import threading
import time

import pytest

aiohttp = pytest.importorskip("aiohttp")

from test_serve import N, open_page, origin, run, served_pipeline  # noqa: E402

import rxcuda  # noqa: E402
from rxcuda import Block  # noqa: E402
from rxcuda.view import _protocol, _serve  # noqa: E402


@pytest.fixture
def engine():
    yield from served_pipeline()


# -- the public path ----------------------------------------------------------------------------------------
def test_a_set_from_the_page_goes_through_block_set(engine, monkeypatch):
    """Whatever block.set checks (type, range, and the counts a parameter is tied to) the page gets: the
    server calls it, not a private check, and a refusal reaches the page worded for the web."""
    calls = []
    plain_set = Block.set

    def checked_set(self, **values):
        calls.append((self.name, values))
        if values.get("n", 0) > N:
            raise ValueError(f"{self.name}.n (i32) counts the elements of {self.name}.x: at most {N}, a Python or "
                             f"NumPy int (got {values['n']}, a int)")
        plain_set(self, **values)

    monkeypatch.setattr(Block, "set", checked_set)
    mul = engine.blocks[1]

    async def go(view):
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            await page.send({"type": "set", "block": "scalar_mul", "param": "scale", "value": 2.5, "id": 1})
            await page.next("ack")
            await page.send({"type": "set", "block": "scalar_mul", "param": "n", "value": 100_000_000})
            err = await page.next("error")
            assert err["message"] == (f"scalar_mul.n (i32) counts the elements of scalar_mul.x: at most {N}, a "
                                      "whole number (got 100000000)")
            await page.send({"type": "ping"})  # the socket stays open
            await page.next("pong")

    with engine.serve() as view:
        run(go(view))
    assert calls == [("scalar_mul", {"scale": 2.5}), ("scalar_mul", {"n": 100_000_000})]
    assert mul.params["scale"].value == 2.5 and mul.params["n"].value == N


def test_the_page_cannot_set_a_count_past_its_buffers(engine):
    """The real count check (rxcuda.BoundsError), not a stand-in: n=100000000 and n=-5 on 1024-element buffers
    are refused with the port and its size, nothing changes, and a value that fits is taken."""
    mul = engine.blocks[1]

    async def go(view):
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            for value, says in ((100_000_000, f"is more than port 'x' holds ({N} elements)"), (-5, "negative")):
                await page.send({"type": "set", "block": "scalar_mul", "param": "n", "value": value})
                err = await page.next("error")
                assert "scalar_mul.n" in err["message"] and says in err["message"], err
                assert "engine.resize" in err["message"] or value < 0
            await page.send({"type": "set", "block": "scalar_mul", "param": "n", "value": N // 2, "id": 7})
            await page.next("ack")

    with engine.serve() as view:
        run(go(view))
    assert mul.params["n"].value == N // 2
    assert engine.tick().state == "ok"


@pytest.mark.parametrize(("value", "says"), [
    (2.5, "scalar_mul.n (i32) takes a whole number (got 2.5)"),
    (1e10, "scalar_mul.n (i32) must be within [-2147483648, 2147483647] (got 10000000000)"),
])
def test_the_page_gets_the_librarys_refusal_without_python_words(engine, value, says):
    mul = engine.blocks[1]

    async def go(view):
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            await page.send({"type": "set", "block": "scalar_mul", "param": "n", "value": value})
            message = (await page.next("error"))["message"]
            assert says in message and "Python" not in message and "NumPy" not in message, message

    with engine.serve() as view:
        run(go(view))
    assert mul.params["n"].value == N


def test_for_page_rewords_only_python_words():
    assert _protocol.for_page("a.x (f32) takes a number: a Python or NumPy int or float (got '2', a str)") \
        == "a.x (f32) takes a number (got '2')"
    assert _protocol.for_page("a.n (i64) takes an integer: a Python or NumPy int (got 2.5, a float)") \
        == "a.n (i64) takes a whole number (got 2.5)"
    kept = "a.scale (f32) must be within [0.0, 1.0], its declared range (got 1.5)"
    assert _protocol.for_page(kept) == kept


# -- engine.serve(params=...) -------------------------------------------------------------------------------
def test_params_limits_the_controls_and_refuses_the_rest(engine):
    mul = engine.blocks[1]

    async def go(view):
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view, hello=False)
            await page.send({"type": "hello", "token": ""})
            graph, params = await page.next("graph"), await page.next("params")
            shown = {b["name"]: [p["name"] for p in b["params"]] for b in graph["blocks"]}
            assert shown == {"vector_add": [], "scalar_mul": ["scale"]}
            assert params["values"] == {"scalar_mul.scale": 1.0}
            await page.send({"type": "set", "block": "scalar_mul", "param": "n", "value": 3})
            err = (await page.next("error"))["message"]
            assert err.startswith("scalar_mul.n is not a control of this page") and "scalar_mul.scale" in err
            await page.send({"type": "set", "block": "scalar_mul", "param": "scale", "value": 4.0, "id": "ok"})
            await page.next("ack")
            # a change from Python of a parameter the page does not show stays off the page
            mul.params["n"].value = 8
            mul.params["scale"].value = 5.0
            got = await page.until("params", lambda m: "scalar_mul.scale" in m["values"]
                                   and m["values"]["scalar_mul.scale"] == 5.0)
            assert set(got["values"]) == {"scalar_mul.scale"}

    with engine.serve(params=["scalar_mul.scale"]) as view:
        run(go(view))
    assert mul.params["n"].value == 8 and mul.params["scale"].value == 5.0


def test_params_takes_blocks_and_composites(engine):
    add, mul = engine.blocks
    assert _serve.exposed_names(engine, [add]) == {"vector_add.n"}
    assert _serve.exposed_names(engine, "scalar_mul.scale") == {"scalar_mul.scale"}
    assert _serve.exposed_names(engine, [add, "scalar_mul.n"]) == {"vector_add.n", "scalar_mul.n"}
    gain = rxcuda.Composite("gain")
    inner = gain.add(Block.from_kernel("kernels/scalar_mul.ptx", size=N, name="inner"))
    gain.expose("x", inner["x"])
    instance = engine.add(gain)
    assert _serve.exposed_names(engine, [instance]) == {"gain/inner.scale", "gain/inner.n"}
    with engine.serve(params=[]) as view:
        assert view._exposed == frozenset()


@pytest.mark.parametrize(("params", "says"), [
    (["scalar_mul.gain"], "scalar_mul has no parameter 'gain' (parameters: scale, n)"),
    (["nope.scale"], "'nope.scale' names no block's parameter; write 'block.param'"),
    (["scale"], "'scale' names no block's parameter"),
    ([Block.from_kernel("kernels/scalar_mul.ptx", size=4, name="stray")], "'stray' is not a block of this engine"),
])
def test_bad_params_are_refused_when_serving(engine, params, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        engine.serve(params=params)


# -- the socket's size limit ----------------------------------------------------------------------------------
def test_a_message_over_the_socket_limit_gets_an_error_before_the_socket_closes(engine):
    async def go(view):
        async with aiohttp.ClientSession() as s:
            page = await open_page(s, view)
            await page.send('{"type":"ping","pad":"' + "x" * 20_000 + '"}')  # over 4 KiB: an error, still open
            assert "message too long: 20" in (await page.next("error"))["message"]
            await page.send({"type": "ping"})
            await page.next("pong")
            await page.send('{"type":"ping","pad":"' + "x" * _serve.MAX_FRAME_BYTES + '"}')
            err = await page.next("error")
            assert err["message"].startswith(f"message too long: over {_serve.MAX_FRAME_BYTES} bytes")
            msg = await page.ws.receive(timeout=5)
            assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009, (msg.type, msg.data)

    with engine.serve() as view:
        run(go(view))


def test_the_protocol_page_states_the_limits_the_code_has():
    text = (_serve.STATIC.parent / "PROTOCOL.md").read_text()
    assert f"at most {_protocol.MAX_MESSAGE} bytes" in text
    beyond = " ".join(text.split(f"over {_serve.MAX_FRAME_BYTES} bytes")[1].split()[:40])
    assert "gets an `error` too, and then the socket closes with code 1009" in beyond


# -- keep serving ---------------------------------------------------------------------------------------------
def test_wait_keeps_serving_and_returns_when_the_view_stops(engine):
    with engine.serve() as view:
        t0 = time.monotonic()
        assert view.wait(0.05) is True and time.monotonic() - t0 >= 0.05
        threading.Timer(0.1, view.dispose).start()
        t0 = time.monotonic()
        assert view.wait(30) is False and time.monotonic() - t0 < 5
    assert view.wait() is False  # a stopped view does not block
    with engine.serve() as view:
        threading.Timer(0.05, engine.close).start()
        assert view.wait() is False


def test_rxcuda_view_wait_max_caps_every_wait(engine, monkeypatch):
    monkeypatch.setenv("RXCUDA_VIEW_WAIT_MAX", "0.05")
    with engine.serve() as view:
        t0 = time.monotonic()
        assert view.wait() is True and view.wait(600) is True and time.monotonic() - t0 < 5
        monkeypatch.setenv("RXCUDA_VIEW_WAIT_MAX", "soon")
        with pytest.raises(ValueError, match="RXCUDA_VIEW_WAIT_MAX must be a number of seconds"):
            view.wait(1)


@pytest.mark.parametrize("seconds", [-1, "60", True, float("nan")])
def test_wait_refuses_what_is_not_a_number_of_seconds(engine, seconds):
    with engine.serve() as view, pytest.raises(ValueError, match=r"view.wait\(seconds\) takes a number of seconds"):
        view.wait(seconds)


def test_the_url_is_served_until_wait_returns(engine):
    with engine.serve() as view:
        url = origin(view)

        async def fetch():
            async with aiohttp.ClientSession() as s, s.get(url + "/static/style.css") as r:
                return r.status

        threading.Timer(0.3, view.dispose).start()
        assert run(fetch()) == 200
        view.wait()
