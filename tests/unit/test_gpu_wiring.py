"""GPU ownership, the VRAM-release gate and waivers wired into transactions and the CLI (fakes)."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from anvil_ctl import cli, log
from anvil_ctl.adapters.shm import proc_cgroup_container
from anvil_ctl.bootstrap import App
from anvil_ctl.commands import audit, transactions
from anvil_ctl.commands import gpus_and_waivers as gpu_cmds
from anvil_ctl.config.host import GpuRole
from anvil_ctl.core.model import LABEL_SLOT, GpuProcess
from anvil_ctl.core.states import TxState
from anvil_ctl.core.steps import StepContext
from anvil_ctl.core.waiver import VRAM_RESERVE
from anvil_ctl.engine.gpu_ownership import ownership_mode, record_ownership, release_ownership
from anvil_ctl.engine.plans.args import Candidate, LoadArgs
from anvil_ctl.engine.plans.load import GUARDS as LOAD_GUARDS
from anvil_ctl.engine.plans.load import LoadMemo, candidate_identity
from anvil_ctl.gpu.waiver_policy import resolve
from anvil_ctl.persistence import gpu_ledger, waiver_rows
from tests.unit.fake_gpus import FakeGpuProbe, ManualClock, reading
from tests.unit.fakehost import FakeHost

UA = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UB = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
UUIDS = {"compute-a": UA, "compute-b": UB}
SECONDARY = """
[slots.secondary]
binding = "127.0.0.1:8002"
router_tier = "secondary-local"
aliases = ["llm.secondary"]
gpu_roles = ["compute-a", "compute-b"]
"""


def owners(host: FakeHost) -> dict[str, tuple[str, str, str]]:
    return {
        role: (o["container_id"], o["mode"], o["slot"])
        for role, o in gpu_ledger.gpu_owners(host.app().store).items()
    }


def add_secondary_slot(host: FakeHost) -> None:
    path = host.settings.config
    path.write_text(path.read_text() + SECONDARY)


def side_candidate(host: FakeHost, roles: tuple[str, ...], name: str = "side") -> Candidate:
    """A candidate for the secondary slot on `roles`."""
    base = host.candidate(served="side-model", name=name)
    spec = replace(
        base.spec,
        env=(
            ("FAKE_SERVED_MODEL", "side-model"),
            ("FAKE_BINDING", "127.0.0.1:8002"),
            ("FAKE_VRAM_MIB", "1000"),
        ),
        labels=tuple((k, "secondary" if k == LABEL_SLOT else v) for k, v in base.spec.labels),
        gpu_uuids=tuple(UUIDS[r] for r in roles),
    )
    return replace(base, spec=spec, gpu_roles=roles, served_model="side-model")


def guard_check(host: FakeHost, cand: Candidate, incumbent: Any = None) -> Any:
    """The load plan's GPU guard on this candidate (replacing `incumbent`, if given)."""
    ctx = StepContext(
        tx_id="t-guard",
        kind="load",
        args=LoadArgs(slot="secondary", candidate=cand, incumbent=incumbent, incumbent_running=True),
        world=host.app().world(),
        memo=LoadMemo(),
    )
    (guard,) = [g for g in LOAD_GUARDS if g.name == "GpuRolesFree"]
    return guard.check(ctx)


@pytest.fixture
def gpu_world(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every world built gets a FakeGpuProbe (readings a test sets) and a ManualClock."""
    probe = FakeGpuProbe([reading(UA, 97_887, 0), reading(UB, 97_887, 0, index=1)])
    clock = ManualClock()
    original = App.world

    def world(self: App) -> Any:
        w = original(self)
        w.gpus, w.clock = probe, clock
        return w

    monkeypatch.setattr(App, "world", world)
    return {"probe": probe, "clock": clock}


class TestOwnershipMode:
    def test_a_serve_on_several_roles_owns_them_exclusively(self) -> None:
        assert ownership_mode(("compute-a", "compute-b")) == "exclusive"

    def test_a_serve_on_one_role_owns_it_split(self) -> None:
        assert ownership_mode(("compute-a",)) == "split"


class TestOwnershipLedger:
    def test_adopt_claims_the_incumbents_roles_exclusively(self, fake_host: FakeHost) -> None:
        inc = fake_host.incumbent_id
        assert owners(fake_host) == {
            "compute-a": (inc, "exclusive", "primary"),
            "compute-b": (inc, "exclusive", "primary"),
        }

    def test_load_moves_both_roles_from_the_stopped_incumbent_to_the_candidate(
        self, fake_host: FakeHost
    ) -> None:
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.COMMITTED, out.reason
        cand = out.results["start-candidate"]["container_id"]
        assert owners(fake_host) == {
            "compute-a": (cand, "exclusive", "primary"),
            "compute-b": (cand, "exclusive", "primary"),
        }
        assert out.after is not None
        assert out.after.body["gpu_owners"]["compute-a"]["container_id"] == cand

    def test_a_compensated_load_leaves_the_incumbent_owning_its_roles(self, fake_host: FakeHost) -> None:
        before = owners(fake_host)
        out = transactions.load(
            fake_host.app(), slot="primary", candidate=fake_host.candidate(fail_health=True)
        )
        assert out.state == TxState.COMPENSATED
        assert owners(fake_host) == before
        assert out.before is not None and out.after is not None
        assert out.before.body["gpu_owners"] == out.after.body["gpu_owners"]

    def test_the_undo_gives_the_roles_back_to_the_incumbent_and_is_idempotent(
        self, fake_host: FakeHost
    ) -> None:
        app = fake_host.app()
        world = app.world()
        inc = app.store.current_identity("primary", "incumbent")
        assert inc is not None
        cand = fake_host.candidate()
        cid = world.runtime.create(cand.spec)
        record_ownership(world, "t-undo", candidate_identity(world, "primary", cand, cid), inc)
        assert {o[0] for o in owners(fake_host).values()} == {cid}
        first = release_ownership(world, "t-undo", inc)
        second = release_ownership(world, "t-undo", inc)
        assert first == {
            "released": ["compute-a", "compute-b"],
            "reclaimed_for_incumbent": ["compute-a", "compute-b"],
        }
        assert second == {"released": [], "reclaimed_for_incumbent": []}
        assert owners(fake_host) == {
            "compute-a": (inc.container_id, "exclusive", "primary"),
            "compute-b": (inc.container_id, "exclusive", "primary"),
        }


class TestGpuRolesFree:
    def test_an_exclusive_owner_refuses_any_other_gpu_start_naming_it(self, fake_host: FakeHost) -> None:
        add_secondary_slot(fake_host)
        loaded = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        cand_id = loaded.results["start-candidate"]["container_id"]
        before = fake_host.world.read()["containers"]
        out = transactions.load(
            fake_host.app(),
            slot="secondary",
            candidate=side_candidate(fake_host, ("compute-b",)),
        )
        assert out.state == TxState.REFUSED and out.exit_code == 3
        assert out.refusal is not None and out.refusal.guard == "GpuRolesFree"
        assert f"owned exclusively by container {cand_id[:12]} in slot primary" in out.reason
        assert out.refusal.data["owner"]["container_id"] == cand_id
        assert fake_host.world.read()["containers"] == before  # nothing created or stopped

    def test_a_split_owner_refuses_only_its_own_role(self, fake_host: FakeHost) -> None:
        add_secondary_slot(fake_host)
        store, inc = fake_host.app().store, fake_host.incumbent_id
        gpu_ledger.release_roles(store, ["compute-a", "compute-b"], container_id=inc, tx_id=None)
        gpu_ledger.claim_roles(
            store, ["compute-a"], container_id=inc, tx_id="t-split", mode="split", slot="primary"
        )
        on_a = guard_check(fake_host, side_candidate(fake_host, ("compute-a",)))
        assert on_a is not None
        assert on_a.reason == (
            f"GPU role compute-a is owned by container {inc[:12]} in slot primary "
            "(transaction t-split, split)"
        )
        assert guard_check(fake_host, side_candidate(fake_host, ("compute-b",))) is None
        both = guard_check(fake_host, side_candidate(fake_host, ("compute-a", "compute-b")))
        assert both is not None
        assert both.reason.startswith("an exclusive start needs every GPU role free, but")

    def test_the_incumbent_being_replaced_does_not_compete(self, fake_host: FakeHost) -> None:
        add_secondary_slot(fake_host)
        inc = fake_host.app().store.current_identity("primary", "incumbent")
        assert inc is not None
        cand = side_candidate(fake_host, ("compute-a", "compute-b"))
        assert guard_check(fake_host, cand) is not None
        assert guard_check(fake_host, cand, incumbent=inc) is None

    def test_an_unknown_process_on_a_card_refuses_the_load_naming_its_pid(
        self, fake_host: FakeHost, gpu_world: dict[str, Any]
    ) -> None:
        gpu_world["probe"].set_used(UB, 4_000, [GpuProcess(pid=4242, used_mib=4_000)])
        before = fake_host.world.read()["containers"]
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate())
        assert out.state == TxState.REFUSED
        assert out.refusal is not None and out.refusal.guard == "GpuRolesFree"
        assert out.reason == (
            "GPU role compute-b has processes that no known serve owns: "
            "pid 4242 (4000 MiB; no container we know)"
        )
        assert fake_host.world.read()["containers"] == before
        assert {o[0] for o in owners(fake_host).values()} == {fake_host.incumbent_id}


class TestProcCgroupContainer:
    def test_finds_the_docker_container_of_a_pid(self, tmp_path: Path) -> None:
        cid = "ab" * 32
        (tmp_path / "77").mkdir()
        (tmp_path / "77" / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n")
        assert proc_cgroup_container(77, tmp_path) == cid

    def test_a_host_process_or_a_gone_pid_has_none(self, tmp_path: Path) -> None:
        (tmp_path / "78").mkdir()
        (tmp_path / "78" / "cgroup").write_text("0::/user.slice/session-3.scope\n")
        assert proc_cgroup_container(78, tmp_path) is None
        assert proc_cgroup_container(79, tmp_path) is None


class TestReleaseGateInLoad:
    def _load(self, host: FakeHost, need: int) -> Any:
        cand = replace(host.candidate(), vram_need_mib=need)
        return transactions.load(host.app(), slot="primary", candidate=cand)

    def test_the_step_result_holds_need_reserve_and_both_readings(
        self, fake_host: FakeHost, gpu_world: dict[str, Any]
    ) -> None:
        probe: FakeGpuProbe = gpu_world["probe"]
        probe.set_used(UA, 90_000)  # the stopped incumbent's memory, freed two gate polls later
        probe.after_polls(3, UA, 0)
        out = self._load(fake_host, 80_000)
        assert out.state == TxState.COMMITTED, out.reason
        gate = out.results["release-vram"]
        assert gate["need_mib"] == 80_000
        assert gate["reserve_mib"] == {"compute-a": 3072, "compute-b": 3072}
        assert gate["required_free_mib"] == {UA: 83_072, UB: 83_072}
        assert gate["before"][UA]["used_mib"] == 90_000
        assert gate["after"][UA]["used_mib"] == 0
        # poll 1 was the guards' one reading (BaseVerified's GPUs found and GpuRolesFree's
        # strangers see the same answer)
        assert gate["polls"] == 2 and gate["waivers"] == []
        steps = audit.show(fake_host.app(), out.tx_id or "")["steps"]
        shown = json.dumps([e for e in steps if e["step"] == "release-vram"], default=str)
        assert '"need_mib": 80000' in shown  # journaled, not only returned

    def test_a_release_timeout_compensates_and_the_incumbent_is_back(
        self, fake_host: FakeHost, gpu_world: dict[str, Any]
    ) -> None:
        gpu_world["probe"].set_used(UA, 90_000)  # never released
        out = self._load(fake_host, 80_000)
        assert out.state == TxState.COMPENSATED and out.exit_code == 4
        assert "release-vram" in out.reason and "not released within 120 s" in out.reason
        world = fake_host.world.read()
        assert world["containers"][fake_host.incumbent_id]["status"] == "running"
        assert [c for c in world["containers"].values() if c["name"] == "cand"] == []
        assert world["router"]["tiers"]["primary-local"]["state"] == "ready"
        assert {o[0] for o in owners(fake_host).values()} == {fake_host.incumbent_id}

    def test_a_roles_waiver_lowers_the_reserve_the_gate_waits_for(
        self, fake_host: FakeHost, gpu_world: dict[str, Any]
    ) -> None:
        waived = gpu_cmds.waive(
            fake_host.app(),
            policy="vram-reserve",
            scope="compute-a,compute-b",
            value=0,
            approved_by="operator",
            reason="model-only pair",
            no_expiry=True,
        )
        gpu_world["probe"].set_used(UA, 15_000)  # 82,887 free: enough for 80,000 + 0
        out = self._load(fake_host, 80_000)
        assert out.state == TxState.COMMITTED, out.reason
        gate = out.results["release-vram"]
        assert gate["reserve_mib"] == {"compute-a": 0, "compute-b": 0}
        assert gate["waivers"] == [waived["waiver"]["id"]]


@pytest.fixture
def anvilctl(fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """Run `anvilctl ARGS --json` on the fake host: (exit code, parsed stdout or text)."""
    # cli.main would point structlog at pytest's captured stderr, closed after the test.
    monkeypatch.setattr(log, "configure", lambda *_a, **_k: None)
    for key, value in fake_host.env().items():
        if key.startswith("ANVIL_"):
            monkeypatch.setenv(key, value)

    def run(*args: str) -> tuple[int, Any]:
        capsys.readouterr()
        code = cli.main([*args, "--json"])
        out = capsys.readouterr().out
        try:
            return code, json.loads(out)
        except json.JSONDecodeError:
            return code, out

    return run


def waiver_row_counts(host: FakeHost) -> tuple[int, int, int]:
    with host.app().store.read() as s:
        return tuple(  # type: ignore[return-value]
            s.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("waivers", "waiver_revocations", "audit_journal")
        )


WAIVE_EXPIRING = ["waive", "--policy", "vram-reserve", "--value", "0", "--approved-by", "operator"]
WAIVE = [*WAIVE_EXPIRING, "--no-expiry"]


class TestWaiverCli:
    def test_waive_records_an_active_roles_waiver(self, anvilctl: Any, fake_host: FakeHost) -> None:
        code, out = anvilctl(*WAIVE, "--scope", "compute-a,compute-b", "--reason", "pair")
        assert code == 0
        w = out["waiver"]
        assert (w["roles"], w["value"], w["approved_by"]) == (
            ["compute-a", "compute-b"],
            0,
            "operator",
        )
        assert out["reclassified"] == {"recorded": [], "skipped": []}
        code, listed = anvilctl("waivers", "list")
        assert code == 0 and [(r["id"], r["state"]) for r in listed] == [(w["id"], "active")]

    def test_a_recipe_digest_scope_applies_to_that_recipe_only(
        self, anvilctl: Any, fake_host: FakeHost
    ) -> None:
        code, out = anvilctl(*WAIVE, "--scope", "sha256:" + "d" * 64, "--reason", "this recipe")
        assert code == 0 and out["waiver"]["recipe_digest"] == "d" * 64
        ws = waiver_rows.waivers(fake_host.app().store)
        now = datetime.now(UTC)
        assert reserve_in_force(ws, "d" * 64, now) == 0
        assert reserve_in_force(ws, "e" * 64, now) == 3072

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--policy", "gpu-hours", "--scope", "compute-a"], "Invalid value for '--policy': 'gpu-hours'"),
            (["--scope", "Compute A!"], "waiver scope"),
            (["--scope", "compute-z"], "not in the host config"),
            (["--scope", "compute-a", "--value", "-1"], "Invalid value for '--value'"),
            (["--scope", "compute-a", "--value", str(10**30)], "Invalid value for '--value'"),
            (["--scope", "compute-a", "--expires", "2020-01-01"], "is not in the future"),
            (["--scope", "compute-a", "--expires", "soon"], "expected an RFC 3339 date"),
            (["--scope", "compute-a", "--approved-by", " "], "Invalid value for '--approved-by'"),
        ],
    )
    def test_bad_input_exits_2_and_writes_nothing(
        self,
        anvilctl: Any,
        fake_host: FakeHost,
        capsys: pytest.CaptureFixture[str],
        args: list[str],
        message: str,
    ) -> None:
        before = waiver_row_counts(fake_host)
        base = {"--policy": "vram-reserve", "--value": "0", "--approved-by": "operator"}
        given = dict(zip(args[::2], args[1::2], strict=True))
        argv = ["waive", "--reason", "r"]
        for k, v in {**base, **given}.items():
            argv += [k, v]
        if "--expires" not in given:
            argv.append("--no-expiry")  # one of the two is required; the case is about another field
        capsys.readouterr()
        code = cli.main(argv)
        assert code == 2
        assert message in capsys.readouterr().err
        assert waiver_row_counts(fake_host) == before

    def test_an_expired_waiver_stops_applying(self, anvilctl: Any, fake_host: FakeHost) -> None:
        expires = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        code, _ = anvilctl(*WAIVE_EXPIRING, "--scope", "compute-a", "--reason", "r", "--expires", expires)
        assert code == 0
        ws = waiver_rows.waivers(fake_host.app().store)
        later = datetime.now(UTC) + timedelta(days=3)
        assert reserve_in_force(ws, None, datetime.now(UTC)) == 0
        assert reserve_in_force(ws, None, later) == 3072
        listed = gpu_cmds.list_waivers(fake_host.app(), now=later)
        assert [r["state"] for r in listed] == ["expired"]

    def test_revoke_stops_the_waiver_and_keeps_its_record(self, anvilctl: Any, fake_host: FakeHost) -> None:
        _, out = anvilctl(*WAIVE, "--scope", "compute-a", "--reason", "r")
        wid = out["waiver"]["id"]
        code, revoked = anvilctl("waivers", "revoke", wid, "--by", "lead", "--reason", "done")
        assert code == 0 and revoked["revoked"] == wid
        ws = waiver_rows.waivers(fake_host.app().store)
        assert reserve_in_force(ws, None, datetime.now(UTC)) == 3072
        _, listed = anvilctl("waivers", "list")
        assert [(r["id"], r["state"], r["reason"]) for r in listed] == [(wid, "revoked", "r")]
        before = waiver_row_counts(fake_host)
        assert anvilctl("waivers", "revoke", wid, "--by", "lead", "--reason", "again")[0] == 2
        assert anvilctl("waivers", "revoke", "wvr-nope", "--by", "x", "--reason", "y")[0] == 2
        assert waiver_row_counts(fake_host) == before


class TestGpusCli:
    def test_gpus_lists_readings_with_role_and_owner(self, anvilctl: Any, fake_host: FakeHost) -> None:
        code, out = anvilctl("gpus")
        assert code == 0 and out["driver"] == "fake"
        rows = {g["role"]: g for g in out["gpus"]}
        assert set(rows) == {"compute-a", "compute-b"}
        assert rows["compute-a"]["uuid"] == UA and rows["compute-a"]["free_mib"] == 97_887
        owner = rows["compute-b"]["owner"]
        assert (owner["container_id"], owner["mode"]) == (fake_host.incumbent_id, "exclusive")

    def test_detect_write_keeps_the_rest_of_the_config(self, anvilctl: Any, fake_host: FakeHost) -> None:
        path = fake_host.settings.config
        path.write_text("# operator notes\n" + path.read_text().replace("97887", "1"))
        code, out = anvilctl("gpus", "detect", "--write")
        assert code == 0 and out["written"] is True
        written = path.read_text()
        assert written.startswith("# operator notes\n")
        assert "capacity_mib = 97887" in written and "capacity_mib = 1\n" not in written
        for kept in ("[slots.primary]", 'router_tier = "primary-local"', "[policy]"):
            assert kept in written
        again = anvilctl("gpus", "detect", "--write")[1]
        assert again["written"] is False and path.read_text() == written

    def test_an_override_that_orphans_a_slot_role_exits_2_and_writes_nothing(
        self, anvilctl: Any, fake_host: FakeHost
    ) -> None:
        path = fake_host.settings.config
        before = path.read_text()
        code, _ = anvilctl("gpus", "detect", "--write", "--override", f"{UA}=big")
        assert code == 2
        assert path.read_text() == before

    def test_detect_creates_a_missing_config_with_only_the_roles(
        self, fake_host: FakeHost, tmp_path: Path
    ) -> None:
        settings = fake_host.settings.model_copy(update={"config": tmp_path / "new" / "anvil.toml"})
        out = gpu_cmds.detect(App(settings=settings, env={}), overrides={UB: "big"}, write=True)
        assert out["written"] is True
        assert out["roles"]["compute-a"]["uuid"] == UA and out["roles"]["big"]["uuid"] == UB
        assert settings.config.read_text() == out["toml"]
        assert "[gpu_roles.big]\nuuid = " + json.dumps(UB) in out["toml"]


class TestReplaceGpuRoles:
    OLD = (
        "# workstation under the desk\n"
        'host = "h"  # as in records\n\n'
        "[gpu_roles.compute-a]  # the big card\n"
        'uuid = "GPU-old"\n'
        "capacity_mib = 1\n"
        "reserve_mib = 2048  # keep 2 GiB\n\n"
        "[gpu_roles.gone]\n"
        'uuid = "GPU-gone"\n'
        "capacity_mib = 1\n\n"
        "[router]\n"
        'kind = "none"  # no router here\n'
    )

    def roles(self) -> dict[str, GpuRole]:
        return {
            "compute-a": GpuRole(uuid=UA, capacity_mib=97_887, reserve_mib=2048),
            "compute-b": GpuRole(uuid=UB, capacity_mib=97_887, name="NVIDIA H200"),
        }

    def test_updates_a_kept_role_in_place_with_its_comments(self) -> None:
        new = gpu_cmds.replace_gpu_roles(self.OLD, self.roles())
        assert "[gpu_roles.compute-a]  # the big card\n" + f'uuid = "{UA}"' in new
        assert "reserve_mib = 2048  # keep 2 GiB" in new

    def test_keeps_every_other_key_and_comment(self) -> None:
        new = gpu_cmds.replace_gpu_roles(self.OLD, self.roles())
        for line in (
            "# workstation under the desk",
            'host = "h"  # as in records',
            'kind = "none"  # no router here',
        ):
            assert line in new

    def test_removes_a_role_no_longer_detected_and_adds_a_new_one(self) -> None:
        data = tomllib.loads(gpu_cmds.replace_gpu_roles(self.OLD, self.roles()))
        assert data["gpu_roles"] == {
            "compute-a": {"uuid": UA, "capacity_mib": 97_887, "reserve_mib": 2048},
            "compute-b": {"uuid": UB, "capacity_mib": 97_887, "name": "NVIDIA H200"},
        }
        assert data["router"] == {"kind": "none"}

    def test_adds_the_roles_when_there_were_none(self) -> None:
        data = tomllib.loads(gpu_cmds.replace_gpu_roles('host = "h"', self.roles()))
        assert data["host"] == "h" and set(data["gpu_roles"]) == {"compute-a", "compute-b"}


def reserve_in_force(waivers: Any, recipe_digest: str | None, now: datetime) -> int:
    """The VRAM reserve in force for compute-a against a 3072 MiB default."""
    policy = resolve(
        VRAM_RESERVE,
        policy_default=3072,
        role="compute-a",
        recipe_digest=recipe_digest,
        waivers=waivers,
        now=now,
    )
    return policy.value
