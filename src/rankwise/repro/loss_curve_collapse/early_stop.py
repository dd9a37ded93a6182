"""Reproduction `loss-curve-collapse:early-stop`: a run's final loss, predicted from its first 30% aligned to the
collapsed curve of a smaller model, ranks an LR sweep when tau is held fixed, and not when lambda is (the paper's
second application: with lambda fixed tau varies across the sweep and between the small and the big model).

The main experiment's family, schedule and TPP (see `main`): 5 peak LRs at width 32 (the big model), with tau fixed
(lambda = 1 / (eta tau T)) and with lambda fixed (the tau arm's lambda at the middle LR, so tau spans 16x over the
sweep, and the width-16 reference of a configuration has twice the big run's tau). Each arm's LR is chosen on the
held-out eval loss. Per configuration, l_ref = the normalised curve of a width-16 run of the same rule and value;
the big run's final (smoothed training) loss is predicted by the divisor fitted on its first 30%; Spearman and
regret against the true finals, per seed.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import ClaimKind, PairedClaim, SampleClaim
from rankwise.core.report import Report
from rankwise.errors import InvalidInputError
from rankwise.repro.loss_curve_collapse import analysis as A
from rankwise.repro.loss_curve_collapse import plots
from rankwise.repro.loss_curve_collapse.common import (SLUG, Runner, Testbed, declare_checks, lr_sweep, measure_checks,
                                                       schedule_note)
from rankwise.repro.loss_curve_collapse.family import RunSpec
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    bed: Testbed
    width: int  # the big model of the sweep
    ref_width: int  # the small model whose normalised curve is each configuration's l_ref
    tpp: float
    tau: float
    lr_grid: tuple[float, ...]
    seeds: int
    early_fraction: float

    def __post_init__(self) -> None:
        if not self.ref_width < self.width:
            raise InvalidInputError(f"the reference model must be smaller than the big one, got ref_width "
                                    f"{self.ref_width} >= width {self.width}")
        if not 0 < self.early_fraction < 1 or len(self.lr_grid) < 3:
            raise InvalidInputError("need a prefix fraction in (0, 1) and >= 3 LRs to rank, got "
                                    f"{self.early_fraction}, {self.lr_grid}")


# Full-size cost (measured as in `main`: 1 thread, ~2/3 of a busy core): a width-32 run at TPP 10 (643 steps) ~22 s,
# its width-16 reference (162 steps) ~5 s; 2 arms x 5 LRs x 5 seeds x 27 s = 1350 s; determinism rerun 5 s.
# ~1360 s (~23 min), ~15 min on an idle core. 5 seeds, not 3: the tau-vs-lambda Spearman difference of the earlier
# design (+0.07 [-0.2, 0.23]) was below its seed-to-seed spread.
SIZES = BySize(
    smoke=Settings(bed=Testbed(batch_size=4, seq_len=32, eval_windows=4, window=0.05), width=32, ref_width=16,
                   tpp=0.25, tau=0.2, lr_grid=(0.005, 0.01, 0.02), seeds=2, early_fraction=0.3),
    full=Settings(bed=Testbed(batch_size=8, seq_len=64, eval_windows=64, window=0.03), width=32, ref_width=16,
                  tpp=10.0, tau=0.2, lr_grid=(0.0025, 0.005, 0.01, 0.02, 0.04), seeds=5, early_fraction=0.3),
)
RANK_MIN = 0.6
REGRET_MAX = 0.01
LAMBDA_ARM = "lambda fixed"


def _declare(report: Report, s: Settings) -> None:
    P = ClaimKind.PAPER
    bed = s.bed.describe((s.ref_width, s.width), s.tpp, s.tau)
    report.declare(SampleClaim("early_rank_tau_fixed_d2z", f"per seed: Spearman between the final loss predicted from "
                               f"the first {s.early_fraction:.0%} and the true final over the {len(s.lr_grid)}-LR "
                               f"sweep at width {s.width}, tau fixed", ">", RANK_MIN, kind=P,
                               discriminates=control(LAMBDA_ARM), testbed=bed, post_hoc=True))
    report.declare(PairedClaim("early_rank_tau_vs_lambda_d2z", "per seed: Spearman with tau fixed minus with lambda "
                               "fixed", ">", 0.0, kind=P, discriminates=comparison(LAMBDA_ARM), testbed=bed,
                               post_hoc=True))
    report.declare(SampleClaim("early_pick_regret_tau_fixed_d2z", "per seed: relative final-loss regret of the LR "
                               "picked from the prefix against the best true final, tau fixed", "<=", REGRET_MAX,
                               kind=P, discriminates=control(LAMBDA_ARM), testbed=bed, post_hoc=True))
    declare_checks(report, bed)


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report(SLUG, "Early stopping in an LR sweep from the collapsed curve: tau fixed vs lambda fixed", size,
                    seed)
    _declare(report, s)
    run_ = Runner(s.bed)
    mid = s.lr_grid[len(s.lr_grid) // 2]
    lam = run_.fixed_lambda(s.tau, mid, s.width, s.tpp)
    arms = {"tau fixed": ("tau", s.tau), LAMBDA_ARM: ("lambda", lam)}
    early = {}
    for arm, (rule, value) in arms.items():
        sel, big = lr_sweep(run_, s.width, s.tpp, s.lr_grid, rule, value, s.seeds, seed, f"LR sweep, {arm}")
        _, small = lr_sweep(run_, s.ref_width, s.tpp, s.lr_grid, rule, value, s.seeds, seed, f"references, {arm}")
        report.record_arm(f"LR sweep, {arm}", sel, budget={"steps": run_.steps(s.width, s.tpp), "runs_per_lr": s.seeds})
        early[arm] = [A.early_stop(b, sm, s.bed.window, s.early_fraction) for b, sm in zip(big, small)]
    report.check_budgets_matched(["steps", "runs_per_lr"])

    tau_rho, lam_rho = [e.spearman for e in early["tau fixed"]], [e.spearman for e in early[LAMBDA_ARM]]
    report.measure("early_rank_tau_fixed_d2z", tau_rho)
    report.get_claim("early_rank_tau_fixed_d2z").measure_control(lam_rho)
    report.measure_paired("early_rank_tau_vs_lambda_d2z", tau_rho, lam_rho)
    report.measure("early_pick_regret_tau_fixed_d2z", [e.regret for e in early["tau fixed"]])
    report.get_claim("early_pick_regret_tau_fixed_d2z").measure_control([e.regret for e in early[LAMBDA_ARM]])
    measure_checks(report, run_, run_.memo[RunSpec(s.ref_width, s.tpp, s.lr_grid[0], "tau", s.tau, seed)])

    t = report.table(f"Early stopping at {s.early_fraction:.0%} (per seed)", ["arm", "seed", "spearman", "regret",
                                                                              "mean_abs_rel_error"])
    for arm, es in early.items():
        for i, e in enumerate(es):
            t.add(arm=arm, seed=i, spearman=e.spearman, regret=e.regret, mean_abs_rel_error=e.abs_rel_error)
    t = report.table(f"Hidden-matrix tau over the sweep (width {s.width} / reference width {s.ref_width})",
                     ["arm", "lr", "tau_big", "tau_reference"])
    for arm, (rule, value) in arms.items():
        for lr in s.lr_grid:
            big, ref = (run_.memo[RunSpec(w, s.tpp, lr, rule, value, seed)] for w in (s.width, s.ref_width))
            t.add(arm=arm, lr=lr, tau_big=big.hidden_tau, tau_reference=ref.hidden_tau)
    report.plots["early_stopping"] = plots.plot_early(early, s.lr_grid)
    report.note(f"Training runs: {len(run_.memo) + 1}. lambda-fixed arm: lambda = {lam:.4g} (tau = {s.tau} at the "
                f"middle LR {mid:g}, width {s.width}).")
    schedule_note(report)
    return report.finish()
