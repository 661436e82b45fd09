"""Evidence bundles as the report reads them: verified first, then their JSON artifacts.

A bundle that differs from its manifest raises EvidenceMismatch (exit 6): nothing on a
report may come from it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from anvil_ctl.core.errors import EvidenceMismatch
from anvil_ctl.core.jsontypes import JSONObject, JSONValue
from anvil_ctl.qualify.evidence import read_manifest, verify_bundle
from anvil_ctl.qualify.manifest import listed_entries
from anvil_ctl.qualify.narrow import fields


@dataclass(frozen=True)
class Bundle:
    """One verified evidence directory and its JSON artifacts."""

    tx_id: str
    directory: Path
    manifest_sha256: str
    files: dict[str, JSONValue]

    @classmethod
    def load(cls, directory: Path, tx_id: str = "") -> Bundle:
        checked = verify_bundle(directory)
        if not checked.ok:
            problems = ", ".join(f"{m.path}: {m.problem}" for m in checked.mismatches)
            raise EvidenceMismatch(
                f"{directory}: evidence does not match its manifest ({problems}); "
                "nothing is reported from it",
                mismatches=[m.path for m in checked.mismatches],
            )
        manifest = read_manifest(directory)
        files: dict[str, JSONValue] = {
            str(a["path"]): json.loads((directory / str(a["path"])).read_text())
            for a in listed_entries(manifest)
            if str(a["path"]).endswith(".json")
        }
        digest = hashlib.sha256((directory / "manifest.json").read_bytes()).hexdigest()
        return cls(tx_id or str(manifest.get("tx_id", directory.name)), directory, digest, files)

    def gate(self, gate_type: str) -> JSONObject | None:
        """The first gate artifact (by name) whose evidence says it is of `gate_type`."""
        return next(
            (
                v
                for k, v in sorted(self.files.items())
                if isinstance(v, dict) and fields(v.get("evidence", {})).get("gate_type") == gate_type
            ),
            None,
        )


@dataclass
class ReportInputs:
    qualification: Bundle
    decisions: list[Mapping[str, object]] = field(default_factory=list)
    waivers: list[JSONObject] = field(default_factory=list)
    promotions: list[Bundle] = field(default_factory=list)
    ab: list[Bundle] = field(default_factory=list)
