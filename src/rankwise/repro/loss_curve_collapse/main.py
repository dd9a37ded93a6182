"""Reproduction `loss-curve-collapse`: normalised loss curves of a muP family collapse when tokens-per-parameter,
the schedule and the AdamW timescale tau are shared; the residual from collapse detects injected faults; a prefix
aligned to the collapsed curve ranks a learning-rate sweep when tau is held fixed.

Card loss-curve-collapse.md at CPU scale (see `family` for the models): byte-level 2-layer Llamas of widths
{32, 48, 64} on the wiki corpus, batch 32 x 64 tokens, TPP 10, 5% warmup then cosine to zero, AdamW (0.9, 0.95).

1. LR sweep (the validation tuning and the early-stopping experiment): 5 peak LRs at width 48 (TPP 5), with tau
   fixed (lambda = 1 / (eta tau T)) and with lambda fixed (the tau-arm's lambda at the middle LR); each arm's LR is
   chosen on the held-out eval loss. Each big run's final loss is predicted from its first 30% aligned to the
   normalised curve of a width-32 run of the same configuration; Spearman against the true finals.
2. Families at the tau arm's LR: (a) tau = 0.2 for every width, (b) lambda fixed (tau's lambda at width 48),
   (c) tau = 0.2 with mixed TPP. Spread: mean over t_hat in [0.2, 1] of the across-width std of l(t_hat).
3. Faults on the largest width (a 3x LR spike for 2% of training, a stuck data loader for 5%, both at t_hat = 0.5):
   reference l_ref = the mean normalised curve of the smaller widths of (a); the divisor fitted on t_hat in
   (0.1, 0.4]; alarm when |rho| > 3 x the small runs' largest across-run std of l on t_hat >= 0.4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rankwise.core.arms import select_from_scores
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.data import token_windows
from rankwise.data.compact_vocab import byte_tokenizer
from rankwise.recipes.loss_curve_collapse import weight_decay_for_timescale
from rankwise.repro.loss_curve_collapse import analysis as A
from rankwise.repro.loss_curve_collapse import plots
from rankwise.repro.loss_curve_collapse.family import BASE_WIDTH, RunResult, RunSpec, run_one, steps_for
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    widths: tuple[int, ...]  # the family; the last one is the "large" run of the fault experiment
    tpp: float
    mixed_tpp: tuple[float, ...]  # one per width, for family (c)
    batch_size: int
    seq_len: int
    tau: float
    lr_grid: tuple[float, ...]
    sweep_width: int
    sweep_ref_width: int
    sweep_tpp: float
    seeds: int
    extra_clean_seeds: int  # more clean large runs for the false-alarm rate
    eval_windows: int
    window: float  # EMA time constant in t_hat
    fault_at: float
    spike_len: float
    stuck_len: float
    spike: float
    early_fraction: float


SIZES = BySize(
    smoke=Settings(widths=(16, 32), tpp=0.25, mixed_tpp=(0.5, 0.25), batch_size=4, seq_len=32, tau=0.2,
                   lr_grid=(0.005, 0.02), sweep_width=32, sweep_ref_width=16, sweep_tpp=0.25, seeds=2,
                   extra_clean_seeds=0, eval_windows=4, window=0.05, fault_at=0.5, spike_len=0.05, stuck_len=0.1,
                   spike=3.0, early_fraction=0.3),
    full=Settings(widths=(32, 48, 64), tpp=10.0, mixed_tpp=(20.0, 5.0, 10.0), batch_size=32, seq_len=64, tau=0.2,
                  lr_grid=(0.0025, 0.005, 0.01, 0.02, 0.04), sweep_width=48, sweep_ref_width=32, sweep_tpp=5.0,
                  seeds=3, extra_clean_seeds=2, eval_windows=64, window=0.03, fault_at=0.5, spike_len=0.02,
                  stuck_len=0.05, spike=3.0, early_fraction=0.3),
)
SPREAD_LO = 0.2  # the card's spread window t_hat in [0.2, 1]
FIT = (0.1, 0.4)  # the detector's divisor is fitted here, before the faults
MONITOR_LO = 0.4
BAND_FACTOR = 3.0
DETECT_WITHIN = 0.1  # a detection counts if the alarm comes within 0.1 of training after the injection
RANK_MIN = 0.6
REGRET_MAX = 0.01
DETECT_MIN = 0.8
FALSE_ALARM_MAX = 0.2
FAULTS = ("lr_spike", "stuck_data")


def _declare(report: Report, s: Settings) -> None:
    P, I, S = ClaimKind.PAPER, ClaimKind.INVARIANT, ClaimKind.SANITY
    report.declare(PairedClaim("collapse_tau_fixed_vs_lambda_fixed", "collapse spread with lambda fixed minus with tau "
                               f"fixed (tau = {s.tau}), widths {list(s.widths)}, paired by seed", ">", 0.0, kind=P))
    report.declare(PairedClaim("collapse_tau_fixed_vs_mixed_tpp", f"collapse spread with mixed TPP {list(s.mixed_tpp)} "
                               f"minus with shared TPP {s.tpp} (both tau fixed), paired by seed", ">", 0.0, kind=P))
    report.declare(SampleClaim("fault_detected", f"per faulted run ({', '.join(FAULTS)} at t_hat = {s.fault_at}, width "
                               f"{s.widths[-1]}): 1 if |rho| crosses the band within {DETECT_WITHIN} after the "
                               "injection (and not before it), else 0", ">=", DETECT_MIN, kind=P))
    report.declare(SampleClaim("false_alarm_rate", f"per clean run of width {s.widths[-1]}: 1 if |rho| crosses the "
                               f"band anywhere in t_hat [{MONITOR_LO}, 1], else 0", "<=", FALSE_ALARM_MAX, kind=P))
    report.declare(SampleClaim("residual_alarm_before_raw", "per faulted run: t_hat of the raw-loss alarm (a rise "
                               "above its running minimum by the band; 1 if never) minus t_hat of the residual alarm",
                               ">", 0.0, kind=P))
    report.declare(SampleClaim("early_rank_tau_fixed", f"per seed: Spearman between the final loss predicted from the "
                               f"first {s.early_fraction:.0%} and the true final over the {len(s.lr_grid)}-LR sweep, tau "
                               "fixed", ">", RANK_MIN, kind=P))
    report.declare(PairedClaim("early_rank_tau_vs_lambda", "per seed: Spearman with tau fixed minus with lambda "
                               "fixed", ">", 0.0, kind=P))
    report.declare(SampleClaim("early_pick_regret_tau_fixed", "per seed: relative final-loss regret of the LR picked "
                               "from the prefix against the best true final, tau fixed", "<=", REGRET_MAX, kind=P))
    report.declare(Claim("normalised_curve_ends_at_one", "max over runs of |l(1) - 1|", "<=", 1e-12, kind=I))
    report.declare(Claim("timescale_as_declared", "max over tau-fixed runs and decayed groups of |B / (eta_g lambda_g "
                         "D) / tau - 1| from the optimizer's own settings", "<=", 1e-9, kind=I))
    report.declare(Claim("same_seed_same_curve", "max |loss difference| between two runs of one configuration and "
                         "seed", "<=", 0.0, kind=I))
    report.declare(Claim("single_epoch", "max over runs of training tokens / tokens in the train split", "<=", 1.0,
                         kind=S))
    report.declare(Claim("loss_still_falling", "clean runs whose smoothed loss at t_hat = 1 is not below its value at "
                         "t_hat = 0.9", "<=", 0, kind=S))


class Runner:
    """Runs (and memoises) training runs of the family on shared windows."""

    def __init__(self, s: Settings) -> None:
        tok = byte_tokenizer()
        self.s = s
        self.train = token_windows(tok, "train", s.seq_len)
        self.eval = token_windows(tok, "eval", s.seq_len, s.eval_windows)
        self.memo: dict[RunSpec, RunResult] = {}

    def __call__(self, spec: RunSpec) -> RunResult:
        if spec not in self.memo:
            s = self.s
            length = s.spike_len if spec.fault == "lr_spike" else s.stuck_len
            self.memo[spec] = run_one(spec, self.train, self.eval, s.batch_size, s.fault_at, length, s.spike)
        return self.memo[spec]

    def steps(self, width: int, tpp: float) -> int:
        return steps_for(width, tpp, self.s.batch_size * self.s.seq_len)[0]

    def fixed_lambda(self, lr: float, width: int, tpp: float) -> float:
        """The lambda that gives tau at (lr, width, tpp): the lambda-fixed arm's constant."""
        return weight_decay_for_timescale(self.s.tau, lr * BASE_WIDTH / width, self.steps(width, tpp))


def _sweep(report: Report, s: Settings, run: Runner, seed: int):
    """The LR sweep: validation choice of each arm's LR, and the early-stopping ranking per seed."""
    mid = s.lr_grid[len(s.lr_grid) // 2]
    lam = run.fixed_lambda(mid, s.sweep_width, s.sweep_tpp)
    arms = {"tau": ("tau", s.tau), "lambda": ("lambda", lam)}
    chosen, early = {}, {}
    for arm, (rule, value) in arms.items():
        early[arm] = []
        finals = np.zeros((s.seeds, len(s.lr_grid)))
        for i in range(s.seeds):
            say(f"LR sweep, {arm} fixed, seed {i + 1}/{s.seeds}")
            big = [run(RunSpec(s.sweep_width, s.sweep_tpp, lr, rule, value, seed + i)) for lr in s.lr_grid]
            small = [run(RunSpec(s.sweep_ref_width, s.sweep_tpp, lr, rule, value, seed + i)) for lr in s.lr_grid]
            finals[i] = [b.eval_loss for b in big]
            early[arm].append(A.early_stop(big, small, s.window, s.early_fraction))
        sel = select_from_scores(s.lr_grid, finals.mean(0).tolist(), higher_is_better=False, param="lr")
        steps = run.steps(s.sweep_width, s.sweep_tpp)
        report.record_arm(f"LR sweep, {arm} fixed", sel, budget={"steps": steps, "runs_per_lr": s.seeds})
        chosen[arm] = float(sel.chosen)
    report.check_budgets_matched(["steps", "runs_per_lr"])
    return chosen, early, lam


def _families(s: Settings, run: Runner, lr: float, seed: int):
    lam = run.fixed_lambda(lr, s.widths[len(s.widths) // 2], s.tpp)
    fam = {"tau fixed": [], "lambda fixed": [], "mixed TPP": []}
    for i in range(s.seeds):
        say(f"families, seed {i + 1}/{s.seeds}")
        fam["tau fixed"].append([run(RunSpec(w, s.tpp, lr, "tau", s.tau, seed + i)) for w in s.widths])
        fam["lambda fixed"].append([run(RunSpec(w, s.tpp, lr, "lambda", lam, seed + i)) for w in s.widths])
        fam["mixed TPP"].append([run(RunSpec(w, t, lr, "tau", s.tau, seed + i)) for w, t in zip(s.widths, s.mixed_tpp)])
    return fam, lam


def _faults(s: Settings, run: Runner, lr: float, seed: int, fam):
    small = [r for runs in fam["tau fixed"] for r in runs[:-1]]
    ref = A.reference_from(small, s.window)
    band = A.band_from(small, s.window, MONITOR_LO, BAND_FACTOR)
    large = s.widths[-1]
    clean = [runs[-1] for runs in fam["tau fixed"]]
    clean += [run(RunSpec(large, s.tpp, lr, "tau", s.tau, seed + s.seeds + j)) for j in range(s.extra_clean_seeds)]
    faulty = {f: [run(RunSpec(large, s.tpp, lr, "tau", s.tau, seed + i, fault=f)) for i in range(s.seeds)]
              for f in FAULTS}
    monitor = (MONITOR_LO, 1.0)
    clean_alarms = [A.alarms(r, ref, s.window, FIT, monitor, band) for r in clean]
    fault_alarms = {f: [A.alarms(r, ref, s.window, FIT, monitor, band) for r in rs] for f, rs in faulty.items()}
    return ref, band, clean, clean_alarms, faulty, fault_alarms


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("loss-curve-collapse", "Loss-curve collapse of a byte-level muP LM family: tau fixed vs lambda "
                    "fixed, fault detection, early stopping", size, seed)
    _declare(report, s)
    run_ = Runner(s)

    chosen, early, sweep_lam = _sweep(report, s, run_, seed)
    lr = chosen["tau"]
    fam, fam_lam = _families(s, run_, lr, seed)
    ref, band, clean, clean_alarms, faulty, fault_alarms = _faults(s, run_, lr, seed, fam)

    spreads = {k: [A.spread(runs, s.window, SPREAD_LO) for runs in v] for k, v in fam.items()}
    report.measure_paired("collapse_tau_fixed_vs_lambda_fixed", spreads["lambda fixed"], spreads["tau fixed"])
    report.measure_paired("collapse_tau_fixed_vs_mixed_tpp", spreads["mixed TPP"], spreads["tau fixed"])

    def detected(a: A.Alarm) -> float:
        t = a.residual_at
        return float(t is not None and s.fault_at <= t <= s.fault_at + DETECT_WITHIN)

    all_fault = [a for f in FAULTS for a in fault_alarms[f]]
    report.measure("fault_detected", [detected(a) for a in all_fault])
    report.measure("false_alarm_rate", [float(a.residual_at is not None) for a in clean_alarms])
    report.measure("residual_alarm_before_raw", [(1.0 if a.raw_at is None else a.raw_at)
                                                 - (1.0 if a.residual_at is None else a.residual_at) for a in all_fault])
    report.measure("early_rank_tau_fixed", [e.spearman for e in early["tau"]])
    report.measure_paired("early_rank_tau_vs_lambda", [e.spearman for e in early["tau"]],
                          [e.spearman for e in early["lambda"]])
    report.measure("early_pick_regret_tau_fixed", [e.regret for e in early["tau"]])

    runs = list(run_.memo.values())
    report.measure("normalised_curve_ends_at_one", max(abs(A.normalised(r, s.window).final - 1) for r in runs))
    report.measure("timescale_as_declared", max(abs(t / r.spec.value - 1) for r in runs if r.spec.rule == "tau"
                                                for t in r.group_taus))
    first = fam["tau fixed"][0][0]
    again = run_one(first.spec, run_.train, run_.eval, s.batch_size, s.fault_at, s.stuck_len, s.spike)
    report.measure("same_seed_same_curve", float(np.abs(again.curve.loss - first.curve.loss).max()))
    train_tokens = run_.train.numel()
    report.measure("single_epoch", max(float(r.curve.loss.size * s.batch_size * s.seq_len) / train_tokens for r in runs))
    not_falling = 0
    for r in runs:
        if r.spec.fault is None:
            sm = A.smoothed(r, s.window)
            not_falling += int(not sm.final < float(sm.at([0.9])[0]))
    report.measure("loss_still_falling", not_falling)

    _tables(report, s, fam, spreads, lr, fam_lam, sweep_lam, early, band, clean, clean_alarms, faulty, fault_alarms)
    report.plots["raw_curves"] = plots.plot_raw(fam, 0)
    report.plots["normalised_curves"] = plots.plot_normalised(fam, s.window, SPREAD_LO)
    report.plots["fault_residuals"] = plots.plot_residuals(ref, band, clean, faulty, s.window, FIT, s.fault_at)
    report.plots["early_stopping"] = plots.plot_early(early, s.lr_grid)
    report.note(f"Total training runs: {len(runs) + 1} (memoised where two experiments share a configuration); the "
                f"tau arm's LR {lr:g} is used for the families and the fault runs.")
    report.note("Schedule: the harness's warmup (5%) + cosine to zero, not the paper's linear decay to zero; every run "
                "shares the shape, which is what collapse requires. N counts non-embedding parameters.")
    return report.finish()


def _tables(report, s, fam, spreads, lr, fam_lam, sweep_lam, early, band, clean, clean_alarms, faulty, fault_alarms):
    t = report.table("Families (per width: steps, hidden-matrix tau, final smoothed training loss, eval loss; means "
                     "over seeds)", ["family", "width", "tpp", "N", "steps", "hidden_tau", "final_train_loss",
                                     "eval_loss"])
    for name, per_seed in fam.items():
        for j in range(len(per_seed[0])):
            rs = [runs[j] for runs in per_seed]
            t.add(family=name, width=rs[0].spec.width, tpp=rs[0].spec.tpp, N=rs[0].params, steps=rs[0].steps,
                  hidden_tau=rs[0].hidden_tau, final_train_loss=float(np.mean([A.smoothed(r, s.window).final for r in rs])),
                  eval_loss=float(np.mean([r.eval_loss for r in rs])))
    t = report.table("Collapse spread per seed (mean over t_hat in [0.2, 1] of the across-width std of l)",
                     ["family", *[f"seed_{i}" for i in range(s.seeds)], "mean"])
    for name, v in spreads.items():
        t.add(family=name, **{f"seed_{i}": x for i, x in enumerate(v)}, mean=float(np.mean(v)))
    t = report.table(f"Fault detector (band {band:.4g}; None = no alarm)", ["run", "seed", "residual_alarm_t",
                                                                            "raw_alarm_t", "max_abs_residual"])
    for r, a in zip(clean, clean_alarms):
        t.add(run="clean", seed=r.spec.seed, residual_alarm_t=str(a.residual_at), raw_alarm_t=str(a.raw_at),
              max_abs_residual=a.max_abs_residual)
    for f in FAULTS:
        for r, a in zip(faulty[f], fault_alarms[f]):
            t.add(run=f, seed=r.spec.seed, residual_alarm_t=str(a.residual_at), raw_alarm_t=str(a.raw_at),
                  max_abs_residual=a.max_abs_residual)
    t = report.table(f"Early stopping at {s.early_fraction:.0%} (per seed)", ["arm", "seed", "spearman", "regret",
                                                                              "mean_abs_rel_error"])
    for arm, es in early.items():
        for i, e in enumerate(es):
            t.add(arm=f"{arm} fixed", seed=i, spearman=e.spearman, regret=e.regret, mean_abs_rel_error=e.abs_rel_error)
    report.note(f"lambda-fixed constants: sweep lambda = {sweep_lam:.4g} (tau = {s.tau} at the middle LR), family "
                f"lambda = {fam_lam:.4g} (tau = {s.tau} at width {s.widths[len(s.widths) // 2]}).")
    if not math.isfinite(band):
        report.note("the detector band is not finite")
