"""A fake host for engine tests: state dir, anvil.toml, fake world, an adopted incumbent."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from anvil_ctl.bootstrap import App
from anvil_ctl.commands import transactions
from anvil_ctl.config.settings import Settings
from anvil_ctl.core.model import (
    LABEL_MANAGED,
    LABEL_RECIPE_DIGEST,
    LABEL_ROLE,
    LABEL_SLOT,
    ContainerSpec,
)
from anvil_ctl.engine.plans.args import Candidate
from anvil_ctl.persistence import qualification
from anvil_ctl.persistence.migrate import upgrade
from anvil_ctl.testing.runtime import FakeRuntime
from anvil_ctl.testing.world import FakeWorld


class ScriptedWorld(FakeWorld):
    """The fake world with the setters tests script it by: images, GPUs, log lines, failures."""

    def add_image(self, ref: str) -> str:
        image_id = "sha256:" + hashlib.sha256(ref.encode()).hexdigest()
        with self.edit() as w:
            w["images"][image_id] = {"id": image_id, "tags": [ref], "repo_digests": []}
        return image_id

    def add_gpu(self, uuid: str, total_mib: int, name: str = "Fake GPU") -> None:
        with self.edit() as w:
            w["gpus"].append({"uuid": uuid, "name": name, "total_mib": total_mib})

    def append_log(self, container_id: str, *lines: str) -> None:
        """What a fake container printed."""
        with self.edit() as w:
            c = w["containers"][container_id]
            c.setdefault("log", []).extend(lines)
            c.setdefault("log_at", []).extend([time.time()] * len(lines))

    def set_hang(self, op: str | None) -> None:
        with self.edit() as w:
            w["hang"] = op

    def set_fail(self, op: str, message: str | None, *, times: int | None = None) -> None:
        """Make `op` fail with `message` (None: stop failing); `times` limits how often."""
        with self.edit() as w:
            w.setdefault("fail_times", {}).pop(op, None)
            if message is None:
                w["fail"].pop(op, None)
            else:
                w["fail"][op] = message
                if times is not None:
                    w["fail_times"][op] = times


HOST_TOML = """
host = "testhost"

[gpu_roles.compute-a]
uuid = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
capacity_mib = 97887

[gpu_roles.compute-b]
uuid = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
capacity_mib = 97887

[slots.primary]
binding = "127.0.0.1:8001"
router_tier = "primary-local"
aliases = ["llm.primary"]
gpu_roles = ["compute-a", "compute-b"]

[router]
kind = "smg"

[policy]
health_poll_s = 0.01
stop_timeout_s = 1
"""

INCUMBENT_MODEL = "glm53-flash-exl3-k3-dflash2-k5-fp8-tp2-524k-vision-xgfix"


@dataclass
class FakeHost:
    root: Path
    settings: Settings
    world: ScriptedWorld
    image_id: str
    incumbent_id: str

    def app(self) -> App:
        return App(settings=self.settings, env={})

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "ANVIL_BACKEND": "fake",
            "ANVIL_STATE_DIR": str(self.settings.state_dir),
            "ANVIL_CONFIG": str(self.settings.config),
            "ANVIL_LOG_FORMAT": "json",
        }
        if self.settings.state_db is not None:
            env["ANVIL_STATE_DB"] = self.settings.state_db
        if self.settings.machine_id_file != Path("/etc/machine-id"):
            env["ANVIL_MACHINE_ID_FILE"] = str(self.settings.machine_id_file)
        return env

    def decide(
        self,
        outcome: str = "verified",
        *,
        slot: str = "primary",
        decision_id: str = "d-1",
        waiver_ids: tuple[str, ...] = (),
        reclassifies: str | None = None,
        profile: str = "",
    ) -> None:
        """Record a qualification decision for the slot's candidate, as `qualify` would (by
        the profile `profile`, a name or a file)."""
        app = self.app()
        cand = app.store.current_identity(slot, "candidate")
        assert cand is not None, f"no candidate on slot {slot}"
        qualification.record_decision(
            app.store,
            decision_id=decision_id,
            tx_id=None,
            slot=slot,
            identity_digest=cand.qualification_digest,
            container_id=cand.container_id,
            outcome=outcome,
            waiver_ids=waiver_ids,
            reclassifies=reclassifies,
            profile=profile,
        )

    @property
    def backend(self) -> str:
        return "postgresql" if self.settings.state_db else "sqlite"

    def candidate(
        self,
        served: str = "cand-393k",
        *,
        fail_health: bool = False,
        name: str = "cand",
        vram_mib: int = 94000,
    ) -> Candidate:
        """A candidate holding `vram_mib` per card: by default 3,887 of 97,887 MiB stay free,
        above the standing 3,072 reserve (95,786 leaves the seeds' 2,101 MiB)."""
        env = [
            ("FAKE_SERVED_MODEL", served),
            ("FAKE_BINDING", "127.0.0.1:8001"),
            ("FAKE_VRAM_MIB", str(vram_mib)),
        ]
        if fail_health:
            env.append(("FAKE_FAIL_HEALTH", "1"))
        spec = ContainerSpec(
            name=name,
            image=self.image_id,
            env=tuple(env),
            labels=(
                (LABEL_MANAGED, "true"),
                (LABEL_SLOT, "primary"),
                (LABEL_ROLE, "candidate"),
                (LABEL_RECIPE_DIGEST, "d" * 64),
                ("io.anvil.transaction", "set-by-test"),
            ),
            gpu_uuids=(
                "GPU-aaaaaaaa-0000-0000-0000-000000000001",
                "GPU-bbbbbbbb-0000-0000-0000-000000000002",
            ),
        )
        return Candidate(
            recipe=name,
            recipe_digest="d" * 64,
            served_model=served,
            context_tokens=393216,
            health_path="/health",
            startup_timeout_s=0.5,
            spec=spec,
            gpu_roles=("compute-a", "compute-b"),
        )


def make_fake_host(
    root: Path, *, state_db: str | None = None, host: str = "testhost", machine_id: str | None = None
) -> FakeHost:
    """A fake host under `root`; its state database is SQLite in `root/state`, or `state_db`
    (a database at the schema's head, e.g. from the `pg_database` fixture, or another fake
    host's). `host` names it in anvil.toml; `machine_id` (default: this machine's) is written
    to `root/machine-id` for it, so that two fake hosts of one fleet are two machines."""
    state = root / "state"
    state.mkdir(parents=True, exist_ok=True)
    cfg = root / "anvil.toml"
    cfg.write_text(HOST_TOML.replace('host = "testhost"', f'host = "{host}"', 1))
    extra: dict[str, Path] = {}
    if machine_id is not None:
        (root / "machine-id").write_text(machine_id + "\n")
        extra["machine_id_file"] = root / "machine-id"
    settings = Settings(  # type: ignore[call-arg]
        state_dir=state, state_db=state_db, config=cfg, backend="fake", _env_file=None, **extra
    )
    app = App(settings=settings, env={})
    upgrade(app.create_database())
    world = ScriptedWorld(settings.fake_world_path)
    image_id = world.add_image("anvil-stub@sha256:" + "1" * 64)
    world.add_gpu("GPU-aaaaaaaa-0000-0000-0000-000000000001", 97887)
    world.add_gpu("GPU-bbbbbbbb-0000-0000-0000-000000000002", 97887)
    rt = FakeRuntime(world)
    inc = rt.create(
        ContainerSpec(
            name="incumbent",
            image=image_id,
            env=(("FAKE_SERVED_MODEL", INCUMBENT_MODEL), ("FAKE_BINDING", "127.0.0.1:8001")),
        )
    )
    rt.start(inc)
    world_obj = app.world()
    assert world_obj.router is not None
    world_obj.router.register("primary-local", "http://127.0.0.1:8001", ("llm.primary",))
    out = transactions.adopt(app, slot="primary", container_id=inc, context_tokens=524288)
    assert out.state.value == "committed", out.reason
    return FakeHost(root, settings, world, image_id, inc)


def reopen(root: Path, *, state_db: str | None = None) -> FakeHost:
    """The FakeHost made earlier under root (on `state_db`, if it was), for a child process."""
    settings = Settings(  # type: ignore[call-arg]
        state_dir=root / "state",
        state_db=state_db,
        config=root / "anvil.toml",
        backend="fake",
        _env_file=None,
    )
    world = ScriptedWorld(settings.fake_world_path)
    image_id = next(iter(world.read()["images"]))
    app = App(settings=settings, env={})
    inc = app.store.current_identity("primary", "incumbent")
    assert inc is not None
    return FakeHost(root, settings, world, image_id, inc.container_id)
