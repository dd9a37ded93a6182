"""Reproduction `emac-autta`: active universal test-time adaptation on a corrupted Fashion-MNIST stream with held-out
classes, EMAC against unsupervised TTA, a SimATTA-like active baseline and four selectors at the same label budget.

Card emac-autta.md. A SmallResNet (batch norm, D = 64 > C = 6) pretrained here on clean classes 0-5 meets a stream of
four corruptions in sequence (noise, blur, contrast inversion, affine) that also holds classes 6-9 ("new", to be
rejected). Each arm adapts online (one Adam step per batch of 32 on the BN affine parameters) and predicts before
its update; the metric is the stream's H-score (harmonic mean of known-class accuracy and unknown rejection). Every
adapting arm's learning rate is chosen on a validation stream of other images (train part, its own seed), never
the evaluated one; the evaluated streams (test part) differ per seed, and all arms of a seed see the same stream,
so the claims pair over seeds. The region claims read the source model's pseudo-labels per region of the unknown-
energy partition, against a negative control that partitions at random with the same region sizes.
"""

from __future__ import annotations

import math
import statistics as st
from dataclasses import dataclass

from rankwise.core.arms import grid_step_neighbour, select_from_scores, select_with_extension
from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.repro.emac.arms import ARMS, LABELS, UNSUPERVISED, ArmRun, run_arm, shuffled_region_errors
from rankwise.repro.emac.data import DOMAINS, SEVERITY, evaluated_stream, source_model, validation_stream
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    per_domain: int  # evaluated-stream images per corruption
    val_per_domain: int  # validation-stream images per corruption
    batch: int
    budget: float
    lr_grid: tuple[float, ...]
    max_extend: int
    seeds: int
    pretrained: bool


SIZES = BySize(
    smoke=Settings(per_domain=24, val_per_domain=16, batch=16, budget=0.05, lr_grid=(1e-3,), max_extend=0, seeds=1,
                   pretrained=False),
    full=Settings(per_domain=1500, val_per_domain=750, batch=32, budget=0.03, lr_grid=(1e-4, 3e-4, 1e-3, 3e-3), max_extend=1,
                  seeds=5, pretrained=True),
)
TITLE = "EMAC on a corrupted Fashion-MNIST stream with held-out classes: H-score at a 3% label budget"
TESTBED = "fmnist-14px 0-5 known / 6-9 new, 4 corruptions severity 3, SmallResNet-1block, batch 32, budget 3%"


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("emac-autta", TITLE, size, seed)
    _declare(report)
    model, held_out, excluded = source_model(s.pretrained, seed)
    seeds = [seed + k for k in range(s.seeds)]
    val = validation_stream(s.val_per_domain, excluded)
    streams = {sd: evaluated_stream(s.per_domain, sd) for sd in seeds}
    runs: dict[str, list[ArmRun]] = {}
    val_scores: dict[str, float] = {}
    for arm in ARMS:
        go = lambda lr, sd, stream, arm=arm: run_arm(arm, model, stream, lr, sd, s.budget, s.batch)  # noqa: E731
        if arm == "source":  # nothing to tune
            v = go(0.0 + 1e-3, seeds[0], val)
            selection = select_from_scores([0.0], [v.h_score], True, "lr")
        else:
            def score(lr: float, arm=arm, go=go) -> float:
                h = go(lr, seeds[0], val).h_score
                say(f"{arm}: lr {lr:g} -> validation H-score {h:.2f}")
                return h if math.isfinite(h) else float("nan")

            selection = select_with_extension(s.lr_grid, score, True, "lr", s.max_extend, grid_step_neighbour(s.lr_grid))
        lr = float(selection.chosen) or 1e-3
        val_scores[arm] = selection.chosen_score
        runs[arm] = [go(lr, sd, streams[sd]) for sd in seeds]
        say(f"{arm}: test H-score {st.fmean(r.h_score for r in runs[arm]):.2f} (lr {lr:g})")
        first = runs[arm][0]
        report.record_arm(LABELS[arm], selection, {"stream_images": streams[seeds[0]].images.shape[0], "batch": s.batch,
                                                   "steps": first.steps, "label_budget": first.budget})
    report.check_budgets_matched(["stream_images", "batch", "steps"])
    best_unsup = max(UNSUPERVISED, key=lambda a: val_scores[a])
    controls = [shuffled_region_errors(model, streams[sd], sd, s.batch) for sd in seeds]
    _measure(report, runs, best_unsup, controls)
    _tables(report, runs, controls, best_unsup)
    _notes(report, s, held_out, seeds, streams[seeds[0]].images.shape[0], val.images.shape[0], best_unsup)
    report.plots["emac_h_scores"] = _plot(runs)
    return report.finish()


def _h(runs: dict[str, list[ArmRun]], arm: str) -> list[float]:
    return [r.h_score for r in runs[arm]]


def _declare(report: Report) -> None:
    what = "stream H-score (points), paired over seeds (same stream for every arm of a seed), at the same label budget:"
    for name, desc, arm in [
        ("emac_beats_entropy", "EMAC minus entropy selection (same loss)", "entropy"),
        ("emac_beats_random", "EMAC minus random selection (same loss)", "random"),
        ("mix_restriction_helps", "EMAC minus EMAC selecting from the whole batch (the ablation)", "emac-no-mix"),
        ("emac_beats_best_unsupervised", "EMAC minus the best unsupervised arm (TENT / SHOT-IM / open-set TENT, the one "
         "with the best validation H-score)", "best unsupervised"),
    ]:
        report.declare(PairedClaim(name, f"{what} {desc}", ">", 0.0, kind=ClaimKind.PAPER, discriminates=comparison(arm),
                                   testbed=TESTBED, n_min=3))
    for other in ("old", "new"):
        report.declare(PairedClaim(f"mix_error_exceeds_{other}", f"source model's pseudo-label error (points) in X_mix minus in "
                                   f"X_{other} of the unknown-energy partition, paired over seeds (paper: ~70-83% vs ~10-15%); "
                                   "control: a random partition with the same region sizes", ">", 10.0, kind=ClaimKind.PAPER,
                                   discriminates=control("random partition"), testbed=TESTBED, n_min=3))
    report.declare(PairedClaim("emac_beats_source", f"{what} EMAC minus the source model", ">", 0.0, kind=ClaimKind.SANITY, n_min=3))
    report.declare(Claim("budget_never_exceeded", "largest (labels spent - round(budget x stream)) over every run of every arm",
                         "<=", 0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("emac_selects_only_in_mix", "EMAC's annotated samples outside X_mix, all seeds", "<=", 0,
                         kind=ClaimKind.INVARIANT))


def _measure(report: Report, runs: dict[str, list[ArmRun]], best_unsup: str, controls: list[dict[str, float]]) -> None:
    emac = _h(runs, "emac")
    report.measure_paired("emac_beats_entropy", emac, _h(runs, "entropy"))
    report.measure_paired("emac_beats_random", emac, _h(runs, "random"))
    report.measure_paired("mix_restriction_helps", emac, _h(runs, "emac-no-mix"))
    report.measure_paired("emac_beats_best_unsupervised", emac, _h(runs, best_unsup))
    report.measure_paired("emac_beats_source", emac, _h(runs, "source"))
    source = runs["source"]
    for other in ("old", "new"):
        name = f"mix_error_exceeds_{other}"
        report.measure_paired(name, [r.region_errors["mix"] for r in source], [r.region_errors[other] for r in source])
        report.get_claim(name).measure_control([c["mix"] for c in controls], [c[other] for c in controls])
    report.measure("budget_never_exceeded", max(r.annotations - r.budget for rs in runs.values() for r in rs))
    report.measure("emac_selects_only_in_mix", sum(r.outside_mix for r in runs["emac"]))


def _cell(xs: list[float]) -> str:
    xs = [x for x in xs if math.isfinite(x)]
    return "n/a" if not xs else f"{st.fmean(xs):.2f} ± {st.pstdev(xs):.2f}"


def _tables(report: Report, runs: dict[str, list[ArmRun]], controls: list[dict[str, float]], best_unsup: str) -> None:
    t = report.table("Stream metrics (points, mean ± std over seeds); lr chosen on the validation stream",
                     ["arm", "H-score", "known acc", "unknown rejection", "labels spent / budget", "lr", "seconds"])
    for arm, rs in runs.items():
        t.add(arm=LABELS[arm] + (" (best unsupervised on validation)" if arm == best_unsup else ""),
              **{"H-score": _cell([r.h_score for r in rs]), "known acc": _cell([r.known_acc for r in rs]),
                 "unknown rejection": _cell([r.unknown_acc for r in rs]),
                 "labels spent / budget": f"{rs[0].annotations} / {rs[0].budget}",
                 "lr": "-" if arm == "source" else f"{rs[0].lr:g}", "seconds": f"{st.fmean(r.seconds for r in rs):.1f}"})
    g = report.table("Pseudo-label error per region of the unknown-energy partition (points, mean ± std over seeds; region "
                     "share of the stream)", ["model", "X_old", "X_mix", "X_new", "shares old / mix / new"])
    for arm in ("source", "emac"):
        rs = runs[arm]
        n = sum(rs[0].region_sizes.values())
        g.add(model=LABELS[arm], X_old=_cell([r.region_errors["old"] for r in rs]), X_mix=_cell([r.region_errors["mix"] for r in rs]),
              X_new=_cell([r.region_errors["new"] for r in rs]),
              **{"shares old / mix / new": " / ".join(f"{rs[0].region_sizes[k] / n:.0%}" for k in ("old", "mix", "new"))})
    g.add(model="control: random partition (source)", X_old=_cell([c["old"] for c in controls]),
          X_mix=_cell([c["mix"] for c in controls]), X_new=_cell([c["new"] for c in controls]), **{"shares old / mix / new": "same"})


def _notes(report: Report, s: Settings, held_out, seeds, n_stream: int, n_val: int, best_unsup: str) -> None:
    model = (f"SmallResNet (1 basic block per stage, 16/32/64 channels, batch norm) pretrained here on clean Fashion-MNIST "
             f"classes 0-5 at 14x14 (held-out accuracy {held_out:.1f}%)" if held_out is not None else
             "a seeded random SmallResNet (smoke: nothing is expected to hold)")
    report.note(f"Source model: {model}; features D = 64, C = 6 known classes; classes 6-9 are new.")
    report.note(f"Streams: {', '.join(DOMAINS)} (severity {SEVERITY}) in sequence, {s.per_domain} images each "
                f"({n_stream} in all, about 60% known), batch {s.batch}; validation stream {n_val} train-part images never "
                f"seen in pretraining. Seeds {seeds}: the evaluated stream's draw, order and corruption noise, and the "
                f"selectors' randomness; lr tuned on seed {seeds[0]} on the validation stream only.")
    report.note(f"Budget: {s.budget:.0%} of the stream (round(budget x N) labels), spread evenly over the batches; the oracle "
                "returns the class, or 'unknown' for classes 6-9. Active arms share one loss (MME + clustering-contrastive, "
                "tau 0.1 + cross-entropy on labels, the 16 most recent labelled images replayed each step); they differ "
                "only in selection. Every arm rejects by the same rule (the unknown-energy mixture's posterior > 0.5).")
    report.note(f"The best unsupervised arm (chosen on validation H-score, not on the evaluated streams): {LABELS[best_unsup]}.")


def _plot(runs: dict[str, list[ArmRun]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(runs)
    means = [st.fmean(r.h_score for r in runs[a]) if all(math.isfinite(r.h_score) for r in runs[a]) else 0.0 for a in names]
    errs = [st.pstdev(r.h_score for r in runs[a]) if all(math.isfinite(r.h_score) for r in runs[a]) else 0.0 for a in names]
    colours = ["tab:red" if a == "emac" else "tab:orange" if a == "emac-no-mix" else "tab:blue" for a in names]
    ax.bar(range(len(names)), means, yerr=errs, color=colours)
    ax.set_xticks(range(len(names)), [LABELS[a] for a in names], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("stream H-score (points)")
    fig.tight_layout()
    return fig


__all__ = ["run", "SIZES", "Settings"]
