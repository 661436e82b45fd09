"""The schema revision is checked without alembic: a plain query of `alembic_version` against
the revisions the migration files declare. Only `init` and `db upgrade` import alembic."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from anvil_ctl.core.errors import StateStoreError
from anvil_ctl.persistence.db import make_engine
from anvil_ctl.persistence.migrate import (
    MIGRATIONS_DIR,
    check_revision,
    current_revision,
    known_revisions,
    upgrade,
)

REPO = Path(__file__).resolve().parents[2]


def stamp(db: Path, *revisions: str) -> None:
    con = sqlite3.connect(db)
    con.execute("DELETE FROM alembic_version")
    con.executemany("INSERT INTO alembic_version(version_num) VALUES (?)", [(r,) for r in revisions])
    con.commit()
    con.close()


@pytest.fixture
def upgraded(tmp_path: Path) -> Path:
    db = tmp_path / "a.db"
    upgrade(make_engine(f"sqlite:///{db}"))
    return db


class TestKnownRevisions:
    def test_the_migration_files_declare_what_alembic_reads(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        script = ScriptDirectory.from_config(cfg)
        revisions, head = known_revisions()
        assert revisions == {rev.revision for rev in script.walk_revisions()}
        assert head == script.get_current_head()

    def test_annotated_assignments_are_read_too(self, tmp_path: Path) -> None:
        (tmp_path / "0001_a.py").write_text('revision = "0001"\ndown_revision = None\n')
        (tmp_path / "0002_b.py").write_text(
            'revision: str = "0002"\ndown_revision: Union[str, None] = "0001"\n'
        )
        assert known_revisions(tmp_path) == ({"0001", "0002"}, "0002")

    def test_two_heads_are_refused(self, tmp_path: Path) -> None:
        (tmp_path / "0001_a.py").write_text('revision = "0001"\ndown_revision = None\n')
        (tmp_path / "0002_b.py").write_text('revision = "0002"\ndown_revision = None\n')
        with pytest.raises(StateStoreError, match="one head"):
            known_revisions(tmp_path)


class TestCheckRevision:
    def test_a_database_at_head_passes_and_reads_its_revision(self, upgraded: Path) -> None:
        engine = make_engine(f"sqlite:///{upgraded}")
        assert check_revision(engine) == current_revision(engine) == known_revisions()[1]

    def test_an_older_database_is_refused_naming_db_upgrade(self, upgraded: Path) -> None:
        stamp(upgraded, "0001")
        with pytest.raises(StateStoreError, match="anvilctl db upgrade"):
            check_revision(make_engine(f"sqlite:///{upgraded}"))

    def test_a_database_stamped_at_several_revisions_is_refused(self, upgraded: Path) -> None:
        stamp(upgraded, "0001", "0002")
        with pytest.raises(StateStoreError, match="several revisions"):
            check_revision(make_engine(f"sqlite:///{upgraded}"))

    def test_an_empty_database_has_no_revision(self, tmp_path: Path) -> None:
        engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
        assert current_revision(engine) is None
        assert check_revision(engine, allow_empty=True) is None
        with pytest.raises(StateStoreError, match="anvilctl init"):
            check_revision(engine)

    def test_checking_imports_no_alembic(self, upgraded: Path) -> None:
        child = (
            "import json, sys\n"
            "from anvil_ctl.persistence.db import make_engine\n"
            "from anvil_ctl.persistence.migrate import check_revision\n"
            f"rev = check_revision(make_engine('sqlite:///{upgraded}'))\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako'))\n"
            "print(json.dumps([rev, heavy]))\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", child], capture_output=True, text=True, cwd=REPO, check=True
        )
        rev, loaded = json.loads(r.stdout)
        assert rev == known_revisions()[1]
        assert loaded == []
