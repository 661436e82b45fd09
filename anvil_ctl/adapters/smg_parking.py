"""The parking responder: where smg routes a drained tier's aliases until a serve is routed again.

smg answers a non-retryable `404 model_not_found` once no worker serves an alias, but `503` with
`Retry-After: 1` while one is registered and unavailable. So a drained tier's alias is registered
on a worker (label `anvil.parked`) at this loopback responder, under its own path
(`/parked/<key>`), which answers every request 503 with `Retry-After: 1`; readmission removes it.

A park that this process will end itself (the serve it starts next is routed in the same run)
holds each request instead, for at most its hold: at the hand-over to the routed serve the held
requests are sent on to it and its answer relayed, so a client is answered as soon as the route
is back rather than at smg's next retry. A request still held at the deadline gets the 503.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

UNAVAILABLE = (
    b'{"error": {"message": "the serve behind this model is being replaced; retry shortly", '
    b'"type": "server_error", "code": "service_unavailable"}}'
)


@dataclass
class _Park:
    until: float  # monotonic: requests are held until then at most
    target: str | None = None  # the routed serve's base URL, once handed over


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

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
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _, _, key, rest = [*self.path.split("/", 3), "", "", ""][:4]
        target = self.server.responder.wait_for_target(key)
        if target is None or not self._relay(f"{target}/{rest}", body):
            self._send(503, UNAVAILABLE, retry_after=True)

    def _relay(self, url: str, body: bytes) -> bool:
        """Send the request on to the routed serve and relay its answer as it comes (chunked);
        False when the serve could not be reached (nothing was sent back yet)."""
        headers = {"Content-Type": self.headers.get("Content-Type") or "application/json"}
        try:
            with self.server.client.stream("POST", url, content=body, headers=headers) as answer:
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("Content-Type", "application/json"))
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in answer.iter_bytes():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
        except httpx.TransportError:
            return False
        return True


class _Server(ThreadingHTTPServer):
    responder: ParkingResponder
    client: httpx.Client


class ParkingResponder:
    """A loopback HTTP server on a free port, served from a daemon thread until `close`."""

    def __init__(self) -> None:
        self._parks: dict[str, _Park] = {}
        self._changed = threading.Condition()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.responder = self
        self._server.client = httpx.Client(timeout=httpx.Timeout(10.0, read=None))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2})
        self._thread.daemon = True
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def hold(self, key: str, seconds: float) -> None:
        """Requests to `/parked/<key>` wait up to `seconds` from now for `hand_over`."""
        with self._changed:
            self._parks[key] = _Park(until=time.monotonic() + seconds)

    def hand_over(self, key: str, target: str) -> None:
        """The held requests of `key` (and any that still come) go on to `target`."""
        with self._changed:
            park = self._parks.get(key)
            if park is not None:
                park.target = target.rstrip("/")
                self._changed.notify_all()

    def wait_for_target(self, key: str) -> str | None:
        with self._changed:
            park = self._parks.get(key)
            while park is not None and park.target is None:
                left = park.until - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            return park.target if park is not None else None

    def close(self) -> None:
        with self._changed:  # nothing is handed over any more: what is held gets its 503 now
            for park in self._parks.values():
                park.until = 0.0
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._server.client.close()
