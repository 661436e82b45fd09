"""Fake router and acceptance over the fake world: tiers map to one backend URL each."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from anvil_ctl.core.errors import AuthRejected, StepFailed
from anvil_ctl.core.jsontypes import JSONArray, JSONObject
from anvil_ctl.core.model import Readmission, RouteCheck, RoutedAnswer
from anvil_ctl.testing.runtime import FakeServerProbe
from anvil_ctl.testing.world import FakeWorld, TierDoc, WorldDoc, maybe_hang_or_fail

if TYPE_CHECKING:
    from anvil_ctl.qualify.slosample import Sample


class FakeRouter:
    """A router whose tiers map to one backend URL each; routed answers come from FakeServerProbe."""

    def __init__(self, world: FakeWorld) -> None:
        self.world = world
        self.server = FakeServerProbe(world)

    def probe_credentials(self) -> None:
        maybe_hang_or_fail(self.world, "probe_credentials")  # a router not answering yet
        if not self.world.read()["router"]["admin_token_ok"]:
            raise AuthRejected("router answered 401 to the admin token from the fake credential source")

    def _tier(self, w: WorldDoc, tier: str) -> TierDoc:
        """The tier in `w` (an unknown tier: no URL, in maintenance)."""
        return w["router"]["tiers"].setdefault(tier, {"url": None, "aliases": [], "state": "maint"})

    def register(self, tier: str, url: str, aliases: tuple[str, ...]) -> None:
        with self.world.edit() as w:
            self._tier(w, tier).update({"url": url, "aliases": list(aliases), "state": "ready"})

    def deregister(self, tier: str, url: str) -> None:
        with self.world.edit() as w:
            t = self._tier(w, tier)
            if t["url"] == url:
                t.update({"url": None, "state": "maint"})

    def drain(self, tier: str, *, hold_s: float = 0.0) -> None:
        with self.world.edit() as w:
            self._tier(w, tier)["state"] = "drain"

    def in_flight(self, tier: str, url: str) -> int | None:
        """The serving container's `in_flight`, as a router counts what it passes on."""
        t = self._tier(self.world.read(), tier)
        c = self.server.serving_container(url) if t["url"] == url else None
        return None if c is None else self.server.look_in_flight(c)

    def errors(self, tier: str, url: str) -> int | None:
        """The fake world's `router_errors` for `url` (None: not set, as for an smg without `metrics_url`)."""
        found = self.world.read().get("router_errors", {})
        return int(found[url]) if isinstance(found, dict) and url in found else None

    def readmit(self, r: Readmission) -> None:
        """Registers at once; every readmission is logged in the world's `router.readmits`."""
        self.probe_credentials()
        maybe_hang_or_fail(self.world, "readmit")
        with self.world.edit() as w:
            w["router"].setdefault("readmits", []).append({"tier": r.tier, "url": r.url, "hold": r.hold})
        self.register(r.tier, r.url, r.aliases)
        # The readmission's own check, apart from `routed_chat`, which tests replace.
        answer = self._answer(r.aliases[0])
        if answer.model != r.expected_model:
            raise StepFailed(
                f"readmission of {r.tier}: routed answer from {answer.model!r}, expected {r.expected_model}"
            )

    def routed_chat(self, alias: str) -> RoutedAnswer:
        return self._answer(alias)

    def _answer(self, alias: str) -> RoutedAnswer:
        for t in self.world.read()["router"]["tiers"].values():
            url = t["url"]
            if alias in t["aliases"] and url and t["state"] == "ready":
                models = self.server.models(url)
                if models:
                    serving = self.server.serving_container(url)
                    echo = serving is not None and serving.get("echo_model", False)
                    return RoutedAnswer(200, alias if echo else models[0].id, "ok")
                return RoutedAnswer(503, None)
        return RoutedAnswer(404, None)

    def check_route(self, tier: str, url: str, expected_model: str) -> RouteCheck:
        """Holds when the tier is ready at `url` and a routed chat answers from expected_model."""
        t = self._tier(self.world.read(), tier)

        def verdict(reason: str = "") -> RouteCheck:
            return RouteCheck(tier, url, expected_model, holds=not reason, reason=reason)

        if t["url"] != url:
            return verdict(f"fake tier {tier!r} points at {t['url']!r}")
        if t["state"] != "ready":
            return verdict(f"fake tier {tier!r} is {t['state']}")
        answer = self.routed_chat(t["aliases"][0]) if t["aliases"] else RoutedAnswer(404, None)
        if answer.status != 200 or answer.model != expected_model:
            return verdict(f"routed chat answered {answer.status} from {answer.model!r}")
        return verdict()

    def ready(self) -> bool:
        return bool(self.world.read()["router"]["ready"])

    def view(self, tier: str) -> JSONObject:
        """The same shape as the smg adapter's view; only admitted (ready) backends are listed."""
        t = self._tier(self.world.read(), tier)
        backends: JSONArray = []
        url = t["url"]
        if url and t["state"] == "ready":
            models = [m.id for m in self.server.models(url)]
            aliases: JSONArray = [*t["aliases"]]
            backends.append(
                {
                    "url": url,
                    "aliases": aliases,
                    "observed_model": models[0] if models else None,
                    "healthy": self.server.health(url, "/health"),
                    "state": t["state"],
                }
            )
        return {"router": "fake", "tier": tier, "ready": self.ready(), "backends": backends}


@dataclass(frozen=True)
class FakeAcceptanceResult:
    checks: dict[str, bool]
    model: str | None

    @property
    def passed(self) -> bool:
        return all(self.checks.values())

    def failed_checks(self) -> list[str]:
        return [name for name, ok in self.checks.items() if not ok]

    def as_dict(self) -> JSONObject:
        checks: JSONObject = {**self.checks}
        return {"passed": self.passed, "checks": checks, "model": self.model}


def fake_acceptance(router: FakeRouter) -> Callable[[str, str], FakeAcceptanceResult]:
    """Real-client acceptance stand-in: the routed answer must come from the expected model."""

    def run(alias: str, expected_model: str) -> FakeAcceptanceResult:
        maybe_hang_or_fail(router.world, "acceptance")
        answer = router.routed_chat(alias)
        ok = answer.status == 200 and answer.model == expected_model
        return FakeAcceptanceResult({"plain_chat": ok, "streaming_chat": ok, "tool_call": ok}, answer.model)

    return run


def fake_route_sample(router: FakeRouter) -> Callable[[str, int, int, int | None], Sample]:
    """A watch's active sample stand-in: each request is the fake router's routed answer (an
    error unless it is a 200); the fake world's `route_sample_ttft_s` slows the first token; a
    functional check asked for passes with a 200 answer."""

    def take(alias: str, requests: int, _max_tokens: int, functional: int | None) -> Sample:
        from anvil_ctl.qualify.slosample import RequestResult, Sample

        maybe_hang_or_fail(router.world, "route_sample")
        ttft = float(router.world.read().get("route_sample_ttft_s", 0.01))
        results = []
        for _ in range(requests):
            answer = router.routed_chat(alias)
            ok = answer.status == 200
            failed = RequestResult(False, error=f"HTTP {answer.status}")
            results.append(RequestResult(True, ttft, 100.0, "stop", answer.model) if ok else failed)
        checks: tuple[JSONObject, ...] = ()
        if functional is not None:
            from anvil_ctl.qualify.slosample import FUNCTIONAL

            checks = tuple({"check": k, "ok": router.routed_chat(alias).status == 200} for k in FUNCTIONAL)
        return Sample(time.time(), tuple(results), checks)

    return take
