"""Reproduction `pft-fer`: source-free personalisation of an expression classifier from neutral-only target frames,
PFT against source-only, AdaBN, SHOT-IM, NRC, neutral fine-tuning and PFT without stage 1.

Card pft-fer.md. Procedural 48x48 grey faces (`rankwise.data.faces`): 30 source subjects train the source CNN
(F -> B -> C) and PFT's stage 1; 10 held-out source-like subjects are the validation targets every arm is tuned on
(its Adam learning rate, on the first seed, by mean macro-F1); 10 target subjects are evaluated. Each arm adapts to each target
from that person's neutral frames only, then is tested on held-out neutral and expressive (pain action unit) frames
of that person. Metric: macro-F1 (and accuracy, expressive recall) per target, averaged over targets; the claims
pair the target-average over repetition seeds (each seed re-renders all frames and retrains the source model).
"""

from __future__ import annotations

import math
import statistics as st
import time
from dataclasses import dataclass


from rankwise.apps.vision.pft import PftConfig, expression_metrics, pretrain_translator
from rankwise.core.arms import grid_step_neighbour, select_from_scores, select_with_extension
from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.repro.pft_fer.arms import ARMS, LABELS, TUNED, adapt
from rankwise.repro.pft_fer.data import SOURCE, TARGETS, make_world, train_source_model
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    per_class_source: int  # frames per class per source subject
    adapt: int  # neutral frames per target (what adaptation sees)
    test: int  # test frames per class per target
    source_steps: int
    pretrain_steps: int
    steps: int  # adaptation steps, every training arm
    batch: int
    lr_grid: tuple[float, ...]
    max_extend: int
    seeds: int


SIZES = BySize(
    smoke=Settings(per_class_source=4, adapt=6, test=4, source_steps=5, pretrain_steps=5, steps=3, batch=8, lr_grid=(1e-3,),
                   max_extend=0, seeds=1),
    full=Settings(per_class_source=25, adapt=30, test=30, source_steps=600, pretrain_steps=400, steps=40, batch=16,
                  lr_grid=(1e-4, 1e-3, 1e-2), max_extend=2, seeds=5),
)
TITLE = "PFT on procedural faces: personalising a pain-expression classifier from neutral-only target frames"
TESTBED = "faces-48px 30 source / 10 validation / 10 target subjects, 5 pain AUs, CNN 12/24/48 + B 24 + WN-C, 2 classes"
METRICS = ("accuracy", "macro_f1", "expressive_recall", "neutral_recall")


def run(size: str = "smoke", seed: int = 0) -> Report:
    return run_with(SIZES[size], size, seed)


def run_with(s: Settings, size: str, seed: int) -> Report:
    report = Report("pft-fer", TITLE, size, seed)
    _declare(report)
    seeds = [seed + k for k in range(s.seeds)]
    seen_labels: list[int] = []
    observe = lambda images, labels: seen_labels.extend(labels.tolist())  # noqa: E731
    # results[arm][seed] = per-target metric dicts
    results: dict[str, dict[int, list[dict[str, float]]]] = {a: {} for a in ARMS}
    chosen: dict[str, float] = {}
    frozen_drift = 0.0
    held_acc = []
    t0 = time.perf_counter()
    for k, sd in enumerate(seeds):
        world = make_world(seed, 1000 * sd, s.per_class_source, s.adapt, s.test)
        model, acc = train_source_model(world.source, sd, s.source_steps)
        held_acc.append(acc)
        before = {n: p.detach().clone() for n, p in model.state_dict().items()}
        t = pretrain_translator(model, world.source.images, world.source.labels, world.source.subjects,
                                PftConfig(pretrain_steps=s.pretrain_steps, batch_size=max(s.batch, 32), seed=sd))

        def one(arm: str, lr: float, people, sd=sd, model=model, t=t) -> list[dict[str, float]]:
            out = []
            for person in people:
                m = adapt(arm, model, person.adapt, lr, s.steps, s.batch, sd, t, observe)
                out.append(expression_metrics(m, person.test.images, person.test.labels))
            return out

        if k == 0:  # tune every arm on the validation subjects of the first seed
            for arm in ARMS:
                if arm not in TUNED:
                    sel = select_from_scores([0.0], [_mean(one(arm, 0.0, world.validation), "macro_f1")], True, "lr")
                else:
                    def score(lr: float, arm=arm) -> float:
                        v = _mean(one(arm, lr, world.validation), "macro_f1")
                        say(f"{arm}: lr {lr:g} -> validation macro-F1 {v:.2f}")
                        return v if math.isfinite(v) else float("nan")
                    sel = select_with_extension(s.lr_grid, score, True, "lr", s.max_extend, grid_step_neighbour(s.lr_grid))
                chosen[arm] = float(sel.chosen)
                report.record_arm(LABELS[arm], sel, {"neutral_frames": s.adapt, "steps": s.steps if arm in TUNED else 0,
                                                     "batch": s.batch})
        for arm in ARMS:
            results[arm][sd] = one(arm, chosen[arm], world.targets)
        frozen_drift = max(frozen_drift, max(float((p - before[n]).abs().max()) for n, p in model.state_dict().items()))
        say(f"seed {sd}: " + ", ".join(f"{a} {_mean(results[a][sd], 'macro_f1'):.1f}" for a in ARMS)
            + f" ({time.perf_counter() - t0:.0f} s)")
    report.check_budgets_matched(["neutral_frames", "batch"])
    avg = {a: {m: [_mean(results[a][sd], m) for sd in seeds] for m in METRICS} for a in ARMS}
    _measure(report, avg, seen_labels, frozen_drift, held_acc)
    _tables(report, results, avg, seeds, chosen)
    report.note(f"Seeds {seeds} (population seed {seed}); learning rates tuned on seed {seeds[0]}'s 10 validation subjects "
                f"(held-out source people, never the evaluated targets) by mean macro-F1. Per target: {s.adapt} neutral "
                f"adaptation frames; test {s.test} neutral + {s.test} expressive frames. Source model: {s.source_steps} Adam "
                f"steps on {len(SOURCE)} subjects x {2 * s.per_class_source} frames (held-out-frame accuracy "
                f"{st.fmean(held_acc):.1f}%); stage 1: {s.pretrain_steps} steps; every training arm {s.steps} Adam steps, "
                f"batch {s.batch}.")
    report.plots["pft_macro_f1"] = _plot(avg)
    return report.finish()


def _mean(rows: list[dict[str, float]], key: str) -> float:
    vals = [r[key] for r in rows if math.isfinite(r[key])]
    return st.fmean(vals) if vals else float("nan")


def _declare(report: Report) -> None:
    f1 = "target-average macro-F1 (points), paired over seeds:"
    rec = "target-average expressive-class recall (points), paired over seeds:"
    report.declare(PairedClaim("pft_beats_source", f"{f1} PFT minus source only", ">", 0.0, kind=ClaimKind.PAPER,
                               discriminates=comparison("source only"), testbed=TESTBED, n_min=3))
    report.declare(PairedClaim("pft_beats_adabn", f"{f1} PFT minus AdaBN", ">", 0.0, kind=ClaimKind.PAPER,
                               discriminates=comparison("AdaBN"), testbed=TESTBED, n_min=3))
    report.declare(PairedClaim("stage1_helps", f"{f1} PFT minus PFT without stage 1 (T from the identity)", ">", 0.0,
                               kind=ClaimKind.PAPER, discriminates=comparison("PFT without stage 1"), testbed=TESTBED, n_min=3))
    for name, arm in (("shot_im_loses_recall", "SHOT-IM"), ("finetune_loses_recall", "neutral fine-tuning")):
        report.declare(PairedClaim(name, f"{rec} source only minus {arm} (neutral-only data collapse it); control: the "
                                   "same drop for PFT must not pass", ">", 5.0, kind=ClaimKind.PAPER,
                                   discriminates=control("PFT"), testbed=TESTBED, n_min=3))
    report.declare(Claim("stage2_sees_no_expressive_frame", "expressive-labelled frames received by PFT's stage-2 loop, all "
                         "runs", "<=", 0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("source_model_untouched", "largest change of any source-model tensor after all arms ran", "<=", 0.0,
                         kind=ClaimKind.INVARIANT))
    report.declare(Claim("source_model_learned", "source model accuracy on held-out frames of its own subjects (points, "
                         "mean over seeds)", ">", 80.0, kind=ClaimKind.SANITY))


def _measure(report: Report, avg, seen_labels: list[int], drift: float, held_acc: list[float]) -> None:
    f1 = lambda a: avg[a]["macro_f1"]  # noqa: E731
    recall = lambda a: avg[a]["expressive_recall"]  # noqa: E731
    report.measure_paired("pft_beats_source", f1("pft"), f1("source"))
    report.measure_paired("pft_beats_adabn", f1("pft"), f1("adabn"))
    report.measure_paired("stage1_helps", f1("pft"), f1("pft-no-stage1"))
    for name, arm in (("shot_im_loses_recall", "shot-im"), ("finetune_loses_recall", "finetune")):
        report.measure_paired(name, recall("source"), recall(arm))
        report.get_claim(name).measure_control(recall("source"), recall("pft"))
    report.measure("stage2_sees_no_expressive_frame", sum(1 for v in seen_labels if v != 0))
    report.measure("source_model_untouched", drift)
    report.measure("source_model_learned", st.fmean(held_acc))


def _cell(xs: list[float]) -> str:
    xs = [x for x in xs if math.isfinite(x)]
    return "n/a" if not xs else f"{st.fmean(xs):.1f} ± {st.pstdev(xs):.1f}"


def _tables(report: Report, results, avg, seeds: list[int], chosen: dict[str, float]) -> None:
    t = report.table("Target-average metrics (points, mean ± std over seeds); lr chosen on validation subjects",
                     ["arm", "macro-F1", "accuracy", "expressive recall", "neutral recall", "lr"])
    for a in ARMS:
        t.add(arm=LABELS[a], **{"macro-F1": _cell(avg[a]["macro_f1"]), "accuracy": _cell(avg[a]["accuracy"]),
                                "expressive recall": _cell(avg[a]["expressive_recall"]),
                                "neutral recall": _cell(avg[a]["neutral_recall"]),
                                "lr": "-" if a not in TUNED else f"{chosen[a]:g}"})
    for metric, title in (("macro_f1", "macro-F1"), ("accuracy", "accuracy"), ("expressive_recall", "expressive recall")):
        cols = ["target subject"] + [LABELS[a] for a in ARMS]
        p = report.table(f"Per target subject: {title} (points, mean over seeds)", cols)
        for i, subject in enumerate(TARGETS):
            p.add(**{"target subject": str(subject)},
                  **{LABELS[a]: _cell([results[a][sd][i][metric] for sd in seeds]) for a in ARMS})
        p.add(**{"target subject": "average"}, **{LABELS[a]: _cell(avg[a][metric]) for a in ARMS})


def _plot(avg):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for j, (metric, colour) in enumerate((("macro_f1", "tab:blue"), ("expressive_recall", "tab:red"))):
        means = [st.fmean(avg[a][metric]) if all(math.isfinite(v) for v in avg[a][metric]) else 0.0 for a in ARMS]
        ax.bar([i + 0.4 * j for i in range(len(ARMS))], means, width=0.4, color=colour, label=metric.replace("_", " "))
    ax.set_xticks([i + 0.2 for i in range(len(ARMS))], [LABELS[a] for a in ARMS], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("points (target average)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["run", "run_with", "SIZES", "Settings"]
