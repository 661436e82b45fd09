"""Which removals smg may still land on a URL: the bookkeeping behind readmission's hold."""

from __future__ import annotations

from collections.abc import Callable

from anvil_ctl.log import get_logger

log = get_logger()

OWN_REMOVAL_MIN_S = 5.0
"""smg 1.13's fixed drain before it removes a DELETEd worker: a removal seen sooner after our
DELETE was not (only) ours."""


class PendingRemovals:
    """Per URL: removals seen pending and our own DELETEs not yet seen to land."""

    def __init__(self, hold_s: float, clock: Callable[[], float]) -> None:
        self._hold_s = hold_s
        self._clock = clock
        self._seen: dict[str, tuple[str, float]] = {}
        """URL -> (worker id, first sighting) of the newest removal seen pending there."""
        self._unlanded: dict[str, float] = {}
        """URL -> when this adapter sent a DELETE there whose removal it has not seen land."""

    def saw_pending(self, url: str, worker_id: str) -> None:
        """A removal of `worker_id` at `url` is pending: readmission holds past its sighting."""
        now = self._clock()
        seen = self._seen.get(url)
        if seen is None or seen[0] != worker_id or now >= seen[1] + self._hold_s:
            self._seen[url] = (worker_id, now)
            log.info("router.smg.removal_pending", url=url, worker_id=worker_id)

    def sent_delete(self, url: str) -> float:
        """Note a DELETE sent for `url` now; the time it was sent."""
        sent = self._unlanded[url] = self._clock()
        return sent

    def gone(self, url: str, sent: float, settle_s: float = OWN_REMOVAL_MIN_S) -> None:
        """The URL went after our DELETE sent at `sent`: it landed, if the worker's full drain
        (`settle_s`, smg's default unless it was registered with its own) had passed."""
        if self._clock() - sent >= min(settle_s, OWN_REMOVAL_MIN_S):
            if self._unlanded.get(url) == sent:
                del self._unlanded[url]
        else:
            log.warning("router.smg.early_removal", url=url, seconds=round(self._clock() - sent, 3))

    def hold_until(self, url: str, since: float | None) -> float | None:
        """When every removal that may still be pending for `url` has surely landed (None: none may);
        `since`: the caller's own reason to hold, else None."""
        seen = self._seen.get(url)
        sent = self._unlanded.get(url)
        reasons = [t for t in (since, seen[1] if seen else None, sent) if t is not None]
        return max(reasons) + self._hold_s if reasons else None

    def held(self, url: str, since: float | None) -> bool:
        until = self.hold_until(url, since)
        return until is None or self._clock() >= until
