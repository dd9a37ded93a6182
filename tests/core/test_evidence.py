import json
import math

import numpy as np
import pytest

from rankwise.core.arms import select_from_scores, select_on_validation
from rankwise.core.discrimination import comparison
from rankwise.core.evidence import (
    Claim,
    ClaimKind,
    PairedClaim,
    SampleClaim,
    Verdict,
    bootstrap_mean_interval,
    interval_verdict,
)
from rankwise.core.report import PROTOCOL, SMOKE_NOTE, Report
from rankwise.errors import InvalidInputError, NumericalError

P, F, I = Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE


def _report(size="full", slug="demo"):
    return Report(slug=slug, title="t", size=size, seed=0, environment={"test": True})


# --- verdict boundaries ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("measured, op, threshold, expected", [
    (1.0, ">", 0.5, P), (0.5, ">", 0.5, F), (0.5, ">=", 0.5, P), (0.49, ">=", 0.5, F),
    (0.5, "<", 0.5, F), (0.5, "<=", 0.5, P), (0.51, "<=", 0.5, F), (0.0, "<", 0.5, P),
])
def test_deterministic_claim_boundaries(measured, op, threshold, expected):
    assert Claim("c", "d", op, threshold).measure(measured).verdict is expected


@pytest.mark.parametrize("value, reason", [(math.nan, "nan"), (math.inf, "inf"), (None, "None")])
def test_deterministic_nan_inf_none_fail_with_reason(value, reason):
    c = Claim("c", "d", "<", 1e9).measure(value)
    assert c.verdict is F and reason in c.reason and not c.passed


@pytest.mark.parametrize("low, high, op, t, expected", [
    (0.1, 1.0, ">", 0.0, P), (0.0, 1.0, ">", 0.0, I), (0.0, 1.0, ">=", 0.0, P), (-1.0, 0.0, ">", 0.0, F),
    (-1.0, 0.0, ">=", 0.0, I), (-1.0, -0.1, ">=", 0.0, F), (-1.0, 1.0, ">", 0.0, I),
    (-1.0, -0.1, "<", 0.0, P), (-1.0, 0.0, "<", 0.0, I), (-1.0, 0.0, "<=", 0.0, P), (0.0, 1.0, "<", 0.0, F),
    (0.0, 1.0, "<=", 0.0, I), (0.1, 1.0, "<=", 0.0, F), (2.0, 2.0, ">", 2.0, F), (2.0, 2.0, ">=", 2.0, P),
])
def test_interval_verdict_boundaries(low, high, op, t, expected):
    assert interval_verdict(low, high, op, t) is expected


def test_interval_verdict_rejects_bad_intervals_and_ops():
    for low, high, op in [(1.0, 0.0, ">"), (math.nan, 1.0, ">"), (0.0, 1.0, "==")]:
        with pytest.raises(InvalidInputError):
            interval_verdict(low, high, op, 0.0)


# --- paired and sample claims ---------------------------------------------------------------------------------------


def _paired(diffs, op=">", threshold=0.0, n_min=3, name="c"):
    base = np.linspace(1.0, 2.0, len(diffs))
    return PairedClaim(name, "d", op, threshold, "paper", n_min=n_min).measure(base + np.asarray(diffs), base)


def test_paired_clear_pass_clear_fail_and_straddle():
    assert _paired([1.0, 1.2, 0.9, 1.1, 1.05], ">", 0.5).verdict is P
    assert _paired([-1.0, -1.2, -0.9, -1.1, -1.05], ">", 0.0).verdict is F
    straddle = _paired([-1.0, 1.0, -0.5, 0.6, 0.1], ">", 0.0)
    assert straddle.interval.low < 0 < straddle.interval.high and straddle.verdict is I and straddle.reason is None


def test_too_few_seeds_is_inconclusive_even_when_clear():
    c = _paired([1.0, 1.1], ">", 0.0, n_min=3)
    assert c.verdict is I and "too few seeds" in c.reason
    assert _paired([1.0, 1.1, 1.2], ">", 0.0, n_min=3).verdict is P


def test_tie_at_threshold_is_never_a_superiority_pass():
    tie = _paired([0.5] * 4, ">", 0.5)
    assert (tie.interval.low, tie.interval.high) == pytest.approx((0.5, 0.5)) and tie.verdict is not P
    assert _paired([0.0] * 4, ">", 0.0).verdict is F
    # Summing then dividing gives mean([0.1] * 3) = 0.10000000000000002: a tie must not pass by rounding.
    ulp = PairedClaim("u", "d", ">", 0.1).measure([0.1] * 3, [0.0] * 3)
    assert ulp.verdict is F and ulp.measured == 0.1 and ulp.interval.low == 0.1
    # `>=` is non-inferiority within the declared margin: an interval exactly at the margin clears it.
    assert _paired([0.0] * 4, ">=", 0.0).verdict is P


def test_bootstrap_is_reproducible_and_not_trivially_exact():
    diffs = [0.3, -0.1, 0.5, 0.2, 0.05]
    a, b = _paired(diffs, name="same"), _paired(diffs, name="same")
    assert a.interval.ci_method == "BCa" and a.interval.low < a.interval.high
    assert (a.interval.low, a.interval.high) == (b.interval.low, b.interval.high)
    assert "BCa, 9999 resamples" in a.test and "paired" in a.test


def test_interval_contains_true_mean_difference_on_a_large_sample():
    rng = np.random.default_rng(123)
    base = rng.normal(5.0, 2.0, size=400)
    method = base + rng.normal(0.3, 1.0, size=400)
    c = PairedClaim("big", "d", ">", 0.0).measure(method, base)
    assert c.interval.low < 0.3 < c.interval.high
    assert c.interval.high - c.interval.low < 0.3  # narrow enough that containment means something
    assert c.verdict is P


def test_pairing_removes_a_shared_per_seed_offset():
    rng = np.random.default_rng(7)
    effect = 1.0 + 0.1 * rng.normal(size=6)
    offset = 100.0 * rng.normal(size=6)  # what each seed does to both arms alike
    with_offset = PairedClaim("p", "d", ">", 0.5).measure(offset + effect, offset)
    without = PairedClaim("p", "d", ">", 0.5).measure(effect, np.zeros(6))
    assert with_offset.interval.low == pytest.approx(without.interval.low, abs=1e-9)
    assert with_offset.interval.high == pytest.approx(without.interval.high, abs=1e-9)
    assert with_offset.interval.high - with_offset.interval.low < 0.5 and with_offset.verdict is P


def test_bca_degenerate_falls_back_to_percentile(monkeypatch):
    import scipy.stats

    real = scipy.stats.bootstrap

    def nan_bca(*args, **kwargs):
        res = real(*args, **kwargs)
        if kwargs.get("method") == "BCa":
            res.confidence_interval = type(res.confidence_interval)(math.nan, math.nan)
        return res

    monkeypatch.setattr(scipy.stats, "bootstrap", nan_bca)
    iv = bootstrap_mean_interval([0.1, 0.4, 0.2, 0.3], "k")
    assert iv.ci_method == "percentile" and iv.low < 0.25 < iv.high


def test_sample_claim_and_non_finite_seed():
    assert SampleClaim("s", "d", "<", 1.0, "sanity").measure([0.5, 0.6, 0.55]).verdict is P
    assert SampleClaim("s", "d", "<", 0.5, "sanity").measure([0.5, 0.6, 0.55]).verdict is F
    bad = PairedClaim("n", "d", ">", 0.0).measure([1.0, math.nan, 1.0], [0.0, 0.0, 0.0])
    assert bad.verdict is F and "[1]" in bad.reason


def test_bad_declarations_and_measurements_raise():
    for kwargs in [dict(op="=="), dict(threshold=math.nan), dict(kind="headline")]:
        args = dict(name="c", description="d", op=">", threshold=0.0, kind=None) | kwargs
        with pytest.raises(InvalidInputError):
            PairedClaim(**args)
    with pytest.raises(InvalidInputError, match="baseline"):
        PairedClaim("c", "d", ">", 0.0).measure([1.0, 2.0, 3.0], [1.0, 2.0])
    c = Claim("c", "d", ">", 0.0).measure(1.0)
    with pytest.raises(InvalidInputError, match="already measured"):
        c.measure(2.0)
    with pytest.raises(InvalidInputError):
        PairedClaim("c", "d", ">", 0.0, n_min=1)


# --- declaring before the run ---------------------------------------------------------------------------------------


def test_declared_but_unmeasured_is_inconclusive_not_dropped(tmp_path):
    r = _report()
    r.declare(PairedClaim("p", "d", ">", 0.0, "paper"))
    r.declare(SampleClaim("s", "d", ">", 0.0, "sanity"))
    r.declare(Claim("c", "d", ">", 0.0, "invariant"))
    assert [c.verdict for c in r.claims] == [I, I, I] and all(c.reason == "not measured" for c in r.claims)
    assert not r.reproduced
    data = json.loads((r.write(tmp_path) / "report.json").read_text())
    assert [c["verdict"] for c in data["claims"]] == ["INCONCLUSIVE"] * 3
    assert data["claims"][0]["measured"] is None and data["claims"][0]["n"] is None
    assert (tmp_path / "report.md").read_text().count("INCONCLUSIVE: not measured") == 3


def test_double_declaration_and_unknown_or_wrong_measure_raise():
    r = _report()
    r.declare(PairedClaim("p", "d", ">", 0.0, "paper"))
    with pytest.raises(InvalidInputError, match="already declared"):
        r.declare(Claim("p", "d", ">", 0.0))
    with pytest.raises(InvalidInputError, match="already declared"):
        r.claim("p", "d", 1.0, ">", 0.0)
    with pytest.raises(InvalidInputError, match="no claim"):
        r.measure("nope", 1.0)
    with pytest.raises(InvalidInputError, match="no claim"):
        r.measure_paired("nope", [1.0], [0.0])
    with pytest.raises(InvalidInputError, match="measure_paired"):
        r.measure("p", 1.0)
    r.declare(Claim("c", "d", ">", 0.0))
    with pytest.raises(InvalidInputError, match="not paired"):
        r.measure_paired("c", [1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    r.measure_paired("p", [1.0, 2.0, 3.0], [0.0, 0.5, 1.0])
    assert r.get_claim("p").verdict is P


# --- arms -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scores, chosen, edge", [
    ([0.9, 0.5, 0.1], 1e-4, "low"), ([0.1, 0.5, 0.9], 1e-2, "high"), ([0.1, 0.9, 0.5], 1e-3, None),
])
def test_selection_edge_flag(scores, chosen, edge):
    s = select_from_scores([1e-4, 1e-3, 1e-2], scores, higher_is_better=True, param="lr")
    assert s.chosen == chosen and s.edge == edge and s.on_edge is (edge is not None)
    assert (s.flag is None) is (edge is None)


def test_selection_lower_is_better_unsorted_grid_one_point_and_nan():
    calls = []
    s = select_on_validation([3, 1, 2], lambda v: calls.append(v) or abs(v - 2.2), higher_is_better=False)
    assert calls == [3, 1, 2] and s.chosen == 2 and not s.on_edge  # 2 is interior by value, last by position
    assert select_from_scores([3, 1, 2], [0.0, 1.0, 1.0], False).edge == "high"  # 3 is the largest value
    one = select_from_scores([0.1], [0.5], True)
    assert not one.tuned and not one.on_edge and "not tuned" in one.flag
    assert select_from_scores([1, 2, 3], [math.nan, 0.1, 0.2], True).chosen == 3
    assert select_from_scores([1, 2, 3], [0.2, 0.5, math.nan], True).chosen == 2
    with pytest.raises(NumericalError):
        select_from_scores([1, 2], [math.nan, math.nan], True)
    with pytest.raises(InvalidInputError):
        select_from_scores([], [], True)
    with pytest.raises(InvalidInputError):
        select_from_scores([1, 2], [0.1], True)


def test_arms_table_flags_edges_and_budget_mismatch(tmp_path):
    r = _report()
    r.record_arm("method", select_from_scores([1, 2, 3], [0.1, 0.9, 0.5], True, "lr"), {"params": 100, "steps": 50})
    r.record_arm("lora", select_from_scores([1, 2, 3], [0.1, 0.5, 0.9], True, "lr"), {"params": 104, "steps": 50})
    r.record_arm("fixed", select_from_scores([2], [0.4], True, "lr"), {"params": 100, "steps": 50})
    assert r.check_budgets_matched(["params", "steps"]) == {"params": False, "steps": True}
    assert r.check_budgets_matched(["params"], rel_tol=0.05) == {"params": True}
    with pytest.raises(InvalidInputError):
        r.record_arm("lora", select_from_scores([1], [0.1], True), {})
    with pytest.raises(InvalidInputError):
        r.record_arm("x", select_from_scores([1], [0.1], True), {"steps": "many"})
    r.write(tmp_path)
    md = (tmp_path / "report.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ") and "lr =" in line}
    assert "FLAG" not in rows["method"] and "high edge" in rows["lora"] and "not tuned" in rows["fixed"]
    assert "Budget `params` matched across arms (rel_tol 0): **NO**" in md
    data = json.loads((tmp_path / "report.json").read_text())
    assert [a["on_edge"] for a in data["arms"]] == [False, True, False]
    assert data["arms"][1]["budget"] == {"params": 104, "steps": 50} and data["arms"][1]["grid"] == [1, 2, 3]
    assert data["budget_checks"][0]["matched"] == {"params": False, "steps": True}


# --- reproduced, exit codes, smoke ----------------------------------------------------------------------------------


def _mixed(size, paper_values):
    r = _report(size)
    for i, v in enumerate(paper_values):
        r.claim(f"paper{i}", "d", v, ">", 0.0, kind=ClaimKind.PAPER, discriminates=comparison("baseline"))
    r.claim("inv", "d", -1.0, ">", 0.0, kind="invariant")
    r.claim("san", "d", -1.0, ">", 0.0, kind="sanity")
    r.claim("old", "d", -1.0, ">", 0.0)
    return r


def test_reproduced_needs_full_and_every_paper_claim_pass_and_ignores_other_kinds():
    r = _mixed("full", [1.0, 2.0])
    assert r.reproduced and not r.passed and r.exit_code() == 1
    assert r.verdict_counts() == {"paper": {"PASS": 2, "FAIL": 0, "INCONCLUSIVE": 0},
                                  "invariant": {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 0},
                                  "sanity": {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 0},
                                  "unclassified": {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 0}}
    assert not _mixed("full", [1.0, -1.0]).reproduced
    assert not _mixed("smoke", [1.0]).reproduced
    no_paper = _report()
    no_paper.claim("inv", "d", 1.0, ">", 0.0, kind="invariant")
    no_paper.claim("old", "d", 1.0, ">", 0.0)
    assert no_paper.passed and not no_paper.reproduced
    pending = _mixed("full", [1.0])
    pending.declare(PairedClaim("later", "d", ">", 0.0, "paper"))
    assert not pending.reproduced


def test_smoke_exit_code_zero_with_failing_claims_and_says_so(tmp_path):
    smoke = _mixed("smoke", [-1.0])
    assert smoke.exit_code() == 0 and _mixed("full", [-1.0]).exit_code() == 1
    inconclusive = _report()
    inconclusive.declare(Claim("c", "d", ">", 0.0, "paper"))
    assert inconclusive.exit_code() == 0
    smoke.write(tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["note_smoke"] == SMOKE_NOTE
    assert SMOKE_NOTE in (tmp_path / "report.md").read_text().split("## Claims")[0]
    assert _report("full").to_dict()["note_smoke"] is None


def test_json_round_trip_fields(tmp_path):
    r = _report()
    r.declare(PairedClaim("p", "method beats baseline", ">", 0.1, "paper", n_min=3))
    r.measure_paired("p", [1.5, 1.7, 1.6, 1.65], [1.0, 1.1, 1.05, 1.0])
    r.claim("c", "exact", 0.0, "<=", 0.0, kind="invariant")
    r.finish().write(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["protocol"] == PROTOCOL == 3 and data["reproduced"] is True and data["passed"] is True
    assert data["verdicts"]["paper"] == {"PASS": 1, "FAIL": 0, "INCONCLUSIVE": 0}
    p, c = data["claims"]
    c0 = r.claims[0]
    assert p["kind"] == "paper" and p["type"] == "paired" and p["verdict"] == "PASS" and p["passed"] is True
    assert p["measured"] == pytest.approx(0.575) and p["n"] == 4 and p["op"] == ">" and p["threshold"] == 0.1
    assert (p["low"], p["high"]) == (c0.interval.low, c0.interval.high) and p["low"] > 0.1
    assert p["samples"] == pytest.approx([0.5, 0.6, 0.55, 0.65]) and p["baseline_samples"] == [1.0, 1.1, 1.05, 1.0]
    assert p["test"] == "paired bootstrap 95% CI of mean(method - baseline), BCa, 9999 resamples"
    assert c["kind"] == "invariant" and c["type"] == "deterministic" and c["measured"] == 0.0 and "low" not in c
    md = (tmp_path / "report.md").read_text()
    assert "### Paper claims" in md and "### Invariants (hold by construction; checks, not evidence)" in md
    assert "(n=4 seeds)" in md and f"[{p['low']:.4g}, {p['high']:.4g}]" in md


# --- history --------------------------------------------------------------------------------------------------------


def _versioned(threshold, measured=1.0, extra=True, size="full"):
    r = _report(size)
    r.claim("gain", "method minus baseline", measured, ">", threshold, kind="paper")
    if extra:
        r.claim("inv", "exact", 0.0, "<=", 0.0, kind="invariant")
    return r


def test_history_records_changes_and_is_kept_across_writes(tmp_path):
    # smoke reports (development runs) may change a claim's definition; full ones refuse it (test_discrimination)
    _versioned(0.1, size="smoke").write(tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["history"] == []
    _versioned(0.2, size="smoke").write(tmp_path)
    h = json.loads((tmp_path / "report.json").read_text())["history"]
    assert len(h) == 1 and h[0]["claim"] == "gain" and h[0]["when"].endswith("+00:00")
    assert h[0]["before"]["threshold"] == 0.1 and h[0]["after"]["threshold"] == 0.2
    _versioned(0.2, size="smoke").write(tmp_path)  # nothing changed: nothing appended
    assert len(json.loads((tmp_path / "report.json").read_text())["history"]) == 1
    _versioned(0.2, measured=0.0, extra=False, size="smoke").write(tmp_path)  # verdict changes, a claim disappears
    h = json.loads((tmp_path / "report.json").read_text())["history"]
    assert len(h) == 3 and h[0]["before"]["threshold"] == 0.1
    assert h[1]["claim"] == "gain" and (h[1]["before"]["verdict"], h[1]["after"]["verdict"]) == ("PASS", "FAIL")
    assert h[2]["claim"] == "inv" and h[2]["after"] is None
    assert "## Claim history" in (tmp_path / "report.md").read_text()
    _versioned(0.3, size="full").write(tmp_path)  # another size is another report: no history carried
    assert json.loads((tmp_path / "report.json").read_text())["history"] == []


def test_corrupt_previous_report_restarts_history_with_a_note(tmp_path):
    (tmp_path / "report.json").write_text('{"protocol": 2, "slug": "demo", "hist')
    r = _versioned(0.1)
    r.write(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["history"] == [] and "previous report.json unreadable: history restarted" in data["notes"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_claim_over_evaluation_units_says_so_instead_of_seeds():
    from rankwise.core.evidence import PairedClaim
    from rankwise.core.report import Report

    report = Report("unit-test", "units", "smoke", 0)
    report.declare(PairedClaim("per-window", "per-window NLL difference", ">", 0.0, unit="windows"))
    report.measure_paired("per-window", [1.0, 2.0, 3.0, 4.0], [0.0, 0.5, 1.0, 1.5])
    assert report.get_claim("per-window").to_dict()["unit"] == "windows"
    assert "n=4 windows" in report.to_markdown() and "seeds" not in report.to_markdown().split("per-window NLL")[1].split("\n")[0]


# --- a claim withheld because a premise of its testbed failed -------------------------------------------------------
def test_withheld_claim_is_inconclusive_keeps_its_numbers_and_cannot_make_reproduced():
    r = Report("m", "t", "full", 0)
    c = r.declare(PairedClaim("gap", "method - baseline", ">", 0.0, kind=ClaimKind.PAPER))
    r.measure_paired("gap", [2.0, 2.1, 1.9, 2.2, 2.0], [0.0, 0.1, 0.0, 0.1, 0.0])
    assert c.verdict is Verdict.PASS and r.reproduced
    c.withhold("80% of the units are dead")
    assert c.verdict is Verdict.INCONCLUSIVE and not r.reproduced
    assert "80% of the units are dead" in c.reason and "the test alone: PASS" in c.reason
    d = c.to_dict()
    assert d["verdict"] == "INCONCLUSIVE" and d["low"] > 0 and d["method_samples"][0] == 2.0
    with pytest.raises(InvalidInputError, match="reason"):
        c.withhold("")


def test_withholding_an_unmeasured_claim_leaves_it_not_measured():
    c = Claim("x", "d", "<", 1.0, kind=ClaimKind.PAPER).withhold("premise failed")
    assert c.verdict is Verdict.INCONCLUSIVE and c.reason == "not measured"
