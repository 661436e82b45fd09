"""The lifecycle on the fakes for serves probed through the llama-cpp-python engine profile.

The fake containers behave the way llama.cpp does where the controller depends on it: no
health route, the context length only in the refusal of an over-long prompt, answers that
echo the request's model. Adopt, recheck, load, promote and rollback work through the
profile's fields, and a gate waiver reclassifies a failed decision.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import gpus_and_waivers as gpu_cmd
from anvil_ctl.commands import lifecycle, recheck, transactions
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.model import LABEL_MANAGED, LABEL_ROLE, LABEL_SLOT, ContainerSpec
from anvil_ctl.core.states import TxState
from anvil_ctl.engine.plans.args import Candidate
from anvil_ctl.persistence import qualification
from anvil_ctl.persistence.migrate import upgrade
from anvil_ctl.testing.runtime import FakeRuntime
from tests.unit.fakehost import ScriptedWorld

HOST_TOML = """
host = "llama-host"

[slots.primary]
binding = "127.0.0.1:8001"
router_tier = "primary-local"
aliases = ["llm.primary"]

[router]
kind = "haproxy"
runtime_socket = "/nonexistent"

[policy]
health_poll_s = 0.01
stop_timeout_s = 1
"""
LLAMA_ENV = (("FAKE_BINDING", "127.0.0.1:8001"), ("FAKE_NO_HEALTH_ROUTE", "1"), ("FAKE_ECHO_MODEL", "1"))
RECIPE_DIGEST = "e" * 64


@dataclasses.dataclass
class LlamaHost:
    settings: Settings
    world: ScriptedWorld
    image_id: str
    incumbent_id: str

    def app(self) -> App:
        return App(settings=self.settings, env={})

    def candidate(self) -> Candidate:
        env = (*LLAMA_ENV, ("FAKE_SERVED_MODEL", "smollm2-8k"), ("FAKE_MAX_MODEL_LEN", "8192"))
        spec = ContainerSpec(
            name="cand",
            image=self.image_id,
            env=env,
            labels=((LABEL_MANAGED, "true"), (LABEL_SLOT, "primary"), (LABEL_ROLE, "candidate")),
        )
        return Candidate(
            recipe="llama-8k",
            recipe_digest=RECIPE_DIGEST,
            served_model="smollm2-8k",
            context_tokens=8192,
            health_path=None,
            startup_timeout_s=0.5,
            spec=spec,
            engine_profile="llama-cpp-python",
        )


@pytest.fixture
def host(tmp_path: Path) -> LlamaHost:
    cfg = tmp_path / "anvil.toml"
    cfg.write_text(HOST_TOML)
    settings = Settings(state_dir=tmp_path / "state", config=cfg, backend="fake", _env_file=None)  # type: ignore[call-arg]
    app = App(settings=settings, env={"ANVIL_ROUTER_CLIENT_TOKEN": "client-token-123"})
    upgrade(app.create_database())
    world = ScriptedWorld(settings.fake_world_path)
    image_id = world.add_image("llama@sha256:" + "2" * 64)
    rt = FakeRuntime(world)
    inc = rt.create(
        ContainerSpec(
            name="llama-2k-by-hand",
            image=image_id,
            env=(*LLAMA_ENV, ("FAKE_SERVED_MODEL", "smollm2-2k"), ("FAKE_MAX_MODEL_LEN", "2048")),
        )
    )
    rt.start(inc)
    router = app.world().router
    assert router is not None
    router.register("primary-local", "http://127.0.0.1:8001", ("llm.primary",))
    return LlamaHost(settings, world, image_id, inc)


def adopt(host: LlamaHost, context_tokens: int = 2048) -> TxState:
    out = transactions.adopt(
        host.app(),
        slot="primary",
        container_id=host.incumbent_id,
        context_tokens=context_tokens,
        engine="llama-cpp-python",
    )
    return out.state


class TestAdoptAndRecheck:
    def test_adopt_observes_the_context_through_the_engines_refusal(self, host: LlamaHost) -> None:
        with pytest.raises(BadInput, match="refuses prompts of 2048 tokens or more"):
            adopt(host, context_tokens=4096)
        assert adopt(host) == TxState.COMMITTED
        ident = host.app().store.current_identity("primary", "incumbent")
        assert ident is not None and ident.engine_profile == "llama-cpp-python"

    def test_an_unknown_engine_profile_is_bad_input(self, host: LlamaHost) -> None:
        with pytest.raises(BadInput, match="--engine 'exllamav3'"):
            transactions.adopt(
                host.app(),
                slot="primary",
                container_id=host.incumbent_id,
                context_tokens=2048,
                engine="exllamav3",
            )

    def test_recheck_holds_without_a_health_route_and_with_an_echoing_router_answer(
        self, host: LlamaHost
    ) -> None:
        adopt(host)
        result = recheck.recheck(host.app(), "primary")
        observed = {a["name"]: a["observed"] for a in result.assertions}
        assert result.passed, [a for a in result.assertions if not a["passed"]]
        assert observed["health"]["health_route"] is None
        assert observed["context_tokens"]["how"] == "refusal"
        assert observed["routed_smoke"]["model"] == "llm.primary"

    def test_a_context_that_drifted_is_named_by_the_refusal(self, host: LlamaHost) -> None:
        adopt(host)
        with host.world.edit() as w:
            w["containers"][host.incumbent_id]["max_model_len"] = 1024
        result = recheck.recheck(host.app(), "primary")
        context = next(a for a in result.assertions if a["name"] == "context_tokens")
        assert not context["passed"] and context["observed"]["value"] == 1024


class TestLoadPromoteRollback:
    def test_the_whole_swap_runs_on_the_profiles_fields(self, host: LlamaHost) -> None:
        adopt(host)
        load = transactions.load(host.app(), slot="primary", candidate=host.candidate())
        assert load.state == TxState.COMMITTED, load.reason
        awaited = load.results["await-candidate"]
        assert awaited["health_path"] is None and awaited["served_model"] == "smollm2-8k"
        app = host.app()
        cand = app.store.current_identity("primary", "candidate")
        assert cand is not None and cand.engine_profile == "llama-cpp-python"
        qualification.record_decision(
            app.store,
            decision_id="d-1",
            tx_id=None,
            slot="primary",
            identity_digest=cand.qualification_digest,
            container_id=cand.container_id,
            outcome="verified",
        )
        promote = lifecycle.promote(host.app(), slot="primary", approved_by="operator")
        assert promote.state == TxState.COMMITTED, promote.reason
        assert promote.results["routed-smoke"]["model"] == "llm.primary"
        assert promote.results["routed-smoke"]["served_model"] == "smollm2-8k"
        assert recheck.recheck(host.app(), "primary").passed
        back = lifecycle.rollback(host.app(), slot="primary")
        assert back.state == TxState.COMMITTED, back.reason
        assert host.world.read()["containers"][host.incumbent_id]["status"] == "running"
        assert recheck.recheck(host.app(), "primary").passed


class TestGateWaiver:
    T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def record_failed(self, host: LlamaHost) -> None:
        app = host.app()
        app.store.begin(kind="qualify", slot="primary", args={}, owner=app.owner, tx_id="tx-q")
        qualification.record_evidence(
            app.store,
            "tx-q",
            [
                {"name": n, "kind": "functional", "passed": ok, "classification": c}
                | {"artifact": "", "sha256": "", "size": 0}
                for n, ok, c in (
                    ("served-identity", True, "pass"),
                    ("smoke", False, "wrong_answer"),
                    ("tools", False, "no_tool_call"),
                    ("capacity", True, "pass"),
                )
            ],
        )
        qualification.record_decision(
            app.store,
            decision_id="dec-raw",
            tx_id="tx-q",
            slot="primary",
            identity_digest="q" * 64,
            container_id="c" * 64,
            outcome="failed",
            body={"policy": "standing", "recipe_digest": RECIPE_DIGEST},
        )

    def waive(self, host: LlamaHost, *names: str, **kw: object) -> dict[str, object]:
        args: dict[str, object] = {
            "policy": "gate",
            "scope": RECIPE_DIGEST,
            "value": None,
            "gates": names,
            "approved_by": "operator",
            "reason": "a 135M model does not follow instructions",
            "expires": "2026-12-02",
            "now": self.T0,
        }
        return gpu_cmd.waive(host.app(), **(args | kw))  # type: ignore[arg-type]

    def test_waiving_every_failed_gate_reclassifies_the_decision_verified_naming_them(
        self, host: LlamaHost
    ) -> None:
        self.record_failed(host)
        out = self.waive(host, "smoke", "tools")
        waiver = out["waiver"]
        assert waiver["gates"] == ["smoke", "tools"] and waiver["expires_at"].startswith("2026-12-02")  # type: ignore[index]
        decisions = qualification.decisions(host.app().store, slot="primary")
        raw, newer = decisions
        assert raw["outcome"] == "failed" and newer["reclassifies"] == "dec-raw"
        assert newer["outcome"] == "verified" and newer["waiver_ids"] == [waiver["id"]]  # type: ignore[index]
        assert sorted(newer["reasons"]) == [
            f"smoke failed, waived by {waiver['id']}",  # type: ignore[index]
            f"tools failed, waived by {waiver['id']}",  # type: ignore[index]
        ]

    def test_waiving_only_some_failed_gates_leaves_the_decision_failed(self, host: LlamaHost) -> None:
        self.record_failed(host)
        self.waive(host, "smoke")
        assert len(qualification.decisions(host.app().store, slot="primary")) == 1

    @pytest.mark.parametrize(
        ("kw", "message"),
        [
            ({"scope": "compute-a"}, "applies to one recipe digest"),
            ({"gates": ()}, "expected the gates"),
            ({"gates": ("engine-alive",)}, "cannot be waived"),
            ({"value": 5}, "a gate waiver's value is 0"),
        ],
    )
    def test_a_malformed_gate_waiver_is_bad_input_and_nothing_is_recorded(
        self, host: LlamaHost, kw: dict[str, object], message: str
    ) -> None:
        with pytest.raises(BadInput, match=message):
            self.waive(host, "smoke", **kw)
        assert gpu_cmd.list_waivers(host.app()) == []

    def test_a_gate_waiver_expires(self, host: LlamaHost) -> None:
        self.record_failed(host)
        self.waive(host, "smoke", "tools")
        later = gpu_cmd.list_waivers(host.app(), now=self.T0 + timedelta(days=3))
        assert [w["state"] for w in later] == ["expired"]
