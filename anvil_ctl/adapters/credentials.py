"""Router credentials: one resolution chain for the admin and client tokens.

Each token: the environment variable the host config names, then the credential TOML file,
which must be the user's own and 0600 or stricter. Warning: `Secret` keeps a token out of
`repr`, `str`, equality and hashing; errors name a token's source, never its value.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from anvil_ctl.config.host import RouterConfig
from anvil_ctl.config.inputs import read_input_file
from anvil_ctl.core.errors import CredentialError
from anvil_ctl.core.validate import check_token

TokenKind = Literal["admin", "client"]
_FILE_KEYS: dict[TokenKind, str] = {"admin": "admin_token", "client": "client_token"}
MAX_CREDENTIAL_BYTES = 64 * 1024


@dataclass(frozen=True)
class Secret:
    """A token plus where it came from; the value never appears in repr, str or comparisons."""

    _value: str = field(repr=False, compare=False)
    source: str

    def reveal(self) -> str:
        """The token itself, for the one place that puts it on the wire."""
        return self._value

    def __str__(self) -> str:
        return f"<secret from {self.source}>"


@dataclass(frozen=True)
class RouterCredentials:
    """The router's client token and admin token (None where socket permissions are the admin)."""

    client: Secret
    admin: Secret | None = None

    def require_admin(self) -> Secret:
        if self.admin is None:
            raise CredentialError("no router admin token was resolved", kind="admin")
        return self.admin

    def __repr__(self) -> str:
        admin = self.admin.source if self.admin else None
        return f"RouterCredentials(admin_source={admin!r}, client_source={self.client.source!r})"

    __str__ = __repr__


def check_private_file(path: Path) -> os.stat_result:
    """Refuse a credential file that is missing, irregular, foreign, or open to group/others."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise CredentialError(f"credential file {path} does not exist", file=str(path)) from None
    except OSError as exc:
        raise CredentialError(
            f"credential file {path} cannot be read: {exc.strerror}", file=str(path)
        ) from exc
    if not stat.S_ISREG(st.st_mode):
        raise CredentialError(f"credential file {path} is not a regular file", file=str(path))
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        raise CredentialError(
            f"credential file {path} is owned by uid {st.st_uid}, not by the current user "
            f"(uid {os.geteuid()}); refusing to use it",
            file=str(path),
            owner=st.st_uid,
        )
    if mode & 0o077:
        raise CredentialError(
            f"credential file {path} has mode {mode:04o}; it must grant nothing to group or "
            f"others (chmod 600 {path})",
            file=str(path),
            mode=f"{mode:04o}",
        )
    return st


def read_credential_file(path: Path) -> dict[str, str]:
    """The token entries of a checked credential file; every problem names the file and key, never a value."""
    check_private_file(path)
    text = read_input_file(path, "credential file", max_bytes=MAX_CREDENTIAL_BYTES, error=CredentialError)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # Keep only the position: a decoder message must never carry file content.
        where = re.search(r"\(at (line \d+, column \d+|end of document)\)", str(exc))
        raise CredentialError(
            f"credential file {path} is not valid TOML ({where.group(1) if where else 'syntax'})",
            file=str(path),
        ) from None
    except RecursionError:
        raise CredentialError(f"credential file {path} is nested too deeply", file=str(path)) from None
    out: dict[str, str] = {}
    for key in _FILE_KEYS.values():
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise CredentialError(
                f"credential file {path}: {key} must be a non-empty string", file=str(path), key=key
            )
        out[key] = checked_token(value.strip(), f"credential file {path} ({key})")
    return out


def checked_token(value: str, source: str) -> str:
    """`value` if it can be sent as a bearer token; CredentialError naming `source` otherwise."""
    try:
        return check_token(value)
    except ValueError as exc:
        raise CredentialError(f"router token from {source}: {exc}", source=source) from None


def resolve_token(
    kind: TokenKind, env_name: str, env: Mapping[str, str], credential_file: Path | None
) -> Secret:
    """Resolve one token: environment variable first, then the credential file."""
    value = env.get(env_name, "").strip()
    if value:
        return Secret(checked_token(value, f"env {env_name}"), f"env {env_name}")
    key, tried = _FILE_KEYS[kind], f"env {env_name}"
    if credential_file is not None:
        source = f"file {credential_file} ({key})"
        entries = read_credential_file(credential_file)
        if key in entries:
            return Secret(entries[key], source)
        tried += f", {source}"
    raise CredentialError(f"router {kind} token not found; tried {tried}", kind=kind, tried=tried)


def resolve_credentials(
    router: RouterConfig, env: Mapping[str, str], *, need_admin: bool = True
) -> RouterCredentials:
    """Both router tokens through the chain; the admin token only when the router uses one."""
    client = resolve_token("client", router.client_token_env, env, router.credential_file)
    admin = (
        resolve_token("admin", router.admin_token_env, env, router.credential_file) if need_admin else None
    )
    return RouterCredentials(client=client, admin=admin)
