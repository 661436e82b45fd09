"""The one way into every transaction (`anvil_ctl.engine.entry`): one place mints its ID, each
kind prepares its arguments once, and the host lock is the entry's, released on every way out."""

from __future__ import annotations

import ast
import fcntl
import os
import uuid
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import anvil_ctl
from anvil_ctl.commands import lifecycle, transactions
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import LABEL_TX
from anvil_ctl.core.states import TxState
from anvil_ctl.engine import entry
from anvil_ctl.engine.lock import HostLock, held_locks
from anvil_ctl.engine.plans import KINDS, promote
from tests.unit.fakehost import FakeHost

PACKAGE = Path(anvil_ctl.__file__).parent


def _calls(callee: str) -> set[tuple[str, str]]:
    """(module, enclosing function) of every call to `callee` in the package."""
    found: set[tuple[str, str]] = set()
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Call):
                    name = (
                        node.func.attr
                        if isinstance(node.func, ast.Attribute)
                        else getattr(node.func, "id", "")
                    )
                    if name == callee:
                        found.add((module, func.name))
    return found


def _loaded_and_verified(host: FakeHost) -> None:
    out = transactions.load(host.app(), slot="primary", candidate=host.candidate())
    assert out.state == TxState.COMMITTED, out.reason
    host.decide()


def _os_lock_free(host: FakeHost) -> bool:
    """Nobody holds the host's lock file (a second open file description can take it)."""
    fd = os.open(host.app().settings.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


class TestOneMintPlace:
    def test_the_package_makes_transaction_ids_only_in_the_entry(self) -> None:
        """Besides the entry (transaction IDs), uuid4 makes only other things' IDs: the host
        lock's row, a waiver, and the path of a worker smg parks a drained alias on. The store
        has no default ID to make."""
        assert _calls("uuid4") == {
            ("anvil_ctl.engine.entry", "_mint"),
            ("anvil_ctl.engine.lock", "claim"),
            ("anvil_ctl.commands.gpus_and_waivers", "waive"),
            ("anvil_ctl.adapters.smg", "_park"),
        }

    def test_only_the_entry_and_recover_run_the_transaction_engine(self) -> None:
        assert _calls("TransactionEngine") == {
            ("anvil_ctl.engine.entry", "run"),
            ("anvil_ctl.engine.recover", "recover_unfinished"),
        }

    def test_the_journal_requires_the_id_it_is_given(self, fake_host: FakeHost) -> None:
        with pytest.raises(TypeError, match="tx_id"):
            fake_host.app().store.begin(kind="load", slot="primary", args={}, owner=fake_host.app().owner)  # type: ignore[call-arg]

    def test_the_minted_id_names_the_transaction_its_lock_row_and_the_container(
        self, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        minted: list[str] = []
        real = uuid.uuid4

        def counted() -> uuid.UUID:
            value = real()
            minted.append(str(value))
            return value

        monkeypatch.setattr(entry, "uuid", SimpleNamespace(uuid4=counted))
        lock_rows: list[str | None] = []
        claim = HostLock.claim

        def claiming(self: HostLock) -> None:
            claim(self)
            lock_rows.append(self.tx_id)

        monkeypatch.setattr(HostLock, "claim", claiming)
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.COMMITTED, out.reason
        assert minted == [out.tx_id] == lock_rows
        cid = str(out.results["start-candidate"]["container_id"])
        assert fake_host.app().world().runtime.inspect(cid).labels[LABEL_TX] == out.tx_id

    def test_a_dry_run_mints_nothing(self, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(
            entry, "uuid", SimpleNamespace(uuid4=lambda: pytest.fail("a dry run minted an ID"))
        )
        out = transactions.load(
            fake_host.app(), slot="primary", candidate=fake_host.candidate(), dry_run=True
        )
        assert out.dry_run and out.tx_id is None


class TestPrepareOnce:
    def test_a_promotion_prepares_once_and_reads_the_standing_decision_once(
        self, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        _loaded_and_verified(fake_host)
        calls = {"prepare": 0, "standing_decision": 0}
        kind: Any = KINDS["promote"]

        def prepare(world: Any, request: Any) -> Any:
            calls["prepare"] += 1
            return promote.prepare(world, request)

        def standing(store: Any, digest: str) -> Any:
            calls["standing_decision"] += 1
            return real_standing(store, digest)

        real_standing = promote.standing_decision
        monkeypatch.setitem(KINDS, "promote", replace(kind, preparer=prepare))
        monkeypatch.setattr(promote, "standing_decision", standing)
        out = lifecycle.promote(fake_host.app(), slot="primary", approved_by="operator")
        assert out.state == TxState.COMMITTED, out.reason
        assert calls == {"prepare": 1, "standing_decision": 1}

    def test_the_guard_judges_the_decision_prepare_read(self, fake_host: FakeHost) -> None:
        """CandidateVerified refuses on the prepared outcome, not on a second read."""
        _loaded_and_verified(fake_host)
        app = fake_host.app()
        world = app.world()
        args = promote.prepare(world, promote.PromoteRequest(slot="primary", approved_by="operator"))
        assert (args.decision_id, args.decision_outcome) == ("d-1", "verified")
        stale = replace(args, decision_outcome="failed")
        refusal = promote.CandidateVerified().check(
            promote.Ctx(tx_id="t", kind="promote", args=stale, world=world, memo=promote.NoMemo())
        )
        assert refusal is not None and "decision is failed (decision d-1)" in refusal.reason


class TestTheLockIsTheEntrys:
    def test_bad_input_found_by_prepare_releases_the_lock_and_writes_nothing(
        self, fake_host: FakeHost
    ) -> None:
        app = fake_host.app()
        before = len(app.store.unresolved()), len(held_locks(app.store))
        with pytest.raises(BadInput, match="no candidate has been loaded"):
            lifecycle.promote(app, slot="primary", approved_by="operator")
        assert (len(app.store.unresolved()), len(held_locks(app.store))) == before == (0, 0)
        assert _os_lock_free(fake_host)

    def test_a_failed_transaction_releases_its_row_and_the_os_lock(self, fake_host: FakeHost) -> None:
        _loaded_and_verified(fake_host)
        fake_host.world.set_fail("readmit", "backend answered 503")
        out = lifecycle.promote(fake_host.app(), slot="primary", approved_by="operator")
        assert out.state == TxState.COMPENSATED, out.reason
        assert held_locks(fake_host.app().store) == []
        assert _os_lock_free(fake_host)

    def test_an_interrupt_that_escapes_the_run_keeps_the_row_for_recover_and_frees_the_os_lock(
        self, fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Ctrl-C mid-transaction leaves it unfinished: its lock row stays, naming it, so the
        next mutator is refused until `recover`; the OS lock goes with the process."""
        _loaded_and_verified(fake_host)
        app = fake_host.app()
        real = app.store.step_event

        def failing(tx_id: str, **kw: Any) -> None:
            if kw.get("step") == "routed-smoke" and kw.get("event") == "intent":
                raise KeyboardInterrupt
            real(tx_id, **kw)

        monkeypatch.setattr(app.store, "step_event", failing)
        with pytest.raises(KeyboardInterrupt):
            lifecycle.promote(app, slot="primary", approved_by="operator")
        (row,) = held_locks(app.store)
        (unfinished,) = app.store.unresolved()
        assert row.tx_id == unfinished.id and unfinished.kind == "promote"
        assert _os_lock_free(fake_host)

    def test_the_probe_sees_a_held_lock(self, fake_host: FakeHost) -> None:
        app = fake_host.app()
        held = HostLock(app.store, app.settings.lock_path, app.owner, "probe")
        held.acquire(claim=False)
        try:
            assert not _os_lock_free(fake_host)
        finally:
            held.release()
        assert _os_lock_free(fake_host)
