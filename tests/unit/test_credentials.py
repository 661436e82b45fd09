"""Router credentials: env first, then an owner-only TOML file; a token never shows in text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from anvil_ctl.adapters.credentials import (
    RouterCredentials,
    Secret,
    check_private_file,
    resolve_credentials,
    resolve_token,
)
from anvil_ctl.bootstrap import UnresolvedCredentialsRouter
from anvil_ctl.config.host import RouterConfig
from anvil_ctl.core.errors import AuthRejected, CredentialError
from anvil_ctl.core.ports import Router

ADMIN = "adm-4f1c2e-secret"
CLIENT = "cli-9b7a55-secret"


@pytest.fixture
def cred_file(tmp_path: Path):
    def make(text: str = f'admin_token = "{ADMIN}"\nclient_token = "{CLIENT}"\n', mode=0o600):
        path = tmp_path / "router.toml"
        path.write_text(text)
        path.chmod(mode)
        return path

    return make


class TestSecret:
    def test_repr_and_str_name_the_source_not_the_value(self):
        secret = Secret(ADMIN, "env X")
        assert ADMIN not in repr(secret)
        assert ADMIN not in str(secret)
        assert "env X" in repr(secret)
        assert secret.reveal() == ADMIN

    def test_credentials_repr_holds_no_token(self):
        creds = RouterCredentials(client=Secret(CLIENT, "env C"), admin=Secret(ADMIN, "env A"))
        text = repr(creds) + str(creds)
        assert ADMIN not in text
        assert CLIENT not in text
        assert text == "RouterCredentials(admin_source='env A', client_source='env C')" * 2

    def test_missing_admin_token_is_a_credential_error(self):
        with pytest.raises(CredentialError):
            RouterCredentials(client=Secret(CLIENT, "c")).require_admin()


class TestResolveCredentials:
    def test_environment_wins_over_the_file(self, cred_file):
        config = RouterConfig(credential_file=cred_file())
        env = {
            "ANVIL_ROUTER_ADMIN_TOKEN": "from-env-admin",
            "ANVIL_ROUTER_CLIENT_TOKEN": "from-env",
        }
        creds = resolve_credentials(config, env)
        assert creds.require_admin().reveal() == "from-env-admin"
        assert creds.require_admin().source == "env ANVIL_ROUTER_ADMIN_TOKEN"
        assert creds.client.reveal() == "from-env"

    def test_file_is_used_when_the_environment_is_empty(self, cred_file):
        path = cred_file()
        creds = resolve_credentials(RouterConfig(credential_file=path), {})
        assert creds.require_admin().reveal() == ADMIN
        assert creds.client.reveal() == CLIENT
        assert creds.client.source == f"file {path} (client_token)"

    def test_env_names_come_from_the_router_config(self):
        config = RouterConfig(admin_token_env="MY_ADMIN", client_token_env="MY_CLIENT")
        creds = resolve_credentials(config, {"MY_ADMIN": "a" * 9, "MY_CLIENT": "c" * 9})
        assert creds.require_admin().source == "env MY_ADMIN"

    def test_missing_everywhere_names_every_place_tried(self, cred_file):
        path = cred_file(text=f'client_token = "{CLIENT}"\n')
        with pytest.raises(CredentialError) as err:
            resolve_credentials(RouterConfig(credential_file=path), {})
        assert "env ANVIL_ROUTER_ADMIN_TOKEN" in str(err.value)
        assert str(path) in str(err.value)

    def test_admin_token_is_not_needed_for_socket_administered_routers(self):
        creds = resolve_credentials(RouterConfig(), {"ANVIL_ROUTER_CLIENT_TOKEN": CLIENT}, need_admin=False)
        assert creds.admin is None

    @pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o666])
    def test_a_file_open_to_group_or_others_is_refused_naming_file_and_mode(self, cred_file, mode):
        path = cred_file(mode=mode)
        with pytest.raises(CredentialError) as err:
            resolve_credentials(RouterConfig(credential_file=path), {})
        assert str(path) in str(err.value)
        assert f"{mode:04o}" in str(err.value)
        assert ADMIN not in str(err.value)

    def test_owner_only_modes_are_accepted(self, cred_file):
        assert check_private_file(cred_file(mode=0o400)).st_size > 0

    def test_a_foreign_owner_is_refused(self, cred_file, monkeypatch):
        path = cred_file()
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(path).st_uid + 1)
        with pytest.raises(CredentialError, match="owned by uid"):
            check_private_file(path)

    def test_a_missing_file_is_a_credential_error(self, tmp_path):
        with pytest.raises(CredentialError, match="does not exist"):
            resolve_token("client", "UNSET", {}, tmp_path / "nope.toml")

    def test_invalid_toml_does_not_echo_the_file(self, cred_file):
        path = cred_file(text=f'admin_token = "{ADMIN}\nclient_token = 3\n')
        with pytest.raises(CredentialError) as err:
            resolve_token("admin", "UNSET", {}, path)
        assert ADMIN not in str(err.value)
        assert "not valid TOML" in str(err.value)

    def test_a_non_string_token_is_refused(self, cred_file):
        path = cred_file(text="admin_token = 5\n")
        with pytest.raises(CredentialError, match="admin_token must be a non-empty string"):
            resolve_token("admin", "UNSET", {}, path)

    def test_no_module_reads_the_process_environment(self, monkeypatch):
        monkeypatch.setenv("ANVIL_ROUTER_CLIENT_TOKEN", "process-env-token")
        with pytest.raises(CredentialError):
            resolve_credentials(RouterConfig(), {}, need_admin=False)


class TestUnresolvedCredentialsRouter:
    """What the real world routes through when the router's tokens cannot be resolved."""

    def _router(self) -> UnresolvedCredentialsRouter:
        return UnresolvedCredentialsRouter(
            CredentialError("no router admin token was resolved", kind="admin")
        )

    @pytest.mark.parametrize(
        ("call", "args"),
        [
            ("probe_credentials", ()),
            ("register", ("primary-local", "http://127.0.0.1:8001", ("llm.primary",))),
            ("deregister", ("primary-local", "http://127.0.0.1:8001")),
            ("drain", ("primary-local",)),
            ("readmit", ("primary-local", "http://127.0.0.1:8001", ("llm.primary",), "m", 1.0)),
            ("routed_chat", ("llm.primary",)),
            ("check_route", ("primary-local", "http://127.0.0.1:8001", "m")),
            ("ready", ()),
        ],
    )
    def test_every_call_of_the_port_refuses_naming_the_credential_problem(
        self, call: str, args: tuple
    ) -> None:
        with pytest.raises(
            AuthRejected, match="router credentials unavailable: no router admin token"
        ) as info:
            getattr(self._router(), call)(*args)
        assert info.value.data == {"kind": "admin"}

    def test_it_is_a_router_whose_view_names_the_problem_and_that_has_nothing_to_close(self) -> None:
        router = self._router()
        assert isinstance(router, Router)
        assert router.view("primary-local") == {"tier": "primary-local", "error": "credentials unavailable"}
        assert getattr(router, "close", None) is None
        with pytest.raises(AttributeError):
            router.anything_else  # noqa: B018
