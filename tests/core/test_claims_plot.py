"""The claims figure (core.claims_plot): what it draws from a claim's dictionary, and that every written report
carries it (unless the experiment drew its own under that name)."""

from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from rankwise.core.claims_plot import claim_points, claims_figure, drawable  # noqa: E402
from rankwise.core.report import CLAIMS_PLOT, Report  # noqa: E402


def test_points_of_paired_and_sample_claims():
    paired = {"type": "paired", "method_samples": [3.0, 5.0, math.nan], "baseline_samples": [1.0, 1.5, 0.0]}
    assert claim_points(paired) == [2.0, 3.5]  # the non-finite pair is left out
    assert claim_points({"type": "sample", "samples": [1.0, None, math.inf, 2.0]}) == [1.0, 2.0]
    assert claim_points({"type": "deterministic"}) == []


def test_what_can_be_drawn():
    assert drawable({"type": "deterministic", "measured": 1e-12, "threshold": 1e-9})
    assert not drawable({"type": "deterministic", "measured": None, "threshold": 1e-9})
    assert not drawable({"type": "sample", "samples": [1.0], "threshold": math.nan})
    assert claims_figure([{"type": "deterministic", "measured": None, "threshold": 1.0}]) is None


def test_one_panel_per_drawable_claim_with_a_log_axis_for_tiny_errors():
    claims = [
        {"name": "tiny", "type": "deterministic", "measured": 1e-15, "threshold": 1e-10, "op": "<=", "verdict": "PASS"},
        {"name": "gain", "type": "paired", "method_samples": [2.0, 3.0, 2.5], "baseline_samples": [1.0, 1.0, 1.0],
         "low": 1.1, "high": 1.9, "measured": 1.5, "threshold": 0.0, "op": ">", "verdict": "PASS"},
        {"name": "skipped", "type": "sample", "samples": [], "threshold": None},
    ]
    fig = claims_figure(claims, title="t")
    axes = fig.axes
    assert len(axes) == 2
    assert axes[0].get_xscale() == "log" and axes[1].get_xscale() == "linear"
    left, right = axes[1].get_xlim()
    assert left <= 0.0 <= right  # the threshold is always in view
    plt.close(fig)


def test_written_reports_carry_the_claims_figure(tmp_path):
    report = Report(slug="x", title="t", size="smoke", seed=0)
    report.claim("ok", "sanity", measured=1e-12, op="<=", threshold=1e-9)
    report.finish().write(tmp_path)
    assert (tmp_path / f"{CLAIMS_PLOT}.png").read_bytes()[:4] == b"\x89PNG"
    assert f"{CLAIMS_PLOT}.png" in json.loads((tmp_path / "report.json").read_text())["plots"]
    assert f"![{CLAIMS_PLOT}]({CLAIMS_PLOT}.png)" in (tmp_path / "report.md").read_text()
    empty = Report(slug="x", title="t", size="smoke", seed=0).finish()
    empty.write(tmp_path / "none")
    assert not (tmp_path / "none" / f"{CLAIMS_PLOT}.png").exists()
