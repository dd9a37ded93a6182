"""Reproduction `consistent-lra`: low-recourse rank-k subspaces over row streams, with the promise kept at every step.

Card consistent-lra.md, at CPU scale:
- Streams: S1, the adversarial alternation (d=40, k=5; sigma_5 and sigma_6 cross at every burst), over several
  random instances; S2, scikit-learn digits rows (d=64, k=10), scikit-image camera rows (k=20) and Fashion-MNIST
  images pooled to 7x7 (d=49, k=10; the one real stream long enough for B to skip rows) in a random order per seed;
  S3, the lower-bound phases (d=20, k=5).
- Algorithms: A (lazy additive, Thm 1.1), B (online ridge-leverage sampling, recompute on sample; the card's
  reading of Thm 1.3) at the card's c and, as B', at a small c where p_t < 1 on the real streams (at the card's c
  they are shorter than the sample the theorem needs, so B samples every row and is recompute-the-SVD there),
  D (verify-then-recompute, the card's reference); baselines recompute-every-step SVD and Frequent Directions
  (l = k + ceil(k/eps)). One eps for all; OPT_t exact (float64 eigenvalues) at every step.
- Recourse = sum_t ||P_t - P_{t-1}||_F^2 (the card's definition), with the unsquared path length and the number of
  changes beside it. Growth = fitted exponent of cumulative recourse against t over the last decade of the stream:
  logarithmic growth has exponent ~1/ln t (0.1-0.2 here), linear growth 1.
- Claims separate the algorithms: each consistent algorithm's claim is judged on recompute-the-SVD too, each
  baseline's on A, and B's multiplicative promise on A (which promises only an additive error). On the randomly
  ordered real streams the squared recourse does not separate them (the SVD drifts in many small moves), so the
  claims there count subspace changes; the earlier squared-recourse claims there, which the SVD passed as well, are
  retired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import torch

from rankwise.algorithms.consistent_lra import lower_bound_phases, prefix_optimal_cost
from rankwise.core.arms import select_from_scores
from rankwise.core.discrimination import control
from rankwise.core.evidence import Claim, ClaimKind, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.repro.consistent_lra.plots import plot_guarantees, plot_recourse
from rankwise.repro.consistent_lra.runs import (
    ALGORITHMS, A, B, B_SPARSE, D, FD, SVD, Run, mean, run_all, std,
)
from rankwise.repro.consistent_lra.streams import (
    ADVERSARIAL, CAMERA, DIGITS, FASHION, adversarial_rows, camera_rows, digits_rows, fashion_rows,
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
    fashion_rows: int
    fashion_pool: int  # average-pooling window: d = (28 / pool)^2
    fashion_seeds: int
    lower_bound_rows: int
    eps: float
    eps_sweep: tuple[float, ...]
    oversampling: float  # c of algorithm B (the card's range 0.5-4)
    sparse_grid: tuple[float, ...]  # B''s c: the smallest that keeps the promise on validation orders is chosen


# B''s c, chosen on validation orders of the real streams (seed + 100, + 101; not among the reported orders): the
# smallest at which B' kept its (1 + eps) promise at every step of every one (score: the mean share of rows sampled;
# lower is better).
SPARSE_GRID = (0.2, 0.1, 0.05, 0.02, 0.01)
VALIDATION_ORDERS = (100, 101)
SIZES = BySize(
    smoke=Settings(adversarial_rows=400, adversarial_seeds=3, digits_rows=300, digits_seeds=3, camera_rows=96,
                   camera_column_stride=8, camera_seeds=3, fashion_rows=600, fashion_pool=4,
                   fashion_seeds=3, lower_bound_rows=200, eps=0.2, eps_sweep=(0.1, 0.2),
                   oversampling=1.0, sparse_grid=SPARSE_GRID),
    full=Settings(adversarial_rows=50000, adversarial_seeds=8, digits_rows=None, digits_seeds=10, camera_rows=None,
                  camera_column_stride=2, camera_seeds=5, fashion_rows=20000, fashion_pool=4,
                  fashion_seeds=5, lower_bound_rows=5000, eps=0.2, eps_sweep=(0.05, 0.1, 0.2),
                  oversampling=1.0, sparse_grid=SPARSE_GRID),
)
LOG_MAX_EXPONENT = 0.35  # logarithmic growth: 1/ln(t) is 0.1-0.2 at the stream lengths used; a margin above that
LINEAR_MIN_EXPONENT = 0.7  # linear growth: exponent 1; a margin below it
# B's samples (each one change) number sum_t p_t ~ c k log^2(t) / eps^2: growth exponent ~ 2 / ln t, 0.27-0.32 at
# n = 512-1797 and 0.18 at 50,000 rows; a margin above that, still well below linear.
POLYLOG_MAX_EXPONENT = 0.5
REAL_STREAMS = ("digits", "camera", "fashion")
MAX_SAMPLED_FRACTION = 0.5  # B' must keep fewer than half the rows of the long stream, or it is the SVD again
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
    # Post hoc (after the squared-recourse claims on the real streams and B's promise, judged against the SVD,
    # were found not to discriminate): the number of subspace changes on the real streams, B' at a small c, and B's
    # promise judged against A.
    post_hoc = dict(kind=ClaimKind.PAPER, post_hoc=True)
    report.declare(SampleClaim("Bsparse_recourse_polylog_adversarial", f"{B_SPARSE}: per-seed growth exponent of "
                               "cumulative recourse on S1 (last decade)", "<=", POLYLOG_MAX_EXPONENT,
                               discriminates=control(SVD), **post_hoc))
    for stream in REAL_STREAMS:
        report.declare(SampleClaim(f"A_changes_logarithmic_{stream}", f"{A}: per-order growth exponent of the number "
                                   f"of subspace changes on {stream} rows (each change costs <= 2k recourse)", "<=",
                                   LOG_MAX_EXPONENT, discriminates=control(SVD), **post_hoc))
    # on fashion only: digits and camera are shorter than the sample B needs before it can skip rows
    report.declare(SampleClaim("Bsparse_changes_polylog_fashion", f"{B_SPARSE}: per-order growth exponent of the "
                               "number of subspace changes on fashion rows", "<=", POLYLOG_MAX_EXPONENT,
                               discriminates=control(SVD), **post_hoc))
    for alg, tag in ((B, "B"), (B_SPARSE, "Bsparse")):
        report.declare(Claim(f"{tag}_multiplicative_every_step", f"{alg}: max over runs and steps of (cost - (1+eps) "
                             "OPT - slack) / ||A^(t)||_F^2 (promise w.h.p.; <= 0: held at every step of every run)",
                             "<=", 0.0, discriminates=control(A), **post_hoc))  # A promises only cost <= OPT + eps F
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
    report.declare(Claim("Bsparse_samples_fraction_fashion", f"{B_SPARSE}: max over the fashion orders of the share "
                         "of rows sampled (each sample moves the subspace)", "<", MAX_SAMPLED_FRACTION,
                         kind=ClaimKind.SANITY, post_hoc=True))
    report.declare(Claim("lower_bound_forces_moves", "S3: min over D, FD and recompute SVD of the fraction of "
                         "complete phases (after the first) in which the subspace moved", ">=", 1.0,
                         kind=ClaimKind.SANITY))


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("consistent-lra", "Consistent low-rank approximation: recourse and the per-step promise on "
                    "adversarial and real row streams", size, seed)
    _declare(report)
    c = (s.oversampling, _choose_sparse_c(report, s, seed))
    runs: dict[str, list[dict[str, Run]]] = {"adversarial": [], "digits": [], "camera": [], "fashion": []}
    for i in range(s.adversarial_seeds):
        say(f"S1 adversarial alternation, instance {i + 1}/{s.adversarial_seeds}")
        runs["adversarial"].append(run_all(adversarial_rows(s.adversarial_rows, seed + i), "adversarial",
                                           ADVERSARIAL.rank, s.eps, c, seed + i))
    for i in range(s.digits_seeds):
        say(f"S2 digits, order {i + 1}/{s.digits_seeds}")
        runs["digits"].append(run_all(digits_rows(s.digits_rows, seed + i), "digits", DIGITS.rank, s.eps, c,
                                      seed + i))
    for i in range(s.camera_seeds):
        say(f"S2 camera, order {i + 1}/{s.camera_seeds}")
        runs["camera"].append(run_all(camera_rows(s.camera_rows, s.camera_column_stride, seed + i), "camera",
                                      CAMERA.rank, s.eps, c, seed + i))
    for i in range(s.fashion_seeds):
        say(f"S2 fashion, order {i + 1}/{s.fashion_seeds}")
        runs["fashion"].append(run_all(fashion_rows(s.fashion_rows, s.fashion_pool, seed + i), "fashion", FASHION.rank,
                                       s.eps, c, seed + i))
    all_runs = [r for per_stream in runs.values() for per_seed in per_stream for r in per_seed.values()]

    def per_seed(stream: str, alg: str, attr: str) -> list[float]:
        return [getattr(per[alg], attr) for per in runs[stream]]

    # Each recourse claim is also judged on its control: the consistent algorithms' claims on recompute-the-SVD,
    # the baselines' on the lazy additive algorithm (a claim both sides pass does not separate them).
    def measured_with_control(name: str, stream: str, alg: str, control_alg: str, attr: str = "exponent") -> None:
        report.measure(name, per_seed(stream, alg, attr))
        report.get_claim(name).measure_control(per_seed(stream, control_alg, attr))

    measured_with_control("A_recourse_logarithmic_adversarial", "adversarial", A, SVD)
    measured_with_control("B_recourse_logarithmic_adversarial", "adversarial", B, SVD)
    measured_with_control("svd_recourse_linear_adversarial", "adversarial", SVD, A)
    measured_with_control("fd_recourse_linear_adversarial", "adversarial", FD, A)
    measured_with_control("Bsparse_recourse_polylog_adversarial", "adversarial", B_SPARSE, SVD)
    for stream in REAL_STREAMS:
        measured_with_control(f"A_changes_logarithmic_{stream}", stream, A, SVD, "changes_exponent")
    measured_with_control("Bsparse_changes_polylog_fashion", "fashion", B_SPARSE, SVD, "changes_exponent")
    report.measure("D_recourse_logarithmic_adversarial", per_seed("adversarial", D, "exponent"))

    def worst(alg: str, attr: str = "worst_violation") -> float:
        return max(getattr(r, attr) for r in all_runs if r.algorithm == alg)

    for alg, tag in ((B, "B"), (B_SPARSE, "Bsparse")):
        report.measure(f"{tag}_multiplicative_every_step", worst(alg, "worst_multiplicative_violation"))
        # A's own promise is additive: whether it also met (1 + eps) OPT_t says whether the bar can be missed
        report.get_claim(f"{tag}_multiplicative_every_step").measure_control(worst(A, "worst_multiplicative_violation"))
    report.measure("Bsparse_samples_fraction_fashion", max(per[B_SPARSE].changed_fraction for per in runs["fashion"]))
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
    sweep = _eps_sweep(report, s, c, seed)
    moved = _lower_bound(report, s, c, seed)
    report.measure("lower_bound_forces_moves", min(moved[alg] for alg in (D, FD, SVD)))
    report.plots["recourse_vs_n"] = plot_recourse(runs, s.eps)
    report.plots["approximation_vs_n"] = plot_guarantees(runs, s.eps)
    _notes(report, s, c, sweep)
    return report.finish()


def _choose_sparse_c(report: Report, s: Settings, seed: int) -> float:
    """B''s c: the smallest in the grid whose run kept the (1 + eps) promise at every step on a validation order of
    each real stream (score = mean share of rows sampled; a broken promise scores nan, i.e. the point failed)."""
    streams = []
    for order in VALIDATION_ORDERS:
        for rows, rank in ((digits_rows(s.digits_rows, seed + order), DIGITS.rank),
                           (camera_rows(s.camera_rows, s.camera_column_stride, seed + order), CAMERA.rank),
                           (fashion_rows(s.fashion_rows, s.fashion_pool, seed + order), FASHION.rank)):
            x = np.ascontiguousarray(rows, dtype=np.float64)
            streams.append((x, rank, prefix_optimal_cost(torch.from_numpy(x), rank), seed + order))
    scores = []
    for c in s.sparse_grid:
        say(f"B' validation: c = {c}")
        fractions = []
        for rows, rank, opt, order_seed in streams:
            r = run_all(rows, "validation", rank, s.eps, (s.oversampling, c), order_seed, algorithms=(B_SPARSE,),
                        opt=opt)[B_SPARSE]
            fractions.append(r.changed_fraction if r.worst_violation <= 0 else math.nan)
        scores.append(mean(fractions))
    selection = select_from_scores(s.sparse_grid, scores, higher_is_better=False, param="c")
    report.record_arm(B_SPARSE, selection, {"validation_orders_per_stream": len(VALIDATION_ORDERS)})
    return float(selection.chosen)


def _rank(stream: str) -> int:
    return {"adversarial": ADVERSARIAL.rank, "digits": DIGITS.rank, "camera": CAMERA.rank,
            "fashion": FASHION.rank}[stream]


def _stream_tables(report: Report, runs: dict[str, list[dict[str, Run]]], s: Settings) -> None:
    cols = ["stream", "algorithm", "seeds", "rows", "recourse_mean", "recourse_std", "growth_exponent_mean",
            "path_length_mean", "changes_mean", "changes_exponent_mean", "recomputations_mean", "worst_ratio",
            "worst_additive_error", "worst_multiplicative_violation", "changed_fraction_mean",
            "promise_held_every_step", "seconds_mean"]
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
                  worst_multiplicative_violation=max(r.worst_multiplicative_violation for r in rs),
                  changed_fraction_mean=mean(r.changed_fraction for r in rs),
                  promise_held_every_step="yes" if all(r.worst_violation <= 0 for r in rs) else "NO",
                  seconds_mean=mean(r.seconds for r in rs))
    per = report.table("Per-seed growth exponents of cumulative recourse (last decade of each stream)",
                       ["stream", "algorithm", "per_seed_exponents", "per_seed_recourse"])
    for stream, per_stream in runs.items():
        for alg in ALGORITHMS:
            per.add(stream=stream, algorithm=alg,
                    per_seed_exponents=" ".join(f"{p[alg].exponent:.3f}" for p in per_stream),
                    per_seed_recourse=" ".join(f"{p[alg].total_recourse:.4g}" for p in per_stream))


def _eps_sweep(report: Report, s: Settings, c: tuple[float, float], seed: int) -> dict:
    t = report.table("S1 (first instance): recourse against eps for the consistent algorithms",
                     ["eps", "algorithm", "recourse", "changes", "growth_exponent", "recomputations",
                      "A_log_bound_recomputations", "worst_ratio"])
    rows = adversarial_rows(s.adversarial_rows, seed)
    out = {}
    for eps in s.eps_sweep:
        res = run_all(rows, "adversarial", ADVERSARIAL.rank, eps, c, seed, algorithms=(A, B, B_SPARSE, D))
        out[eps] = res
        for alg, r in res.items():
            t.add(eps=eps, algorithm=alg, recourse=r.total_recourse, changes=r.total_changes,
                  growth_exponent=r.exponent, recomputations=r.recomputations,
                  A_log_bound_recomputations=r.log_bound if r.log_bound is not None else "",
                  worst_ratio=r.worst_ratio)
    return out


def _lower_bound(report: Report, s: Settings, c: tuple[float, float], seed: int) -> dict[str, float]:
    rows, phase = lower_bound_phases(s.lower_bound_rows, 20, 5, s.eps, seed=seed)
    res = run_all(rows, "lower-bound", 5, s.eps, c, seed)
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


def _notes(report: Report, s: Settings, c: tuple[float, float], sweep: dict) -> None:
    report.note(f"eps = {s.eps} for every algorithm; FD's sketch has l = k + ceil(k/eps) rows (its promise is "
                f"1 + k/(l-k) <= 1 + eps); B's oversampling c = {c[0]}, B''s {c[1]} (chosen on validation orders); "
                f"p_t = min(1, c tau_t ln(t+1)/eps^2). "
                f"Rows fed in blocks of 500 (each block batched; the per-step record is the same as row by row).")
    report.note(f"Streams: S1 {s.adversarial_rows} rows x {s.adversarial_seeds} random instances; digits "
                f"{s.digits_rows or 1797} rows x {s.digits_seeds} orders; camera {s.camera_rows or 512} rows, "
                f"columns averaged in groups of {s.camera_column_stride} (d = {512 // s.camera_column_stride}), "
                f"x {s.camera_seeds} orders; fashion {s.fashion_rows} of the 60,000 training images x "
                f"{s.fashion_seeds} orders, pooled {s.fashion_pool}x{s.fashion_pool} (d = {(28 // s.fashion_pool) ** 2});"
                f" S3 {s.lower_bound_rows} rows.")
    report.note("B's claims on the real streams are made on fashion only: ridge-leverage sampling keeps every row until "
                "its sample reaches ~ c k ln(t) / eps^2 rows, which is more than digits' 1,797 or camera's 512 rows "
                "at any c that keeps the promise (the table's changed_fraction), so on those two B moves at most "
                "steps and cannot be told from the SVD.")
    report.note("Promise checks add a float64 rounding slack 8 eps64 (d + t) ||A^(t)||_F^2; for t <= k (OPT_t = 0) "
                "this makes the multiplicative promise mean 'every row so far lies in the subspace'.")
    report.note("Retired after the previous full run (all PASS, none discriminating): A/B_recourse_logarithmic_digits and "
                "_camera (the SVD's squared recourse grew as slowly) and B_guarantee_every_step (judged against the "
                "exact SVD, which meets any (1+eps) bar). Their replacements, labelled post hoc: the number of "
                "subspace changes on the real streams (the SVD changes at every row), B' at a small c (at the "
                "card's c B samples every row of the real streams, i.e. is the SVD), and B's promise judged "
                "against A (whose own promise is only additive).")
    report.note("The squared recourse rewards many small moves (m moves of size delta/m cost delta^2/m): on the "
                "randomly ordered real streams the recompute-every-step baseline drifts in small steps, so its "
                "squared recourse need not grow linearly there; the path length and the number of changes show the "
                "difference (the table). On S1 the swaps are of size ~2 and all measures agree.")


__all__ = ["run", "SIZES", "Settings"]
