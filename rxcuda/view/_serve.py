"""The live view: a running engine as a web page, parameters as controls (``engine.serve()``).

``LiveView(engine)`` (installed as ``engine.serve(host="127.0.0.1", port=0, token=None)``) starts an aiohttp
server on a daemon thread with its own asyncio loop. ``GET /`` is the page and ``/static/...`` its assets
(shipped in ``rxcuda/view/static/``: no CDN), ``/ws`` the WebSocket that carries compact JSON both ways
(``rxcuda/view/PROTOCOL.md`` is the protocol).

What the page sees comes from the engine's streams (:mod:`rxcuda.view._collect`): subscribers on the engine
thread only store, and the server sends at most ~30 messages of each kind a second to each page, everything
since the last one batched, latest values winning, so a page never slows the frames. A ``set`` from a page
does exactly ``block.params[name].value = v``: one change event, the same coalescing, a hot update of the
next frame; every page (and a change from Python or a bound stream) moves the sliders of every page.

Security: the server binds to 127.0.0.1 unless told otherwise, and refuses a WebSocket whose ``Origin`` is
not its own page (another site must not drive a local engine) and, on a local bind, requests whose ``Host``
is not local (DNS rebinding). Any other interface needs a token (generated when none is given, logged once
and kept in ``view.url``), checked on the page and in the WebSocket's hello. Page messages are limited in
size (4 KiB) and rate (200 a second), checked like any parameter set, and can do nothing but set scalar
parameters and ask for previews of ports.

>>> import rxcuda, urllib.request
>>> engine = rxcuda.Engine(driver=rxcuda.cuda.NullDriver())
>>> _ = engine.add(rxcuda.Block.from_kernel("scalar_mul", size=16))
>>> with engine.serve() as view:
...     view.url.startswith("http://127.0.0.1:")
True
>>> engine.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ..engine._engine import Engine
from ..model._errors import EngineClosedError, RxcudaError
from . import _protocol
from ._collect import MAX_DIAGNOSTICS, MAX_FRAMES, Collector, graph_message, status_message
from ._protocol import Refused

log = logging.getLogger("rxcuda.view")

VERSION = 1
STATIC = Path(__file__).with_name("static")
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
INTERVAL = 1 / 30  # at most this often a page gets a message of each kind
STATUS_EVERY = 1.0  # seconds between status messages
RATE = 200  # page messages a second (a burst of as many is allowed)
MAX_FRAME_BYTES = 65536  # a WebSocket frame beyond this closes the socket (beyond MAX_MESSAGE: an error)
PREVIEW_EVERY = 0.25  # seconds between two previews of one port
PREVIEW_FRAMES = 4  # engine.observe(every=...) for a preview
PREVIEW_POINTS = 512
HIST_BINS = 32
MAX_PREVIEWS = 8  # per page
CLOSE_BAD_TOKEN = 4403


class LiveViewError(RxcudaError, RuntimeError):
    """The live view could not start: aiohttp is missing, or the address cannot be bound."""


class LiveView:
    """A running engine served as a web page; ``engine.serve()`` makes one (see the module docstring).

    ``url`` is the page's address (with ``?token=...`` when a token is needed), ``token`` the token (None on
    a local bind without one), ``pages`` the pages connected now. ``dispose()`` (or the end of a ``with``
    block, or ``engine.close()``) stops the server.

    >>> view = engine.serve()                                  # doctest: +SKIP
    >>> print(view.url)                                        # doctest: +SKIP
    http://127.0.0.1:53117/
    >>> view.dispose()                                         # doctest: +SKIP
    """

    def __init__(self, engine: Engine, host: str = "127.0.0.1", port: int = 0, token: str | None = None):
        if not isinstance(engine, Engine):
            raise TypeError(f"serve() shows an rxcuda.Engine (got {type(engine).__name__}); use engine.serve()")
        if engine.closed:
            raise EngineClosedError("engine.serve: the engine is closed; serve a running engine")
        if not isinstance(host, str) or not host:
            raise TypeError(f"engine.serve(host=...) takes an interface address such as '127.0.0.1' (got {host!r})")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"engine.serve(port=...) takes 0 (any free port) to 65535 (got {port!r})")
        if token is not None and (not isinstance(token, str) or len(token) < 8 or not token.isprintable()):
            raise ValueError("engine.serve(token=...) takes a string of at least 8 printable characters, or None "
                             "(a non-local bind then gets a generated one)")
        try:
            from aiohttp import web  # noqa: F401
        except ImportError as e:
            raise LiveViewError("the live view needs aiohttp: pip install 'rxcuda[view]' (or pip install "
                                "aiohttp)") from e
        self.host = host
        self.local = host in LOCAL_HOSTS
        generated = token is None and not self.local
        self.token = secrets.token_urlsafe(24) if generated else token
        self._engine = engine
        self._pages: set[_Page] = set()
        self._graph: dict | None = None  # the latest graph message
        self._names: dict[int, str] = {}  # block id -> name, for parameter changes
        self._closed = False
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._wake: asyncio.Event | None = None
        self._runner: Any = None
        self._pump_task: asyncio.Task | None = None
        self.port = port
        self._collector = Collector(engine, self._poke)  # stores until the server's pump drains it
        ready = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(ready,), name="rxcuda-live-view", daemon=True)
        self._thread.start()
        ready.wait()
        if self._start_error is not None:
            self._thread.join(5)
            self._collector.dispose()
            e = self._start_error
            raise LiveViewError(f"engine.serve: cannot listen on {host}:{port}: {e}") from e
        self._done = engine.frames.subscribe(on_completed=self._engine_closed)
        if generated:
            log.warning("rxcuda live view on %s: open %s (the token is shown only here)", self.host, self.url)

    # -- the address ----------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The page's address; on a bind to every interface it names this machine."""
        host = self.host
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        query = f"?token={self.token}" if self.token else ""
        return f"http://{host}:{self.port}/{query}"

    @property
    def pages(self) -> int:
        """How many pages are connected (past their hello) now."""
        return sum(1 for p in list(self._pages) if p.ready)

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<LiveView {self.url} {'closed' if self._closed else f'{self.pages} pages'}>"

    def __enter__(self) -> LiveView:
        return self

    def __exit__(self, *exc) -> None:
        self.dispose()

    # -- lifetime ---------------------------------------------------------------------------------------
    def dispose(self) -> None:
        """Stop the server: close every page's socket, stop listening, unsubscribe (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._collector.dispose()
        self._done.dispose()
        loop = self._loop
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        if threading.current_thread() is not self._thread:
            self._thread.join(10)

    close = dispose

    def _engine_closed(self) -> None:
        if threading.current_thread() is self._thread:
            threading.Thread(target=self.dispose, daemon=True).start()
        else:
            self.dispose()

    def _poke(self) -> None:
        """From the collector (any thread): something arrived."""
        loop, wake = self._loop, self._wake
        if wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(wake.set)

    def _run(self, ready: threading.Event) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start())
        except BaseException as e:
            self._start_error = e
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _start(self) -> None:
        from aiohttp import web

        self._wake = asyncio.Event()
        app = web.Application(middlewares=[_middleware()], client_max_size=MAX_FRAME_BYTES)
        app.router.add_get("/", self._index)
        app.router.add_get("/ws", self._socket)
        app.router.add_get("/static/{name:.+}", self._static)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        self._pump_task = asyncio.ensure_future(self._pump())

    async def _shutdown(self) -> None:
        if self._pump_task is not None:
            self._pump_task.cancel()
        for page in list(self._pages):
            await page.close(1001, "the live view stopped")
        if self._runner is not None:
            await self._runner.cleanup()
        for page in list(self._pages):
            page.drop_previews()
        current = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not current]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)
        asyncio.get_running_loop().stop()

    # -- HTTP -------------------------------------------------------------------------------------------
    def _host_ok(self, request) -> bool:
        """On a local bind without a token, the Host header must be local (no DNS rebinding)."""
        if self.token is not None:
            return True
        host = urlsplit(f"//{request.host}").hostname or ""
        return host in LOCAL_HOSTS

    def _token_ok(self, given: str | None) -> bool:
        return self.token is None or (isinstance(given, str) and hmac.compare_digest(given.encode(),
                                                                                      self.token.encode()))

    async def _index(self, request):
        from aiohttp import web

        if not self._host_ok(request):
            return web.Response(status=403, text=f"the live view answers only to a local address, not "
                                                 f"{request.host}; open http://127.0.0.1:{self.port}/")
        if not self._token_ok(request.query.get("token")):
            return web.Response(status=403, text="this live view needs its token: open the address printed "
                                                 "when it started (it ends in ?token=...)")
        page = STATIC / "index.html"
        if not page.is_file():
            return web.Response(status=503, text=f"the live view's page is missing from {STATIC}; reinstall "
                                                 "rxcuda")
        return web.FileResponse(page, headers={"Cache-Control": "no-store"})

    async def _static(self, request):
        from aiohttp import web

        if not self._host_ok(request):
            return web.Response(status=403, text="the live view answers only to a local address")
        root = STATIC.resolve()
        path = (root / request.match_info["name"]).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            return web.Response(status=404, text=f"no such file in the live view: {request.match_info['name']}")
        return web.FileResponse(path)

    # -- the WebSocket --------------------------------------------------------------------------------------
    async def _socket(self, request):
        from aiohttp import WSMsgType, web

        origin = request.headers.get("Origin")
        expected = f"http://{request.host}"
        if not self._host_ok(request) or origin is None or origin.lower() != expected.lower():
            return web.Response(status=403, text=f"WebSocket refused: its Origin ({origin or 'none'}) is not this "
                                                 f"live view's page ({expected})")
        ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, heartbeat=None)
        await ws.prepare(request)
        page = _Page(ws)
        self._pages.add(page)
        sender = asyncio.ensure_future(page.send_loop())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await self._receive(page, msg.data)
                elif msg.type == WSMsgType.BINARY:
                    page.error("the live view takes JSON text messages, not binary ones")
                if page.closing:
                    break
        finally:
            self._pages.discard(page)
            page.drop_previews()
            await page.flush()
            sender.cancel()
        return ws

    async def _receive(self, page: _Page, text: str) -> None:
        if not page.allow():
            return
        try:
            msg = _protocol.parse(text)
            kind = msg["type"]
            if kind == "ping":
                page.put({"type": "pong"})
            elif kind == "hello":
                await self._hello(page, msg)
            elif not page.ready:
                raise Refused("send hello first: {\"type\":\"hello\",\"token\":\"...\"}")
            elif kind == "set":
                self._set(page, msg)
            elif kind == "preview":
                await self._preview(page, msg)
            elif kind == "unpreview":
                block, port, _ = _protocol.check_preview(msg, self._blocks())
                page.drop_preview((block.name, port))
        except Refused as e:
            page.error(str(e))

    async def _hello(self, page: _Page, msg: Mapping) -> None:
        if not self._token_ok(msg.get("token")):
            page.error("wrong or missing token: open the address printed when the live view started")
            await page.flush()
            await page.close(CLOSE_BAD_TOKEN, "wrong token")
            return
        engine = self._engine
        if self._graph is None:
            self._graph = self._build(graph_message)
        page.ready = True
        page.put({"type": "hello", "version": VERSION,
                  "engine": {"device": getattr(engine.device, "name", "?"), "profile": engine.profile,
                             "frame": engine.frame}})
        if self._graph is not None:
            page.put(self._graph)
        page.put({"type": "params", "values": {f"{b.name}.{n}": p.value for b in engine.blocks
                                               for n, p in b.params.items()}})
        status = self._build(status_message)
        if status is not None:
            page.put(status)

    def _set(self, page: _Page, msg: Mapping) -> None:
        prm, value = _protocol.check_set(msg, self._blocks())
        frame = self._engine.frame
        try:
            prm.value = value  # exactly what Python does: one change event, coalesced, a hot update
        except (TypeError, ValueError) as e:  # a race with a rename or a range change: still nothing stored
            raise Refused(str(e)) from None
        if "id" in msg:
            page.put({"type": "ack", "id": msg["id"], "frame": frame})

    async def _preview(self, page: _Page, msg: Mapping) -> None:
        block, port, kind = _protocol.check_preview(msg, self._blocks())
        key = (block.name, port)
        if key in page.previews:
            page.previews[key].kind = kind
            return
        if len(page.previews) >= MAX_PREVIEWS:
            raise Refused(f"at most {MAX_PREVIEWS} previews at a time; unpreview one first")
        engine = self._engine
        try:  # observe() may wait for the engine thread between frames: not on this loop
            obs = await asyncio.get_running_loop().run_in_executor(
                None, lambda: engine.observe(block[port], every=PREVIEW_FRAMES))
        except (RxcudaError, TypeError, ValueError, KeyError) as e:
            raise Refused(f"cannot preview {block.name}.{port}: {e}") from None
        preview = _Preview(block.name, port, kind, engine)
        preview.subscription = obs.subscribe(preview.on_next)
        page.previews[key] = preview

    def _blocks(self) -> dict[str, Any]:
        return {b.name: b for b in self._engine.blocks}

    def _build(self, make):
        try:
            return make(self._engine)
        except Exception as e:  # the engine closed or changed under us: the next change tries again
            log.debug("live view: %s failed: %s", make.__name__, e)
            return None

    # -- the pump: the collector's batches to every page ----------------------------------------------------
    async def _pump(self) -> None:
        wake = self._wake
        assert wake is not None
        last_send = last_status = 0.0
        while True:
            try:
                timeout = max(0.0, last_status + STATUS_EVERY - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout)
                wake.clear()
                wait = last_send + INTERVAL - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                last_send = now = time.monotonic()
                status_due = now - last_status >= STATUS_EVERY
                self._send(self._collector.drain(), status_due)
                if status_due:
                    last_status = now
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let one bad batch stop the view
                log.warning("live view: sending failed: %s: %s", type(e).__name__, e)
                await asyncio.sleep(INTERVAL)

    def _send(self, batch, status_due: bool) -> None:
        pages = [p for p in self._pages if p.ready]
        if not pages:
            if batch.graph:
                self._graph = None  # built again for the next page
            return
        msgs: list[dict] = []
        if batch.graph:
            graph = self._build(graph_message)
            if graph is not None:
                self._graph = graph
                self._names = {b["id"]: b["name"] for b in graph["blocks"]}
                msgs.append(graph)
        if batch.params:
            names = self._names
            if any(bid not in names for bid, _ in batch.params):
                names = self._names = {b.id: b.name for b in self._engine.blocks}
            values = {f"{names[bid]}.{n}": v for (bid, n), v in batch.params.items() if bid in names}
            if values:
                msgs.append({"type": "params", "values": values})
        if batch.frames or batch.marks:
            msgs.append({"type": "frames", "frames": batch.frames, "fps": batch.fps, "marks": batch.marks,
                         "blocks": batch.blocks})
        for d in batch.diagnostics:
            msgs.append({"type": "diagnostic", "severity": d.severity, "subject": d.subject, "message": d.message,
                         "frame": d.frame, "block": self._names.get(d.block) if d.block is not None else None})
        if batch.dropped:
            msgs.append({"type": "diagnostic", "severity": "warning", "subject": "live view", "frame": None,
                         "block": None, "message": f"{batch.dropped} more diagnostics in this interval were left "
                                                   f"out (engine.diagnostic_log has them)"})
        if batch.status or status_due:
            status = self._build(status_message)
            if status is not None:
                msgs.append(status)
        for page in pages:
            for m in msgs:
                page.put(m)
            for preview in list(page.previews.values()):
                m = preview.message()
                if m is not None:
                    page.put(m)


# -- one page ---------------------------------------------------------------------------------------------
class _Page:
    """One connected page: its outbox (merged, latest wins), its sender task, rate limit and previews."""

    def __init__(self, ws):
        self.ws = ws
        self.ready = False
        self.closing = False
        self.event = asyncio.Event()
        self.items: dict[str, dict] = {}  # graph, params, frames, status, hello: merged by kind
        self.queue: list[dict] = []  # diagnostics, previews, errors, acks, pongs: in order
        self.previews: dict[tuple[str, str], _Preview] = {}
        self.tokens = float(RATE)
        self.refilled = time.monotonic()
        self.limited_at = 0.0

    def allow(self) -> bool:
        """The rate limit (a token bucket of RATE a second); an excess message gets an error at most once a
        second."""
        now = time.monotonic()
        self.tokens = min(float(RATE), self.tokens + (now - self.refilled) * RATE)
        self.refilled = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        if now - self.limited_at >= 1.0:
            self.limited_at = now
            self.error(f"too many messages: at most {RATE} a second; the excess was ignored")
        return False

    def put(self, msg: dict) -> None:
        kind = msg["type"]
        old = self.items.get(kind)
        if kind == "frames" and old is not None:
            old["frames"] = (old["frames"] + msg["frames"])[-MAX_FRAMES:]
            old["marks"] = (old["marks"] + msg["marks"])[-MAX_FRAMES:]
            old["fps"] = msg["fps"]
            old["blocks"] = msg["blocks"] or old["blocks"]
        elif kind == "params" and old is not None:
            old["values"] = {**old["values"], **msg["values"]}
        elif kind in ("frames", "params", "graph", "status", "hello"):
            self.items[kind] = dict(msg)
        else:
            if kind == "diagnostic" and sum(1 for m in self.queue if m["type"] == "diagnostic") >= 4 * MAX_DIAGNOSTICS:
                return  # a page that stopped reading: keep the newest diagnostics the pump sends later
            self.queue.append(msg)
        self.event.set()

    def error(self, message: str) -> None:
        self.put({"type": "error", "message": message})

    def take(self) -> list[dict]:
        out = [self.items.pop(k) for k in ("hello", "graph", "params", "status", "frames") if k in self.items]
        out += self.queue
        self.queue = []
        return out

    async def send_loop(self) -> None:
        while True:
            await self.event.wait()
            self.event.clear()
            await self.flush()

    async def flush(self) -> None:
        for m in self.take():
            if self.ws.closed:
                return
            try:
                await self.ws.send_str(dumps(m))
            except (ConnectionError, RuntimeError):
                return

    async def close(self, code: int, reason: str) -> None:
        self.closing = True
        if not self.ws.closed:
            await self.ws.close(code=code, message=reason.encode())

    def drop_preview(self, key) -> None:
        p = self.previews.pop(key, None)
        if p is not None:  # ending an observe() may wait for the engine thread: not on the server's loop
            asyncio.get_running_loop().run_in_executor(None, p.dispose)

    def drop_previews(self) -> None:
        for key in list(self.previews):
            self.drop_preview(key)


class _Preview:
    """A sampled ``engine.observe()`` of one port for one page: the engine thread stores the latest array
    (one assignment), the pump samples it at most every PREVIEW_EVERY seconds."""

    def __init__(self, block: str, port: str, kind: str, engine: Engine):
        self.block, self.port, self.kind = block, port, kind
        self._engine = engine
        self.latest: tuple[int, Any] | None = None
        self.sent = 0.0
        self.subscription: Any = None

    def on_next(self, array) -> None:
        self.latest = (self._engine.frame, array)

    def dispose(self) -> None:
        sub, self.subscription = self.subscription, None
        if sub is not None:
            try:
                sub.dispose()
            except Exception as e:  # the engine stopped or closed meanwhile: nothing left to end
                log.debug("live view: ending a preview: %s", e)

    def message(self) -> dict | None:
        now = time.monotonic()
        latest = self.latest
        if latest is None or now - self.sent < PREVIEW_EVERY:
            return None
        self.latest, self.sent = None, now
        frame, array = latest
        return sample(self.block, self.port, self.kind, frame, array)


def sample(block: str, port: str, kind: str, frame: int, array) -> dict:
    """The ``preview`` message of one port's values: for ``line`` every ``stride``-th value (at most
    PREVIEW_POINTS: ``data[i]`` is element ``i * stride``), for ``hist`` HIST_BINS bins of the finite values.

    >>> sample("mul", "out", "line", 3, np.arange(2000, dtype=np.float32))["stride"]
    4
    >>> sample("mul", "out", "hist", 3, np.ones(10))["data"]["counts"][:2]
    [0, 0]
    """
    a = np.asarray(array)
    while a.dtype.names:  # structs and vector types (float4): their first field's values
        a = a[a.dtype.names[0]]
    try:
        flat = a.reshape(-1).astype(np.float64)
    except (TypeError, ValueError):
        flat = np.zeros(0)
    n = int(flat.size)
    msg: dict[str, Any] = {"type": "preview", "block": block, "port": port, "kind": kind, "frame": frame,
                           "count": n}
    if kind == "hist":
        finite = flat[np.isfinite(flat)]
        counts, edges = np.histogram(finite, bins=HIST_BINS) if finite.size else (np.zeros(HIST_BINS, int),
                                                                                  np.linspace(0, 1, HIST_BINS + 1))
        msg["data"] = {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}
        msg["stride"] = 1
    else:
        stride = max(1, math.ceil(n / PREVIEW_POINTS))
        msg["stride"] = stride
        msg["data"] = [float(v) if math.isfinite(v) else None for v in flat[::stride][:PREVIEW_POINTS].tolist()]
    return msg


def dumps(msg: dict) -> str:
    """Compact JSON; NaN and infinities (which JSON lacks) become null."""
    try:
        return json.dumps(msg, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_scrub(msg), separators=(",", ":"), allow_nan=False)


def _scrub(v):
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _scrub(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_scrub(x) for x in v]
    return v


def _middleware():
    """Headers on every response (made here: aiohttp is optional, imported only when a view starts)."""
    from aiohttp import web

    @web.middleware
    async def headers(request, handler):
        response = await handler(request)
        response.headers.setdefault("X-Frame-Options", "DENY")  # no other site frames the controls
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")  # the token stays out of Referer headers
        return response

    return headers


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> LiveView:
    """Serve ``engine`` as a live web page (installed as ``Engine.serve``); see :class:`LiveView`.

    ``port=0`` picks a free port (``view.url`` says which). A ``host`` other than 127.0.0.1/localhost/::1
    needs a token: pass one, or one is generated and logged once (``view.url`` carries it).

    >>> view = engine.serve()                                 # doctest: +SKIP
    >>> view.url                                              # doctest: +SKIP
    'http://127.0.0.1:53117/'
    """
    return LiveView(engine, host, port, token)


def _engine_serve(self: Engine, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> LiveView:
    """Serve this engine as a live web page: the pipeline as a graph with states, frame times, diagnostics,
    memory, and every scalar parameter as a control that sets it. Returns a :class:`rxcuda.view.LiveView`
    (``.url``; ``dispose()`` or a ``with`` block stops it; so does ``engine.close()``). Installed by
    ``rxcuda.view``; see :func:`rxcuda.view.serve`.

    >>> with engine.serve() as view:                          # doctest: +SKIP
    ...     print(view.url); running = engine.run(60); input()
    """
    return LiveView(self, host, port, token)


def install() -> None:
    """Attach ``serve`` to ``Engine`` (DESIGN.md: a convenience that reaches upward lives in the upper package)."""
    Engine.serve = _engine_serve  # type: ignore[attr-defined]


__all__ = ["LiveView", "LiveViewError", "install", "sample", "serve"]
