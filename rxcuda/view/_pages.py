"""One connected page of the live view (``_serve``): its outbox, rate limit and port previews, and the JSON
the server sends (``rxcuda/view/PROTOCOL.md``).

A page's outbox merges what the pump puts (``graph``, ``params``, ``frames``, ``status``: the latest wins, frames
are appended) and keeps the rest in order (diagnostics, previews, errors, acks), so a slow page gets fewer,
larger messages and never holds up the engine.

>>> dumps({"type": "preview", "data": [1.0, float("nan")]})
'{"type":"preview","data":[1.0,null]}'
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
from typing import Any

import numpy as np

from ._collect import MAX_DIAGNOSTICS, MAX_FRAMES

log = logging.getLogger("rxcuda.view")

RATE = 200  # page messages a second (a burst of as many is allowed)
PREVIEW_EVERY = 0.25  # seconds between two previews of one port
PREVIEW_POINTS = 512
HIST_BINS = 32


# -- one page ---------------------------------------------------------------------------------------------
class Page:
    """One connected page: its outbox (merged, latest wins), its sender task, rate limit and previews."""

    def __init__(self, ws):
        self.ws = ws
        self.ready = False
        self.closing = False
        self.event = asyncio.Event()
        self.items: dict[str, dict] = {}  # graph, params, frames, status, hello: merged by kind
        self.queue: list[dict] = []  # diagnostics, previews, errors, acks, pongs: in order
        self.previews: dict[tuple[str, str], Preview] = {}
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

    def error(self, message: str, id: Any = None) -> None:
        self.put({"type": "error", "message": message} if id is None else {"type": "error", "message": message,
                                                                           "id": id})

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


class Preview:
    """A sampled ``engine.observe()`` of one port for one page: the engine thread stores the latest array
    (one assignment), the pump samples it at most every PREVIEW_EVERY seconds."""

    def __init__(self, block: str, port: str, kind: str, engine: Any):  # an Engine, or the view's _source.Source
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




@functools.cache
def _socket_class():
    """aiohttp's WebSocketResponse that says why before it closes for a message over its limit (made here:
    aiohttp is optional, imported only when a view starts)."""
    from aiohttp import WSCloseCode, web

    class Socket(web.WebSocketResponse):
        too_big = ""

        async def close(self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True) -> bool:
            # aiohttp's reader refuses a message over max_msg_size from its header and closes with 1009 at
            # once; the page gets an error first, as for any other refused message
            if code == WSCloseCode.MESSAGE_TOO_BIG and not self.closed:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await self.send_str(dumps({"type": "error", "message": self.too_big}))
                message = message or b"message too big"
            return await super().close(code=code, message=message, drain=drain)

    return Socket


def page_socket(limit: int, too_big: str):
    """A WebSocket response taking messages of at most ``limit`` bytes; a bigger one is answered with the
    error ``too_big``, then the socket closes with code 1009 (Message Too Big)."""
    ws = _socket_class()(max_msg_size=limit, heartbeat=None)
    ws.too_big = too_big
    return ws


__all__ = ["HIST_BINS", "PREVIEW_EVERY", "PREVIEW_POINTS", "RATE", "Page", "Preview", "dumps", "page_socket", "sample"]
