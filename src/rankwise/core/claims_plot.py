"""The claims figure of a reproduction report: one panel per claim, its evidence against its declared threshold.

Drawn from the claims' dictionaries (`Claim.to_dict()`, the entries of report.json's `claims`), so that a committed
report can be drawn again without re-running it (the documentation site does this for reports written before the
figure existed). Each claim keeps its own axis, since claims of one report measure different things in different
units:
- a stochastic claim (`sample`, `paired`): every seed's value (for a paired claim, method minus baseline) as a dot,
  the confidence interval as a bar, the point estimate as a diamond;
- a deterministic claim: the measured value as a diamond, on a log axis when value and threshold are both positive
  and orders of magnitude apart (errors of 1e-15 against a tolerance of 1e-10).
The threshold is a vertical line, the side the claim needs shaded; the colour is the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

VERDICT_COLOURS = {"PASS": "#2e7d32", "FAIL": "#c62828", "INCONCLUSIVE": "#f9a825"}
NEUTRAL = "#616161"
# value and threshold this many decades apart: a deterministic claim's panel uses a log axis
LOG_DECADES = 2.0


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def claim_points(claim: Mapping[str, Any]) -> list[float]:
    """The per-seed values a claim's interval summarises (method minus baseline for a paired claim), finite only."""
    method, baseline = claim.get("method_samples"), claim.get("baseline_samples")
    if claim.get("type") == "paired" and isinstance(method, list) and isinstance(baseline, list):
        pairs = [(_finite(m), _finite(b)) for m, b in zip(method, baseline)]
        return [m - b for m, b in pairs if m is not None and b is not None]
    samples = claim.get("samples")
    return [v for v in (_finite(s) for s in samples) if v is not None] if isinstance(samples, list) else []


def drawable(claim: Mapping[str, Any]) -> bool:
    """A claim has something to draw: a finite threshold and a finite measurement, interval or sample."""
    if _finite(claim.get("threshold")) is None:
        return False
    return any(_finite(claim.get(k)) is not None for k in ("measured", "low", "high")) or bool(claim_points(claim))


def _use_log_axis(values: Sequence[float], threshold: float) -> bool:
    positive = [v for v in (*values, threshold) if v > 0]
    if len(positive) != len(values) + 1:
        return False
    return math.log10(max(positive)) - math.log10(min(positive)) >= LOG_DECADES


def _label(claim: Mapping[str, Any]) -> str:
    kind = f"{claim.get('kind', '?')} {claim.get('type', '?')}"
    unit = claim.get("unit")
    paired = ", method - baseline" if claim.get("type") == "paired" else ""
    return f"{claim.get('name', '?')}\n{kind}{paired}" + (f" over {unit}" if unit else "")


def _draw(ax: Any, claim: Mapping[str, Any]) -> None:
    colour = VERDICT_COLOURS.get(str(claim.get("verdict")), NEUTRAL)
    threshold = float(claim["threshold"])
    points = claim_points(claim)
    low, high, measured = (_finite(claim.get(k)) for k in ("low", "high", "measured"))
    values = [v for v in (*points, low, high, measured) if v is not None]
    if claim.get("type") == "deterministic" and _use_log_axis(values, threshold):
        ax.set_xscale("log")
    if points:
        ax.plot(points, [0.0] * len(points), "o", color=colour, alpha=0.45, ms=5, zorder=2)
    if low is not None and high is not None:
        ax.plot([low, high], [0.0, 0.0], "-", color=colour, lw=3, solid_capstyle="butt", zorder=3)
        ax.plot([low, high], [0.0, 0.0], "|", color=colour, ms=14, mew=2, zorder=3)
    if measured is not None:
        ax.plot([measured], [0.0], "D", color=colour, ms=7, mec="black", mew=0.6, zorder=4)
    ax.axvline(threshold, color="black", lw=1, ls="--", zorder=1)
    left, right = ax.get_xlim()
    span = (left, right)
    if threshold < left or threshold > right:
        span = (min(left, threshold), max(right, threshold))
        ax.set_xlim(*span)
    op = str(claim.get("op", ""))
    if op in (">", ">="):
        ax.axvspan(threshold, span[1], color=colour, alpha=0.07, zorder=0)
    elif op in ("<", "<="):
        ax.axvspan(span[0], threshold, color=colour, alpha=0.07, zorder=0)
    ax.set_xlim(*span)
    ax.set_yticks([])
    ax.set_ylim(-1, 1)
    ax.set_ylabel(_label(claim), rotation=0, ha="right", va="center", fontsize=8)
    ax.set_title(f"{claim.get('verdict', '?')}: needs {op} {threshold:g}", fontsize=8, loc="right", color=colour)
    ax.tick_params(axis="x", labelsize=7)


def claims_figure(claims: Sequence[Mapping[str, Any]], title: str | None = None) -> Any | None:
    """A matplotlib Figure with one panel per drawable claim, or None when no claim can be drawn."""
    shown = [c for c in claims if drawable(c)]
    if not shown:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 0.95 * len(shown) + 0.6), squeeze=False)
    for ax, claim in zip(axes[:, 0], shown):
        _draw(ax, claim)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
