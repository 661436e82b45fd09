"""TLS for the adapters' httpx clients: the costly trust roots are loaded only where a URL is
https; an all-`http://` client gets a context without roots, which fails closed."""

from __future__ import annotations

import ssl
from functools import cache


@cache
def _verifying() -> ssl.SSLContext:
    import httpx

    return httpx.create_ssl_context()


def context_for(*urls: str | None) -> ssl.SSLContext:
    if any(u is not None and u.lower().startswith("https:") for u in urls):
        return _verifying()
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, and trusts nothing: fails closed
