"""Typed views the CLI wraps results in, choosing the renderer; `payload()` is what `--json` prints."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Row = Mapping[str, object]


def record(value: object) -> Mapping[str, object]:
    """`value` as a record to read fields from; an empty one when it is None or not a record."""
    return value if isinstance(value, Mapping) else {}


def items(value: object) -> Sequence[object]:
    """`value` as a list to go through; an empty one when it is None or not a list."""
    return value if isinstance(value, list | tuple) else ()


def records(value: object) -> list[Mapping[str, object]]:
    """The records of a list (see `items`); anything else in it is skipped."""
    return [v for v in items(value) if isinstance(v, Mapping)]


class View:
    """Base of the CLI's views: `payload()` is the JSON document."""

    def payload(self) -> object:
        raise NotImplementedError


@dataclass(frozen=True)
class _Data(View):
    """A view of one record; its payload is the record."""

    data: Mapping[str, object]

    def payload(self) -> object:
        return dict(self.data)


@dataclass(frozen=True)
class _Rows(View):
    """A view of rows; its payload is the list of them."""

    rows: Sequence[Row]

    def payload(self) -> object:
        return [dict(r) for r in self.rows]


@dataclass(frozen=True)
class Table(_Rows):
    """Rows of records; human: a table of `columns` (default the first row's keys), via `cells` if given."""

    columns: Sequence[str] | None = None
    cells: Callable[[Row], Row] | None = None

    def human_rows(self) -> list[dict[str, object]]:
        rows = [dict(self.cells(r)) if self.cells else dict(r) for r in self.rows]
        if self.columns is None:
            return rows
        return [{c: r.get(c) for c in self.columns} for r in rows]


class StatusView(_Data):
    """`status`: slots with binding, served models, incumbent, candidates and router view."""


class DiffView(_Rows):
    """`audit diff`: a transaction's snapshot diffs (label, equal, hashes, changes)."""


class ChainCheck(_Data):
    """`audit verify`: the chain walked, covered rows re-digested, head compared (ok, problems)."""

    @property
    def ok(self) -> bool:
        return bool(self.data["ok"])


class GpuReadings(_Data):
    """`gpus`: every GPU the probe sees, with role and owner; the driver version."""


class DetectedRoles(_Data):
    """`gpus detect`: the `[gpu_roles.*]` TOML and whether it was written."""


class EvidenceAudit(_Data):
    """`audit evidence`: one transaction's gate rows and its manifest check."""

    @property
    def ok(self) -> bool:
        return bool(record(self.data["verify"])["ok"])


@dataclass(frozen=True)
class Text(View):
    """Plain text printed as is (human) and as a JSON string."""

    text: str

    def payload(self) -> object:
        return self.text


class TransactionView(_Data):
    """`audit show`: one transaction's states, step events, snapshots and identities, as a timeline."""


class InitView(_Data):
    """`init` and `db upgrade`: which database and config, the schema revision before and after."""


WAIVER_COLUMNS = (
    "id",
    "state",
    "policy",
    "value",
    "roles",
    "gates",
    "recipe_digest",
    "approved_by",
    "created_at",
    "expires_at",
    "revoked_at",
    "reason",
)


def waiver_table(rows: Sequence[Row]) -> Table:
    """`waivers list` and `audit waivers`: every waiver with its state now."""
    return Table(rows, columns=WAIVER_COLUMNS)
