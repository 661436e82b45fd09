"""The stub engine's connections behave as the engines it stands in for: TCP_NODELAY on each."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from anvil_stub.options import parse_options
from anvil_stub.server import Handler, make_server


@pytest.fixture
def nodelay_seen() -> Iterator[tuple[str, list[int]]]:
    """A stub served in this process; each accepted connection's TCP_NODELAY, read after the
    handler's own set-up, goes into the list."""
    server, _state = make_server(parse_options(["--port", "0"], {}), [])
    seen: list[int] = []
    handler = server.RequestHandlerClass

    def setup(self: Handler) -> None:
        Handler.setup(self)
        seen.append(self.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server.RequestHandlerClass = type("Observed", (handler,), {"setup": setup})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


class TestConnections:
    def test_every_accepted_connection_has_tcp_nodelay_set(self, nodelay_seen: tuple[str, list[int]]) -> None:
        url, seen = nodelay_seen
        with httpx.Client(timeout=10) as client:  # one kept-alive connection, then a second
            assert client.get(f"{url}/health").status_code == 200
            assert client.post(f"{url}/v1/chat/completions", json={"messages": []}).status_code in (200, 400)
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 200
        assert len(seen) == 2 and all(seen), seen
