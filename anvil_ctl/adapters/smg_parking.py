"""The parking responder: where smg routes a drained tier's aliases until a serve is routed again.

smg answers a non-retryable `404 model_not_found` once no worker serves an alias, but `503` with
`Retry-After: 1` while one is registered and unavailable. So a drained tier's alias is registered
on a worker (label `anvil.parked`) at this loopback responder, under its own path
(`/parked/<id>`), which answers every request 503 with `Retry-After: 1`; readmission removes it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

UNAVAILABLE = json.dumps(
    {
        "error": {
            "message": "the serve behind this model is being replaced; retry shortly",
            "type": "server_error",
            "code": "service_unavailable",
        }
    }
).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def _send(self, status: int, body: bytes, retry_after: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if retry_after:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path.endswith("/v1/models"):
            self._send(200, b'{"object":"list","data":[{"id":"anvil-parked","object":"model"}]}')
        elif path.endswith("/health"):
            self._send(200, b'{"status":"ok"}')
        else:
            self._send(404, b'{"error":{"message":"not found"}}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(503, UNAVAILABLE, retry_after=True)


class ParkingResponder:
    """A loopback HTTP server on a free port, served from a daemon thread until `close`."""

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2})
        self._thread.daemon = True
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
