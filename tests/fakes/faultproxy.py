"""A small HTTP/1.1 reverse proxy for tests that injects transient faults.

It sits between an HTTP client (the Azure SDK) and a local server (Azurite) and, per
request, may answer ``503 Server Busy`` without forwarding, reset the connection before
forwarding, reset it *after* forwarding (the server did the work, the client never heard),
or delay before forwarding.  Everything else is relayed unchanged.  Standard library only.

    with FaultProxy(azurite_port, fail_ratio=0.3, reset_ratio=0.1, seed=1) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/devstoreaccount1"
        ...
        proxy.set_faults(fail_ratio=0.0, reset_ratio=0.0)
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["FaultProxy"]

_CHUNK = 1 << 20  # bytes per read/write while streaming bodies
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "expect",
}
_BUSY_BODY = b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code><Message>injected</Message></Error>'
_METHODS = ("GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "MERGE")

# The fault drawn for one request.
_FORWARD, _FAIL, _RESET_BEFORE, _RESET_AFTER = "forward", "fail", "reset_before", "reset_after"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy

    def handle_error(self, request, client_address):  # quiet: clients drop connections on purpose
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FaultProxy"
    timeout = 60  # idle keep-alive connections end after this long
    server: _Server

    def setup(self):
        super().setup()
        self.server.proxy._track(self.connection, add=True)

    def finish(self):
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.proxy._track(self.connection, add=False)

    def log_message(self, format, *args):
        pass

    def _handle(self):
        try:
            self.server.proxy._serve(self)
        except (OSError, http.client.HTTPException):  # a side went away: drop this connection
            self.close_connection = True


for _method in _METHODS:
    setattr(_Handler, "do_" + _method, _Handler._handle)
del _method


class FaultProxy:
    """Reverse proxy on 127.0.0.1 (free port) to ``127.0.0.1:target_port`` with injected faults."""

    def __init__(
        self,
        target_port: int,
        *,
        fail_ratio: float = 0.0,
        reset_ratio: float = 0.0,
        delay_ratio: float = 0.0,
        delay_seconds: float = 0.0,
        seed: int = 0,
        only_methods: set[str] | None = None,
    ):
        self.target_port = target_port
        self.fail_ratio = fail_ratio
        self.reset_ratio = reset_ratio
        self.delay_ratio = delay_ratio
        self.delay_seconds = delay_seconds
        self.only_methods = {m.upper() for m in only_methods} if only_methods is not None else None
        self._check_ratios()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self.stats: dict = {
            "requests": 0,
            "forwarded": 0,
            "failed_503": 0,
            "resets": 0,
            "resets_before": 0,
            "resets_after": 0,
            "delayed": 0,
            "by_method": {},
        }
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"faultproxy-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self._server.server_close()
        with self._lock:
            open_connections = list(self._connections)
        for conn in open_connections:  # wake handler threads blocked on idle keep-alive reads
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_faults(
        self,
        fail_ratio: float | None = None,
        reset_ratio: float | None = None,
        delay_ratio: float | None = None,
        delay_seconds: float | None = None,
    ) -> None:
        """Change fault ratios while running; arguments left as None keep their value."""
        with self._lock:
            if fail_ratio is not None:
                self.fail_ratio = fail_ratio
            if reset_ratio is not None:
                self.reset_ratio = reset_ratio
            if delay_ratio is not None:
                self.delay_ratio = delay_ratio
            if delay_seconds is not None:
                self.delay_seconds = delay_seconds
            self._check_ratios()

    def _check_ratios(self) -> None:
        for name in ("fail_ratio", "reset_ratio", "delay_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if self.fail_ratio + self.reset_ratio > 1.0:
            raise ValueError("fail_ratio + reset_ratio must not exceed 1")

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)

    # -- per request -------------------------------------------------------------------------

    def _draw(self, method: str) -> tuple[str, float]:
        """Pick this request's fault and delay (thread-safe) and count it."""
        with self._lock:
            self.stats["requests"] += 1
            self.stats["by_method"][method] = self.stats["by_method"].get(method, 0) + 1
            if self.only_methods is not None and method not in self.only_methods:
                return _FORWARD, 0.0
            roll = self._rng.random()
            half_reset = self.reset_ratio / 2
            if roll < self.fail_ratio:
                fault = _FAIL
            elif roll < self.fail_ratio + half_reset:
                fault = _RESET_BEFORE
            elif roll < self.fail_ratio + self.reset_ratio:
                fault = _RESET_AFTER
            else:
                fault = _FORWARD
            delay = 0.0
            if fault != _FAIL and fault != _RESET_BEFORE and self._rng.random() < self.delay_ratio:
                delay = self.delay_seconds
            return fault, delay

    def _count(self, *keys: str) -> None:
        with self._lock:
            for key in keys:
                self.stats[key] += 1

    def _serve(self, h: _Handler) -> None:
        method = h.command.upper()
        fault, delay = self._draw(method)

        if fault == _RESET_BEFORE:
            self._count("resets", "resets_before")
            self._reset(h)
            return

        if fault == _FAIL:
            self._drain_body(h)
            self._count("failed_503")
            h.send_response_only(503, "Server Busy")
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(_BUSY_BODY)))
            h.send_header("x-ms-error-code", "ServerBusy")
            h.send_header("x-ms-request-id", "faultproxy")
            h.send_header("Date", h.date_time_string())
            if h.close_connection:
                h.send_header("Connection", "close")
            h.end_headers()
            if method != "HEAD":
                h.wfile.write(_BUSY_BODY)
            return

        if delay > 0:
            self._count("delayed")
            time.sleep(delay)

        upstream = http.client.HTTPConnection("127.0.0.1", self.target_port, timeout=120)
        try:
            try:
                response = self._forward(h, upstream, method)
            except (OSError, http.client.HTTPException):
                self._reply_bad_gateway(h)
                return
            self._count("forwarded")
            if fault == _RESET_AFTER:
                try:  # let the server finish its work, then never tell the client
                    while response.read(_CHUNK):
                        pass
                except (OSError, http.client.HTTPException):
                    pass
                self._count("resets", "resets_after")
                self._reset(h)
                return
            self._relay(h, response, method)
        finally:
            upstream.close()

    @staticmethod
    def _reset(h: _Handler) -> None:
        """Close the client connection abruptly so it sees ECONNRESET."""
        h.close_connection = True
        conn = h.connection
        try:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        try:
            h.rfile.close()  # drop the makefile reference so close() really closes (RST)
        except OSError:
            pass
        conn.close()

    @staticmethod
    def _body_chunks(h: _Handler):
        """Yield the request body in pieces (Content-Length or chunked), unbounded in size."""
        if "chunked" in h.headers.get("Transfer-Encoding", "").lower():
            while True:
                line = h.rfile.readline(65537)
                if not line:
                    raise ConnectionError("client closed inside a chunked body")
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while h.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return
                remaining = size
                while remaining:
                    data = h.rfile.read(min(remaining, _CHUNK))
                    if not data:
                        raise ConnectionError("client closed inside a chunked body")
                    remaining -= len(data)
                    yield data
                h.rfile.readline(3)
            return
        remaining = int(h.headers.get("Content-Length") or 0)
        while remaining > 0:
            data = h.rfile.read(min(remaining, _CHUNK))
            if not data:
                raise ConnectionError("client closed inside the body")
            remaining -= len(data)
            yield data

    def _drain_body(self, h: _Handler) -> None:
        for _ in self._body_chunks(h):
            pass

    def _forward(self, h: _Handler, upstream: http.client.HTTPConnection, method: str) -> http.client.HTTPResponse:
        chunked = "chunked" in h.headers.get("Transfer-Encoding", "").lower()
        body = b"".join(self._body_chunks(h)) if chunked else None  # rare: re-frame with a length
        upstream.putrequest(method, h.path, skip_host=True, skip_accept_encoding=True)
        for name, value in h.headers.items():
            lower = name.lower()
            if lower in _HOP_BY_HOP or (chunked and lower == "content-length"):
                continue
            upstream.putheader(name, value)
        if chunked:
            upstream.putheader("Content-Length", str(len(body)))
        upstream.endheaders()
        if chunked:
            upstream.send(body)
        else:
            for data in self._body_chunks(h):
                upstream.send(data)
        return upstream.getresponse()

    @staticmethod
    def _relay(h: _Handler, response: http.client.HTTPResponse, method: str) -> None:
        no_body = method == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200
        chunked = response.chunked and not no_body
        h.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() in _HOP_BY_HOP:
                continue
            h.send_header(name, value)
        buffered = None
        if chunked:
            h.send_header("Transfer-Encoding", "chunked")
        elif not no_body and response.length is None:
            buffered = response.read()  # length only known at EOF: buffer and send one
            h.send_header("Content-Length", str(len(buffered)))
        if h.close_connection:
            h.send_header("Connection", "close")
        h.end_headers()
        if no_body:
            return
        if buffered is not None:
            h.wfile.write(buffered)
            return
        while True:
            data = response.read(_CHUNK)
            if not data:
                break
            if chunked:
                h.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
            else:
                h.wfile.write(data)
        if chunked:
            h.wfile.write(b"0\r\n\r\n")
        elif response.length:  # upstream ended early: the client must not reuse this connection
            h.close_connection = True

    @staticmethod
    def _reply_bad_gateway(h: _Handler) -> None:
        body = b"<Error><Code>BadGateway</Code><Message>upstream unreachable</Message></Error>"
        h.close_connection = True
        h.send_response_only(502, "Bad Gateway")
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write(body)
