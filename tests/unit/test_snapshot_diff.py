"""Snapshot diffs say what happened: added, removed, changed; stored as a JSON Patch (RFC 6902)."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anvil_ctl.cli.render_tx import change_line
from anvil_ctl.core.snapshot import (
    Snapshot,
    diff,
    from_patch,
    to_patch,
)
from anvil_ctl.persistence import queries
from tests.unit.clirun import Run, in_process
from tests.unit.fakehost import FakeHost

BACKEND = {"url": "http://127.0.0.1:8001", "observed_model": "m", "healthy": True}


def lines(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [change_line(c.as_dict()) for c in diff(Snapshot.of(before), Snapshot.of(after))]


class TestDiff:
    def test_a_key_only_after_is_one_addition_of_its_whole_value(self) -> None:
        assert lines({"gpu_owners": {}}, {"gpu_owners": {"compute-a": {"container_id": "7180"}}}) == [
            '+ gpu_owners.compute-a: {"container_id": "7180"}'
        ]

    def test_a_key_only_before_is_one_removal_of_its_whole_value(self) -> None:
        assert lines({"gpu_owners": {"compute-a": {"container_id": "7180"}}}, {"gpu_owners": {}}) == [
            '- gpu_owners.compute-a: {"container_id": "7180"}'
        ]

    def test_a_value_present_on_both_sides_is_changed_with_before_and_after(self) -> None:
        assert lines({"a": {"status": "running"}}, {"a": {"status": "exited"}}) == [
            '~ a.status: "running" -> "exited"'
        ]

    def test_a_backend_list_going_from_one_to_none_removes_that_backend(self) -> None:
        assert lines({"router": {"backends": [BACKEND]}}, {"router": {"backends": []}}) == [
            '- router.backends[0]: {"healthy": true, "observed_model": "m", "url": "http://127.0.0.1:8001"}'
        ]

    def test_a_backend_list_going_from_none_to_one_adds_it(self) -> None:
        assert lines({"router": {"backends": []}}, {"router": {"backends": [BACKEND]}}) == [
            '+ router.backends[0]: {"healthy": true, "observed_model": "m", "url": "http://127.0.0.1:8001"}'
        ]

    def test_absence_is_never_printed_as_none_and_null_is_a_value(self) -> None:
        out = lines({"a": None, "b": 1}, {"a": 1, "c": None})
        assert out == ["~ a: null -> 1", "- b: 1", "+ c: null"]
        assert not any("None" in line for line in out)

    def test_a_bool_and_an_int_are_different_values(self) -> None:
        assert lines({"a": True}, {"a": 1}) == ["~ a: true -> 1"]

    def test_equal_snapshots_have_no_changes(self) -> None:
        assert lines({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) == []


json_leaf = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["x", "y", "a/b", "t~1"])
json_tree = st.recursive(
    json_leaf,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "c/d", "e~f", "0x"]), children, max_size=3)
    ),
    max_leaves=12,
)


class TestJsonPatch:
    def test_removal_and_change_keep_the_value_taken_away_in_a_test_op(self) -> None:
        patch = to_patch(diff(Snapshot.of({"a": 1, "b": 2}), Snapshot.of({"a": 3})))
        assert patch == [
            {"op": "test", "path": "/a", "value": 1},
            {"op": "replace", "path": "/a", "value": 3},
            {"op": "test", "path": "/b", "value": 2},
            {"op": "remove", "path": "/b"},
        ]

    def test_pointer_tokens_escape_slash_and_tilde(self) -> None:
        (change,) = diff(Snapshot.of({}), Snapshot.of({"a/b": {"c~d": 1}}))
        assert change.pointer == "/a~1b" and to_patch([change])[0]["path"] == "/a~1b"

    @settings(max_examples=200, deadline=None)
    @given(before=json_tree, after=json_tree)
    def test_the_patch_turns_before_into_after_and_reads_back_as_the_same_changes(
        self, before: Any, after: Any
    ) -> None:
        a, b = Snapshot.of({"root": before}), Snapshot.of({"root": after})
        changes = diff(a, b)
        patch = to_patch(changes)
        assert jsonpatch.apply_patch(a.body, patch) == b.body
        assert [change_line(c.as_dict()) for c in from_patch(patch)] == [
            change_line(c.as_dict()) for c in changes
        ]

    def test_the_patch_refuses_a_document_it_was_not_made_from(self) -> None:
        patch = to_patch(diff(Snapshot.of({"a": 1}), Snapshot.of({"a": 2})))
        with pytest.raises(jsonpatch.JsonPatchTestFailed):
            jsonpatch.apply_patch({"a": 5, "schema": 1}, patch)


class TestStoredDiffs:
    def _tx(self, fake_host: FakeHost) -> str:
        app = fake_host.app()
        (row,) = queries.transactions(app.store, kind="adopt", limit=1)
        return str(row["tx_id"])

    def test_a_diff_is_stored_as_a_json_patch_and_read_back_as_changes(self, fake_host: FakeHost) -> None:
        app, tx = fake_host.app(), self._tx(fake_host)
        before = Snapshot.of({"router": {"backends": [BACKEND]}})
        after = Snapshot.of({"router": {"backends": []}})
        app.store.record_diff(tx, "one-to-none", before, after, diff(before, after))
        (row,) = [d for d in queries.snapshot_diffs(app.store, tx) if d["label"] == "one-to-none"]
        assert row["format"] == "json-patch"
        assert jsonpatch.apply_patch(before.body, row["patch"]) == after.body
        assert row["changes"] == [
            {"op": "remove", "path": "router.backends[0]", "pointer": "/router/backends/0", "before": BACKEND}
        ]


@pytest.fixture
def anvilctl(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Run:
    return in_process(fake_host, monkeypatch, capsys)


class TestDiffRendering:
    def test_audit_diff_prints_plus_minus_and_tilde_lines_and_never_none(
        self, fake_host: FakeHost, anvilctl: Run
    ) -> None:
        app = fake_host.app()
        (row,) = queries.transactions(app.store, kind="adopt", limit=1)
        before = Snapshot.of({"gpu_owners": {}, "router": {"backends": [BACKEND]}, "state": "a"})
        after = Snapshot.of({"gpu_owners": {"compute-a": "7180"}, "router": {"backends": []}, "state": "b"})
        app.store.record_diff(row["tx_id"], "rendered", before, after, diff(before, after))
        r = anvilctl("audit", "diff", row["tx_id"])
        assert r.code == 0, r.err
        assert "rendered: 3 change(s)" in r.out
        assert '  + gpu_owners.compute-a: "7180"' in r.out
        assert '  - router.backends[0]: {"healthy": true' in r.out
        assert '  ~ state: "a" -> "b"' in r.out
        assert "None" not in r.out

    def test_a_load_outcome_lists_its_changes_the_same_way(self, fake_host: FakeHost, anvilctl: Run) -> None:
        from anvil_ctl.cli import render
        from anvil_ctl.commands import transactions

        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        lines_out = [line.strip() for line in _rendered(render, out).splitlines()]
        changes = [line for line in lines_out if line[:2] in ("+ ", "- ", "~ ")]
        assert changes and all("None" not in line for line in changes)
        assert any(line.startswith("+ gpu_owners.compute-a") or "gpu_owners" in line for line in changes)


def _rendered(render: Any, result: Any) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        render.show(result, as_json=False)
    return buf.getvalue()
