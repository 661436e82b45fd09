"""One /dev/shm reading while the host is only observed: guards + before snapshot, and recheck.

Each residue scan walks every process's maps and descriptors; before a transaction's first
mutation (its guards and its before snapshot) and in recheck (assertions and snapshot) the
host is only observed, so one scan answers every question there. Outside that stretch
every reading scans again: the after snapshot sees what the steps changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from anvil_ctl.commands import recheck, transactions
from anvil_ctl.core.model import ResidueFile
from anvil_ctl.core.states import TxState
from anvil_ctl.engine import world as world_module
from anvil_ctl.engine.observe import observe
from anvil_ctl.engine.world import World, one_reading
from anvil_ctl.testing.router import FakeRouter
from anvil_ctl.testing.runtime import FakeRuntime, FakeServerProbe, FakeSharedMemory
from tests.unit.fakehost import FakeHost, make_fake_host

LEFT = {"path": "/dev/shm/nccl-left01", "size": 4096}


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every residue scan of the fake's shared memory, counted."""
    seen: list[int] = []
    real = FakeSharedMemory.residue

    def counted(self: FakeSharedMemory) -> list[ResidueFile]:
        seen.append(1)
        return real(self)

    monkeypatch.setattr(FakeSharedMemory, "residue", counted)
    return seen


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every question asked of the fake's container runtime (inspect, list, image), named."""
    seen: list[str] = []
    for name in ("inspect", "list", "image"):
        real = getattr(FakeRuntime, name)

        def counted(self: FakeRuntime, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            seen.append(_name)
            return _real(self, *args, **kw)

        monkeypatch.setattr(FakeRuntime, name, counted)
    return seen


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every question asked of the fake engine probe and router (models, health, view,
    readiness, routed chat, route check), named; the fake router's own calls included."""
    seen: list[str] = []
    for cls, names in (
        (FakeServerProbe, ("models", "health", "listening")),
        (FakeRouter, ("view", "ready", "routed_chat", "check_route")),
    ):
        for name in names:
            real = getattr(cls, name)

            def counted(self: Any, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                seen.append(_name)
                return _real(self, *args, **kw)

            monkeypatch.setattr(cls, name, counted)
    return seen


def put(host: FakeHost, *entries: dict[str, Any]) -> None:
    with host.world.edit() as w:
        w["residue"] = [dict(e) for e in entries]


class TestOneReading:
    def test_inside_the_stretch_one_scan_answers_and_after_it_a_reading_scans_again(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        world: World = fake_host.app().world()
        shm = world.shm
        assert shm is not None
        with one_reading(world):
            assert world.shm is not None
            assert world.shm.residue() == []
            put(fake_host, LEFT)  # appears meanwhile: the stretch keeps its one reading
            assert world.shm.residue() == []
        assert len(scans) == 1
        assert world.shm is shm
        assert [r.path for r in world.shm.residue()] == [LEFT["path"]]
        assert len(scans) == 2

    def test_a_kept_reading_answers_only_the_next_stretch_and_only_if_it_resumes_it(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        world: World = fake_host.app().world()
        with one_reading(world, keep=True):
            assert world.shm is not None and world.shm.residue() == []
        put(fake_host, LEFT)  # appears meanwhile: the stretch that resumes sees what was kept
        with one_reading(world, resume=True):
            assert world.shm.residue() == []
        assert len(scans) == 1
        with one_reading(world, keep=True):
            assert len(world.shm.residue()) == 1
        with one_reading(world):  # takes the kept reading away unused
            assert len(world.shm.residue()) == 1
        with one_reading(world, resume=True):  # nothing kept: it reads for itself
            assert len(world.shm.residue()) == 1
        assert len(scans) == 4

    def test_a_removal_inside_the_stretch_makes_the_next_reading_scan(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        put(fake_host, LEFT)
        world: World = fake_host.app().world()
        with one_reading(world):
            assert world.shm is not None
            assert [r.path for r in world.shm.residue()] == [LEFT["path"]]
            world.shm.remove_unheld()
            assert world.shm.residue() == []
        assert len(scans) == 2

    def test_recheck_scans_once_for_its_assertion_and_its_snapshot(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        result = recheck.recheck(fake_host.app(), "primary")
        assert result.passed, result.failed
        assert [a["passed"] for a in result.assertions if a["name"] == "shm_residue_zero"] == [True]
        assert len(scans) == 1

    def test_a_load_scans_once_before_its_first_mutation_and_once_after(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate("cand-393k"))
        assert out.state == TxState.COMMITTED, out.reason
        assert out.before is not None and out.after is not None
        # The base check and the before snapshot share one scan; the after snapshot has its own.
        assert len(scans) == 2

    def test_residue_left_before_a_load_refuses_it_from_the_one_reading(
        self, fake_host: FakeHost, scans: list[int]
    ) -> None:
        put(fake_host, LEFT)
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate("cand-393k"))
        assert out.state == TxState.REFUSED
        assert "shm_residue_zero" in out.reason
        assert len(scans) == 1


class TestOneLook:
    """Inside the stretch each container, image and container query is asked of the runtime
    once; a change made through the runtime forgets what was seen; after it, every call asks."""

    def test_inside_the_stretch_one_inspect_answers_until_a_change_is_made(
        self, fake_host: FakeHost, looks: list[str]
    ) -> None:
        world: World = fake_host.app().world()
        runtime, cid = world.runtime, fake_host.incumbent_id
        with one_reading(world):
            assert world.runtime.inspect(cid).running
            assert world.runtime.inspect(cid).running
            assert [c.id for c in world.runtime.list()] == [c.id for c in world.runtime.list()]
            assert looks == ["inspect", "list"]
            world.runtime.stop(cid, 1.0)  # a change: what was seen is forgotten
            assert not world.runtime.inspect(cid).running
            assert looks == ["inspect", "list", "inspect"]
        assert world.runtime is runtime
        world.runtime.inspect(cid)
        world.runtime.inspect(cid)
        assert looks == ["inspect", "list", "inspect", "inspect", "inspect"]

    def test_a_load_asks_the_runtime_fewer_questions_and_records_the_same_snapshots(
        self, fake_host: FakeHost, tmp_path: Path, looks: list[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The same load on two identical hosts, with and without the one look."""
        other = make_fake_host(tmp_path / "other")
        seen_plainly = observe(fake_host.app().world(), ["primary"])
        looks.clear()
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate("cand-393k"))
        with_look = len(looks)
        monkeypatch.delitem(world_module._STRETCH, "runtime")
        looks.clear()
        plain = transactions.load(other.app(), slot="primary", candidate=other.candidate("cand-393k"))
        assert out.state == plain.state == TxState.COMMITTED, (out.reason, plain.reason)
        assert with_look < len(looks), (with_look, len(looks))
        # The before snapshot is exactly what a plain observation saw just before.
        assert out.before is not None
        assert out.before.sha256 == seen_plainly.sha256


class TestOneReadingOfTheBindingAndTheRouter:
    """Inside the stretch each binding's models and health and each router reading are asked
    once; a change made through the stretch (here: a container stopped) forgets every reading;
    after it, every call asks."""

    def test_inside_the_stretch_each_is_asked_once_until_a_change_is_made(
        self, fake_host: FakeHost, asked: list[str]
    ) -> None:
        world: World = fake_host.app().world()
        url = world.config.slot("primary").base_url
        router, server = world.router, world.server
        assert router is not None
        with one_reading(world):
            assert world.router is not None
            for _ in range(2):
                assert [m.id for m in world.server.models(url)] == [
                    "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix"
                ]
                assert world.server.health(url, "/health")
                assert world.router.routed_chat("llm.primary").status == 200
                assert world.router.ready()
            # the fake router's chat reads the binding's models itself: the second "models"
            assert sorted(asked) == ["health", "models", "models", "ready", "routed_chat"]
            world.runtime.stop(fake_host.incumbent_id, 1.0)  # a change: every reading is forgotten
            assert world.server.models(url) == []
            assert world.router.routed_chat("llm.primary").status != 200
            # asked again: the model list, and the chat (the fake router reads the models for it)
            assert sorted(asked[5:]) == ["models", "models", "routed_chat"]
        assert (world.router, world.server) == (router, server)
        asked.clear()
        world.server.models(url)
        world.server.models(url)
        assert asked == ["models", "models"]

    def test_a_load_makes_one_routed_chat_fewer_and_records_the_same_availability(
        self, fake_host: FakeHost, tmp_path: Path, asked: list[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The same load on two identical hosts, with and without one reading of the binding
        and the router: the availability check sees the routed chat of BaseVerified's smoke."""
        other = make_fake_host(tmp_path / "other")
        asked.clear()  # the other host's adoption asked too
        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate("cand-393k"))
        with_reading = list(asked)
        for name in ("server", "router", "gpus"):
            monkeypatch.delitem(world_module._STRETCH, name)
        asked.clear()
        plain = transactions.load(other.app(), slot="primary", candidate=other.candidate("cand-393k"))
        assert out.state == plain.state == TxState.COMMITTED, (out.reason, plain.reason)
        assert with_reading.count("routed_chat") == asked.count("routed_chat") - 1
        assert len(with_reading) < len(asked), (with_reading, asked)

        def availability(host: FakeHost, tx_id: str | None) -> dict[str, Any]:
            assert tx_id is not None
            events = host.app().store.step_events(tx_id)
            return next(dict(e.detail) for e in events if e.step == "availability" and e.event == "before")

        seen, plain_seen = availability(fake_host, out.tx_id), availability(other, plain.tx_id)
        assert seen["serving"] and seen["routed_model"] == plain_seen["routed_model"]
        assert {k: v for k, v in seen.items() if k != "harbour"} == {
            k: v for k, v in plain_seen.items() if k != "harbour"
        }


class TestOneListingOfTheManagedContainers:
    def test_narrower_queries_of_managed_containers_are_answered_from_one_listing(
        self, fake_host: FakeHost, looks: list[str]
    ) -> None:
        from anvil_ctl.core.model import LABEL_MANAGED, LABEL_ROLE, LABEL_SLOT

        transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate("cand-393k"))
        world: World = fake_host.app().world()
        queries = [
            {LABEL_MANAGED: "true", LABEL_SLOT: "primary"},
            {LABEL_MANAGED: "true", LABEL_ROLE: "candidate"},
            {LABEL_MANAGED: "true", LABEL_SLOT: "elsewhere"},
        ]
        plainly = [sorted(c.id for c in world.runtime.list(labels=q)) for q in queries]
        assert plainly[0] and plainly[1] and not plainly[2]
        looks.clear()
        with one_reading(world):
            seen = [sorted(c.id for c in world.runtime.list(labels=q)) for q in queries]
            world.runtime.inspect(plainly[1][0])  # inspected to be listed
        assert seen == plainly
        assert looks == ["list"]

    def test_an_adapter_listing_through_the_worlds_runtime_shares_the_stretchs_listing(
        self, fake_host: FakeHost, looks: list[str]
    ) -> None:
        """What the real world gives the /dev/shm scanner and the simulated GPUs."""
        from anvil_ctl.adapters.shm import managed_containers
        from anvil_ctl.core.model import LABEL_MANAGED, LABEL_SLOT
        from anvil_ctl.engine.world import current_runtime

        out = transactions.load(fake_host.app(), slot="primary", candidate=fake_host.candidate("cand-393k"))
        candidate = str(out.results["start-candidate"]["container_id"])
        world: World = fake_host.app().world()
        managed = managed_containers(current_runtime(world))
        looks.clear()
        with one_reading(world):
            held = managed()
            slot = world.runtime.list(labels={LABEL_MANAGED: "true", LABEL_SLOT: "primary"})
        assert candidate in held and candidate in [c.id for c in slot]
        assert looks == ["list"]
        managed()  # outside the stretch: the runtime itself is asked
        assert looks == ["list", "list"]
