"""Process settings: the environment (prefix ANVIL_) or CLI flags, and where each path came from."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from anvil_ctl.config.fields import STATE_DB_RE, FilePath, url_field, valid_if
from anvil_ctl.core.validate import unsafe_char
from anvil_ctl.places import DefaultPaths, process_defaults


class Settings(BaseSettings):
    """Process settings, from the environment (prefix ANVIL_) or CLI flags."""

    model_config = SettingsConfigDict(env_prefix="ANVIL_", extra="ignore")

    state_dir: FilePath = Field(
        default_factory=lambda: process_defaults().state_dir,
        description="Directory for the database, lock and evidence; default /var/lib/anvil as "
        "root, else $XDG_DATA_HOME/anvil (~/.local/share/anvil)",
    )
    state_db: (
        Annotated[
            str,
            valid_if(
                lambda v: unsafe_char(v) is None and STATE_DB_RE.match(v),
                "expected a database URL: sqlite:///PATH or postgresql://USER@HOST/DB",
            ),
        ]
        | None
    ) = Field(
        None,
        description="SQLAlchemy URL of the state database; default sqlite:///<state_dir>/anvil.db",
    )
    config: FilePath = Field(
        default_factory=lambda: process_defaults().config,
        description="Path of the host config file; default /etc/anvil/anvil.toml as root, else "
        "$XDG_CONFIG_HOME/anvil/anvil.toml (~/.config/anvil/anvil.toml)",
    )
    recipes_dir: FilePath | None = Field(
        None,
        description="Directory of recipe TOML files, searched first; then the host config's "
        "recipes_dir, then the recipes shipped with anvilctl",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: console on a TTY, JSON lines otherwise"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level (on a terminal, where progress is shown: warning unless set)"
    )
    progress_heartbeat_s: float = Field(
        2.0,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Progress on a pipe: a 'still ...' line after this many quiet seconds in a "
        "step; 0 turns it off",
    )
    backend: Literal["real", "fake"] = Field(
        "real",
        description="real: Docker, NVML, HTTP routers; fake: the simulated host of anvil_ctl.testing",
    )
    fake_world: FilePath | None = Field(
        None,
        description="JSON file holding the fake backend's world; default <state_dir>/fake-world.json",
    )
    gpu: Literal["nvml", "simulated"] = Field(
        "nvml",
        description="nvml: real GPUs; simulated: GPUs declared in the host config, driven by stubs",
    )
    docker_host: Annotated[str, url_field("unix", "tcp", "http", "https", "ssh")] | None = Field(
        None, description="Docker Engine URL; default from DOCKER_HOST"
    )
    machine_id_file: FilePath = Field(
        Path("/etc/machine-id"),
        description="The file holding this machine's identity, recorded when a host name is first "
        "used with a state database and checked on every later use; another file for tests that "
        "run two hosts on one machine",
    )
    crash_at: str | None = Field(
        None,
        description="Fault injection for tests and `make chaos` only: SIGKILL this process right after "
        "the journal row KIND:STEP:PHASE:EVENT (or KIND:state:STATE; * matches anything) commits",
    )
    pause_at: str | None = Field(
        None,
        description="Fault injection for tests and `make chaos` only: at this journal boundary, write it "
        "into <state_dir>/paused-at and wait until that file is removed",
    )

    @field_validator("state_dir")
    @classmethod
    def _state_dir(cls, value: Path) -> Path:
        if value.exists() and not value.is_dir():
            raise ValueError(f"{value} exists and is not a directory; expected a state directory")
        return value

    @property
    def db_url(self) -> str:
        return self.state_db or f"sqlite:///{(self.state_dir / 'anvil.db').resolve()}"

    @property
    def lock_path(self) -> Path:
        return self.state_dir / "anvil.lock"

    @property
    def pause_file(self) -> Path:
        return self.state_dir / "paused-at"

    @property
    def evidence_dir(self) -> Path:
        return self.state_dir / "evidence"

    @property
    def fake_world_path(self) -> Path:
        return self.fake_world or self.state_dir / "fake-world.json"


def setting_origins(
    flags: Mapping[str, object], env: Mapping[str, str], defaults: DefaultPaths
) -> dict[str, str]:
    """Where each path setting came from (`--state-dir`, `ANVIL_STATE_DIR`, `default (root)`,
    `default (XDG)`), as `status` and `init` print it."""
    upper = {k.upper() for k, v in env.items() if v}
    out: dict[str, str] = {}
    for name in ("state_dir", "state_db", "config", "recipes_dir"):
        variable = "ANVIL_" + name.upper()
        if flags.get(name) is not None:
            out[name] = "--" + name.replace("_", "-")
        elif variable in upper:
            out[name] = variable
        elif name in ("state_dir", "config"):
            out[name] = f"default ({defaults.why})"
        elif name == "state_db":
            out[name] = "default (<state dir>/anvil.db)"
        else:
            out[name] = "not set"
    return out
