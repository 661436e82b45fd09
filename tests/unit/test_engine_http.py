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


# llama-server's /metrics with --metrics, as its handler writes it (ggml-org/llama.cpp
# tools/server/server.cpp): HELP, TYPE and one unlabelled sample per metric.
LLAMA_SERVER_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""


class TestRunningRequests:
    def test_llama_servers_gauge_is_what_its_profile_reads(self) -> None:
        from anvil_ctl.core.engine_profile import engine_profile

        metric = engine_profile("llama-server").running_metric
        assert metric == "llamacpp:requests_processing"
        p = probe(lambda req: httpx.Response(200, text=LLAMA_SERVER_METRICS))
        assert p.running("http://127.0.0.1:8001", metric) == 2

    def test_a_server_started_without_metrics_has_no_count(self) -> None:
        """llama-server without --metrics answers 501: None, and the drain asks the router."""
        answer = {"error": {"code": 501, "message": "This server does not support metrics endpoint."}}
        p = probe(lambda req: httpx.Response(501, json=answer))
        assert p.running("http://127.0.0.1:8001", "llamacpp:requests_processing") is None
