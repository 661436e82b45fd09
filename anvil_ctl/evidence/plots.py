"""The report's plots, drawn by matplotlib (the optional extra `report`) as inline SVG with
text kept as text and nothing fetched; matplotlib is imported only when a report is made."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from anvil_ctl.core.errors import BadInput
from anvil_ctl.core.jsontypes import JSONMapping, fields, items, number

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.typing import RcKeyType

PALETTE = ("#1f5fa8", "#d2691e", "#2e8b57", "#8e44ad", "#b22222", "#555555")
STYLE: dict[RcKeyType, object] = {
    "svg.fonttype": "none",  # text as text, no embedded glyph paths, no font files
    "svg.hashsalt": "anvil-report",  # stable element IDs: the same data draws the same SVG
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],  # ships with matplotlib: no font lookup warnings
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def require_matplotlib() -> None:
    """BadInput naming the optional extra when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise BadInput(
            "evidence report needs matplotlib: install the optional extra, pip install 'anvil-ctl[report]'",
            field="report",
        ) from None


@contextmanager
def _figure(width: float, height: float) -> Iterator[Figure]:
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(STYLE):
        yield Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]  # inline: no XML declaration or DOCTYPE
    # The RDF metadata names vocabularies by URL; the page keeps only SVG's own namespaces.
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.S)


CAPACITY_METRICS = (
    ("ttft_s", "TTFT (s)", "Time to first token"),
    ("prefill_tps", "effective prefill (tok/s)", "Prefill"),
    ("decode_tps", "decode (tok/s)", "Decode"),
)


def capacity_svg(series: Mapping[str, Sequence[JSONMapping]]) -> str:
    """TTFT, prefill and decode against measured prompt tokens: p50 lines per concurrency over every
    completed request as a faint point; a request far above every p50 is counted in the title."""
    with _figure(10.5, 3.4) as fig:
        axes = fig.subplots(1, 3)
        for ax, (key, ylabel, title) in zip(axes, CAPACITY_METRICS, strict=True):
            p50s: list[float] = []
            ys: list[float] = []
            for i, (label, cells) in enumerate(series.items()):
                color = PALETTE[i % len(PALETTE)]
                rows = [fields(r) for cell in cells for r in items(cell.get("rows", []))]
                pairs = [(r, number(r.get("prompt_tokens")), number(r.get(key))) for r in rows]
                pts = [(x, y) for r, x, y in pairs if r.get("completed") and x and y is not None]
                if pts:
                    ax.scatter(*zip(*pts, strict=True), s=10, alpha=0.35, color=color)
                    ys.extend(p[1] for p in pts)
                at = [(number(c.get("prompt_tokens_p50")) or 0, number(c.get(f"{key}_p50"))) for c in cells]
                line = [(x, y) for x, y in at if y is not None]
                if line:
                    ax.plot(*zip(*line, strict=True), marker="o", color=color, label=label)
                    p50s.extend(p[1] for p in line)
            top = 1.5 * max(p50s) if p50s else None
            hidden = sum(1 for y in ys if top is not None and y > top)
            if top is not None:
                ax.set_ylim(0, max([y for y in ys if y <= top] + p50s) * 1.12)
            ax.set_title(title + (f" ({hidden} above the axis)" if hidden else ""))
            ax.set_xlabel("measured prompt tokens")
            ax.set_ylabel(ylabel)
            _thousands(ax)
        axes[0].legend(loc="upper left", fontsize=8)
        return _svg(fig)


def _thousands(ax: Axes, *, tokens_x: bool = True) -> None:
    """Thousands separators on y; prompt tokens as 4K, 8K, ... on x (unless x has labels)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    if tokens_x:
        ax.xaxis.set_major_locator(MaxNLocator(5))
        ax.xaxis.set_major_formatter(
            FuncFormatter(lambda v, _p: f"{v / 1000:g}K" if abs(v) >= 1000 else f"{v:g}")
        )
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}" if abs(v) >= 100 else f"{v:g}"))


VramBar = tuple[str, Mapping[str, int | None]]
"""Free MiB per card at one moment, and its label."""


def vram_svg(
    cards: Sequence[str], bars: Sequence[VramBar], standing: int | None, in_force: int | None
) -> str:
    """Free VRAM per card before the workload, after it and after acceptance, against the reserve."""
    with _figure(8.5, 3.2) as fig:
        ax = fig.subplots()
        width = 0.8 / max(1, len(bars))
        for i, (label, free) in enumerate(bars):
            xs = [c + (i - (len(bars) - 1) / 2) * width for c in range(len(cards))]
            values = [free.get(card) for card in cards]
            drawn = [(x, v) for x, v in zip(xs, values, strict=True) if v is not None]
            rects = ax.bar(
                [d[0] for d in drawn], [d[1] for d in drawn], width * 0.92, label=label, color=PALETTE[i]
            )
            ax.bar_label(rects, labels=[f"{d[1]:,}" for d in drawn], fontsize=7, padding=2)
        if standing is not None:
            ax.axhline(standing, color="#b22222", linewidth=1.5, label=f"standing reserve {standing:,} MiB")
        if in_force is not None and in_force != standing:
            ax.axhline(
                in_force,
                color="#b22222",
                linestyle="--",
                linewidth=1.2,
                label=f"reserve in force {in_force:,} MiB",
            )
        ax.set_xticks(range(len(cards)), list(cards))
        ax.set_ylabel("free MiB per card")
        ax.set_title("Free VRAM per card against the reserve")
        fig.legend(fontsize=8, loc="outside right upper")
        _thousands(ax, tokens_x=False)
        return _svg(fig)


def ab_svg(comparison: JSONMapping) -> str:
    """Each arm's decode and prefill p50 per cell, with the delta (B vs A) over each pair."""
    names = fields(comparison["arms"])
    cells = [fields(c) for c in items(comparison["cells"]) if not fields(c).get("skipped")]
    with _figure(9.0, 3.1) as fig:
        axes = fig.subplots(1, 2)
        for ax, (metric, title) in zip(
            axes, (("decode_p50", "Decode p50 (tok/s)"), ("prefill_p50", "Prefill p50 (tok/s)")), strict=True
        ):
            xs = range(len(cells))
            for i, arm in enumerate(("A", "B")):
                values = [_p50(c, arm, metric) or 0 for c in cells]
                ax.bar(
                    [x + (i - 0.5) * 0.38 for x in xs],
                    values,
                    0.36,
                    color=PALETTE[i],
                    label=f"{arm}: {names[arm]}",
                )
            for x, c in zip(xs, cells, strict=True):
                delta = number(fields(c["delta_pct"])[metric])
                top = max(_p50(c, "A", metric) or 0, _p50(c, "B", metric) or 0)
                if delta is not None:
                    ax.annotate(f"{delta:+.1f}%", (x, top), ha="center", va="bottom", fontsize=8)
            ax.set_xticks(list(xs), [str(c["label"]) for c in cells])
            ax.set_title(title)
            _thousands(ax, tokens_x=False)
        axes[0].legend(fontsize=8, loc="lower left")
        return _svg(fig)


def _p50(cell: JSONMapping, arm: str, metric: str) -> float | None:
    return number(fields(cell[arm])[metric])
