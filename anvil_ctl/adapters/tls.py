"""TLS for the adapters' httpx clients: trust roots are loaded only where a URL is https.

Building an httpx client builds an SSL context, and loading the CA bundle into it
is costly, for every client of every command, although the
engines, the stub's GPU endpoint and usually the router speak plain HTTP on
127.0.0.1. A client whose URLs are all `http://` gets a context without trust
roots: it never needs one, and if it were ever sent to an https URL it could not
complete a handshake (it fails closed, it never skips verification). A client with
an `https://` URL gets the default verifying context, built once per process.
"""

from __future__ import annotations

import ssl
from functools import cache


@cache
def _verifying() -> ssl.SSLContext:
    import httpx

    return httpx.create_ssl_context()


def context_for(*urls: str | None) -> ssl.SSLContext:
    """The SSL context for a client that talks to `urls`."""
    if any(u is not None and u.lower().startswith("https:") for u in urls):
        return _verifying()
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, and trusts nothing: fails closed
