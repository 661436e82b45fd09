"""Coding-agent checks: deterministic tasks x repetitions under a visible-answer budget, validated
statically. Classifications: `pass`, `wrong_answer`, `reasoning_leak`,
`visible_answer_budget_exhausted` (a `length` finish that shows nothing wrong), `error`."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from anvil_ctl.core.jsontypes import JSONArray, JSONObject, JSONValue
from anvil_ctl.qualify.gates.base import Gate, GateContext, has_think_markup, user
from anvil_ctl.qualify.results import GateResult

_BLOCK = re.compile(r"```[\w+-]*[ \t]*\n(.*?)```", re.DOTALL)
BUDGET = "visible_answer_budget_exhausted"


@dataclass(frozen=True)
class CodingTask:
    """One deterministic task: its prompt, how to validate, and a reference answer."""

    id: str
    marker: str
    """The tag its prompt opens with: the stub's answer book (scripts/fixtures.py) keys on it."""
    prompt: str
    reference: str
    must_contain: tuple[str, ...] = ()
    must_not_contain: tuple[str, ...] = ()
    defines: str | None = None
    json_equals: JSONValue = None
    regex_matches: tuple[str, ...] = ()
    regex_rejects: tuple[str, ...] = ()

    def contradictions(self, text: str) -> list[str]:
        """What in `text` (even partial) is already wrong."""
        squeezed = " ".join(text.split())
        return [f"contains {bad!r}" for bad in self.must_not_contain if bad in squeezed]

    def problems(self, text: str) -> list[str]:
        """Everything wrong with a complete answer; empty when it is correct."""
        found = self.contradictions(text)
        fenced = _BLOCK.search(text)  # the first fenced block's body, or the whole text
        body = (fenced.group(1) if fenced else text).strip()
        squeezed = " ".join(body.split())
        found += [f"missing {need!r}" for need in self.must_contain if need not in squeezed]
        if self.defines is not None:
            try:
                tree = ast.parse(body)
            except SyntaxError as exc:
                found.append(f"not Python: {exc.msg}")
            else:
                names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
                if self.defines not in names:
                    found.append(f"does not define {self.defines}()")
        if self.json_equals is not None:
            try:
                value = json.loads(body)
            except json.JSONDecodeError as exc:
                found.append(f"not JSON: {exc.msg}")
            else:
                if value != self.json_equals:
                    found.append(f"JSON differs: {value!r}")
        if self.regex_matches or self.regex_rejects:
            found += self._regex_problems(body)
        return found

    def _regex_problems(self, body: str) -> list[str]:
        pattern = body.strip().strip("`").strip()
        if pattern.startswith(("r'", 'r"')):
            pattern = pattern[2:-1]
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            return [f"not a regular expression: {exc}"]
        found = [f"does not match {s!r}" for s in self.regex_matches if not compiled.fullmatch(s)]
        found += [f"wrongly matches {s!r}" for s in self.regex_rejects if compiled.fullmatch(s)]
        return found


TASKS: tuple[CodingTask, ...] = (
    CodingTask(
        id="reverse-words",
        marker="[CODING-1]",
        prompt=(
            "[CODING-1] Write a Python function reverse_words(s: str) -> str that returns the "
            "words of s in reverse order, joined by single spaces. Answer with one Python code "
            "block only."
        ),
        reference=(
            "```python\ndef reverse_words(s: str) -> str:\n"
            '    """Return the words of s in reverse order, joined by single spaces."""\n'
            '    return " ".join(reversed(s.split()))\n```'
        ),
        must_contain=("split",),
        defines="reverse_words",
    ),
    CodingTask(
        id="json-config",
        marker="[CODING-2]",
        prompt=(
            "[CODING-2] Write the JSON configuration object of a service named anvil that "
            "listens on port 8001 with debug disabled, with exactly the keys name, port and "
            "debug. Answer with the JSON object only, in one code block."
        ),
        reference='```json\n{"name": "anvil", "port": 8001, "debug": false}\n```',
        json_equals={"name": "anvil", "port": 8001, "debug": False},
    ),
    CodingTask(
        id="move-plan",
        marker="[CODING-3]",
        prompt=(
            "[CODING-3] Give one POSIX shell command that moves every file ending in .log from "
            "/srv/in to /srv/archive without overwriting files that already exist there and "
            "without deleting anything. Answer with one shell code block only."
        ),
        reference="```sh\nmv -n /srv/in/*.log /srv/archive/\n```",
        must_contain=("mv", "/srv/in", "/srv/archive", ".log"),
        must_not_contain=("rm ", "rm -"),
    ),
    CodingTask(
        id="iso-date-regex",
        marker="[CODING-4]",
        prompt=(
            "[CODING-4] Write a Python regular expression that fully matches an ISO date "
            "YYYY-MM-DD with month 01-12 and day 01-31. Answer with the bare pattern only, in one "
            "code block, without quotes."
        ),
        reference="```\n\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])\n```",
        regex_matches=("2026-09-02", "1999-12-31", "2000-01-01"),
        regex_rejects=("2026-13-01", "2026-9-2", "20260902", "2026-00-10", "2026-01-32"),
    ),
    CodingTask(
        id="fix-mean",
        marker="[CODING-5]",
        prompt=(
            "[CODING-5] This Python function is wrong: def mean(xs): return sum(xs) / len(xs) - 1 "
            "Give the corrected function mean(xs) in one Python code block only."
        ),
        reference=(
            "```python\ndef mean(xs):\n"
            '    """Arithmetic mean of a non-empty sequence of numbers."""\n'
            "    return sum(xs) / len(xs)\n```"
        ),
        must_contain=("sum(xs) / len(xs)",),
        must_not_contain=("len(xs) - 1",),
        defines="mean",
    ),
)


def classify(task: CodingTask, content: str, finish_reason: str | None) -> tuple[str, list[str]]:
    """(classification, problems) of one answer."""
    if has_think_markup(content):
        return "reasoning_leak", ["reasoning markup in the visible answer"]
    if finish_reason == "length":
        wrong = task.contradictions(content)
        return ("wrong_answer", wrong) if wrong else (BUDGET, ["cut at the visible-answer budget"])
    problems = task.problems(content)
    return ("wrong_answer" if problems else "pass"), problems


@dataclass(kw_only=True, eq=False)
class CodingAgent(Gate):
    """`tasks` x `repetitions` deterministic coding tasks, each answer validated."""

    gate_type = "coding"

    repetitions: int = 3
    visible_tokens: int = 2048
    reasoning_allowance: int = 0
    tasks: list[str] | None = None
    concurrency: int = 1

    async def run(self, gate_ctx: GateContext) -> GateResult:
        tasks = [t for t in TASKS if not self.tasks or t.id in self.tasks]
        max_tokens = self.visible_tokens + (self.reasoning_allowance if gate_ctx.thinking else 0)
        asked = [(t.id, [user(t.prompt)], max_tokens) for t in tasks]
        attempts = await self.repeat(gate_ctx, asked, self.repetitions, self.concurrency)
        rows: JSONArray = []
        counts: dict[str, int] = {}
        for task, attempt in zip(tasks * self.repetitions, attempts, strict=True):
            label, result = attempt.label, attempt.result
            if result is None:
                verdict, problems = "error", [attempt.error or "no result"]
            else:
                verdict, problems = classify(task, result.content, result.finish_reason)
            counts[verdict] = counts.get(verdict, 0) + 1
            gate_ctx.on_request(self.name, verdict == "pass", f"{label}: {verdict}")
            rows.append(
                {
                    "label": label,
                    "task": task.id,
                    "classification": verdict,
                    "problems": [*problems],
                    "finish_reason": None if result is None else result.finish_reason,
                    "completion_tokens": None
                    if result is None or result.usage is None
                    else result.usage.completion_tokens,
                    "content": None if result is None else result.content,
                    "error": attempt.error,
                }
            )
        total = len(rows)
        passed = total > 0 and counts.get("pass", 0) == total
        # The worst verdict classifies the gate: a wrong answer outranks a cut one.
        order = ("error", "reasoning_leak", "wrong_answer", BUDGET)
        classification = next((v for v in order if counts.get(v)), "pass")
        evidence: JSONObject = {"max_tokens": max_tokens, "counts": dict(counts), "results": rows}
        return self.result(passed, classification, evidence, f"{counts.get('pass', 0)}/{total}")
