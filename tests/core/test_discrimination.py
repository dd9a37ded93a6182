"""Claims that discriminate (issue 24, section 1): a paper claim counts only if the baseline or a control could have
failed it, and a verdict binds its claim's definition."""

import json

import pytest

from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import Claim, PairedClaim, SampleClaim
from rankwise.core.report import Report
from rankwise.errors import InvalidInputError


def _full() -> Report:
    return Report("demo", "t", "full", 0, environment={"test": True})


def test_an_undeclared_paper_claim_cannot_make_a_method_reproduced():
    r = _full()
    r.claim("gain", "d", 1.0, ">", 0.0, kind="paper")
    assert r.claims[0].verdict.value == "PASS" and not r.reproduced
    assert r.to_dict()["claims"][0]["discrimination"]["status"] == "undeclared"
    ok = _full()
    ok.claim("gain", "d", 1.0, ">", 0.0, kind="paper", discriminates=comparison("lora"))
    assert ok.reproduced


def test_a_claim_its_control_passes_too_is_not_discriminating():
    def run(control_value):
        r = _full()
        r.claim("purity", "best unit's purity >= 0.8", 0.9, ">=", 0.8, kind="paper", discriminates=control("dense heads"))
        if control_value is not None:
            r.get_claim("purity").measure_control(control_value)  # the same test on the control arm
        return r

    unmeasured, passes, fails = run(None), run(0.85), run(0.5)
    assert [x.get_claim("purity").discrimination_status for x in (unmeasured, passes, fails)] == [
        "control not measured", "not discriminating (the control passes too)", "discriminates"]
    assert [x.reproduced for x in (unmeasured, passes, fails)] == [False, False, True]
    d = passes.to_dict()["claims"][0]["discrimination"]
    assert d == {"how": "control", "arm": "dense heads", "status": "not discriminating (the control passes too)",
                 "control_verdict": "PASS", "control_measured": 0.85}
    assert "**not discriminating (the control passes too)**" in passes.to_markdown()


def test_a_stochastic_control_is_judged_by_the_same_interval_test():
    c = SampleClaim("coverage", "d", ">=", 0.9, "paper", discriminates=control("bootstrap"))
    c.measure([0.95, 0.96, 0.94, 0.95, 0.97])
    c.measure_control([0.91, 0.93, 0.92, 0.94, 0.92])  # the baseline passes the same bar: not evidence
    assert c.discrimination_status.startswith("not discriminating")
    p = PairedClaim("beats", "d", ">", 0.0, "paper", discriminates=control("head only"))
    p.measure([1.0, 1.1, 1.2], [0.5, 0.5, 0.6])
    p.measure_control([0.4, 0.5, 0.5], [0.5, 0.5, 0.6])  # the head-only arm does not beat the baseline
    assert p.discrimination_status == "discriminates"


def test_a_paired_claim_is_a_comparison_with_its_baseline_unless_it_says_otherwise():
    p = PairedClaim("beats", "d", ">", 0.0, "paper")
    p.measure([1.0, 1.1, 1.2], [0.5, 0.5, 0.6])
    assert p.discrimination_status == "discriminates"
    assert p.to_dict()["discrimination"]["how"] == "comparison"


def test_declaring_discrimination_is_for_paper_claims_and_controls_for_control_claims():
    with pytest.raises(InvalidInputError, match="only paper claims"):
        Claim("x", "d", ">", 0.0, "invariant", discriminates=comparison("b"))
    with pytest.raises(InvalidInputError, match="declares no control"):
        Claim("x", "d", ">", 0.0, "paper", discriminates=comparison("b")).measure_control(1.0)
    with pytest.raises(InvalidInputError, match="comparison\\(arm\\) or"):
        Claim("x", "d", ">", 0.0, "paper", discriminates="baseline")


def test_a_verdict_binds_its_claims_definition_and_a_replacement_is_post_hoc(tmp_path):
    first = _full()
    first.claim("gain", "d", -1.0, ">", 0.0, kind="paper", discriminates=comparison("lora"), testbed="minilm")
    first.write(tmp_path)
    for changed in ({"testbed": "smollm2"}, {"discriminates": comparison("ia3")}):
        again = _full()
        again.claim("gain", "d", 1.0, ">", 0.0, kind="paper", **{"discriminates": comparison("lora"), "testbed": "minilm", **changed})
        with pytest.raises(InvalidInputError, match="cannot change after its verdict"):
            again.write(tmp_path)
    threshold = _full()
    threshold.claim("gain", "d", 1.0, ">", -5.0, kind="paper", discriminates=comparison("lora"), testbed="minilm")
    with pytest.raises(InvalidInputError, match="new name with post_hoc=True"):
        threshold.write(tmp_path)
    # the redesign under a new, post-hoc name: written, and the earlier FAIL stays and still counts
    redo = _full()
    redo.claim("gain_smollm2", "d", 1.0, ">", 0.0, kind="paper", discriminates=comparison("lora"), testbed="smollm2",
               post_hoc=True)
    redo.write(tmp_path)
    data = json.loads((tmp_path / "report.json").read_text())
    assert [r["name"] for r in data["retired"]] == ["gain"] and data["retired"][0]["verdict"] == "FAIL"
    assert data["reproduced"] is False and redo.claims[0].verdict.value == "PASS"
    md = (tmp_path / "report.md").read_text()
    assert "*(post hoc)*" in md and "Retired claims" in md
    again = _full()  # the retired claim is carried on by later runs too
    again.claim("gain_smollm2", "d", 1.0, ">", 0.0, kind="paper", discriminates=comparison("lora"), testbed="smollm2",
                post_hoc=True)
    again.write(tmp_path)
    assert [r["name"] for r in json.loads((tmp_path / "report.json").read_text())["retired"]] == ["gain"]


def test_a_verdict_hidden_by_a_protocol_2_redefinition_is_recalled_and_counts(tmp_path):
    # A protocol-2 report: the claim FAILed on one testbed, then the same name PASSed on another (only the description
    # changed, which protocol 2 did not fingerprint); its history holds the FAIL.
    hidden = {"claim": "gain", "when": "2026-12-01T14:24:54+00:00", "after": {"kind": "paper", "verdict": "PASS"},
              "before": {"kind": "paper", "type": "deterministic", "op": ">", "threshold": 0.0, "verdict": "FAIL",
                         "description": "accuracy on minilm"}}
    old = {"protocol": 2, "slug": "demo", "size": "full", "history": [hidden], "retired": [],
           "claims": [{"name": "gain", "kind": "paper", "type": "deterministic", "op": ">", "threshold": 0.0,
                       "verdict": "PASS", "reason": None}]}
    (tmp_path / "report.json").write_text(json.dumps(old))

    def rerun(recall: bool) -> dict:
        r = _full()
        r.claim("gain_smollm2", "d", 1.0, ">", 0.0, kind="paper", discriminates=comparison("lora"), post_hoc=True)
        if recall:
            r.recall_hidden_verdict("gain", "the minilm testbed")
        r.write(tmp_path)
        return json.loads((tmp_path / "report.json").read_text())

    data = rerun(recall=True)
    recalled = [x for x in data["retired"] if x["name"].startswith("gain (until")]
    assert len(recalled) == 1 and recalled[0]["verdict"] == "FAIL" and recalled[0]["reason"] == "the minilm testbed"
    assert data["reproduced"] is False  # without the recall, the retired PASS alone would have let it count
    assert sorted(x["name"] for x in rerun(recall=True)["retired"]) == sorted(x["name"] for x in data["retired"])
    with pytest.raises(InvalidInputError, match="reason"):
        _full().recall_hidden_verdict("gain", "")


def test_a_report_without_the_recall_lets_the_retired_pass_alone_decide(tmp_path):
    old = {"protocol": 2, "slug": "demo", "size": "full", "history": [], "retired": [],
           "claims": [{"name": "gain", "kind": "paper", "type": "deterministic", "op": ">", "threshold": 0.0,
                       "verdict": "PASS", "reason": None}]}
    (tmp_path / "report.json").write_text(json.dumps(old))
    r = _full()
    r.claim("gain_smollm2", "d", 1.0, ">", 0.0, kind="paper", discriminates=comparison("lora"), post_hoc=True)
    r.recall_hidden_verdict("gain", "nothing hidden: no FAIL in the history")
    r.write(tmp_path)
    assert r.reproduced and [x["name"] for x in r.retired] == ["gain"]


def test_the_same_definition_may_be_rerun_and_a_smoke_report_may_change():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for value in (-1.0, 1.0):  # a rerun of the same claim: its verdict may change, its definition may not
            r = _full()
            r.claim("gain", "d", value, ">", 0.0, kind="paper", discriminates=comparison("lora"))
            r.write(d)
        smoke = Report("demo", "t", "smoke", 0, environment={"test": True})
        smoke.claim("gain", "d", 1.0, ">", 0.0, kind="paper", discriminates=comparison("lora"))
        smoke.write(d + "/smoke")
        other = Report("demo", "t", "smoke", 0, environment={"test": True})
        other.claim("gain", "d", 1.0, ">", 0.5, kind="paper", discriminates=comparison("lora"))
        other.write(d + "/smoke")  # development runs: no refusal


def test_a_stochastic_paper_claim_states_the_smallest_effect_it_could_detect():
    r = _full()
    r.declare(PairedClaim("beats", "d", ">", 0.0, "paper"))
    r.measure_paired("beats", [1.0, 1.2, 0.9, 1.1, 1.0], [0.5, 0.6, 0.5, 0.7, 0.6])
    assert "smallest effect this interval could detect: ±" in r.to_markdown()


def test_a_component_tuned_off_is_read_as_adding_nothing_measurable():
    from rankwise.core.arms import select_from_scores

    r = _full()
    r.record_arm("peso", select_from_scores([0.0, 0.5, 2.0], [0.9, 0.8, 0.7], higher_is_better=True, param="lam"),
                 {"steps": 10}, off=0.0)
    r.record_arm("peso-b", select_from_scores([0.0, 0.5, 2.0], [0.7, 0.9, 0.8], higher_is_better=True, param="lam"),
                 {"steps": 10}, off=0.0)
    readings = [n for n in r.notes if n.startswith("Reading")]
    assert len(readings) == 1 and "'peso'" in readings[0] and "lam = 0" in readings[0] and "adds nothing measurable" in readings[0]


def test_a_control_without_a_finite_value_is_not_counted_as_failing():
    c = SampleClaim("gap", "d", ">=", 1.0, "paper", discriminates=control("deep linear"))
    c.measure([1.5, 1.6, 1.4])
    c.measure_control([float("inf"), 2.0, 3.0])  # an infinite ratio "fails" the bar only by having no value
    assert c.discrimination_status == "control not judged (no finite measurement)"
    r = _full()
    r.declare(c)
    assert not r.reproduced
