"""Router adapter for HAProxy (Debian 2.6) through its Runtime API on a Unix socket.

Register readies a free slot of the tier's backend (`haproxy_config`), drain sets `drain`,
deregister `maint`. Warning: routing reads the buffered body (`tune.bufsize` 1 MiB); a `"model"`
key beyond it is answered 404."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from anvil_ctl.adapters.credentials import RouterCredentials, Secret
from anvil_ctl.adapters.engine_http import context_for
from anvil_ctl.adapters.haproxy_config import READY_URI, backend_name, check_socket
from anvil_ctl.adapters.router_http import (
    NotYetRouted,
    RouterHttp,
    check_answer,
    probe_client_token,
    readmit_loop,
    routed_chat,
)
from anvil_ctl.core.errors import AdapterError, TransientError
from anvil_ctl.core.jsontypes import JSONValue
from anvil_ctl.core.model import Backend, Readmission, RouteCheck, RoutedAnswer
from anvil_ctl.log import get_logger

log = get_logger()


@dataclass(frozen=True)
class ServerSlot:
    tier: str
    name: str
    addr: str
    port: int
    status: str  # HAProxy's `show stat` status: UP, DOWN, MAINT, DRAIN, "UP 1/2", ...
    sessions: int = 0
    """`scur` + `qcur`: requests the server is answering and requests queued for it."""
    errors: int = 0
    """`hrsp_5xx` + `eresp` + `econ`: 5xx answers, aborted responses, failed connections."""

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}"

    @property
    def state(self) -> str:
        s = self.status.upper()
        if s.startswith("MAINT"):
            return "maint"
        if s.startswith("DRAIN"):
            return "drain"
        return "ready"

    @property
    def healthy(self) -> bool:
        s = self.status.upper()
        return s == "UP" or s.startswith("UP ") or s.startswith("DRAIN") or s == "NO CHECK"


def _split_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise AdapterError(f"backend url {url!r}: expected http://IP:PORT")
    return parts.hostname, parts.port


class HaproxyRouter(RouterHttp):
    """`anvil_ctl.core.ports.Router` over HAProxy's Runtime API and its data plane."""

    NAME = "haproxy"
    READY_PATH = READY_URI  # answers 200 once some tier has a server up

    def __init__(
        self,
        url: str,
        socket_path: Path,
        credentials: RouterCredentials,
        tiers: Mapping[str, tuple[str, ...]],
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url.rstrip("/")
        self.socket_path = Path(socket_path)
        self.tiers = dict(tiers)
        self._client: Secret = credentials.client
        self._http = httpx.Client(transport=transport, timeout=10.0, verify=context_for(self.url))
        self._sleep = sleep

    def command(self, line: str) -> str:
        check_socket(self.socket_path)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5.0)
                sock.connect(str(self.socket_path))
                sock.sendall(line.encode() + b"\n")
                chunks = list(iter(lambda: sock.recv(65536), b""))
        except OSError as exc:
            raise TransientError(f"haproxy runtime API {self.socket_path}: {exc.strerror or exc}") from exc
        return b"".join(chunks).decode(errors="replace")

    def _set(self, line: str) -> None:
        answer = self.command(line).strip()
        if answer and not answer.startswith(("IP changed", "no need to change")):
            raise AdapterError(f"haproxy refused {line!r}: {answer}")
        log.info("router.haproxy.set", command=line)

    def slots(self, tier: str) -> list[ServerSlot]:
        self._known(tier)
        backend = backend_name(tier)
        text = self.command("show stat")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if not lines or not lines[0].startswith("# "):
            raise AdapterError("haproxy `show stat`: unexpected answer")
        header = lines[0][2:].split(",")
        out: list[ServerSlot] = []
        for row in lines[1:]:
            rec = dict(zip(header, row.split(","), strict=False))
            if rec.get("pxname") != backend or rec.get("svname") in ("FRONTEND", "BACKEND"):
                continue
            addr, _, port = rec.get("addr", "").rpartition(":")
            out.append(
                ServerSlot(
                    tier=tier,
                    name=rec["svname"],
                    addr=addr,
                    port=int(port) if port.isdigit() else 0,
                    status=rec.get("status", ""),
                    sessions=sum(int(rec.get(k) or 0) for k in ("scur", "qcur")),
                    errors=sum(int(rec.get(k) or 0) for k in ("hrsp_5xx", "eresp", "econ")),
                )
            )
        if not out:
            raise AdapterError(f"haproxy has no backend {backend!r}: config and tiers disagree")
        return out

    def _known(self, tier: str) -> None:
        if tier not in self.tiers:
            raise AdapterError(
                f"tier {tier!r} is not in the haproxy config; expected one of {sorted(self.tiers)}"
            )

    def _slot_for(self, tier: str, url: str) -> ServerSlot | None:
        host, port = _split_url(url)
        for slot in self.slots(tier):
            if slot.addr == host and slot.port == port and slot.state != "maint":
                return slot
        return None

    def probe_credentials(self) -> None:
        """Admin: the socket's permissions and `show info`; client: a chat to an unrouted alias."""
        if "Name:" not in self.command("show info"):
            raise AdapterError("haproxy `show info`: unexpected answer")
        probe_client_token(self._http, self.url, self._client)

    def _listed(self, tier: str) -> list[tuple[Backend, JSONValue]]:
        """HAProxy does not know what a backend serves: no observed model."""
        return [
            (Backend(s.url, s.healthy, self.tiers[tier], s.state, f"{backend_name(tier)}/{s.name}"), None)
            for s in self.slots(tier)
            if s.state != "maint"
        ]

    def register(self, tier: str, url: str, aliases: tuple[str, ...]) -> None:
        """Point a free slot of the tier at `url` and make it ready (aliases: from the config)."""
        self._known(tier)
        missing = [a for a in aliases if a not in self.tiers[tier]]
        if missing:
            raise AdapterError(
                f"aliases {missing} are not routed to tier {tier!r} by the haproxy config; "
                "regenerate the config"
            )
        host, port = _split_url(url)
        current = self._slot_for(tier, url)
        backend = backend_name(tier)
        if current is not None:
            # `show stat` says DOWN, not DRAIN, for a drained server whose checks fail (its
            # serve was stopped): only a healthy one is surely in the ready state already.
            if current.state != "ready" or not current.healthy:
                self._set(f"set server {backend}/{current.name} state ready")
            return
        free = [s for s in self.slots(tier) if s.state == "maint"]
        if not free:
            raise AdapterError(f"tier {tier!r} has no free server slot for {url}")
        slot = free[0]
        self._set(f"set server {backend}/{slot.name} addr {host} port {port}")
        # A slot a canary weighed keeps that weight through maintenance: start from the config's.
        self._set(f"set server {backend}/{slot.name} weight 100%")
        self._set(f"set server {backend}/{slot.name} state ready")
        log.info("router.haproxy.register", tier=tier, url=url, slot=slot.name)

    def set_weights(self, tier: str, weights: Mapping[str, int]) -> None:
        """Server weights of the tier's backends (`WeightedRouter`): HAProxy's round robin
        sends each server new requests in proportion to its weight; 0 sends it none."""
        self._known(tier)
        backend = backend_name(tier)
        names = {}
        for url, weight in weights.items():  # all checked before any is set
            if not 0 <= weight <= 256:
                raise AdapterError(f"haproxy weight {weight} for {url}: expected 0-256")
            slot = self._slot_for(tier, url)
            if slot is None:
                raise AdapterError(f"tier {tier!r} has no server for {url} to weigh; register it first")
            names[slot.name] = weight
        for name, weight in names.items():
            self._set(f"set server {backend}/{name} weight {weight}")
        log.info("router.haproxy.weights", tier=tier, weights=dict(weights))

    def deregister(self, tier: str, url: str) -> None:
        """Put the slot serving `url` into maintenance; absent is fine."""
        slot = self._slot_for(tier, url)
        if slot is not None:
            self._set(f"set server {backend_name(tier)}/{slot.name} state maint")

    def drain(self, tier: str, *, hold_s: float = 0.0) -> None:
        """No new requests to the tier's backends; in-flight ones finish (`hold_s`: HAProxy
        answers the tier's new requests 503 itself, it holds none)."""
        for slot in self.slots(tier):
            if slot.state == "ready":
                self._set(f"set server {backend_name(tier)}/{slot.name} state drain")

    def in_flight(self, tier: str, url: str) -> int | None:
        """The server's `scur` + `qcur` (HAProxy keeps them for a draining server too)."""
        slot = self._slot_for(tier, url)
        return None if slot is None else slot.sessions

    def errors(self, tier: str, url: str) -> int | None:
        """The server's `hrsp_5xx` + `eresp` + `econ` (`show stat`), since HAProxy started."""
        slot = self._slot_for(tier, url)
        return None if slot is None else slot.errors

    def readmit(self, r: Readmission) -> None:
        """`hold` changes nothing here: the Runtime API queues nothing that could land later."""
        tier, url, aliases = r.tier, r.url, r.aliases
        self._known(tier)
        alias = (aliases or self.tiers[tier])[0]
        target = _split_url(url)

        def attempt() -> RoutedAnswer:
            # The tier has one backend: others leave; a restarted haproxy lost our
            # runtime changes, so registering again is part of every attempt.
            for slot in self.slots(tier):
                if slot.state != "maint" and (slot.addr, slot.port) != target:
                    self._set(f"set server {backend_name(tier)}/{slot.name} state maint")
            self.register(tier, url, aliases)
            mine = self._slot_for(tier, url)
            if mine is not None and mine.state == "ready" and not mine.healthy:
                # Its checks have not yet seen the serve answer; the routed chat below proves it does.
                self._set(f"set server {backend_name(tier)}/{mine.name} health up")
                mine = self._slot_for(tier, url)
            if mine is None or not mine.healthy:
                raise NotYetRouted(f"haproxy slot for {url} not up yet")
            # The one backend carries everything: a weight a canary left could route nothing.
            self._set(f"set server {backend_name(tier)}/{mine.name} weight 100%")
            answer = routed_chat(self._http, self.url, alias, self._client)
            check_answer(answer, alias, r.expected_model)
            # Nothing is queued to undo a Runtime API change (unlike smg's removals), so the hold
            # is one look: still ready after the chat (a restarted haproxy has every slot in maint).
            if (held := self._slot_for(tier, url)) is None or held.state != "ready":
                raise NotYetRouted(f"haproxy slot for {url} left the ready state during readmission")
            return answer

        readmit_loop(
            attempt, what=f"haproxy tier {tier} -> {url}", deadline_s=r.deadline_s, sleep=self._sleep
        )

    def check_route(self, tier: str, url: str, expected_model: str) -> RouteCheck:
        _split_url(url)  # a malformed URL is an error of the caller's, not a verdict
        return super().check_route(tier, url, expected_model)

    def _route_problem(self, tier: str, url: str) -> tuple[str, str]:
        self._known(tier)
        target = _split_url(url)
        live = [s for s in self.slots(tier) if s.state != "maint"]
        mine = [s for s in live if (s.addr, s.port) == target]
        others = sorted(s.url for s in live if s not in mine and s.state == "ready")
        alias = self.tiers[tier][0]
        if not mine:
            return f"no server of haproxy backend {backend_name(tier)} points at {url}", alias
        if others:
            return f"tier {tier!r} also routes to {', '.join(others)}", alias
        if mine[0].state != "ready":
            return f"haproxy server {mine[0].name} for {url} is {mine[0].state}", alias
        if not mine[0].healthy:
            return f"haproxy reads {url} {mine[0].status}", alias
        return "", alias
