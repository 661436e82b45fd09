"""The bad-input suite: command lines, host configs, recipes, state databases, settings and
evidence bundles as a careless or hostile operator gives them (`badinput_cases.py`).

Every case runs `anvilctl` in this process (`cli.main`) against one fake host shared by
the module, after writing the case's files into its own directory, and asserts: the exit
code; for a refusal, exactly one line on stderr, `anvilctl: error: ...`, naming the input,
and no traceback; and, whatever the outcome, the state database (dumped), the state
directory, the fake world and the case's own directory unchanged. Sharing the host is
what makes the last check strong: a case that wrote anything would show in every later
case too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from anvil_ctl import cli, log
from anvil_ctl.adapters.credentials import resolve_credentials
from anvil_ctl.config.host import RouterConfig
from anvil_ctl.core.errors import CredentialError
from anvil_ctl.core.states import ExitCode
from tests.unit.badinput_cases import CASES, CREDENTIALS, SECRET, Case, CredentialCase
from tests.unit.fakehost import FakeHost, make_fake_host
from tests.unit.hoststate import environ, host_state

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHost]:
    with pytest.MonkeyPatch.context() as mp:
        # cli.main would point structlog at the captured stderr of one test; keep conftest's.
        mp.setattr(log, "configure", lambda *_a, **_k: None)
        yield make_fake_host(tmp_path_factory.mktemp("host"))


def fill(text: str, host: FakeHost, case_dir: Path) -> str:
    return (
        text.replace("{case}", str(case_dir))
        .replace("{host}", str(host.root))
        .replace("{incumbent}", host.incumbent_id)
        .replace("{recipes}", str(REPO / "recipes"))
    )


def write_files(case: Case, case_dir: Path, host: FakeHost) -> None:
    for rel, content in case.files.items():
        path = case_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path, host.root)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_in_one_line_and_changes_nothing(
    case: Case, host: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_files(case, tmp_path, host)
    env = {
        "ANVIL_BACKEND": "fake",
        "ANVIL_STATE_DIR": str(host.settings.state_dir),
        "ANVIL_CONFIG": str(host.settings.config),
        "ANVIL_RECIPES_DIR": str(REPO / "recipes"),
        "ANVIL_LOG_FORMAT": "json",
        **{k: fill(v, host, tmp_path) for k, v in case.env.items()},
    }
    argv = [fill(a, host, tmp_path) for a in case.argv]
    before = host_state(host, tmp_path)
    capsys.readouterr()
    with environ(env):
        code = cli.main(argv)
    out, err = capsys.readouterr()

    assert code == case.code, f"exit {code}, expected {case.code}: {err or out}"
    assert "Traceback" not in err and "internal error" not in err
    if case.stream == "err" and case.code != 0:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("anvilctl: error: "), err
        assert case.names in lines[0], lines[0]
        assert not any(ch in lines[0] for ch in "\x1b\u202e\x00"), "the error line must be escaped"
    elif case.stream == "out":
        assert case.names in out, out
        assert "\x1b" not in out
    assert host_state(host, tmp_path) == before


class TestTheSuite:
    def test_has_at_least_150_cases_with_unique_names(self) -> None:
        assert len(CASES) >= 150
        assert len({c.id for c in CASES}) == len(CASES)

    def test_covers_every_category_with_refusals_and_accepted_edges(self) -> None:
        categories = {c.category for c in CASES}
        assert categories == {"cli", "config", "recipe", "database", "settings", "manifest"}
        assert any(c.code == 0 for c in CASES) and sum(c.code == 2 for c in CASES) >= 120


@pytest.mark.parametrize("case", CREDENTIALS, ids=[c.id for c in CREDENTIALS])
def test_router_credentials_resolve_or_refuse_naming_the_source_never_the_token(
    case: CredentialCase, tmp_path: Path, host: FakeHost
) -> None:
    """A credential that cannot be used is a refusal before any router call (exit 3 through the
    credential guard), naming the file or variable; no message ever carries a token."""
    path = tmp_path / "router.toml"
    configured = case.content is not None or case.id in ("missing-file",)
    if case.content is not None:
        if callable(case.content):
            case.content(path, host.root)
        else:
            data = case.content.encode() if isinstance(case.content, str) else case.content
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, case.mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(path, case.mode)
    if case.foreign_owner:
        if os.geteuid() != 0:
            pytest.skip("changing a file's owner needs root")
        os.chown(path, 65534, 65534)
    router = RouterConfig(credential_file=path if configured else None)
    try:
        creds = resolve_credentials(router, case.env, need_admin=True)
    except CredentialError as exc:
        assert not case.accepted, str(exc)
        assert exc.exit_code == ExitCode.REFUSED
        assert case.names in str(exc) and "\n" not in str(exc)
        assert SECRET not in str(exc) and SECRET not in repr(exc.data)
        return
    assert case.accepted, f"accepted: {creds!r}"
    assert SECRET not in repr(creds) and SECRET not in str(creds)
