"""TLS contexts of the adapters' clients: trust roots only where a URL is https, never no checks."""

from __future__ import annotations

import ssl

from anvil_ctl.adapters.engine_http import context_for


class TestContextFor:
    def test_plain_http_clients_load_no_trust_roots_and_still_verify(self) -> None:
        tls = context_for("http://127.0.0.1:30000", None)
        assert tls.get_ca_certs() == [] and tls.cert_store_stats()["x509_ca"] == 0
        assert tls.verify_mode == ssl.CERT_REQUIRED and tls.check_hostname

    def test_an_https_url_gets_the_verifying_context_built_once(self) -> None:
        tls = context_for("http://127.0.0.1:30000", "https://router.example:8443")
        assert tls.verify_mode == ssl.CERT_REQUIRED and tls.check_hostname
        assert tls.cert_store_stats()["x509_ca"] > 0
        assert context_for("HTTPS://other.example") is tls

    def test_no_url_at_all_is_plain_http(self) -> None:
        assert context_for().cert_store_stats()["x509_ca"] == 0
