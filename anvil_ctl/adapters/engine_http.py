"""The ServerProbe port over httpx: /health, /v1/models, /metrics and the context probe of an engine.

TLS for the adapters' httpx clients (`context_for`): the costly trust roots are loaded only where
a URL is https; an all-`http://` client gets a context without roots, which fails closed."""

from __future__ import annotations

import socket
import ssl
import time
from functools import cache

import httpx

from anvil_ctl.core.errors import AdapterError, TransientError
from anvil_ctl.core.jsontypes import JSONValue
from anvil_ctl.core.model import ModelCard, PromptAnswer


@cache
def _verifying() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def context_for(*urls: str | None) -> ssl.SSLContext:
    if any(u is not None and u.lower().startswith("https:") for u in urls):
        return _verifying()
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, and trusts nothing: fails closed


def metric_samples(text: str, name: str, where: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each sample of `name` in Prometheus text; AdapterError naming `where` else."""
    from prometheus_client.parser import text_string_to_metric_families  # only where a metric is read

    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise AdapterError(f"{where}: not Prometheus text ({exc})") from exc
    return [(s.labels, s.value) for family in families for s in family.samples if s.name == name]


class HttpServerProbe:
    """One client for the probe's life: no trust roots (plain HTTP on loopback), no keep-alive."""

    def __init__(self, timeout_s: float = 5.0, transport: httpx.BaseTransport | None = None) -> None:
        self._timeout_s = timeout_s
        self._transport = transport
        self._client: httpx.Client | None = None

    def _get(self, url: str) -> httpx.Response:
        if self._client is None:
            self._client = httpx.Client(
                timeout=self._timeout_s,
                transport=self._transport,
                limits=httpx.Limits(max_keepalive_connections=0),
                verify=context_for(),  # engines answer plain HTTP at their loopback binding
            )
        return self._client.get(url)

    def get_json(self, url: str) -> JSONValue:
        """The JSON body of a GET that answered 2xx (httpx's errors otherwise)."""
        response = self._get(url).raise_for_status()
        body: JSONValue = response.json()
        return body

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def listening(self, base_url: str) -> bool:
        url = httpx.URL(base_url)
        try:
            with socket.create_connection((url.host, url.port or 80), timeout=self._timeout_s):
                return True
        except OSError:
            return False

    def health(self, base_url: str, path: str) -> bool:
        try:
            return self._get(base_url.rstrip("/") + path).status_code == 200
        except httpx.TransportError:
            return False

    def models(self, base_url: str) -> list[ModelCard]:
        try:
            r = self._get(base_url.rstrip("/") + "/v1/models")
        except httpx.TransportError:
            return []
        except httpx.HTTPError as exc:
            raise TransientError(f"{base_url}/v1/models: {exc}") from exc
        if r.status_code != 200:
            return []
        try:
            data = r.json().get("data", [])
            return [ModelCard(str(m["id"]), m.get("max_model_len")) for m in data]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise AdapterError(f"{base_url}/v1/models: not an OpenAI model list") from exc

    def running(self, base_url: str, metric: str) -> int | None:
        """The gauge `metric` on /metrics summed over its labels; None without an answer or the gauge."""
        try:
            r = self._get(base_url.rstrip("/") + "/metrics")
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        samples = metric_samples(r.text, metric, f"{base_url}/metrics")
        return round(sum(value for _, value in samples)) if samples else None

    def probe_prompt(self, base_url: str, model: str, words: int) -> PromptAnswer:
        """A chat of `words` one-token words, max_tokens 1 (a long timeout: the prompt may be evaluated)."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "a " * words}],
            "max_tokens": 1,
            "temperature": 0,
        }
        started = time.monotonic()
        try:
            with httpx.Client(timeout=max(self._timeout_s, 600.0), transport=self._transport) as client:
                r = client.post(base_url.rstrip("/") + "/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise TransientError(f"{base_url}/v1/chat/completions (context probe): {exc!r}") from exc
        return PromptAnswer(r.status_code, r.text[:1000], round(time.monotonic() - started, 3))
