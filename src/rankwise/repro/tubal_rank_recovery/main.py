"""Reproduction `tubal-rank-recovery`: small initialisation + early stopping keeps the recovery error flat in the
over-estimated tubal rank R, spectral initialisation does not.

Card tubal-rank-recovery.md, at CPU scale: X* = X * X^T [n, n, k] of tubal rank r, ||X*|| = 1; m = 5 n r k Gaussian
measurements with noise at 20 dB SNR, 10% held out for early stopping (argmin of the validation loss, Thm 4); FGD on
U * U^T, U [n, R, k], for R from r to n, from a small random initialisation (alpha) and from the spectral
initialisation. The step size of each arm is chosen on a separate tuning instance by the early-stopping
validation loss at the largest R. Every R and initialisation of a seed runs in one batch on shared measurements. Metric: relative squared error
RSE = ||U U^T - X*||_F^2 / ||X*||_F^2 at the early-stopping step.
"""

from __future__ import annotations

import math
import statistics as st
from dataclasses import dataclass

import numpy as np
import torch

from rankwise.algorithms.tubal import fourier_singular_values, t_transpose, to_fourier
from rankwise.core.arms import select_from_scores
from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.repro.setup import BySize
from rankwise.repro.tubal_rank_recovery.plots import plot_error_vs_rank, plot_trajectories
from rankwise.repro.tubal_rank_recovery.runs import SMALL, SPECTRAL, RunSpec, make_problem, run_batch


@dataclass(frozen=True)
class Settings:
    n: int
    k: int
    r: int
    ranks: tuple[int, ...]  # R values (the first must be r: the exact-rank reference)
    m_factor: float
    val_fraction: float
    snr_db: float
    iterations: int
    alpha: float  # small initialisation scale
    step_grid: tuple[float, ...]
    seeds: int


SIZES = BySize(
    smoke=Settings(n=8, k=2, r=2, ranks=(2, 4, 8), m_factor=5.0, val_fraction=0.1, snr_db=20.0, iterations=150,
                   alpha=1e-6, step_grid=(0.1, 0.2), seeds=3),
    full=Settings(n=30, k=3, r=3, ranks=(3, 6, 12, 24, 30), m_factor=5.0, val_fraction=0.1, snr_db=20.0,
                  iterations=3000, alpha=1e-10, step_grid=(0.1, 0.2, 0.4, 0.8, 1.6), seeds=6),
)
FLAT_MARGIN = 0.1  # slope of log RSE against log R: <= 0.1 means < 26% growth over a 10x range of R
GROWS_MARGIN = 0.25  # theory: RSE grows ~ linearly in R (slope 1) for spectral initialisation
RATIO_MARGIN = math.log10(2.0)  # spectral's RSE at the largest R at least 2x small initialisation's
EXACT_FACTOR = 1.2  # the card: small init within ~20% of exact-rank FGD
ES_FACTOR = 1.2  # the card: the early-stopping iterate close to the best one
SYMMETRY_TOL = 1e-10  # relative t-asymmetry / negative Fourier eigenvalues of U * U^T: rounding only


def _slope(ranks, values) -> float:
    return float(np.polyfit(np.log(np.asarray(ranks, dtype=float)), np.log(np.asarray(values, dtype=float)), 1)[0])


def _testbed(s: Settings) -> str:
    return (f"{s.n}x{s.n}x{s.k} tensors of tubal rank {s.r}, {s.m_factor:g} n r k Gaussian measurements, "
            f"{s.snr_db:g} dB SNR, {s.val_fraction:.0%} held out, {s.iterations} FGD iterations")


def _declare(report: Report, s: Settings) -> None:
    bed = _testbed(s)
    # Each claim says how it could fail: the other initialisation judged by the same test (a control), or a
    # comparison with a baseline measured in the same run.
    report.declare(SampleClaim("small_init_flat_in_R", "per-seed slope of log RSE(ES) against log R, small init, R "
                               f"in {list(s.ranks)}", "<=", FLAT_MARGIN, kind=ClaimKind.PAPER,
                               discriminates=control("spectral init"), testbed=bed))
    report.declare(SampleClaim("spectral_init_grows_with_R", "per-seed slope of log RSE(ES) against log R, spectral "
                               "init", ">", GROWS_MARGIN, kind=ClaimKind.PAPER, discriminates=control("small init"),
                               testbed=bed))
    report.declare(PairedClaim("small_beats_spectral_at_max_R", f"log10 RSE(ES) at R = {s.ranks[-1]}: spectral init "
                               "minus small init, paired by seed", ">", RATIO_MARGIN, kind=ClaimKind.PAPER,
                               discriminates=comparison("spectral init"), testbed=bed))
    report.declare(SampleClaim("small_init_matches_exact_rank", f"per-seed RSE(ES) of small init at R = "
                               f"{s.ranks[-1]} / RSE(ES) of exact-rank FGD (spectral init, R = r)", "<=", EXACT_FACTOR,
                               kind=ClaimKind.PAPER, discriminates=comparison("exact-rank FGD (spectral init, R = r)"),
                               testbed=bed))
    report.declare(SampleClaim("early_stopping_near_best", f"per-seed RSE at the early-stopping step / min_t RSE_t, "
                               f"small init, R = {s.ranks[-1]}", "<=", ES_FACTOR, kind=ClaimKind.PAPER,
                               discriminates=control("the last iterate (no early stopping)"), testbed=bed))
    report.declare(Claim("estimates_symmetric_psd", "max over runs of ||Z - Z^T||_F / ||Z||_F and of -min Fourier "
                         "eigenvalue / max, Z = U * U^T at the ES step", "<=", SYMMETRY_TOL, kind=ClaimKind.INVARIANT))
    report.declare(Claim("noise_at_declared_snr", "max over seeds of |measured SNR - declared SNR| (dB)", "<=", 1.0,
                         kind=ClaimKind.SANITY))
    report.declare(Claim("no_run_diverged", "number of diverged runs (small and spectral arms, all R and seeds)", "<=", 0,
                         kind=ClaimKind.SANITY))


def _tune(report: Report, s: Settings, seed: int) -> dict[str, float]:
    """Each arm's step on a separate instance: the early-stopping validation loss at the largest R."""
    p = make_problem(s.n, s.r, s.k, s.m_factor, s.val_fraction, s.snr_db, seed + 10_000)
    specs = [RunSpec(init, s.ranks[-1], eta, s.alpha) for init in (SMALL, SPECTRAL) for eta in s.step_grid]
    res = run_batch(p, specs, s.iterations, seed + 10_000, desc="FGD tuning")
    chosen = {}
    for init in (SMALL, SPECTRAL):
        scores = [float(r.val_loss.min()) if r.val_loss is not None and not bool(r.diverged) else math.inf
                  for sp, r in zip(specs, res) if sp.init == init]
        sel = select_from_scores(s.step_grid, scores, higher_is_better=False, param="eta")
        report.record_arm(f"{init} init", sel, budget={"iterations": s.iterations, "measurements": p.train.m})
        chosen[init] = float(sel.chosen)
    report.check_budgets_matched(["iterations", "measurements"])
    return chosen


def _symmetry_defect(z: torch.Tensor) -> float:
    asym = float((z - t_transpose(z)).norm() / z.norm().clamp_min(1e-300))
    z_hat = to_fourier(z)
    herm = (z_hat + z_hat.transpose(0, 1).conj()) / 2
    ev = torch.linalg.eigvalsh(herm.permute(2, 0, 1))
    neg = float((-ev.min()).clamp_min(0) / ev.max().clamp_min(1e-300))
    return max(asym, neg)


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("tubal-rank-recovery", "Small vs spectral initialisation for over-parameterised low-tubal-rank "
                    "recovery (FGD with early stopping)", size, seed)
    _declare(report, s)
    steps = _tune(report, s, seed)
    specs = ([RunSpec(SMALL, R, steps[SMALL], s.alpha) for R in s.ranks]
             + [RunSpec(SPECTRAL, R, steps[SPECTRAL]) for R in s.ranks])
    results, snr_err, defect, trajectories = [], [], 0.0, None
    for i in range(s.seeds):
        say(f"seed {i + 1}/{s.seeds}: {len(specs)} FGD runs in one batch")
        p = make_problem(s.n, s.r, s.k, s.m_factor, s.val_fraction, s.snr_db, seed + i)
        snr_err.append(abs(p.snr_db - s.snr_db))
        res = run_batch(p, specs, s.iterations, seed + i, desc=f"FGD seed {i + 1}")
        results.append({(sp.init, sp.rank): r for sp, r in zip(specs, res)})
        defect = max([defect] + [_symmetry_defect(r.estimate) for r in res if not bool(r.diverged)])
        if i == 0:
            trajectories = {sp.init: r for sp, r in zip(specs, res) if sp.rank == s.ranks[-1]}
            kappa = _condition(p.truth, s.r)

    def es(init, R):
        return [float(r[(init, R)].es_rse) for r in results]

    r_max = s.ranks[-1]
    per_seed = {init: [[float(res[(init, R)].es_rse) for R in s.ranks] for res in results] for init in (SMALL, SPECTRAL)}
    slopes = {init: [_slope(s.ranks, v) for v in per_seed[init]] for init in (SMALL, SPECTRAL)}
    report.measure("small_init_flat_in_R", slopes[SMALL])
    report.get_claim("small_init_flat_in_R").measure_control(slopes[SPECTRAL])
    report.measure("spectral_init_grows_with_R", slopes[SPECTRAL])
    report.get_claim("spectral_init_grows_with_R").measure_control(slopes[SMALL])
    report.measure_paired("small_beats_spectral_at_max_R", np.log10(es(SPECTRAL, r_max)), np.log10(es(SMALL, r_max)))
    report.measure("small_init_matches_exact_rank",
                   [a / b for a, b in zip(es(SMALL, r_max), es(SPECTRAL, s.ranks[0]))])
    report.measure("early_stopping_near_best",
                   [float(r[(SMALL, r_max)].es_rse / r[(SMALL, r_max)].best_rse) for r in results])
    report.get_claim("early_stopping_near_best").measure_control(
        [float(r[(SMALL, r_max)].final_rse / r[(SMALL, r_max)].best_rse) for r in results])
    report.measure("estimates_symmetric_psd", defect)
    report.measure("noise_at_declared_snr", max(snr_err))
    report.measure("no_run_diverged", sum(int(bool(r[key].diverged)) for r in results for key in r))

    t = report.table("Recovery error against R (means over seeds; RSE = ||UU^T - X*||_F^2 / ||X*||_F^2)",
                     ["init", "R", "step", "rse_es_mean", "rse_es_std", "rse_best_mean", "rse_final_mean",
                      "es_step_mean", "best_step_mean", "diverged"])
    for sp in specs:
        rs = [r[(sp.init, sp.rank)] for r in results]
        es_v = [float(x.es_rse) for x in rs]
        t.add(init=sp.init, R=sp.rank, step=sp.step, rse_es_mean=st.fmean(es_v),
              rse_es_std=st.stdev(es_v) if len(es_v) > 1 else 0.0, rse_best_mean=st.fmean(float(x.best_rse) for x in rs),
              rse_final_mean=st.fmean(float(x.final_rse) for x in rs), es_step_mean=st.fmean(int(x.es_step) for x in rs),
              best_step_mean=st.fmean(int(x.best_step) for x in rs), diverged=sum(int(bool(x.diverged)) for x in rs))
    t2 = report.table("Per-seed slopes of log RSE(ES) against log R", ["init", "per_seed_slopes", "mean_slope"])
    for init in (SMALL, SPECTRAL):
        slopes = [_slope(s.ranks, v) for v in per_seed[init]]
        t2.add(init=init, per_seed_slopes=" ".join(f"{x:.3f}" for x in slopes), mean_slope=st.fmean(slopes))
    report.plots["error_vs_rank"] = plot_error_vs_rank(s.ranks, per_seed)
    report.plots["rse_trajectories"] = plot_trajectories(trajectories, r_max)
    report.note(f"n = {s.n}, k = {s.k}, r = {s.r}; m = {s.m_factor:g} n r k = {int(round(s.m_factor * s.n * s.r * s.k))}"
                f" measurements ({s.val_fraction:.0%} held out for early stopping); noise at {s.snr_db:g} dB SNR; "
                f"{s.iterations} iterations; small init alpha = {s.alpha:g}; kappa(X*) of the first seed = "
                f"{kappa:.2f}; {s.seeds} seeds.")
    report.note("The card's third arm, a large random initialisation (alpha = 10, eta = 1e-3), is left out: in a pilot "
                "at this size it diverged for R <= 12 and converged slowly otherwise, and no claim is about it.")
    report.note(f"Steps chosen on a separate tuning instance (grid {list(s.step_grid)}): small {steps[SMALL]:g}, "
                f"spectral {steps[SPECTRAL]:g}. Early stopping = argmin of the validation loss over all iterations.")
    return report.finish()


def _condition(truth: torch.Tensor, r: int) -> float:
    sv = fourier_singular_values(truth)[:r].flatten()
    return float(sv.max() / sv.min())


__all__ = ["run", "SIZES", "Settings"]
