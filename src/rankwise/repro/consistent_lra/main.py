"""Reproduction `consistent-lra`: low-recourse rank-k subspaces over row streams, with the promise kept at every step.

Card consistent-lra.md, at CPU scale:
- Streams: S1, the adversarial alternation (d=40, k=5; sigma_5 and sigma_6 cross at every burst), over several
  random instances; S2, scikit-learn digits rows (d=64, k=10) and scikit-image camera rows (k=20) in a random order
  per seed; S3, the lower-bound phases (d=20, k=5).
- Algorithms: A (lazy additive, Thm 1.1), B (online ridge-leverage sampling, recompute on sample; the card's
  reading of Thm 1.3), D (verify-then-recompute, the card's reference); baselines recompute-every-step SVD and
  Frequent Directions (l = k + ceil(k/eps)). One eps for all; OPT_t exact (float64 eigenvalues) at every step.
- Recourse = sum_t ||P_t - P_{t-1}||_F^2 (the card's definition), with the unsquared path length and the number of
  changes beside it. Growth = fitted exponent of cumulative recourse against t over the last decade of the stream:
  logarithmic growth has exponent ~1/ln t (0.1-0.2 here), linear growth 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwise.algorithms.consistent_lra import lower_bound_phases
from rankwise.core.discrimination import control
from rankwise.core.evidence import Claim, ClaimKind, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.repro.consistent_lra.plots import plot_guarantees, plot_recourse
from rankwise.repro.consistent_lra.runs import (
    ALGORITHMS, A, B, D, FD, SVD, Run, mean, run_all, std,
)
from rankwise.repro.consistent_lra.streams import (
    ADVERSARIAL, CAMERA, DIGITS, adversarial_rows, camera_rows, digits_rows,
)
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    adversarial_rows: int
    adversarial_seeds: int
    digits_rows: int | None  # None: all 1,797
    digits_seeds: int
    camera_rows: int | None  # None: all 512
    camera_column_stride: int  # columns averaged in groups of this many (d = 512 / stride)
    camera_seeds: int
    lower_bound_rows: int
    eps: float
    eps_sweep: tuple[float, ...]
    oversampling: float  # c of algorithm B


SIZES = BySize(
    smoke=Settings(adversarial_rows=400, adversarial_seeds=3, digits_rows=300, digits_seeds=3, camera_rows=96,
                   camera_column_stride=8, camera_seeds=3, lower_bound_rows=200, eps=0.2, eps_sweep=(0.1, 0.2),
                   oversampling=1.0),
    full=Settings(adversarial_rows=50000, adversarial_seeds=8, digits_rows=None, digits_seeds=10, camera_rows=None,
                  camera_column_stride=2, camera_seeds=5, lower_bound_rows=5000, eps=0.2, eps_sweep=(0.05, 0.1, 0.2),
                  oversampling=1.0),
)
LOG_MAX_EXPONENT = 0.35  # logarithmic growth: 1/ln(t) is 0.1-0.2 at the stream lengths used; a margin above that
LINEAR_MIN_EXPONENT = 0.7  # linear growth: exponent 1; a margin below it
PATH_TOLERANCE = 1e-9  # relative: the triangle inequality holds up to rounding


def _declare(report: Report) -> None:
    for alg, tag in ((A, "A"), (B, "B")):
        report.declare(SampleClaim(f"{tag}_recourse_logarithmic_adversarial",
                                   f"{alg}: per-seed growth exponent of cumulative recourse on S1 (last decade)",
                                   "<=", LOG_MAX_EXPONENT, kind=ClaimKind.PAPER, discriminates=control(SVD)))
    for alg, tag in ((SVD, "svd"), (FD, "fd")):
        report.declare(SampleClaim(f"{tag}_recourse_linear_adversarial",
                                   f"{alg}: per-seed growth exponent of cumulative recourse on S1 (last decade)",
                                   ">", LINEAR_MIN_EXPONENT, kind=ClaimKind.PAPER, discriminates=control(A)))
    for stream in ("digits", "camera"):
        for alg, tag in ((A, "A"), (B, "B")):
            report.declare(SampleClaim(f"{tag}_recourse_logarithmic_{stream}",
                                       f"{alg}: per-order growth exponent of cumulative recourse on {stream} rows",
                                       "<=", LOG_MAX_EXPONENT, kind=ClaimKind.PAPER, discriminates=control(SVD)))
    report.declare(Claim("B_guarantee_every_step", "B: max over runs and steps of (cost - (1+eps) OPT - slack) / "
                         "||A^(t)||_F^2 (promise w.h.p.; <= 0: held at every step of every run)", "<=", 0.0,
                         kind=ClaimKind.PAPER, discriminates=control(SVD)))  # the exact method meets any (1+eps) bar
    report.declare(Claim("A_additive_every_step", "A: max over runs and steps of (cost - OPT - eps ||A||^2 - slack) "
                         "/ ||A^(t)||_F^2", "<=", 0.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("A_recomputations_within_log_bound", "A: max over runs of recomputations / "
                         "(1 + log_{1+eps}(||A^(n)||^2 / ||a_first||^2))", "<=", 1.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("A_recourse_within_bound", "A: max over runs of recourse / (2k (1 + log_{1+eps}(...)))",
                         "<=", 1.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("D_multiplicative_every_step", "D: max over runs and steps of (cost - (1+eps) OPT - slack)"
                         " / ||A^(t)||_F^2", "<=", 0.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("fd_multiplicative_every_step", "FD: max over runs and steps of (cost - (1 + k/(l-k)) OPT "
                         "- slack) / ||A^(t)||_F^2 (Ghashami et al. Thm 3.1)", "<=", 0.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("svd_exact_every_step", "recompute SVD: max over runs and steps of (cost - OPT - slack) / "
                         "||A^(t)||_F^2", "<=", 0.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("lazy_path_not_longer_than_svd", "A and D: max over runs of (path length - recompute "
                         "SVD's path length) / SVD's (both jump between exact top-k subspaces: triangle inequality)",
                         "<=", PATH_TOLERANCE, kind=ClaimKind.INVARIANT))
    report.declare(SampleClaim("D_recourse_logarithmic_adversarial", f"{D} (the card's reference, not the paper's "
                               "algorithm): per-seed growth exponent of recourse on S1", "<=", LOG_MAX_EXPONENT,
                               kind=ClaimKind.SANITY))
    report.declare(Claim("lower_bound_forces_moves", "S3: min over D, FD and recompute SVD of the fraction of "
                         "complete phases (after the first) in which the subspace moved", ">=", 1.0,
                         kind=ClaimKind.SANITY))


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("consistent-lra", "Consistent low-rank approximation: recourse and the per-step promise on "
                    "adversarial and real row streams", size, seed)
    _declare(report)
    runs: dict[str, list[dict[str, Run]]] = {"adversarial": [], "digits": [], "camera": []}
    for i in range(s.adversarial_seeds):
        say(f"S1 adversarial alternation, instance {i + 1}/{s.adversarial_seeds}")
        runs["adversarial"].append(run_all(adversarial_rows(s.adversarial_rows, seed + i), "adversarial",
                                           ADVERSARIAL.rank, s.eps, s.oversampling, seed + i))
    for i in range(s.digits_seeds):
        say(f"S2 digits, order {i + 1}/{s.digits_seeds}")
        runs["digits"].append(run_all(digits_rows(s.digits_rows, seed + i), "digits", DIGITS.rank, s.eps,
                                      s.oversampling, seed + i))
    for i in range(s.camera_seeds):
        say(f"S2 camera, order {i + 1}/{s.camera_seeds}")
        runs["camera"].append(run_all(camera_rows(s.camera_rows, s.camera_column_stride, seed + i), "camera",
                                      CAMERA.rank, s.eps, s.oversampling, seed + i))
    all_runs = [r for per_stream in runs.values() for per_seed in per_stream for r in per_seed.values()]

    def per_seed(stream: str, alg: str, attr: str) -> list[float]:
        return [getattr(per[alg], attr) for per in runs[stream]]

    # Each recourse claim is also judged on its control: the consistent algorithms' claims on recompute-the-SVD,
    # the baselines' on the lazy additive algorithm (a claim both sides pass does not separate them).
    def measured_with_control(name: str, stream: str, alg: str, control_alg: str) -> None:
        report.measure(name, per_seed(stream, alg, "exponent"))
        report.get_claim(name).measure_control(per_seed(stream, control_alg, "exponent"))

    measured_with_control("A_recourse_logarithmic_adversarial", "adversarial", A, SVD)
    measured_with_control("B_recourse_logarithmic_adversarial", "adversarial", B, SVD)
    measured_with_control("svd_recourse_linear_adversarial", "adversarial", SVD, A)
    measured_with_control("fd_recourse_linear_adversarial", "adversarial", FD, A)
    for stream in ("digits", "camera"):
        measured_with_control(f"A_recourse_logarithmic_{stream}", stream, A, SVD)
        measured_with_control(f"B_recourse_logarithmic_{stream}", stream, B, SVD)
    report.measure("D_recourse_logarithmic_adversarial", per_seed("adversarial", D, "exponent"))

    def worst(alg: str, attr: str = "worst_violation") -> float:
        return max(getattr(r, attr) for r in all_runs if r.algorithm == alg)

    report.measure("B_guarantee_every_step", worst(B))
    # recompute SVD's worst violation of its exact bound (cost <= OPT + slack) also bounds the (1+eps) one
    report.get_claim("B_guarantee_every_step").measure_control(worst(SVD))
    report.measure("A_additive_every_step", worst(A))
    a_runs = [r for r in all_runs if r.algorithm == A]
    report.measure("A_recomputations_within_log_bound", max(r.recomputations / r.log_bound for r in a_runs))
    report.measure("A_recourse_within_bound", max(r.total_recourse / (2 * _rank(r.stream) * r.log_bound)
                                                  for r in a_runs))
    report.measure("D_multiplicative_every_step", worst(D))
    report.measure("fd_multiplicative_every_step", worst(FD))
    report.measure("svd_exact_every_step", worst(SVD))
    report.measure("lazy_path_not_longer_than_svd", max(
        (per[alg].path_length - per[SVD].path_length) / max(per[SVD].path_length, 1e-300)
        for per_stream in runs.values() for per in per_stream for alg in (A, D)))

    _stream_tables(report, runs, s)
    sweep = _eps_sweep(report, s, seed)
    moved = _lower_bound(report, s, seed)
    report.measure("lower_bound_forces_moves", min(moved[alg] for alg in (D, FD, SVD)))
    report.plots["recourse_vs_n"] = plot_recourse(runs, s.eps)
    report.plots["approximation_vs_n"] = plot_guarantees(runs, s.eps)
    _notes(report, s, sweep)
    return report.finish()


def _rank(stream: str) -> int:
    return {"adversarial": ADVERSARIAL.rank, "digits": DIGITS.rank, "camera": CAMERA.rank}[stream]


def _stream_tables(report: Report, runs: dict[str, list[dict[str, Run]]], s: Settings) -> None:
    cols = ["stream", "algorithm", "seeds", "rows", "recourse_mean", "recourse_std", "growth_exponent_mean",
            "path_length_mean", "changes_mean", "changes_exponent_mean", "recomputations_mean", "worst_ratio",
            "worst_additive_error", "promise_held_every_step", "seconds_mean"]
    t = report.table(f"Recourse and promise per stream and algorithm (eps = {s.eps}; means over seeds)", cols)
    for stream, per_stream in runs.items():
        for alg in ALGORITHMS:
            rs = [per[alg] for per in per_stream]
            t.add(stream=stream, algorithm=alg, seeds=len(rs), rows=len(rs[0].recourse),
                  recourse_mean=mean(r.total_recourse for r in rs), recourse_std=std(r.total_recourse for r in rs),
                  growth_exponent_mean=mean(r.exponent for r in rs), path_length_mean=mean(r.path_length for r in rs),
                  changes_mean=mean(r.total_changes for r in rs),
                  changes_exponent_mean=mean(r.changes_exponent for r in rs),
                  recomputations_mean=mean(r.recomputations for r in rs), worst_ratio=max(r.worst_ratio for r in rs),
                  worst_additive_error=max(r.worst_additive for r in rs),
                  promise_held_every_step="yes" if all(r.worst_violation <= 0 for r in rs) else "NO",
                  seconds_mean=mean(r.seconds for r in rs))
    per = report.table("Per-seed growth exponents of cumulative recourse (last decade of each stream)",
                       ["stream", "algorithm", "per_seed_exponents", "per_seed_recourse"])
    for stream, per_stream in runs.items():
        for alg in ALGORITHMS:
            per.add(stream=stream, algorithm=alg,
                    per_seed_exponents=" ".join(f"{p[alg].exponent:.3f}" for p in per_stream),
                    per_seed_recourse=" ".join(f"{p[alg].total_recourse:.4g}" for p in per_stream))


def _eps_sweep(report: Report, s: Settings, seed: int) -> dict:
    t = report.table("S1 (first instance): recourse against eps for the consistent algorithms",
                     ["eps", "algorithm", "recourse", "changes", "growth_exponent", "recomputations",
                      "A_log_bound_recomputations", "worst_ratio"])
    rows = adversarial_rows(s.adversarial_rows, seed)
    out = {}
    for eps in s.eps_sweep:
        res = run_all(rows, "adversarial", ADVERSARIAL.rank, eps, s.oversampling, seed, algorithms=(A, B, D))
        out[eps] = res
        for alg, r in res.items():
            t.add(eps=eps, algorithm=alg, recourse=r.total_recourse, changes=r.total_changes,
                  growth_exponent=r.exponent, recomputations=r.recomputations,
                  A_log_bound_recomputations=r.log_bound if r.log_bound is not None else "",
                  worst_ratio=r.worst_ratio)
    return out


def _lower_bound(report: Report, s: Settings, seed: int) -> dict[str, float]:
    rows, phase = lower_bound_phases(s.lower_bound_rows, 20, 5, s.eps, seed=seed)
    res = run_all(rows, "lower-bound", 5, s.eps, s.oversampling, seed)
    phases = int(phase.max()) + 1
    t = report.table(f"S3 lower-bound phases (d=20, k=5, eps={s.eps}, {phases} phases): every (1+eps)-algorithm "
                     "must move in every complete phase after the first",
                     ["algorithm", "phases", "phases_with_a_move", "recourse", "changes", "recourse_per_phase",
                      "promise_held_every_step"])
    moved = {}
    for alg, r in res.items():
        step = np.diff(np.concatenate([[0.0], r.recourse]))
        # phases 1 .. phases-2: the first phase has nothing to switch from, the last may be cut off by n
        with_move = sum(1 for p in range(1, phases - 1) if step[phase == p].sum() > 0)
        moved[alg] = with_move / max(1, phases - 2)
        t.add(algorithm=alg, phases=phases, phases_with_a_move=with_move, recourse=r.total_recourse,
              changes=r.total_changes, recourse_per_phase=r.total_recourse / phases,
              promise_held_every_step="yes" if r.worst_violation <= 0 else "NO")
    return moved


def _notes(report: Report, s: Settings, sweep: dict) -> None:
    report.note(f"eps = {s.eps} for every algorithm; FD's sketch has l = k + ceil(k/eps) rows (its promise is "
                f"1 + k/(l-k) <= 1 + eps); B's oversampling c = {s.oversampling}, p_t = min(1, c tau_t ln(t+1)/eps^2). "
                f"Rows fed in blocks of 500 (each block batched; the per-step record is the same as row by row).")
    report.note(f"Streams: S1 {s.adversarial_rows} rows x {s.adversarial_seeds} random instances; digits "
                f"{s.digits_rows or 1797} rows x {s.digits_seeds} orders; camera {s.camera_rows or 512} rows, "
                f"columns averaged in groups of {s.camera_column_stride} (d = {512 // s.camera_column_stride}), "
                f"x {s.camera_seeds} orders; S3 {s.lower_bound_rows} rows.")
    report.note("Promise checks add a float64 rounding slack 8 eps64 (d + t) ||A^(t)||_F^2; for t <= k (OPT_t = 0) "
                "this makes the multiplicative promise mean 'every row so far lies in the subspace'.")
    report.note("The squared recourse rewards many small moves (m moves of size delta/m cost delta^2/m): on the "
                "randomly ordered real streams the recompute-every-step baseline drifts in small steps, so its "
                "squared recourse need not grow linearly there; the path length and the number of changes show the "
                "difference (the table). On S1 the swaps are of size ~2 and all measures agree.")


__all__ = ["run", "SIZES", "Settings"]
