#!/usr/bin/env python3
"""Run the bad-input suite's cases and the property loaders once more, and print what they did.

    .venv/bin/python scripts/badinput_counts.py [--examples 4000]

Every case of `tests/unit/badinput_cases.py` runs as the suite runs it (in this process,
on a fresh fake host); each credential case resolves; each property loader gets
`--examples` generated inputs. The table counts the exit codes actually seen (a
credential refusal is exit 3: the credential guard refuses before any router call; a
property example that loads is "accepted", one that raises our own error "exit 2", and
any other exception is counted as "crashed", which must stay 0). Measurement only: the
tests are what hold these numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypothesis import given, settings

from anvil_ctl import cli, log
from anvil_ctl.adapters.credentials import read_credential_file, resolve_credentials
from anvil_ctl.config.host import RouterConfig, load_host_config
from anvil_ctl.core.errors import BadInput, CredentialError
from anvil_ctl.evidence.bundle import read_manifest
from anvil_ctl.recipes.model import load_recipe
from tests.unit import test_input_properties as props
from tests.unit.badinput_cases import BASE_RECIPE, CASES, CREDENTIALS, HOST
from tests.unit.fakehost import make_fake_host
from tests.unit.hoststate import environ
from tests.unit.test_bad_input import fill, write_files
from tests.unit.test_unavailable import MUTATIONS, READ_ONLY, held

LABELS = {
    "cli": "command lines",
    "config": "host configs",
    "recipe": "recipes",
    "database": "state databases",
    "settings": "settings (environment)",
    "manifest": "evidence bundles",
    "credential": "router credentials",
    "unavailable": "dependencies unavailable",
}


def run_cases(root: Path) -> dict[str, Counter[int]]:
    log.configure("json", "error")
    log.configure = lambda *_a, **_k: None  # type: ignore[assignment]
    (root / "host").mkdir(parents=True)
    host = make_fake_host(root / "host")
    seen: dict[str, Counter[int]] = {}
    for i, case in enumerate(CASES):
        case_dir = root / f"case-{i}"
        case_dir.mkdir()
        write_files(case, case_dir, host)
        env = {
            "ANVIL_BACKEND": "fake",
            "ANVIL_STATE_DIR": str(host.settings.state_dir),
            "ANVIL_CONFIG": str(host.settings.config),
            "ANVIL_RECIPES_DIR": str(REPO / "recipes"),
            "ANVIL_LOG_FORMAT": "json",
            **{k: fill(v, host, case_dir) for k, v in case.env.items()},
        }
        with (
            environ(env),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            code = cli.main([fill(a, host, case_dir) for a in case.argv])
        seen.setdefault(case.category, Counter())[code] += 1
    for i, cred in enumerate(CREDENTIALS):
        path = root / f"cred-{i}.toml"
        if cred.content is not None:
            if callable(cred.content):
                cred.content(path, host.root)
            else:
                path.write_bytes(cred.content.encode() if isinstance(cred.content, str) else cred.content)
                path.chmod(cred.mode)
        if cred.foreign_owner:
            import os

            os.chown(path, 65534, 65534)
        configured = cred.content is not None or cred.id == "missing-file"
        try:
            resolve_credentials(RouterConfig(credential_file=path if configured else None), cred.env)
            code = 0
        except CredentialError as exc:
            code = exc.exit_code
        seen.setdefault("credential", Counter())[code] += 1
    return seen


def run_unavailable(root: Path) -> Counter[int]:
    """The database held by another process (plainly, then in exclusive locking mode) under every
    read-only command and mutation, and an unreachable Docker Engine under status and recheck."""
    (root / "host").mkdir(parents=True)
    host = make_fake_host(root / "host")
    db = host.settings.state_dir / "anvil.db"
    env = {
        "ANVIL_BACKEND": "fake",
        "ANVIL_STATE_DIR": str(host.settings.state_dir),
        "ANVIL_CONFIG": str(host.settings.config),
        "ANVIL_RECIPES_DIR": str(REPO / "recipes"),
    }
    no_docker = {
        "ANVIL_BACKEND": "real",
        "ANVIL_GPU": "simulated",
        "ANVIL_DOCKER_HOST": f"unix://{root}/none.sock",
    }
    seen: Counter[int] = Counter()

    def run(argv: tuple[str, ...], extra: dict[str, str] | None = None) -> None:
        args = [a.replace("{incumbent}", host.incumbent_id) for a in argv]
        quiet = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())
        with environ({**env, **(extra or {})}), quiet[0], quiet[1]:
            seen[cli.main(args)] += 1

    for mode in ("plain", "exclusive-locking"):
        with held(db, mode):
            for argv in [*READ_ONLY, *MUTATIONS]:
                run(argv)
    run(("status",), no_docker)
    run(("recheck", "--textfile", str(root / "anvil.prom")), no_docker)
    return seen


def run_properties(root: Path, examples: int) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}

    def loader(name: str, load: Any, ours: type[Exception], strategy: Any, file: str) -> None:
        tally = out.setdefault(name, Counter())

        @settings(
            max_examples=examples, deadline=None, database=None, suppress_health_check=list(props.HealthCheck)
        )
        @given(data=strategy)
        def check(data: bytes) -> None:
            path = props.write(root / file, data)
            try:
                load(path)
                tally["accepted"] += 1
            except ours:
                tally["refused"] += 1
            except Exception:
                tally["crashed"] += 1

        check()

    loader(
        "host config (anvil.toml)",
        load_host_config,
        BadInput,
        props.toml_inputs(tomllib.loads(HOST)),
        "anvil.toml",
    )
    loader(
        "recipe", load_recipe, BadInput, props.toml_inputs(tomllib.loads(BASE_RECIPE)), "stub-245k-c1.toml"
    )
    creds = props.toml_inputs({"admin_token": "a" * 20, "client_token": "c" * 20})
    loader("credential file", read_credential_file, CredentialError, creds, "router.toml")
    bundle = root / "bundle"
    bundle.mkdir()
    manifests = props.st.one_of(
        props.st.binary(max_size=300), props.json_values.map(lambda v: props.json.dumps(v).encode())
    )
    loader(
        "evidence manifest", lambda p: read_manifest(p.parent), BadInput, manifests, "bundle/manifest.json"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000, help="generated inputs per loader")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = run_cases(Path(tmp) / "cases")
        cases["unavailable"] = run_unavailable(Path(tmp) / "unavailable")
        properties = run_properties(Path(tmp), args.examples)

    print("| inputs | tried | exit 2 | exit 3 | exit 6 | exit 7 | accepted (0) | other |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    total: Counter[int] = Counter()
    for key, label in LABELS.items():
        c = cases.get(key, Counter())
        total.update(c)
        other = sum(v for k, v in c.items() if k not in (0, 2, 3, 6, 7))
        print(f"| {label} | {sum(c.values())} | {c[2]} | {c[3]} | {c[6]} | {c[7]} | {c[0]} | {other} |")
    other = sum(v for k, v in total.items() if k not in (0, 2, 3, 6, 7))
    print(
        f"| **all cases** | **{sum(total.values())}** | {total[2]} | {total[3]} | {total[6]} | {total[7]} "
        f"| {total[0]} | {other} |"
    )
    print()
    print("| generated inputs (hypothesis) | tried | refused (our error) | accepted | crashed |")
    print("|---|---:|---:|---:|---:|")
    for name, t in properties.items():
        print(f"| {name} | {sum(t.values())} | {t['refused']} | {t['accepted']} | {t['crashed']} |")


if __name__ == "__main__":
    main()
