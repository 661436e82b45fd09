"""Qualification: gates run against a candidate's endpoint, evidence, and a bound decision.

Public surface (the CLI and the qualify transaction use these):

- `run_qualification(...) -> QualificationResult` (sync) / `qualify(...)` (async)
- `load_profile`, `resolve_profile`, `Profile`
- `decide`, `make_decision`, `candidate_identity_digest`, `Decision`
- `EvidenceWriter`, `export_bundle`, `verify_bundle`, `Redaction`
- `make_progress`, `render_summary`, `summary_table`, `render_gates`
"""

from __future__ import annotations

from anvil_ctl.qualify.decision import Decision, candidate_identity_digest, decide, make_decision
from anvil_ctl.qualify.evidence import (
    Artifact,
    EvidenceWriter,
    ExportResult,
    Redaction,
    VerifyResult,
    export_bundle,
    verify_bundle,
)
from anvil_ctl.qualify.profiles import Profile, available_profiles, load_profile, resolve_profile
from anvil_ctl.qualify.report import (
    make_progress,
    render_gates,
    render_summary,
    summary_rows,
    summary_table,
)
from anvil_ctl.qualify.results import GateResult
from anvil_ctl.qualify.runner import QualificationResult, qualify, run_qualification

__all__ = [
    "Artifact",
    "Decision",
    "EvidenceWriter",
    "ExportResult",
    "GateResult",
    "Profile",
    "QualificationResult",
    "Redaction",
    "VerifyResult",
    "available_profiles",
    "candidate_identity_digest",
    "decide",
    "export_bundle",
    "load_profile",
    "make_decision",
    "make_progress",
    "qualify",
    "render_gates",
    "render_summary",
    "resolve_profile",
    "run_qualification",
    "summary_rows",
    "summary_table",
    "verify_bundle",
]
