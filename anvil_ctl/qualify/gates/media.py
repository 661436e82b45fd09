"""Image gates: an image input is accepted, and OCR of fixture images with known text.

Classifications: `pass`, `wrong_answer`, `error`.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from anvil_ctl.core.jsontypes import JSONArray
from anvil_ctl.qualify import prompts
from anvil_ctl.qualify.client import image_part, text_part
from anvil_ctl.qualify.fixtures import load_ocr_cases
from anvil_ctl.qualify.gates.base import Attempt, Gate, GateContext, gather_limited
from anvil_ctl.qualify.gates.chat import body, check_reply, finish
from anvil_ctl.qualify.gates.checks import Checks, same_text
from anvil_ctl.qualify.results import GateResult

OCR_QUESTION = (
    "What text is in the image? Answer with the text only, in capital letters. "
    "When there are several images, give the text of each in order, separated by a single space."
)


class Image(Gate):
    """A request carrying a PNG (data URL) is accepted and answered as instructed."""

    gate_type = "image"

    def __init__(
        self,
        *,
        name: str | None = None,
        image: str = "ocr-anvil-42.png",
        marker: str = "ANVIL-IMAGE-OK",
        max_tokens: int = 256,
    ) -> None:
        super().__init__(name=name)
        self.image = image
        self.marker = marker
        self.max_tokens = max_tokens

    async def run(self, gate_ctx: GateContext) -> GateResult:
        png = (gate_ctx.fixtures_dir / self.image).read_bytes()
        content: JSONArray = [image_part(png), text_part(prompts.reply_exactly(self.marker))]
        attempt = await self.attempt(
            gate_ctx, "image", body(gate_ctx, [{"role": "user", "content": content}], self.max_tokens)
        )
        checks = Checks()
        check_reply(checks, "image", attempt, self.marker)
        return finish(self, checks, [attempt])


class Ocr(Gate):
    """Every fixture case x `repetitions` reads back its known text (case-insensitive)."""

    gate_type = "ocr"

    def __init__(
        self,
        *,
        name: str | None = None,
        repetitions: int = 2,
        cases: list[str] | None = None,
        concurrency: int = 1,
        max_tokens: int = 256,
    ) -> None:
        super().__init__(name=name)
        self.repetitions = repetitions
        self.cases = cases
        self.concurrency = concurrency
        self.max_tokens = max_tokens

    async def run(self, gate_ctx: GateContext) -> GateResult:
        cases = [c for c in load_ocr_cases(gate_ctx.fixtures_dir) if not self.cases or c["id"] in self.cases]
        jobs: list[Callable[[], Awaitable[Attempt]]] = []
        plan: list[dict[str, str]] = []
        for rep in range(self.repetitions):
            for case in cases:
                parts = [image_part((gate_ctx.fixtures_dir / img).read_bytes()) for img in case["images"]]
                content: JSONArray = [*parts, text_part(OCR_QUESTION)]
                request = body(gate_ctx, [{"role": "user", "content": content}], self.max_tokens)
                label = f"{case['id']}#{rep + 1}"
                plan.append({"label": label, "expected": case["expected"]})
                jobs.append(functools.partial(self.attempt, gate_ctx, label, request))
        attempts = await gather_limited(self.concurrency, jobs)
        checks = Checks()
        correct = 0
        for item, attempt in zip(plan, attempts, strict=True):
            result = attempt.result
            ok = result is not None and same_text(result.content, item["expected"], case=False)
            checks.add(
                item["label"],
                ok,
                "error" if result is None else "wrong_answer",
                expected=item["expected"],
                observed=None if result is None else result.content[:300],
                error=attempt.error,
            )
            correct += ok
            gate_ctx.on_request(self.name, ok, item["label"])
        total = len(plan)
        outcome = finish(self, checks, attempts, correct=correct, total=total)
        return self.result(
            outcome.passed and total > 0,
            outcome.classification,
            outcome.evidence,
            f"{correct}/{total}",
        )
