import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from rankwise.core.report import Report  # noqa: E402
from rankwise.errors import InvalidInputError  # noqa: E402


def test_failing_claim_is_reported_as_failed(tmp_path):
    report = Report(slug="demo-method", title="t", size="smoke", seed=0)
    report.claim("better", "method beats baseline", measured=12.0, op="<", threshold=10.0)
    report.claim("fine", "sanity", measured=1.0, op="<=", threshold=1.0)
    report.finish()
    assert not report.passed
    assert [c.passed for c in report.claims] == [False, True]
    report.write(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["passed"] is False and data["claims"][0]["passed"] is False
    assert "| FAIL |" in (tmp_path / "report.md").read_text()


def test_nan_or_missing_measurement_fails():
    report = Report(slug="x", title="t", size="smoke", seed=0)
    assert not report.claim("nan", "d", math.nan, ">", 0).passed
    assert not report.claim("none", "d", None, ">", 0).passed


def test_tables_plots_and_bad_input(tmp_path):
    report = Report(slug="x", title="t", size="full", seed=3)
    table = report.table("results", ["method", "ppl"])
    table.add(method="svd", ppl=20.5)
    with pytest.raises(InvalidInputError, match="no column"):
        table.add(method="care", perplexity=1.0)
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    report.plots["curve"] = fig
    report.finish().write(tmp_path)
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "| svd | 20.5 |" in (tmp_path / "report.md").read_text()
    with pytest.raises(InvalidInputError):
        Report(slug="x", title="t", size="huge", seed=0)
    with pytest.raises(InvalidInputError):
        report.claim("c", "d", 1.0, "==", 1.0)


def test_claim_from_runs_needs_three_seeds():
    """A training-dependent quantity from one lucky run is never evidence; three clearly passing seeds are."""
    from rankwise.core.evidence import ClaimKind, Verdict
    from rankwise.core.report import Report

    r = Report("plop", "t", "full", 0)
    one = r.claim_from_runs("one-run", "d", [0.5], "<", 1.0, kind=ClaimKind.PAPER)
    three = r.claim_from_runs("three-runs", "d", [0.5, 0.52, 0.49], "<", 1.0, kind=ClaimKind.PAPER)
    assert one.verdict is Verdict.INCONCLUSIVE and "seeds" in one.reason
    assert three.verdict is Verdict.PASS
    assert not r.reproduced  # one paper claim is inconclusive
