"""Reproduction `loss-curve-collapse:faults`: the residual from collapse, rho(t_hat) = L(t_hat T) / c_hat - l_ref(t_hat),
flags a faulted run of the largest width early, and stays quiet on clean runs (the paper's deviation diagnostic).

The main experiment's family and schedule (see `main`), in its own process: the family LR is re-chosen by the same
tau-fixed sweep at the smallest width, then
- reference l_ref = the mean normalised curve of the smaller widths (tau fixed, every seed);
- faults on the largest width: a 3x LR spike for 2% of training and a stuck data loader for 5%, both at t_hat = 0.5;
- the detector, declared before measuring: the divisor c_hat fitted on t_hat in (0.1, 0.4], before the faults; band =
  3 x the small runs' largest across-run std of l on t_hat >= 0.4; alarm when |rho| > band on t_hat in [0.4, 1].
Every claim is judged on its own runs: the clean large runs are the control of the detection claim (a detector that
"detects" clean runs as often discriminates nothing) and the faulted runs the control of the false-alarm claim.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import ClaimKind, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.errors import InvalidInputError
from rankwise.repro.loss_curve_collapse import analysis as A
from rankwise.repro.loss_curve_collapse import plots
from rankwise.repro.loss_curve_collapse.common import (SLUG, FaultWindow, Runner, Testbed, declare_checks, family_lr,
                                                       measure_checks, schedule_note)
from rankwise.repro.loss_curve_collapse.family import RunSpec
from rankwise.repro.setup import BySize

FIT = (0.1, 0.4)  # the detector's divisor is fitted here, before the faults
MONITOR_LO = 0.4
BAND_FACTOR = 3.0
DETECT_WITHIN = 0.1  # a detection counts if the alarm comes within 0.1 of training after the injection
DETECT_MIN = 0.8
FALSE_ALARM_MAX = 0.2
FAULTS = ("lr_spike", "stuck_data")


@dataclass(frozen=True)
class Settings:
    bed: Testbed
    widths: tuple[int, ...]  # the reference widths, then the large (monitored) one
    tpp: float
    tau: float
    lr_grid: tuple[float, ...]  # the family-LR sweep at widths[0], as in `main`
    seeds: int
    extra_clean_seeds: int  # more clean large runs for the false-alarm rate
    faults: FaultWindow

    def __post_init__(self) -> None:
        if len(self.widths) < 2 or list(self.widths) != sorted(set(self.widths)):
            raise InvalidInputError(f"need >= 1 reference width and a larger monitored one, smallest first, got "
                                    f"{self.widths}")
        if not FIT[1] <= MONITOR_LO <= self.faults.at < 1:
            raise InvalidInputError(f"the fault (t_hat {self.faults.at}) must come after the divisor fit and inside the "
                                    f"monitored window [{MONITOR_LO}, 1)")


# Full-size cost (measured as in `main`: 1 thread, ~2/3 of a busy core): LR sweep at width 16, 15 runs x 5 s = 75 s
# (its runs at the chosen LR are the width-16 references); width-32 references 3 x 22 = 66 s; width 48 (75 s a run):
# 5 clean + 2 faults x 3 seeds = 11 runs = 825 s; determinism rerun 5 s. ~970 s (~16 min), ~11 min on an idle core.
SIZES = BySize(
    smoke=Settings(bed=Testbed(batch_size=4, seq_len=32, eval_windows=4, window=0.05), widths=(16, 32), tpp=0.25,
                   tau=0.2, lr_grid=(0.005, 0.02), seeds=2, extra_clean_seeds=0,
                   faults=FaultWindow(at=0.5, spike_len=0.05, stuck_len=0.1, spike=3.0)),
    full=Settings(bed=Testbed(batch_size=8, seq_len=64, eval_windows=64, window=0.03), widths=(16, 32, 48), tpp=10.0,
                  tau=0.2, lr_grid=(0.0025, 0.005, 0.01, 0.02, 0.04), seeds=3, extra_clean_seeds=2,
                  faults=FaultWindow(at=0.5, spike_len=0.02, stuck_len=0.05, spike=3.0)),
)


def _declare(report: Report, s: Settings) -> None:
    P = ClaimKind.PAPER
    bed = s.bed.describe(s.widths, s.tpp, s.tau)
    f, large = s.faults, s.widths[-1]
    report.declare(SampleClaim("fault_detected_d2z", f"per faulted run ({', '.join(FAULTS)} at t_hat = {f.at}, width "
                               f"{large}): 1 if |rho| crosses the band within {DETECT_WITHIN} after the injection (and "
                               "not before it), else 0", ">=", DETECT_MIN, kind=P,
                               discriminates=control(f"clean runs of width {large}"), testbed=bed, post_hoc=True))
    report.declare(SampleClaim("false_alarm_rate_d2z", f"per clean run of width {large}: 1 if |rho| crosses the band "
                               f"anywhere in t_hat [{MONITOR_LO}, 1], else 0", "<=", FALSE_ALARM_MAX, kind=P,
                               discriminates=control(f"faulted runs of width {large}"), testbed=bed, post_hoc=True))
    # Both rules are watched from the injection on: a residual already out of the band before the fault (a false
    # alarm, counted by false_alarm_rate_d2z) would otherwise "beat" the raw-loss rule without detecting anything.
    report.declare(SampleClaim("residual_alarm_before_raw_d2z", "per faulted run: t_hat of the first raw-loss alarm "
                               "(a rise above its running minimum by the band) at or after the injection minus that of "
                               "the residual alarm (each 1 if never)", ">", 0.0, kind=P,
                               discriminates=comparison("raw-loss rise alarm"), testbed=bed, post_hoc=True))
    declare_checks(report, bed)


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report(SLUG, "Deviation from collapse as a fault detector on the largest member of a byte-level muP LM "
                    "family", size, seed)
    _declare(report, s)
    run_ = Runner(s.bed, s.faults)
    lr = float(family_lr(report, run_, s.widths[0], s.tpp, s.lr_grid, s.tau, s.seeds, seed).chosen)
    w, large = s.bed.window, s.widths[-1]

    say("reference runs")
    small = [run_(RunSpec(width, s.tpp, lr, "tau", s.tau, seed + i)) for i in range(s.seeds) for width in s.widths[:-1]]
    ref = A.reference_from(small, w)
    band = A.band_from(small, w, MONITOR_LO, BAND_FACTOR)
    say(f"clean and faulted runs, width {large}")
    clean = [run_(RunSpec(large, s.tpp, lr, "tau", s.tau, seed + i)) for i in range(s.seeds + s.extra_clean_seeds)]
    faulty = {f: [run_(RunSpec(large, s.tpp, lr, "tau", s.tau, seed + i, fault=f)) for i in range(s.seeds)]
              for f in FAULTS}
    monitor = (MONITOR_LO, 1.0)
    clean_alarms = [A.alarms(r, ref, w, FIT, monitor, band) for r in clean]
    fault_alarms = {f: [A.alarms(r, ref, w, FIT, monitor, band) for r in rs] for f, rs in faulty.items()}
    all_fault = [a for f in FAULTS for a in fault_alarms[f]]

    def detected(a: A.Alarm) -> float:
        t = a.residual_at
        return float(t is not None and s.faults.at <= t <= s.faults.at + DETECT_WITHIN)

    def alarmed(a: A.Alarm) -> float:
        return float(a.residual_at is not None)

    report.measure("fault_detected_d2z", [detected(a) for a in all_fault])
    report.get_claim("fault_detected_d2z").measure_control([detected(a) for a in clean_alarms])
    report.measure("false_alarm_rate_d2z", [alarmed(a) for a in clean_alarms])
    report.get_claim("false_alarm_rate_d2z").measure_control([alarmed(a) for a in all_fault])
    after = [A.alarms(r, ref, w, FIT, (s.faults.at, 1.0), band) for f in FAULTS for r in faulty[f]]
    report.measure("residual_alarm_before_raw_d2z", [(1.0 if a.raw_at is None else a.raw_at)
                                                     - (1.0 if a.residual_at is None else a.residual_at)
                                                     for a in after])
    measure_checks(report, run_, small[0])

    t = report.table(f"Fault detector (band {band:.4g}; None = no alarm)", ["run", "seed", "residual_alarm_t",
                                                                            "raw_alarm_t", "max_abs_residual"])
    for name, rs, als in [("clean", clean, clean_alarms), *[(f, faulty[f], fault_alarms[f]) for f in FAULTS]]:
        for r, a in zip(rs, als):
            t.add(run=name, seed=r.spec.seed, residual_alarm_t=str(a.residual_at), raw_alarm_t=str(a.raw_at),
                  max_abs_residual=a.max_abs_residual)
    report.plots["fault_residuals"] = plots.plot_residuals(ref, band, clean, faulty, w, FIT, s.faults.at)
    report.note(f"Training runs: {len(run_.memo) + 1}. The family LR {lr:g} is the tau-fixed choice at width "
                f"{s.widths[0]} (the sweep of `loss-curve-collapse`'s main experiment, rerun here); l_ref and the band "
                f"come from widths {list(s.widths[:-1])} x {s.seeds} seeds.")
    if not math.isfinite(band):
        report.note("the detector band is not finite")
    schedule_note(report)
    return report.finish()
