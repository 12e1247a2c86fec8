"""The monitoring endpoint: a small read-only HTTP server in threads of its own, beside the broker's loop.

Routes (``docs/monitoring.md`` describes each):

* ``/metrics``: Prometheus exposition, through prometheus-client (text, or OpenMetrics when asked);
* ``/healthz``: 200 while the broker is alive and its loop answers; 503 with a reason when the store failed,
  the broker is stopping, or the loop has not answered for ``LOOP_TIMEOUT``;
* ``/readyz``: 200 once the broker serves its doors; 503 while it starts (recovering its logs) or stops, and
  while a cluster member knows no leader to send clients to;
* ``/api/overview``, ``/api/stats``, ``/api/topics``, ``/api/topics/NAME``: JSON (:mod:`.views`);
* ``/`` and ``/static/...``: the dashboard, every file it needs served from ``static/``.

Why threads: the broker's loop must never wait for a client of this port, and rendering 10,000 topics as
Prometheus text or JSON takes tens of milliseconds of CPU. So a thread per request (at most
``MAX_REQUESTS`` at once; more are answered 503 at once, and a client has ``REQUEST_TIMEOUT`` to send its
request) does the HTTP and the rendering, and asks the loop only for a snapshot of the counters
(:func:`~broker.monitoring.snapshot.take`, run on the loop in short slices), shared by every request within
``SNAPSHOT_MAX_AGE``: a hundred scrapers cost the loop what one does.

Bound to a loopback address, the server answers only requests whose ``Host`` is a loopback name, so a web
page cannot read it through DNS rebinding.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import mimetypes
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from broker.config import BrokerConfig
from broker.monitoring import views
from broker.monitoring.metrics import BrokerCollector, version
from broker.monitoring.snapshot import Snapshot, name_of, take
from connector.addresses import is_loopback

if TYPE_CHECKING:
    from broker.server import Broker

log = logging.getLogger("mc0.monitoring")

T = TypeVar("T")

#: How long a request waits for the loop (a snapshot, a health check) before it reports the loop stalled.
LOOP_TIMEOUT = 2.0
#: Requests served at once; more are answered 503 at once. A dashboard and a few scrapers need a handful.
MAX_REQUESTS = 8
#: Seconds a client has to send its request (and to read the answer) before its connection is closed.
REQUEST_TIMEOUT = 10.0
#: A snapshot this young is served again instead of taking a new one: the dashboard polls every second,
#: Prometheus every 15 s or so; sharing keeps the loop's cost independent of how many watch.
SNAPSHOT_MAX_AGE = 0.5
#: The dashboard's files.
STATIC = Path(__file__).parent / "static"
#: Every HTML page's policy: nothing is loaded from anywhere but this server.
CONTENT_SECURITY_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"


class Unavailable(Exception):
    """The loop cannot answer now (starting, stopping, or stalled); the message says which."""


class Monitor:
    """The monitoring endpoint of one broker: its HTTP server thread and what the handlers read."""

    def __init__(self, host: str, port: int, *, topic_labels: int, data_dir: Path | None = None) -> None:
        self.server = _Server((host, port), self)
        self.address: tuple[str, int] = self.server.server_address[:2]  # type: ignore[assignment]
        self.loopback = is_loopback(host)
        self.broker: Broker | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self._closed = False
        self._lock = threading.Lock()  # one snapshot at a time; the others wait for it and share it
        self._cached: Snapshot | None = None
        self._cached_at = 0.0
        # Pages rendered from the cached snapshot, by name: rendering 10,000 topics costs CPU that the loop's
        # thread competes for (the GIL), so a page is rendered once per snapshot however many ask for it.
        self._rendered: dict[str, bytes] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(self.latest, topic_labels, data_dir))
        ProcessCollector(registry=self.registry)  # process_open_fds, process_max_fds, CPU, memory, start
        PlatformCollector(registry=self.registry)
        self.files = {path.name: path.read_bytes() for path in STATIC.iterdir() if path.is_file()}
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                       name="mc0-http", daemon=True)
        self.thread.start()

    @classmethod
    def start(cls, config: BrokerConfig) -> Monitor | None:
        """The endpoint ``config`` asks for, listening; None when it is off, or when the *default* port is
        taken (a warning: several brokers on one machine must still start with their defaults). A port asked
        for explicitly that cannot be bound is an OSError naming it."""
        address = config.http_address
        if address is None:
            return None
        host, port = address
        try:
            monitor = cls(host, port, topic_labels=config.http_topic_labels, data_dir=config.data_dir)
        except OSError as error:
            where = f"monitoring endpoint on {host}:{port}"
            if config.http is None:
                log.warning("%s: %s; running without it (choose another with --http HOST:PORT, or off)",
                            where, error.strerror)
                return None
            raise OSError(error.errno, f"{where}: {error.strerror}") from None
        log.info("monitoring on http://%s/ (metrics, health, dashboard)", monitor.where)
        return monitor

    @property
    def where(self) -> str:
        host, port = self.address
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def attach(self, broker: Broker) -> None:
        """The broker serves: from now on requests read it (called on its loop)."""
        self.loop = asyncio.get_running_loop()
        self.broker = broker

    def detach(self) -> None:
        """The broker is stopping: from now on requests are answered "stopping", never read the broker."""
        self.stopping = True

    def close(self) -> None:
        """Stop answering and stop the server thread. Idempotent."""
        self.stopping = True
        if self._closed:
            return
        self._closed = True
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    # ------------------------------------------------------------------------------------ what handlers read

    def on_loop(self, work: Callable[[Broker], Coroutine[Any, Any, T]]) -> T:
        """Run ``work(broker)`` on the broker's loop and wait for it (Unavailable if it cannot answer)."""
        broker, loop = self.broker, self.loop
        if self.stopping:
            raise Unavailable("stopping")
        if broker is None or loop is None:
            raise Unavailable("starting: the broker is opening its store and its doors")
        coroutine = work(broker)
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        except RuntimeError:  # the loop is closed
            coroutine.close()
            raise Unavailable("stopping") from None
        try:
            return future.result(LOOP_TIMEOUT)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise Unavailable(f"the broker's loop has not answered for {LOOP_TIMEOUT:g} s") from None
        except concurrent.futures.CancelledError:
            raise Unavailable("stopping") from None

    def snapshot(self) -> Snapshot:
        """Every topic's counters, at most ``SNAPSHOT_MAX_AGE`` old."""
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached_at > SNAPSHOT_MAX_AGE:
                self._cached = self.on_loop(take)
                self._cached_at = time.monotonic()
                self._rendered = {}
            return self._cached

    def rendered(self, page: str, render: Callable[[Snapshot], bytes]) -> bytes:
        """``render(snapshot)`` of the current snapshot, rendered once per snapshot and page."""
        snapshot = self.snapshot()
        with self._lock:
            body = self._rendered.get(page) if self._cached is snapshot else None
        if body is None:
            body = render(snapshot)
            with self._lock:
                if self._cached is snapshot:
                    self._rendered[page] = body
        return body

    def latest(self) -> Snapshot | None:
        """For the metrics: a snapshot, or None while the broker starts."""
        return None if self.broker is None else self.snapshot()

    def topic(self, name: str) -> Snapshot:
        """A fresh snapshot of the one topic called ``name`` (none in it if there is no such topic)."""

        async def one(broker: Broker) -> Snapshot:
            raw = name.encode("utf-8", "surrogateescape")
            topics = broker.engine.topics
            if raw not in topics:  # a name with bytes that are not UTF-8 is shown escaped: look for it
                raw = next((key for key in topics if name_of(key) == name), raw)
            return await take(broker, [raw])

        return self.on_loop(one)

    def health(self, ready: bool) -> tuple[int, dict[str, Any]]:
        """/healthz (``ready`` False) or /readyz: the status code and the JSON body."""
        if self.broker is None and not self.stopping:
            if ready:
                return 503, {"status": "starting", "reason": "the broker is opening its store and its doors"}
            return 200, {"status": "starting"}

        async def check(broker: Broker) -> tuple[BaseException | None, bool, str | None]:
            hub = broker.hub
            return hub.failure, hub.closed, hub.unready() if ready else None

        try:
            failure, closed, unready = self.on_loop(check)
        except Unavailable as error:
            return 503, {"status": "unavailable", "reason": str(error)}
        if failure is not None:
            return 503, {"status": "failing", "reason": f"{type(failure).__name__}: {failure}"}
        if closed:
            return 503, {"status": "unavailable", "reason": "stopping"}
        if unready is not None:
            return 503, {"status": "unavailable", "reason": unready}
        return 200, {"status": "ready" if ready else "ok"}

    def broker_info(self) -> dict[str, Any]:
        broker = self.broker
        assert broker is not None
        config = broker.config
        return {"version": version(), "pid": os.getpid(), "endpoint": broker.endpoint, "curve": config.curve,
                "data_dir": str(config.data_dir), "http": self.where,
                "gateways": {name: "{}:{}".format(*broker.gateway_address(name)) for name in broker.gateways}}


class _Server(ThreadingHTTPServer):
    """A threading HTTP server with a bound on concurrent requests."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], monitor: Monitor) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.monitor = monitor
        self.slots = threading.BoundedSemaphore(MAX_REQUESTS)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # Not HTTPServer's: it looks the host's name up (getfqdn), which can hang where DNS is missing.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]  # type: ignore[assignment]

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                                b"Connection: close\r\nRetry-After: 1\r\n\r\ntoo many requests at once\n")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT
    _body = True  # False answering HEAD: headers only
    server_version = "mc0"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, _json({"error": "read-only: GET and HEAD only"}),
                   "application/json", extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    # ------------------------------------------------------------------------------------------------ routes

    def _answer(self, body: bool) -> None:
        self._body = body
        monitor = self.server.monitor
        if monitor.loopback and not _loopback_host(self.headers.get("Host", "")):
            self._error(HTTPStatus.FORBIDDEN, "this endpoint answers loopback host names only")
            return
        url = urlsplit(self.path)
        path = url.path
        try:
            query = {key: values[-1] for key, values in parse_qs(url.query).items()}
            if path == "/metrics":
                self._metrics(monitor)
            elif path in ("/healthz", "/readyz"):
                code, document = monitor.health(ready=path == "/readyz")
                self._send(code, _json(document), "application/json")
            elif path == "/api/overview":
                self._send(HTTPStatus.OK, monitor.rendered(path, lambda snapshot: _json(
                    views.overview(snapshot, monitor.broker_info()))), "application/json")
            elif path == "/api/stats":
                body = monitor.rendered(path, lambda snapshot: _json(views.stats(snapshot)))
                self._send(HTTPStatus.OK, body, "application/json")
            elif path in ("/api/topics", "/api/topics/"):
                self._json(views.topics(monitor.snapshot(), **_topic_query(query)))
            elif path.startswith("/api/topics/"):
                self._topic(monitor, unquote(path.removeprefix("/api/topics/"), errors="surrogateescape"))
            elif path == "/" or path.startswith("/static/"):
                self._file(monitor, "index.html" if path == "/" else path.removeprefix("/static/"))
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no such page: {path} (see /api/overview, /metrics, /)")
        except Unavailable as error:
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, str(error))
        except _BadRequest as error:
            self._error(HTTPStatus.BAD_REQUEST, str(error))
        except Exception:
            log.exception("monitoring: %s failed", path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "the page failed; the broker's log has the error")

    def _metrics(self, monitor: Monitor) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        if monitor.broker is None:  # starting: what there is (process metrics, mc0_ready 0), not cached
            body = encoder(monitor.registry)
        else:
            body = monitor.rendered(content_type, lambda _: encoder(monitor.registry))
        self._send(HTTPStatus.OK, body, content_type)

    def _topic(self, monitor: Monitor, name: str) -> None:
        found = monitor.topic(name).topics
        if not found:
            self._error(HTTPStatus.NOT_FOUND, f"no topic {name!r}")
            return
        self._json(views.topic_page(found[0]))

    def _file(self, monitor: Monitor, name: str) -> None:
        data = monitor.files.get(name)
        if data is None:
            self._error(HTTPStatus.NOT_FOUND, f"no such file: {name}")
            return
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind.endswith("javascript"):
            kind += "; charset=utf-8"
        extra = {"Content-Security-Policy": CONTENT_SECURITY_POLICY} if name.endswith(".html") else {}
        self._send(HTTPStatus.OK, data, kind, extra=extra)

    # ----------------------------------------------------------------------------------------------- replies

    def _json(self, document: Any) -> None:
        self._send(HTTPStatus.OK, _json(document), "application/json")

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, _json({"error": message}), "application/json")

    def _send(self, status: int, data: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self._body:
            with contextlib.suppress(OSError):  # the client went away: nothing to tell it
                self.wfile.write(data)


class _BadRequest(Exception):
    pass


def _topic_query(query: dict[str, str]) -> dict[str, Any]:
    """/api/topics's parameters: sort, limit, offset, match."""
    options: dict[str, Any] = {"sort": query.get("sort", "name"), "match": query.get("match", "")}
    if options["sort"] not in views.SORTS:
        raise _BadRequest(f"sort must be one of {', '.join(views.SORTS)}")
    for key in ("limit", "offset"):
        if key in query:
            text = query[key]
            if not text.isdigit():
                raise _BadRequest(f"{key} must be a whole number, not {text!r}")
            options[key] = int(text)
    return options


def _json(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def _loopback_host(header: str) -> bool:
    """A Host header that names a loopback address (with or without a port)."""
    host = header.strip()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    else:
        host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return is_loopback(host.lower())

