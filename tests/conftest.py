"""Shared fixtures. Logs go to stderr at warning level so test output stays readable.

`backend` is parametrized over the two state backends; `state_db` is the state database
of a test that runs on both: None for the default SQLite file, or the URL of a new
database (at the schema's head) on the PostgreSQL server `scripts/testenv` starts
(`tests.pgserver`; skipped without one, failed where the suite requires it);
`fake_host_on` is the fake host on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anvil_ctl.log import configure
from tests.pgserver import PgServer, pg_session_server, skip_or_fail
from tests.unit.fakehost import FakeHost, make_fake_host

configure("console", "warning")


@pytest.fixture(autouse=True)
def _no_default_places(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests name their state directory and host config; one that forgets gets empty places of
    its own, never the host's defaults (/var/lib/anvil and /etc/anvil/anvil.toml as root).
    A test of the defaults removes these variables itself."""
    unset = tmp_path_factory.mktemp("unset")
    monkeypatch.setenv("ANVIL_STATE_DIR", str(unset / "state"))
    monkeypatch.setenv("ANVIL_CONFIG", str(unset / "anvil.toml"))


@pytest.fixture
def fake_host(tmp_path: Path) -> FakeHost:
    return make_fake_host(tmp_path)


BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer | None]:
    yield from pg_session_server()


@pytest.fixture
def pg_database(pg_server: PgServer | None) -> Iterator[Callable[..., str]]:
    """Factory: the URL of a new database (at the schema's head unless migrated=False),
    dropped at teardown."""
    if pg_server is None:
        skip_or_fail()
    assert pg_server is not None
    made: list[str] = []

    def make(*, migrated: bool = True) -> str:
        name = pg_server.database(migrated=migrated)
        made.append(name)
        return pg_server.url_str(name)

    yield make
    for name in made:
        pg_server.drop(name)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def state_db(backend: str, request: pytest.FixtureRequest) -> str | None:
    """None (SQLite in the state directory) or a new PostgreSQL database's URL."""
    if backend == "sqlite":
        return None
    make: Callable[..., str] = request.getfixturevalue("pg_database")
    return make()


@pytest.fixture
def fake_host_on(tmp_path: Path, state_db: str | None) -> FakeHost:
    """The fake host on the `backend` of this parametrization."""
    return make_fake_host(tmp_path, state_db=state_db)
