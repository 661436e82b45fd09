"""The cases of the bad-input suite (`test_bad_input.py`), as data.

Each `Case` is one command line run against the shared fake host, with the files it
needs written into its own directory first. Placeholders in arguments and
environment values: `{case}` (the case's directory), `{host}` (the fake host's
root), `{incumbent}` (the adopted incumbent's container ID), `{recipes}` (the
shipped recipes). `code` is the exit code expected; `names` a text the one error
line must contain (the flag, field or file). `code == 0` marks an edge input that
must be accepted.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

REPO = Path(__file__).resolve().parents[2]
BASE_RECIPE = (REPO / "recipes" / "stub-245k-c1.toml").read_text()

Content = bytes | str | Callable[[Path, Path], None]
"""A file's bytes or text, or a function (path, host root) that makes it."""


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    names: str = ""
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, Content] = field(default_factory=dict)
    stream: str = "err"  # where `names` is looked for: the error line, or stdout (exit 6 reports)

    @property
    def category(self) -> str:
        return self.id.split(":", 1)[0]


# -- file makers -------------------------------------------------------------------------------


def fifo(path: Path, _host: Path) -> None:
    os.mkfifo(path)


def directory(path: Path, _host: Path) -> None:
    path.mkdir()


def symlink_loop(path: Path, _host: Path) -> None:
    other = path.with_name(path.name + ".loop")
    os.symlink(other, path)
    os.symlink(path, other)


def truncated_db(path: Path, host: Path) -> None:
    path.write_bytes((host / "state" / "anvil.db").read_bytes()[:5000])


def foreign_db(path: Path, _host: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t(x)")
    con.commit()
    con.close()


def future_db(path: Path, host: Path) -> None:
    src = sqlite3.connect(host / "state" / "anvil.db")
    dst = sqlite3.connect(path)
    src.backup(dst)
    src.close()
    dst.execute("UPDATE alembic_version SET version_num = '9999_future'")
    dst.commit()
    dst.close()


def deep(n: int) -> str:
    return "a = " + "[" * n + "]" * n + "\n"


# -- host configs ------------------------------------------------------------------------------

HOST = """host = "testhost"

[gpu_roles.compute-a]
uuid = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
capacity_mib = 97887

[gpu_roles.compute-b]
uuid = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
capacity_mib = 97887

[slots.primary]
binding = "127.0.0.1:8001"
router_tier = "primary-local"
aliases = ["llm.primary"]
gpu_roles = ["compute-a", "compute-b"]

[router]
kind = "smg"

[policy]
health_poll_s = 0.01
stop_timeout_s = 1
"""


def host_with(path: tuple[str, ...], value: Any) -> str:
    """The test host config with one value set (`path` of keys), as TOML."""
    data = tomllib.loads(HOST)
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return tomlkit.dumps(data)


def config_case(name: str, content: Content, code: int, names: str) -> Case:
    return Case(
        f"config:{name}",
        ("status",),
        code,
        names,
        {"ANVIL_CONFIG": "{case}/anvil.toml"},
        {"anvil.toml": content},
    )


CONFIGS: list[Case] = [
    config_case("binary", b"\x00\x01\xff\xfe garbage", 2, "not UTF-8"),
    config_case("utf16", HOST.encode("utf-16"), 2, "UTF-16"),
    config_case("latin1", 'host = "caf\xe9"\n'.encode("latin-1"), 2, "not UTF-8"),
    config_case("nul-in-text", 'host = "a"\n\x00\n', 2, "not valid TOML"),
    config_case("nested-100k", deep(100_000), 2, "nested"),
    config_case("nested-20", deep(20), 2, "nested"),
    config_case("oversized", "#" * (2 << 20), 2, "bytes"),
    config_case("syntax", "host = \n", 2, "not valid TOML"),
    config_case("fifo", fifo, 2, "not a regular file"),
    config_case("directory", directory, 2, "is a directory"),
    config_case("symlink-loop", symlink_loop, 2, "symbolic links"),
    config_case("unknown-key", HOST + "\nbogus = 1\n", 2, "bogus"),
    config_case("router-ftp", host_with(("router", "url"), "ftp://127.0.0.1:30000"), 2, "router.url"),
    config_case("router-not-a-url", host_with(("router", "url"), "not a url"), 2, "router.url"),
    config_case("router-port", host_with(("router", "url"), "http://127.0.0.1:99999"), 2, "router.url"),
    config_case("router-creds", host_with(("router", "url"), "http://admin:pw@127.0.0.1:1"), 2, "router.url"),
    config_case(
        "router-js", host_with(("router", "admin_url"), "javascript:alert(1)"), 2, "router.admin_url"
    ),
    config_case("router-kind", host_with(("router", "kind"), "nginx"), 2, "router.kind"),
    config_case(
        "router-env-name", host_with(("router", "admin_token_env"), "BAD NAME"), 2, "admin_token_env"
    ),
    config_case(
        "router-deadline-inf", host_with(("router", "readmit_deadline_s"), float("inf")), 2, "readmit"
    ),
    config_case(
        "policy-inf", host_with(("policy", "stop_timeout_s"), float("inf")), 2, "policy.stop_timeout_s"
    ),
    config_case(
        "policy-nan", host_with(("policy", "stop_timeout_s"), float("nan")), 2, "policy.stop_timeout_s"
    ),
    config_case("policy-negative", host_with(("policy", "health_poll_s"), -1), 2, "policy.health_poll_s"),
    config_case("policy-year", host_with(("policy", "vram_release_deadline_s"), 3.2e7), 2, "vram_release"),
    config_case(
        "policy-huge-mib", host_with(("policy", "vram_reserve_mib"), 2**63 - 1), 2, "vram_reserve_mib"
    ),
    config_case(
        "gpu-capacity-0", host_with(("gpu_roles", "compute-a", "capacity_mib"), 0), 2, "capacity_mib"
    ),
    config_case("gpu-uuid", host_with(("gpu_roles", "compute-a", "uuid"), "GPU-xyz"), 2, "uuid"),
    config_case(
        "gpu-uuid-newline",
        host_with(("gpu_roles", "compute-a", "uuid"), "GPU-aaaaaaaa-0000-0000-0000-000000000001\n"),
        2,
        "uuid",
    ),
    config_case("gpu-name-esc", host_with(("gpu_roles", "compute-a", "name"), "\x1b[2J"), 2, "name"),
    config_case(
        "binding-public", host_with(("slots", "primary", "binding"), "0.0.0.0:8001"), 2, "not loopback"
    ),
    config_case("binding-v6-bare", host_with(("slots", "primary", "binding"), "::1:8001"), 2, "brackets"),
    config_case("binding-port-0", host_with(("slots", "primary", "binding"), "127.0.0.1:0"), 2, "binding"),
    config_case("binding-no-port", host_with(("slots", "primary", "binding"), "127.0.0.1"), 2, "binding"),
    config_case(
        "binding-v6-public", host_with(("slots", "primary", "binding"), "[2001:db8::1]:8001"), 2, "loopback"
    ),
    config_case("aliases-empty", host_with(("slots", "primary", "aliases"), []), 2, "aliases"),
    config_case("alias-esc", host_with(("slots", "primary", "aliases"), ["llm\x1b[31m"]), 2, "aliases"),
    config_case("tier-bidi", host_with(("slots", "primary", "router_tier"), "tier\u202e"), 2, "router_tier"),
    config_case("slot-name", HOST.replace("[slots.primary]", "[slots.Primary]"), 2, "Primary"),
    config_case("slot-role", host_with(("slots", "primary", "gpu_roles"), ["compute-z"]), 2, "compute-z"),
    config_case("host-esc", host_with(("host",), "a\x1b[2J"), 2, "host"),
    config_case("host-empty", host_with(("host",), ""), 2, "host"),
    config_case("cache-dir-empty", host_with(("model_cache_dir",), ""), 2, "model_cache_dir"),
    config_case(
        "credential-nul", host_with(("router", "credential_file"), "/tmp/a\x00b"), 2, "credential_file"
    ),
    config_case(
        "restore-group-name", host_with(("restore_groups",), {"Split A": ["0123456789ab"]}), 2, "Split A"
    ),
    config_case(
        "same-binding",
        HOST + '\n[slots.second]\nbinding = "127.0.0.1:8001"\nrouter_tier = "t2"\naliases = ["x"]\n',
        2,
        "share one binding",
    ),
    # edge inputs that must work
    config_case("ok-ipv6-loopback", host_with(("slots", "primary", "binding"), "[::1]:8001"), 0, ""),
    config_case("ok-utf8-bom", "\ufeff" + HOST, 0, ""),
    config_case("ok-empty", "", 0, ""),
]


# -- recipes -----------------------------------------------------------------------------------


def recipe_with(name: str = "bad", **values: Any) -> str:
    """The shipped stub recipe renamed `name`, with `values` set (None removes a key)."""
    data = tomllib.loads(BASE_RECIPE)
    data["name"] = name
    data["mounts"] = [m for m in data["mounts"] if m["source"].startswith("/")]
    for key, value in values.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return tomlkit.dumps(data)


def recipe_case(name: str, content: Content, code: int, names: str, *, load: bool = False) -> Case:
    argv = ("load", "bad", "--slot", "primary") if load else ("recipes", "validate", "bad")
    return Case(
        f"recipe:{name}",
        argv,
        code,
        names,
        {"ANVIL_RECIPES_DIR": "{case}/recipes"},
        {"recipes/bad.toml": content},
    )


RECIPES: list[Case] = [
    recipe_case("binary", b"\x89PNG\r\n\x1a\n\x00\x00", 2, "not UTF-8"),
    recipe_case("utf16", recipe_with().encode("utf-16"), 2, "UTF-16"),
    recipe_case("nested", deep(100_000), 2, "nested"),
    recipe_case("oversized", recipe_with() + "#" * (2 << 20), 2, "bytes"),
    recipe_case("syntax", 'name = "bad"\ncontext_tokens = \n', 2, "not valid TOML"),
    recipe_case("directory", directory, 2, "is a directory"),
    recipe_case("fifo", fifo, 2, "not a regular file"),
    recipe_case("symlink-loop", symlink_loop, 2, "symbolic links"),
    recipe_case("context-1e19", recipe_with(context_tokens=10**19), 2, "context_tokens"),
    recipe_case("context-negative", recipe_with(context_tokens=-5), 2, "context_tokens"),
    recipe_case("context-zero", recipe_with(context_tokens=0), 2, "context_tokens"),
    recipe_case("context-float", recipe_with(context_tokens=1.5), 2, "context_tokens"),
    recipe_case("context-text", recipe_with(context_tokens="big"), 2, "context_tokens"),
    recipe_case("tp-size", recipe_with(tp_size=1000), 2, "tp_size"),
    recipe_case("concurrency", recipe_with(max_concurrency=10**12), 2, "max_concurrency"),
    recipe_case("timeout-inf", recipe_with(startup_timeout_s=float("inf")), 2, "startup_timeout_s"),
    recipe_case("timeout-nan", recipe_with(startup_timeout_s=float("nan")), 2, "startup_timeout_s"),
    recipe_case("port", recipe_with(port=70000), 2, "port"),
    recipe_case("vram-negative", recipe_with(vram_need_mib=-1), 2, "vram_need_mib"),
    recipe_case("vram-huge", recipe_with(vram_need_mib=2**40), 2, "vram_need_mib"),
    recipe_case("image-tag", recipe_with(image="anvil-stub:latest"), 2, "not pinned"),
    recipe_case("image-newline", recipe_with(image="sha256:" + "a" * 64 + "\n"), 2, "image"),
    recipe_case("model-unpinned", recipe_with(engine="sglang", model="org/model@main"), 2, "model"),
    recipe_case("served-esc", recipe_with(served_model="m\x1b]0;pwned\x07"), 2, "served_model"),
    recipe_case("description-bidi", recipe_with(description="safe\u202eevil"), 2, "description"),
    recipe_case("name-mismatch", recipe_with(name="other"), 2, "differs from the file name"),
    recipe_case("unknown-key", recipe_with(bogus=1), 2, "bogus"),
    recipe_case("env-huge", recipe_with(env={"X": "v" * 10_000}), 2, "env"),
    recipe_case("args-many", recipe_with(args=["a"] * 2000), 2, "args"),
    recipe_case("mount-relative", recipe_with(mounts=[{"source": "/usr", "target": "usr"}]), 2, "mounts"),
    recipe_case("ulimit-huge", recipe_with(ulimits={"nofile": 2**70}), 2, "ulimits"),
    recipe_case("shm-huge", recipe_with(shm_size="99999999999999999g"), 2, "shm_size"),
    recipe_case("health-path", recipe_with(health_path="health"), 2, "health_path"),
    recipe_case("roles-twice", recipe_with(gpu_roles=["compute-a", "compute-a"]), 2, "gpu_roles"),
    recipe_case("load-binary", b"\x00\xff\xfe", 2, "not UTF-8", load=True),
    recipe_case("load-context-1e19", recipe_with(context_tokens=10**19), 2, "context_tokens", load=True),
    recipe_case(
        "load-timeout-inf", recipe_with(startup_timeout_s=float("inf")), 2, "startup_timeout_s", load=True
    ),
    recipe_case("ok-valid", recipe_with(), 0, ""),
    Case(
        "recipe:ok-list-with-a-binary-file",
        ("recipes", "list"),
        0,
        "",
        {"ANVIL_RECIPES_DIR": "{case}/recipes"},
        {"recipes/bad.toml": b"\x00\xff", "recipes/good.toml": recipe_with("good")},
    ),
]


# -- state databases ---------------------------------------------------------------------------


def db_case(
    name: str, content: Content | None, code: int, names: str, argv: tuple[str, ...] = ("status",)
) -> Case:
    files: dict[str, Content] = {} if content is None else {"x.db": content}
    return Case(f"database:{name}", argv, code, names, {"ANVIL_STATE_DB": "sqlite:///{case}/x.db"}, files)


WAIVE_OK = ("waive", "--policy", "vram-reserve", "--scope", "compute-a", "--value", "0", "--no-expiry")
WAIVE_OK_BY = (*WAIVE_OK, "--approved-by", "alice", "--reason", "r")

DATABASES: list[Case] = [
    db_case("text-file", "hello, not a database\n", 2, "not an SQLite database"),
    db_case("text-file-mutation", "hello\n", 2, "not an SQLite database", WAIVE_OK_BY),
    db_case("truncated", truncated_db, 2, "damaged"),
    db_case("truncated-mutation", truncated_db, 2, "damaged", WAIVE_OK_BY),
    db_case("directory", directory, 2, "is a directory"),
    db_case("missing", None, 2, "does not exist"),
    db_case("missing-audit", None, 2, "does not exist", ("audit", "transactions")),
    db_case("empty-file", b"", 2, "not initialised"),
    db_case("foreign", foreign_db, 2, "not an anvil state db"),
    db_case("future-revision", future_db, 2, "newer version"),
    Case(
        "database:missing-directory",
        ("status",),
        2,
        "does not exist",
        {"ANVIL_STATE_DB": "sqlite:///{case}/nx/x.db"},
    ),
    Case(
        "database:state-dir-is-a-file", ("status",), 2, "not a directory", {"ANVIL_STATE_DIR": "/etc/passwd"}
    ),
    Case("database:flag-state-dir-is-a-file", ("--state-dir", "/etc/passwd", "status"), 2, "--state-dir"),
    Case("database:state-dir-missing", ("status",), 2, "does not exist", {"ANVIL_STATE_DIR": "{case}/nx"}),
    Case("database:not-a-url", ("--state-db", "not a url", "status"), 2, "--state-db"),
    Case("database:mysql", ("--state-db", "mysql://u@h/db", "status"), 2, "--state-db"),
    Case("database:url-esc", ("--state-db", "sqlite:///a\x1b[2J", "status"), 2, "--state-db"),
    Case("database:copy-to-esc", ("db", "copy", "--to", "sqlite:///a\x1b[2J"), 2, "--to"),
    Case("database:copy-to-mysql", ("db", "copy", "--to", "mysql://u@h/db"), 2, "--to"),
]


# -- settings from the environment -------------------------------------------------------------

SETTINGS: list[Case] = [
    Case("settings:config-empty", ("status",), 2, "ANVIL_CONFIG", {"ANVIL_CONFIG": ""}),
    Case("settings:config-directory", ("status",), 2, "is a directory", {"ANVIL_CONFIG": "{case}"}),
    Case("settings:config-missing", ("status",), 2, "not found", {"ANVIL_CONFIG": "{case}/nx.toml"}),
    Case("settings:state-dir-empty", ("status",), 2, "ANVIL_STATE_DIR", {"ANVIL_STATE_DIR": ""}),
    Case("settings:log-format", ("status",), 2, "ANVIL_LOG_FORMAT", {"ANVIL_LOG_FORMAT": "xml"}),
    Case("settings:log-level", ("status",), 2, "ANVIL_LOG_LEVEL", {"ANVIL_LOG_LEVEL": "loud"}),
    Case("settings:backend", ("status",), 2, "ANVIL_BACKEND", {"ANVIL_BACKEND": "cloud"}),
    Case("settings:gpu", ("status",), 2, "ANVIL_GPU", {"ANVIL_GPU": "tpu"}),
    Case("settings:docker-host", ("status",), 2, "ANVIL_DOCKER_HOST", {"ANVIL_DOCKER_HOST": "ftp://h:1"}),
    Case("settings:state-db", ("status",), 2, "ANVIL_STATE_DB", {"ANVIL_STATE_DB": "not a url"}),
    Case(
        "settings:recipes-dir",
        ("recipes", "list"),
        2,
        "recipes directory",
        {"ANVIL_RECIPES_DIR": "{case}/nx"},
    ),
    Case(
        "settings:recipes-dir-file",
        ("recipes", "list"),
        2,
        "recipes directory",
        {"ANVIL_RECIPES_DIR": "/etc/passwd"},
    ),
]


# -- command lines -----------------------------------------------------------------------------

ESC_FORGERY = "op\n\x1b[31mFORGED: approved by cfo\x1b[0m"
LONG = "a" * 100_000
RLO = "\u202eevil"


def waive(**over: str) -> tuple[str, ...]:
    args = {
        "--policy": "vram-reserve",
        "--scope": "compute-a",
        "--value": "0",
        "--approved-by": "alice",
        "--reason": "r",
    }
    args.update(over)
    out: list[str] = ["waive"]
    for k, v in args.items():
        out += [k, v]
    if "--expires" not in args:
        out.append("--no-expiry")
    return tuple(out)


def cli(name: str, argv: tuple[str, ...], code: int, names: str, **kw: Any) -> Case:
    return Case(f"cli:{name}", argv, code, names, **kw)


LOAD = ("load", "stub-245k-c1", "--slot", "primary")

COMMAND_LINES: list[Case] = [
    cli("unknown-command", ("bogus",), 2, "No such command"),
    cli("no-command", (), 2, "missing command"),
    cli("unknown-option", ("status", "--bogus"), 2, "--bogus"),
    cli("prefix-option", ("audit", "transactions", "--stat", "committed"), 2, "--stat"),
    cli("load-no-recipe", ("load",), 2, "RECIPE"),
    cli("load-no-slot", ("load", "stub-245k-c1"), 2, "--slot"),
    cli("load-unknown-slot", ("load", "stub-245k-c1", "--slot", "nope"), 2, "slot 'nope'"),
    cli("load-unknown-recipe", ("load", "nope-recipe", "--slot", "primary"), 2, "nope-recipe"),
    cli("load-recipe-esc", ("load", "a\x1bb", "--slot", "primary"), 2, "RECIPE"),
    cli("load-recipe-long", ("load", "x" * 5000, "--slot", "primary"), 2, "RECIPE"),
    cli("load-slot-esc", ("load", "stub-245k-c1", "--slot", "p\x1b"), 2, "--slot"),
    cli("load-drift-no-by", (*LOAD, "--accept-drift"), 2, "--accept-drift needs"),
    cli("load-by-no-drift", (*LOAD, "--by", "alice"), 2, "go with --accept-drift"),
    cli("load-drift-by-esc", (*LOAD, "--accept-drift", "--by", "\x1b[2J", "--reason", "r"), 2, "--by"),
    cli("load-drift-reason-empty", (*LOAD, "--accept-drift", "--by", "a", "--reason", ""), 2, "--reason"),
    cli(
        "adopt-context-negative",
        ("adopt", "x", "--slot", "primary", "--context-tokens", "-5"),
        2,
        "--context-tokens",
    ),
    cli(
        "adopt-context-zero",
        ("adopt", "x", "--slot", "primary", "--context-tokens", "0"),
        2,
        "--context-tokens",
    ),
    cli(
        "adopt-context-1e26",
        ("adopt", "x", "--slot", "primary", "--context-tokens", str(10**26)),
        2,
        "--context-tokens",
    ),
    cli(
        "adopt-context-text",
        ("adopt", "x", "--slot", "primary", "--context-tokens", "lots"),
        2,
        "--context-tokens",
    ),
    cli(
        "adopt-context-float",
        ("adopt", "x", "--slot", "primary", "--context-tokens", "1.5"),
        2,
        "--context-tokens",
    ),
    cli(
        "adopt-unknown-container",
        ("adopt", "nosuch", "--slot", "primary", "--context-tokens", "524288"),
        2,
        "nosuch",
    ),
    cli(
        "adopt-unknown-slot",
        ("adopt", "{incumbent}", "--slot", "nope", "--context-tokens", "1"),
        2,
        "slot 'nope'",
    ),
    cli("adopt-empty-id", ("adopt", "", "--slot", "primary", "--context-tokens", "1"), 2, "CONTAINER_ID"),
    cli("promote-approver-empty", ("promote", "--approved-by", ""), 2, "--approved-by"),
    cli("promote-approver-blank", ("promote", "--approved-by", "   "), 2, "--approved-by"),
    cli("promote-approver-forged", ("promote", "--approved-by", ESC_FORGERY), 2, "--approved-by"),
    cli("promote-approver-long", ("promote", "--approved-by", LONG), 2, "--approved-by"),
    cli("promote-approver-rlo", ("promote", "--approved-by", RLO), 2, "U+202E"),
    cli("promote-no-candidate", ("promote", "--approved-by", "alice"), 2, "no candidate"),
    cli("promote-unknown-slot", ("promote", "--approved-by", "alice", "--slot", "nope"), 2, "slot 'nope'"),
    cli("promote-named-candidate", ("promote", "cand-x", "--approved-by", "alice"), 2, "no candidate"),
    cli("promote-no-approver", ("promote",), 2, "--approved-by"),
    cli("rollback-short-to", ("rollback", "--to", "abcdef1"), 2, "--to"),
    cli("rollback-unknown-to", ("rollback", "--to", "abcdefabcdef"), 2, "--to"),
    cli("rollback-unknown-group", ("rollback", "--restore-group", "nope"), 2, "--restore-group"),
    cli("rollback-unknown-slot", ("rollback", "--slot", "nope"), 2, "slot 'nope'"),
    cli("rollback-empty-to", ("rollback", "--to", ""), 2, "--to"),
    cli("rollback-to-esc", ("rollback", "--to", "\x1b[2Jabcdefgh"), 2, "--to"),
    cli("restore-short-to", ("restore", "--to", "abc"), 2, "--to"),
    cli("waive-policy", waive(**{"--policy": "gpu-hours"}), 2, "--policy"),
    cli("waive-value-1e30", waive(**{"--value": str(10**30)}), 2, "--value"),
    cli("waive-value-negative", waive(**{"--value": "-1"}), 2, "--value"),
    cli("waive-value-text", waive(**{"--value": "zero"}), 2, "--value"),
    cli("waive-approver-forged", waive(**{"--approved-by": ESC_FORGERY}), 2, "--approved-by"),
    cli("waive-reason-clear-screen", waive(**{"--reason": "r\x1b[2J"}), 2, "--reason"),
    cli("waive-approver-long", waive(**{"--approved-by": LONG}), 2, "--approved-by"),
    cli("waive-approver-rlo", waive(**{"--approved-by": RLO}), 2, "--approved-by"),
    cli("waive-approver-zero-width", waive(**{"--approved-by": "ali\u200bce"}), 2, "--approved-by"),
    cli("waive-reason-empty", waive(**{"--reason": ""}), 2, "--reason"),
    cli("waive-reason-long", waive(**{"--reason": "r" * 5000}), 2, "--reason"),
    cli("waive-scope-unknown", waive(**{"--scope": "compute-z"}), 2, "--scope"),
    cli("waive-scope-empty", waive(**{"--scope": ""}), 2, "--scope"),
    cli("waive-scope-digest", waive(**{"--scope": "sha256:xyz"}), 2, "scope"),
    cli("waive-expires-word", waive(**{"--expires": "soon"}), 2, "--expires"),
    cli("waive-expires-past", waive(**{"--expires": "2000-01-01"}), 2, "--expires"),
    cli("waive-expires-invalid", waive(**{"--expires": "2026-13-45"}), 2, "--expires"),
    cli("waive-expires-week", waive(**{"--expires": "2099-W01"}), 2, "--expires"),
    cli("revoke-unknown", ("waivers", "revoke", "wvr-nope", "--by", "a", "--reason", "b"), 2, "wvr-nope"),
    cli("revoke-by-empty", ("waivers", "revoke", "wvr-nope", "--by", "", "--reason", "b"), 2, "--by"),
    cli(
        "revoke-reason-esc",
        ("waivers", "revoke", "wvr-nope", "--by", "a", "--reason", "\x1b[2J"),
        2,
        "--reason",
    ),
    cli("since-word", ("audit", "transactions", "--since", "notadate"), 2, "--since"),
    cli("since-feb-30", ("audit", "transactions", "--since", "2026-02-30"), 2, "--since"),
    cli("since-no-seconds", ("audit", "transactions", "--since", "2026-09-02 12:00"), 2, "--since"),
    cli("since-compact", ("audit", "transactions", "--since", "20260902"), 2, "--since"),
    cli("limit-negative", ("audit", "transactions", "--limit", "-1"), 2, "--limit"),
    cli("limit-zero", ("audit", "transactions", "--limit", "0"), 2, "--limit"),
    cli("limit-1e30", ("audit", "transactions", "--limit", str(10**30)), 2, "--limit"),
    cli("limit-text", ("audit", "transactions", "--limit", "all"), 2, "--limit"),
    cli("kind", ("audit", "transactions", "--kind", "nope"), 2, "--kind"),
    cli("state", ("audit", "transactions", "--state", "nope"), 2, "--state"),
    cli("show-unknown", ("audit", "show", "nosuch"), 2, "nosuch"),
    cli("show-empty", ("audit", "show", ""), 2, "TX"),
    cli("diff-unknown", ("audit", "diff", "nosuch"), 2, "nosuch"),
    cli("audit-evidence-unknown", ("audit", "evidence", "nosuch"), 2, "nosuch"),
    cli("rechecks-limit", ("audit", "rechecks", "--limit", "0"), 2, "--limit"),
    cli("incumbents-role", ("audit", "incumbents", "--role", "nope"), 2, "--role"),
    cli("textfile-missing-dirs", ("recheck", "--textfile", "{case}/nx/dir/x.prom"), 2, "--textfile"),
    cli("textfile-directory", ("recheck", "--textfile", "{case}"), 2, "--textfile"),
    cli("textfile-device", ("recheck", "--textfile", "/dev/null"), 2, "--textfile"),
    cli("textfile-fifo", ("recheck", "--textfile", "{case}/f"), 2, "--textfile", files={"f": fifo}),
    cli("textfile-newline", ("recheck", "--textfile", "{case}/a\nb.prom"), 2, "--textfile"),
    cli("recheck-slot", ("recheck", "--slot", "nope"), 2, "slot 'nope'"),
    cli("export-unknown", ("evidence", "export", "nosuch", "{case}/out"), 2, "nosuch"),
    cli("export-to-file", ("evidence", "export", "nosuch", "{case}/f"), 2, "DIR", files={"f": "x"}),
    cli("verify-file", ("evidence", "verify", "{case}/f"), 2, "DIR", files={"f": "x"}),
    cli("verify-missing", ("evidence", "verify", "{case}/nx"), 2, "DIR"),
    cli("lock-break-unknown", ("lock", "break", "nosuch", "--by", "a", "--reason", "b"), 2, "nosuch"),
    cli("lock-break-by-empty", ("lock", "break", "nosuch", "--by", "", "--reason", "b"), 2, "--by"),
    cli("resolve-unknown", ("resolve", "nosuch", "--by", "a", "--note", "b"), 2, "nosuch"),
    cli("resolve-note-esc", ("resolve", "nosuch", "--by", "a", "--note", "\x1b[2J"), 2, "--note"),
    cli("resolve-by-long", ("resolve", "nosuch", "--by", LONG, "--note", "n"), 2, "--by"),
    cli("unload-unknown", ("unload", "nosuch", "--yes"), 2, "nosuch"),
    cli("unload-empty", ("unload", ""), 2, "CONTAINER_ID"),
    cli("recipes-show-unknown", ("recipes", "show", "nope"), 2, "nope"),
    cli("recipes-validate-unknown", ("recipes", "validate", "nope"), 2, "nope"),
    cli("recipes-plan-slot", ("recipes", "plan", "stub-245k-c1", "--slot", "nope"), 2, "slot 'nope'"),
    cli("recipes-plan-no-slot", ("recipes", "plan", "stub-245k-c1"), 2, "--slot"),
    cli(
        "recipes-show-dir",
        ("recipes", "show", "{case}/d.toml"),
        2,
        "is a directory",
        files={"d.toml": directory},
    ),
    cli("qualify-slot", ("qualify", "--slot", "nope"), 2, "slot 'nope'"),
    cli("qualify-no-slot", ("qualify",), 2, "--slot"),
    cli("qualify-profile-unknown", ("qualify", "--slot", "primary", "--profile", "nope"), 2, "nope"),
    cli(
        "qualify-profile-binary",
        ("qualify", "--slot", "primary", "--profile", "{case}/p.toml"),
        2,
        "not UTF-8",
        files={"p.toml": b"\xff\x00"},
    ),
    cli("qualify-gates-esc", ("qualify", "--slot", "primary", "--gates", "a\x1b"), 2, "--gates"),
    cli("gpus-override", ("gpus", "detect", "--override", "nope"), 2, "--override"),
    cli("completion-shell", ("completion", "powershell"), 2, "powershell"),
    cli("config-flag-directory", ("--config", "{case}", "status"), 2, "--config"),
    cli("config-flag-missing", ("--config", "{case}/nx.toml", "status"), 2, "not found"),
    # edge inputs that must work
    cli("ok-since-offset", ("audit", "transactions", "--since", "2026-01-01T00:00:00+02:00"), 0, ""),
    cli("ok-since-date", ("audit", "transactions", "--since", "2020-01-01"), 0, ""),
    cli("ok-limit-max", ("audit", "transactions", "--limit", "1000000"), 0, ""),
    cli("ok-waivers-list", ("waivers", "list"), 0, ""),
    cli("ok-lock-status", ("lock", "status"), 0, ""),
    cli("ok-validate-shipped", ("recipes", "validate", "stub-245k-c1", "--slot", "primary"), 0, ""),
    cli("load-dry-run-refused", (*LOAD, "--dry-run"), 3, "would be REFUSED", stream="out"),
    cli(
        "promote-unicode-approver-passes-to-the-candidate-check",
        ("promote", "--approved-by", "José Ñúñez", "--dry-run"),
        2,
        "no candidate",
    ),
]


# -- evidence bundles (a broken bundle does not verify: exit 6 naming the problem) -------------


def bundle(manifest: Content | None, **files: Content) -> dict[str, Content]:
    out: dict[str, Content] = {f"b/{k}": v for k, v in files.items()}
    if manifest is not None:
        out["b/manifest.json"] = manifest
    return out


GOOD_SHA = "0" * 64


def manifest(*entries: dict[str, Any]) -> str:
    """A manifest listing `entries`; each gets a valid sha256 and size unless it names them."""
    return json.dumps({"artifacts": [{"sha256": GOOD_SHA, "size": 1, **e} for e in entries]})


MANIFESTS: list[Case] = [
    Case(f"manifest:{name}", ("evidence", "verify", "{case}/b"), 6, names, files=files, stream="out")
    for name, files, names in [
        ("artifacts-strings", bundle('{"artifacts": ["a"]}', a="x"), "artifacts[0]"),
        ("directory", bundle(directory), "is a directory"),
        ("not-json", bundle("{artifacts"), "not JSON"),
        ("binary", bundle(b"\xff\xfe\x00"), "UTF-16"),
        ("nested", bundle("[" * 100_000 + "]" * 100_000), "nested"),
        ("no-artifacts", bundle('{"tx": 1}'), "'artifacts' list"),
        ("escape-path", bundle(manifest({"path": "../../etc/passwd"})), "unsafe_path"),
        ("bad-sha", bundle(manifest({"path": "a", "sha256": "xyz"}), a="x"), "sha256"),
        ("negative-size", bundle(manifest({"path": "a", "size": -1}), a="x"), "size"),
        ("bool-size", bundle(manifest({"path": "a", "size": True}), a="x"), "size"),
        ("path-esc", bundle(manifest({"path": "a\x1b[2J"})), "path"),
        ("twice", bundle(manifest({"path": "a"}, {"path": "a"}), a="x"), "twice"),
        ("loop-artifact", bundle(manifest({"path": "a"}), a=symlink_loop), "unreadable"),
        ("missing-manifest", bundle(None, a="x"), "no manifest.json"),
        ("fifo-manifest", bundle(fifo), "not a regular file"),
    ]
]


CASES: list[Case] = [*COMMAND_LINES, *CONFIGS, *RECIPES, *DATABASES, *SETTINGS, *MANIFESTS]


# -- router credential files and variables (resolved before any router call; exit 3) ----------

SECRET = "s3cr3t-token-value"


@dataclass(frozen=True)
class CredentialCase:
    id: str
    content: Content | None  # the credential file (None: no file configured)
    mode: int = 0o600
    env: dict[str, str] = field(default_factory=dict)
    accepted: bool = False
    names: str = ""
    foreign_owner: bool = False


def creds(admin: Any = SECRET + "-a", client: Any = SECRET + "-c") -> str:
    return tomlkit.dumps({"admin_token": admin, "client_token": client})


CREDENTIALS: list[CredentialCase] = [
    CredentialCase("missing-file", None, names="does not exist", env={}),
    CredentialCase("directory", directory, names="not a regular file"),
    CredentialCase("fifo", fifo, names="not a regular file"),
    CredentialCase("symlink-loop", symlink_loop, names="router.toml"),
    CredentialCase("mode-0644", creds(), mode=0o644, names="chmod 600"),
    CredentialCase("mode-0640", creds(), mode=0o640, names="chmod 600"),
    CredentialCase("mode-0604", creds(), mode=0o604, names="chmod 600"),
    CredentialCase("foreign-owner", creds(), names="owned by uid", foreign_owner=True),
    CredentialCase("binary", b"\xff\xfe\x00\x01" + SECRET.encode(), names="UTF-16"),
    CredentialCase("latin1", f'admin_token = "{SECRET}\xe9"'.encode("latin-1"), names="not UTF-8"),
    CredentialCase("not-toml", f"admin_token = {SECRET}", names="not valid TOML"),
    CredentialCase("nested", deep(10_000), names="nested too deeply"),
    CredentialCase("oversized", creds() + "#" * 70_000, names="bytes"),
    CredentialCase("token-number", creds(admin=5), names="admin_token"),
    CredentialCase("token-empty", creds(admin=""), names="admin_token"),
    CredentialCase("token-space", creds(admin=SECRET + " x"), names="whitespace"),
    CredentialCase("token-newline", creds(admin=SECRET + "\nx"), names="whitespace"),
    CredentialCase("token-tab", creds(client=SECRET + "\tx"), names="whitespace"),
    CredentialCase("token-non-ascii", creds(admin=SECRET + "ö"), names="non-ASCII"),
    CredentialCase("token-control", creds(admin=SECRET + "\x7f"), names="non-printable"),
    CredentialCase("token-long", creds(admin="x" * 5000), names="at most 4096"),
    CredentialCase("no-admin", tomlkit.dumps({"client_token": SECRET}), names="admin token not found"),
    CredentialCase(
        "env-space",
        None,
        env={"ANVIL_ROUTER_CLIENT_TOKEN": "client-ok", "ANVIL_ROUTER_ADMIN_TOKEN": SECRET + " x"},
        names="env ANVIL_ROUTER_ADMIN_TOKEN",
    ),
    CredentialCase(
        "env-non-ascii",
        None,
        env={"ANVIL_ROUTER_CLIENT_TOKEN": "client-ok", "ANVIL_ROUTER_ADMIN_TOKEN": SECRET + "ü"},
        names="non-ASCII",
    ),
    CredentialCase(
        "env-embedded-newline", None, env={"ANVIL_ROUTER_CLIENT_TOKEN": "a\nb"}, names="whitespace"
    ),
    CredentialCase("nothing-anywhere", None, names="not found"),
    # what must work
    CredentialCase("ok-file-0600", creds(), accepted=True),
    CredentialCase("ok-file-0400", creds(), mode=0o400, accepted=True),
    CredentialCase(
        "ok-env-with-trailing-newline",
        None,
        env={"ANVIL_ROUTER_ADMIN_TOKEN": SECRET + "\n", "ANVIL_ROUTER_CLIENT_TOKEN": SECRET},
        accepted=True,
    ),
]
