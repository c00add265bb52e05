"""The live view: a running engine as a web page, parameters as controls (``engine.serve()``).

``LiveView(engine)`` (what ``engine.serve(host="127.0.0.1", port=0, token=None)`` calls) starts an aiohttp
server on a daemon thread with its own asyncio loop. ``GET /`` is the page and ``/static/...`` its assets
(shipped in ``rxcuda/view/static/``: no CDN), ``/ws`` the WebSocket that carries compact JSON both ways
(``rxcuda/view/PROTOCOL.md`` is the protocol).

What the page sees comes from the engine's streams (:mod:`rxcuda.view._collect`): subscribers on the engine
thread only store, and the server sends at most ~30 messages of each kind a second to each page, everything
since the last one batched, latest values winning, so a page never slows the frames. A ``set`` from a page
goes through the public path, ``block.set(name=v)``: every check Python makes refuses it the same way (its
message worded for a web page), else one change event, the same coalescing, a hot update of the next frame;
every page (and a change from Python or a bound stream) moves the sliders of every page.
``engine.serve(params=[...])`` shows only the parameters it names (``"block.param"`` or whole blocks).

Security: the server binds to 127.0.0.1 unless told otherwise, and refuses a WebSocket whose ``Origin`` is
not its own page (another site must not drive a local engine) and, on a local bind, requests whose ``Host``
is not local (DNS rebinding). Any other interface needs a token (generated when none is given, logged once
and kept in ``view.url``), checked on the page and in the WebSocket's hello. Page messages are limited in
size (4 KiB: an error; beyond the socket's 1 MiB: an error, then the socket closes) and rate (200 a
second), and can do nothing but set the scalar parameters the page shows and ask for previews of ports.

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
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..engine._engine import Engine
from ..model._errors import EngineClosedError, RxcudaError
from . import _protocol
from ._collect import Collector
from ._pages import RATE, Page, Preview, dumps, page_socket, sample
from ._protocol import Refused
from ._source import Source, as_source

log = logging.getLogger("rxcuda.view")

VERSION = 1
STATIC = Path(__file__).with_name("static")
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
INTERVAL = 1 / 30  # at most this often a page gets a message of each kind
STATUS_EVERY = 1.0  # seconds between status messages
MAX_FRAME_BYTES = 1 << 20  # the socket's own limit: a message beyond it gets an error, then the socket closes
PREVIEW_FRAMES = 4  # engine.observe(every=...) for a preview
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

    def __init__(self, engine: Engine | Source, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 params: Iterable | None = None):
        engine = as_source(engine)  # what the view reads of the engine, and nothing else (_source)
        if engine.closed:
            raise EngineClosedError("engine.serve: the engine is closed; serve a running engine")
        if not isinstance(host, str) or not host:
            raise TypeError(f"engine.serve(host=...) takes an interface address such as '127.0.0.1' (got {host!r})")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"engine.serve(port=...) takes 0 (any free port) to 65535 (got {port!r})")
        if token is not None and (not isinstance(token, str) or len(token) < 8 or not token.isprintable()):
            raise ValueError("engine.serve(token=...) takes a string of at least 8 printable characters, or None "
                             "(a non-local bind then gets a generated one)")
        self._exposed = None if params is None else exposed_names(engine, params)
        try:
            from aiohttp import web  # noqa: F401
        except ImportError as e:
            raise LiveViewError("the live view needs aiohttp: pip install '.[view]' in rxcuda's checkout (or pip "
                                "install aiohttp)") from e
        self.host = host
        self.local = host in LOCAL_HOSTS
        generated = token is None and not self.local
        self.token = secrets.token_urlsafe(24) if generated else token
        self._engine = engine
        self._pages: set[Page] = set()
        self._graph: dict | None = None  # the latest graph message
        self._names: dict[int, str] = {}  # block id -> name, for parameter changes
        self._closed = False
        self._stopped = threading.Event()  # set when the view stops (wait() returns)
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
        self._stopped.set()
        self._collector.dispose()
        self._done.dispose()
        loop = self._loop
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        if threading.current_thread() is not self._thread:
            self._thread.join(10)

    close = dispose

    def wait(self, seconds: float | None = None) -> bool:
        """Keep serving: block the calling thread for ``seconds`` (None: until the view stops), returning
        early when the view is disposed or the engine closes. Returns whether the view still serves. The
        server runs on its own thread either way; this only keeps a script (or a ``with`` block) alive while
        someone looks at the page. Ctrl-C ends the wait as usual. The environment variable
        ``RXCUDA_VIEW_WAIT_MAX`` (seconds) caps every wait: the tests that run the README's examples set it.

        >>> with engine.serve() as view:                       # doctest: +SKIP
        ...     print(view.url, "- serving for a minute (Ctrl-C stops)")
        ...     view.wait(60)
        """
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float)
                                    or not seconds >= 0):
            raise ValueError(f"view.wait(seconds) takes a number of seconds >= 0, or None for as long as the "
                             f"view serves (got {seconds!r})")
        cap = os.environ.get("RXCUDA_VIEW_WAIT_MAX")
        if cap:
            try:
                seconds = float(cap) if seconds is None else min(seconds, float(cap))
            except ValueError:
                raise ValueError(f"RXCUDA_VIEW_WAIT_MAX must be a number of seconds (got {cap!r})") from None
        self._stopped.wait(seconds)
        return not self._closed

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
        app.router.add_get("/favicon.ico", self._favicon)  # browsers ask for it whatever the page links
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

    async def _favicon(self, request):
        from aiohttp import web

        if not self._host_ok(request):
            return web.Response(status=403, text="the live view answers only to a local address")
        return web.FileResponse(STATIC / "favicon.svg", headers={"Content-Type": "image/svg+xml"})

    # -- the WebSocket --------------------------------------------------------------------------------------
    async def _socket(self, request):
        from aiohttp import WSCloseCode, WSMsgType, web

        origin = request.headers.get("Origin")
        expected = f"http://{request.host}"
        if not self._host_ok(request) or origin is None or origin.lower() != expected.lower():
            return web.Response(status=403, text=f"WebSocket refused: its Origin ({origin or 'none'}) is not this "
                                                 f"live view's page ({expected})")
        # aiohttp refuses a message from its header alone, closing while the sender may still be writing it (the
        # sender can then see a reset instead of the error): its limit sits above ours, so a message just over
        # ours is read whole and refused here, error first, then the close (1009)
        ws = page_socket(4 * MAX_FRAME_BYTES, f"message too long: over {MAX_FRAME_BYTES} bytes (a page message is at "
                                              f"most {_protocol.MAX_MESSAGE}); the live view closes this connection")
        await ws.prepare(request)
        page = Page(ws)
        self._pages.add(page)
        sender = asyncio.ensure_future(page.send_loop())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT and len(msg.data) * 4 > MAX_FRAME_BYTES \
                        and len(msg.data.encode()) > MAX_FRAME_BYTES:
                    await page.flush()
                    await ws.close(code=WSCloseCode.MESSAGE_TOO_BIG)  # sends the error first (page_socket)
                    break
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

    async def _receive(self, page: Page, text: str) -> None:
        if not page.allow():
            return
        msg: Mapping = {}
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
        except Refused as e:  # the refused message's id comes back with the error: the page knows its control
            page.error(str(e), msg.get("id"))

    async def _hello(self, page: Page, msg: Mapping) -> None:
        if not self._token_ok(msg.get("token")):
            page.error("wrong or missing token: open the address printed when the live view started")
            await page.flush()
            await page.close(CLOSE_BAD_TOKEN, "wrong token")
            return
        engine = self._engine
        if self._graph is None:
            self._graph = self._build(self._graph_message)
        page.ready = True
        page.put({"type": "hello", "version": VERSION, "engine": engine.about()})
        if self._graph is not None:
            page.put(self._graph)
        page.put({"type": "params", "values": {key: p.value for b in engine.blocks for n, p in b.params.items()
                                               if self._shows(key := f"{b.name}.{n}")}})
        status = self._build(engine.status)
        if status is not None:
            page.put(status)

    def _set(self, page: Page, msg: Mapping) -> None:
        block, name, value = _protocol.check_set(msg, self._blocks())
        if not self._shows(f"{block.name}.{name}"):
            shown = ", ".join(sorted(self._exposed or ())[:20]) or "none"
            raise Refused(f"{block.name}.{name} is not a control of this page: engine.serve(params=...) shows only "
                          f"{shown}")
        frame = self._engine.frame
        try:  # the public path Python takes, with every check it makes: one change event, a hot update
            self._engine.set(block, **{name: value})
        except (TypeError, ValueError, RxcudaError) as e:  # refused before anything was stored
            raise Refused(_protocol.for_page(str(e))) from None
        if "id" in msg:
            page.put({"type": "ack", "id": msg["id"], "frame": frame})

    async def _preview(self, page: Page, msg: Mapping) -> None:
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
                None, lambda: engine.observe(block[port], PREVIEW_FRAMES))
        except (RxcudaError, TypeError, ValueError, KeyError) as e:
            raise Refused(f"cannot preview {block.name}.{port}: {e}") from None
        preview = Preview(block.name, port, kind, engine)
        preview.subscription = obs.subscribe(preview.on_next)
        page.previews[key] = preview

    def _blocks(self) -> dict[str, Any]:
        return {b.name: b for b in self._engine.blocks}

    def _shows(self, key: str) -> bool:
        """Whether the page shows (and may set) the parameter ``"block.param"``."""
        return self._exposed is None or key in self._exposed

    def _graph_message(self) -> dict:
        """The graph message, with only the parameters this page shows."""
        graph = self._engine.graph()
        if self._exposed is not None:
            graph["blocks"] = [{**b, "params": [p for p in b["params"] if self._shows(f"{b['name']}.{p['name']}")]}
                               for b in graph["blocks"]]
        return graph

    def _build(self, make):
        try:
            return make()
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
            graph = self._build(self._graph_message)
            if graph is not None:
                self._graph = graph
                self._names = {b["id"]: b["name"] for b in graph["blocks"]}
                msgs.append(graph)
        if batch.params:
            names = self._names
            if any(bid not in names for bid, _ in batch.params):
                names = self._names = {b.id: b.name for b in self._engine.blocks}
            values = {key: v for (bid, n), v in batch.params.items()
                      if bid in names and self._shows(key := f"{names[bid]}.{n}")}
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
            status = self._build(self._engine.status)
            if status is not None:
                msgs.append(status)
        for page in pages:
            for m in msgs:
                page.put(m)
            for preview in list(page.previews.values()):
                m = preview.message()
                if m is not None:
                    page.put(m)


def exposed_names(engine: Engine | Source, params) -> frozenset[str]:
    """The ``"block.param"`` names ``engine.serve(params=...)`` shows: each item a name such as
    ``"damp.scale"``, or a block (or composite instance) of ``engine`` for all of its parameters.

    >>> import rxcuda
    >>> engine = rxcuda.Engine(driver=rxcuda.cuda.NullDriver())
    >>> mul = engine.add(rxcuda.Block.from_kernel("kernels/scalar_mul.ptx", size=16, name="mul"))
    >>> sorted(exposed_names(engine, ["mul.scale"])), sorted(exposed_names(engine, [mul]))
    (['mul.scale'], ['mul.n', 'mul.scale'])
    >>> exposed_names(engine, ["mul.gain"])
    Traceback (most recent call last):
    ...
    ValueError: engine.serve(params=...): mul has no parameter 'gain' (parameters: scale, n)
    >>> engine.close()
    """
    if isinstance(params, str) or not isinstance(params, Iterable):
        params = [params]
    blocks = {b.name: b for b in engine.blocks}
    ids = {id(b) for b in engine.blocks}
    out: set[str] = set()
    for item in params:
        if isinstance(item, str):
            name, dot, param = item.rpartition(".")
            block = blocks.get(name) if dot else None
            if block is None:
                known = ", ".join(sorted(blocks)[:20]) or "none"
                raise ValueError(f"engine.serve(params=...): {item!r} names no block's parameter; write "
                                 f"'block.param' with a block of this engine ({known})")
            if param not in block.params:
                raise ValueError(f"engine.serve(params=...): {name} has no parameter '{param}' (parameters: "
                                 f"{', '.join(block.params) or 'none'})")
            out.add(item)
            continue
        members = list(getattr(item, "blocks", None) or [item])  # a composite instance: its blocks
        for block in members:
            if id(block) not in ids:
                raise ValueError(f"engine.serve(params=...): {getattr(block, 'name', block)!r} is not a block of "
                                 "this engine; pass its 'block.param' names or a block engine.add returned")
            out.update(f"{block.name}.{n}" for n in block.params)
    return frozenset(out)


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


def serve(engine: Engine | Source, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
          params: Iterable | None = None) -> LiveView:
    """Serve ``engine`` as a live web page (what ``engine.serve()`` does); see :class:`LiveView`.

    ``port=0`` picks a free port (``view.url`` says which). A ``host`` other than 127.0.0.1/localhost/::1
    needs a token: pass one, or one is generated and logged once (``view.url`` carries it). ``params``
    limits the controls: a list of ``"block.param"`` names or blocks (all their parameters); the page shows
    only those, and a set of any other parameter from a page is refused with an error naming it. None (the
    default) shows every parameter.

    >>> view = engine.serve(params=["damp.scale", echo])      # doctest: +SKIP
    >>> view.url                                              # doctest: +SKIP
    'http://127.0.0.1:53117/'
    """
    return LiveView(engine, host, port, token, params)


__all__ = ["RATE", "LiveView", "LiveViewError", "dumps", "exposed_names", "sample", "serve"]
