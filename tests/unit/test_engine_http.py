"""The HTTP engine probe reads health and the served model list, and tolerates a down engine."""

from __future__ import annotations

import httpx
import pytest

from anvil_ctl.adapters.engine_http import HttpServerProbe
from anvil_ctl.core.errors import AdapterError
from anvil_ctl.core.model import ModelCard


def probe(handler) -> HttpServerProbe:  # type: ignore[no-untyped-def]
    return HttpServerProbe(transport=httpx.MockTransport(handler))


class TestHttpEngineProbe:
    def test_reads_health_and_models_with_max_model_len(self) -> None:
        def handler(req: httpx.Request) -> httpx.Response:
            if req.url.path == "/health":
                return httpx.Response(200)
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 393216}]})

        p = probe(handler)
        assert p.health("http://127.0.0.1:8001", "/health") is True
        assert p.models("http://127.0.0.1:8001") == [ModelCard("m", 393216)]

    def test_a_refused_connection_is_unhealthy_and_serves_nothing(self) -> None:
        def handler(req: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("refused", request=req)

        p = probe(handler)
        assert p.health("http://127.0.0.1:8001", "/health") is False
        assert p.models("http://127.0.0.1:8001") == []

    def test_a_non_openai_answer_is_an_adapter_error(self) -> None:
        p = probe(lambda req: httpx.Response(200, json=["not", "a", "list"]))
        with pytest.raises(AdapterError, match="not an OpenAI model list"):
            p.models("http://127.0.0.1:8001")
