"""Qualification: gates run against a candidate's endpoint, evidence, and a bound decision.

Public surface (the CLI and the qualify transaction use these):

- `run_qualification(...) -> QualificationResult` (sync) / `qualify(...)` (async)
- `load_profile`, `resolve_profile`, `Profile`
- `decide`, `make_decision`, `candidate_identity_digest`, `Decision`
- `EvidenceWriter`, `export_bundle`, `verify_bundle`, `Redaction`
- `make_progress`, `render_summary`, `summary_table`, `render_gates`

Each name is imported from its module when first read (`__getattr__`, PEP 562): importing
one submodule (promote's `vram-after-acceptance` step writes its reading with
`qualify.evidence.EvidenceWriter`) no longer imports the whole qualification machinery
(profiles, gates, A/B, runner: ~75 of the ~95 ms that import took here).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

_WHERE = {
    "anvil_ctl.qualify.decision": ("Decision", "candidate_identity_digest", "decide", "make_decision"),
    "anvil_ctl.qualify.evidence": (
        "Artifact",
        "EvidenceWriter",
        "ExportResult",
        "Redaction",
        "VerifyResult",
        "export_bundle",
        "verify_bundle",
    ),
    "anvil_ctl.qualify.profiles": ("Profile", "available_profiles", "load_profile", "resolve_profile"),
    "anvil_ctl.qualify.report": (
        "make_progress",
        "render_gates",
        "render_summary",
        "summary_rows",
        "summary_table",
    ),
    "anvil_ctl.qualify.results": ("GateResult",),
    "anvil_ctl.qualify.runner": ("QualificationResult", "qualify", "run_qualification"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # read once: the next access is a plain attribute
    return value


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
