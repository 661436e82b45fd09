"""What one `audit verify` checked and found (`Report`), and the JSON it prints.

`verify` fills a Report as it walks; `Report.as_dict()` is the document `anvilctl
audit verify --json` prints, its shape spelled out by `ReportRecord`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from anvil_ctl.persistence import audit
from anvil_ctl.persistence.audit import Head
from anvil_ctl.persistence.chainwalk import Problem, ProblemRecord


class CheckpointRecord(TypedDict):
    """A checkpoint as a report names it: the one a run started from, or the one it recorded."""

    id: int
    head: str  # SEQ:HASH
    mode: str
    at: str


class HeadFileCheck(TypedDict, total=False):
    """The head file beside the database: where it is, the head it records, how far behind."""

    path: str | None
    head: str
    behind: int


class ReportRecord(TypedDict):
    """A `Report` as `audit verify --json` prints it."""

    ok: bool
    mode: str
    escalated: str | None
    rows: int  # = entries_checked, the name earlier versions printed
    entries_checked: int
    rows_checked: int
    entries: int
    head: str
    head_file: HeadFileCheck
    expect_head: str | None
    started_from: CheckpointRecord | None
    checkpoint: CheckpointRecord | None
    checkpoint_error: str | None
    problems: list[ProblemRecord]
    projection_differs: list[str]
    hosts: NotRequired[list[HostEntries]]  # `audit verify` adds the hosts it was asked about


class HostEntries(TypedDict):
    host: str
    host_id: int
    entries: int


@dataclass
class Report:
    """What one `audit verify` checked and found."""

    mode: str  # full | incremental
    head: Head = audit.EMPTY
    entries_checked: int = 0
    rows_checked: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    schema_version: int | None = None
    started_from: CheckpointRecord | None = None  # the checkpoint an incremental run began at
    escalated: str | None = None  # why an incremental run walked everything
    head_file: HeadFileCheck = field(default_factory=HeadFileCheck)
    expect_head: Head | None = None
    checkpoint: CheckpointRecord | None = None  # the checkpoint this run recorded
    checkpoint_error: str | None = None  # why it could not record one (a read-only database)
    problems: list[Problem] = field(default_factory=list)
    projection_differs: list[str] = field(default_factory=list)  # full walks: derived tables off

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> ReportRecord:
        return {
            "ok": self.ok,
            "mode": self.mode,
            "escalated": self.escalated,
            "rows": self.entries_checked,
            "entries_checked": self.entries_checked,
            "rows_checked": self.rows_checked,
            "entries": self.head.seq,
            "head": str(self.head),
            "head_file": self.head_file,
            "expect_head": str(self.expect_head) if self.expect_head else None,
            "started_from": self.started_from,
            "checkpoint": self.checkpoint,
            "checkpoint_error": self.checkpoint_error,
            "problems": [p.as_dict() for p in self.problems],
            "projection_differs": self.projection_differs,
        }
