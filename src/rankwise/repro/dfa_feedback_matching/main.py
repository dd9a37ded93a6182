"""Reproduction `dfa-feedback-matching`: fine-tuning a BP-pretrained network with direct feedback alignment, with
and without feedback-weight matching (card dfa-feedback-matching.md; feasibility review §3).

Testbed (the card's FCN transfer, standing in for CIFAR-100 -> SVHN): fully connected tanh nets 784 -> 256 x (L-1)
-> 10 with L = 4 and 6 weight layers, pretrained with backprop on Fashion-MNIST (all ten classes, 20k images,
`models.vision.pretrained_backbone`, cached), fine-tuned on scikit-learn's digits upscaled to 28x28 with a new
10-way head. Per seed: a stratified split of the digits (train / validation / test), a new head fitted on the
frozen features (BP = DFA on the last layer), then every arm for the same steps and batches (SGD, momentum 0.9):

- BP (the reference, backprop on every layer), DFA_fine (DFA from the pretrained weights, random F ~ N(0, 1/10)),
  DFA_scratch (DFA from a fresh network and head), FWM (feedback + weight matching, then DFA with weight decay λ),
  FWM without weight decay, and the two halves: feedback matching only (F̄, pretrained weights kept) and weight
  matching only (W̄ = F̄ F̄ᵀ, but DFA with random F).

Every arm's learning rate is chosen on the validation split at the first seed (grid extended off an edge); FWM's λ
too (the halves use FWM's λ, DFA_fine / DFA_scratch / FWM-without-decay have none); the other seeds run at the
choice. Claims are paired over seeds on the test split, at the same number of steps. Accuracy right after matching
(before any step) is reported, with the weight alignment (WA) and gradient alignment (GA) at t = 0 and at the end.
"""

from __future__ import annotations

import statistics as st
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rankwise.core.arms import Selection, grid_step_neighbour, select_with_extension, tune_then_seeds
from rankwise.core.discrimination import comparison
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.data.vision import load_digits_images, resize, split, subset
from rankwise.repro.dfa_feedback_matching.arms import (ARMS, BP, DFA_FINE, DFA_SCRATCH, FEEDBACK_ONLY, FWM, FWM_NO_WD,
                                                       WEIGHT_ONLY, FineTune, RunResult, Split, run_arm,
                                                       with_fitted_head)
from rankwise.repro.dfa_feedback_matching.backbone import FullyConnectedNet, fcn_recipe
from rankwise.repro.setup import BySize

SHALLOW, DEEP = 4, 6


@dataclass(frozen=True)
class Settings:
    depths: tuple[int, ...]
    hidden: int
    pretrain_examples: int | None  # None: a random stand-in (smoke), no pretraining
    pretrain_epochs: int
    digits: int | None  # a subset of the 1,797 digits (smoke), None: all
    fractions: tuple[float, float, float]  # train / validation / test
    ft: FineTune
    lr_grid: tuple[float, ...]
    lam_grid: tuple[float, ...]
    max_extend: int
    seeds: int


SIZES = BySize(
    smoke=Settings(depths=(SHALLOW, DEEP), hidden=16, pretrain_examples=None, pretrain_epochs=0, digits=300,
                   fractions=(0.5, 0.2, 0.3), ft=FineTune(steps=4, batch=32, momentum=0.9, warmup_ratio=0.0,
                                                          eval_every=2, head_steps=4, head_lr=1e-2),
                   lr_grid=(0.03,), lam_grid=(1e-3,), max_extend=0, seeds=2),
    full=Settings(depths=(SHALLOW, DEEP), hidden=256, pretrain_examples=20_000, pretrain_epochs=5, digits=None,
                  fractions=(0.55, 0.15, 0.30), ft=FineTune(steps=300, batch=64, momentum=0.9, warmup_ratio=0.05,
                                                            eval_every=50, head_steps=200, head_lr=1e-2),
                  lr_grid=(0.01, 0.03, 0.1), lam_grid=(1e-3, 1e-2, 1e-1), max_extend=2, seeds=10),
)
TESTBED = ("FCN 784-256x(L-1)-10 tanh, BP-pretrained on Fashion-MNIST (10 classes, 20k images), fine-tuned on sklearn "
           "digits upscaled to 28x28 with a new head; 300 SGD steps of 64, split and head per seed")


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("dfa-feedback-matching", "DFA fine-tuning of a BP-pretrained FCN: feedback-weight matching vs "
                    "DFA_fine, DFA_scratch, ablations and BP (Fashion-MNIST -> digits)", size, seed)
    _declare(report)
    digits = resize(load_digits_images(), 28)
    if s.digits is not None:
        digits = subset(digits, s.digits, seed)
    seeds = [seed + k for k in range(s.seeds)]
    splits = {sd: _split(digits, sd, s.fractions) for sd in seeds}
    results: dict[int, dict[str, list[RunResult]]] = {}
    pretrain_accuracy: dict[int, float] = {}
    for depth in s.depths:
        pretrained, pretrain_accuracy[depth] = _pretrained(depth, s, seed)
        say(f"L={depth}: fitting a new head per seed on the frozen features")
        starts = {sd: with_fitted_head(pretrained, splits[sd], sd, s.ft) for sd in seeds}
        results[depth] = _tune_and_run(report, depth, s, seeds, starts, splits)
    report.check_budgets_matched(["steps", "batch", "examples_seen"])
    _measure(report, results, pretrain_accuracy, s)
    _tables(report, results, s)
    _notes(report, s, splits, seeds, pretrain_accuracy)
    report.plots["dfa_fwm"] = _plot(results, s)
    return report.finish()


def _split(digits, sd: int, fractions) -> Split:
    parts = [split(digits, part, sd, fractions) for part in ("train", "val", "test")]
    return Split(*[(p.images, p.labels) for p in parts])


def _pretrained(depth: int, s: Settings, seed: int) -> tuple[torch.nn.Module, float]:
    if s.pretrain_examples is None:  # smoke: a seeded random network of the same family
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return FullyConnectedNet(hidden=s.hidden, depth=depth).eval(), float("nan")
    from rankwise.models.vision import pretrained_backbone

    backbone = pretrained_backbone(fcn_recipe(depth, s.hidden, s.pretrain_examples, s.pretrain_epochs))
    return backbone.module, backbone.held_out_accuracy


def _tune_and_run(report: Report, depth: int, s: Settings, seeds: list[int], starts, splits) -> dict[str, list[RunResult]]:
    """Each arm tuned on validation at seeds[0] (FWM over (lr, λ); its halves at FWM's λ), then every seed."""

    def fresh(sd: int) -> FullyConnectedNet:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(10_000 + sd)
            return FullyConnectedNet(hidden=s.hidden, depth=depth)

    def go(arm: str, lr: float, lam: float, sd: int) -> RunResult:
        return run_arm(arm, lr, lam, sd, starts[sd], fresh, splits[sd], s.ft)

    budget = {"steps": s.ft.steps, "batch": s.ft.batch, "examples_seen": s.ft.steps * s.ft.batch}
    out: dict[str, list[RunResult]] = {}
    lam_chosen = 0.0
    for arm in (BP, DFA_FINE, DFA_SCRATCH, FWM, FWM_NO_WD, FEEDBACK_ONLY, WEIGHT_ONLY):
        label = f"L={depth} {arm}"
        if arm == FWM:
            lr_sel, lam_sel, runs = _tune_fwm(go, s, seeds[0], label)
            lam_chosen = float(lam_sel.chosen)
            report.record_arm(f"{label}: weight decay", lam_sel, budget)
            lr = float(lr_sel.chosen)
            out[arm] = [runs[(lr, lam_chosen)]] + [go(arm, lr, lam_chosen, sd) for sd in seeds[1:]]
        else:
            lam = lam_chosen if ARMS[arm].decay else 0.0
            tuned = tune_then_seeds(s.lr_grid, lambda lr, sd, arm=arm, lam=lam: go(arm, lr, lam, sd), seeds,
                                    score=lambda r: r.val_accuracy, higher_is_better=True, param="lr",
                                    max_extend=s.max_extend, label=label, score_name="validation accuracy")
            lr_sel, out[arm] = tuned.selection, tuned.seed_runs
        report.record_arm(label, lr_sel, budget)
        say(f"{label}: lr {out[arm][0].lr:g}, test accuracy {st.fmean(r.test_accuracy for r in out[arm]):.4f} "
            f"over {len(seeds)} seeds")
    return out


def _tune_fwm(go: Callable[..., RunResult], s: Settings, sd: int, label: str
              ) -> tuple[Selection, Selection, dict[tuple[float, float], RunResult]]:
    """λ on its grid (extended off an edge), each λ scored by its best learning rate (the lr grid extended too)."""
    runs: dict[tuple[float, float], RunResult] = {}
    lr_selections: dict[float, Selection] = {}

    def at(lr: float, lam: float) -> float:
        runs[(lr, lam)] = go(FWM, lr, lam, sd)
        say(f"{label}: lr {lr:.3g}, λ {lam:.3g} -> validation accuracy {runs[(lr, lam)].val_accuracy:.4f}")
        return runs[(lr, lam)].val_accuracy

    def lam_score(lam: float) -> float:
        sel = select_with_extension(s.lr_grid, lambda lr: at(lr, lam), True, "lr", s.max_extend,
                                    grid_step_neighbour(s.lr_grid))
        lr_selections[lam] = sel
        return sel.chosen_score

    lam_sel = select_with_extension(s.lam_grid, lam_score, True, "weight_decay", s.max_extend,
                                    grid_step_neighbour(s.lam_grid))
    return lr_selections[float(lam_sel.chosen)], lam_sel, runs


# --------------------------------------------------------------------------------------------------------- claims

P = ClaimKind.PAPER


def _declare(report: Report) -> None:
    acc = "test accuracy (points) after the same fine-tuning steps"
    for depth in (DEEP, SHALLOW):
        report.declare(PairedClaim(f"fwm_beats_dfa_fine_L{depth}", f"L={depth}: {acc}, FWM minus DFA_fine (paper: FWM "
                                   "fine-tunes where DFA from BP weights lags, e.g. CIFAR-100 -> SVHN +7.97)", ">", 0.0,
                                   kind=P, discriminates=comparison(DFA_FINE), testbed=TESTBED))
    report.declare(PairedClaim("fwm_gap_grows_with_depth", f"{acc}: (FWM - DFA_fine) at L={DEEP} minus at L={SHALLOW} "
                               "(paper: 4 -> 6 layers costs FWM 0.20, DFA_fine 4.85)", ">", 0.0, kind=P,
                               discriminates=comparison(DFA_FINE), testbed=TESTBED))
    report.declare(PairedClaim(f"fwm_beats_dfa_scratch_L{DEEP}", f"L={DEEP}: {acc}, FWM minus DFA_scratch", ">", 0.0,
                               kind=P, discriminates=comparison(DFA_SCRATCH), testbed=TESTBED))
    report.declare(PairedClaim(f"weight_decay_helps_fwm_L{DEEP}", f"L={DEEP}: {acc}, FWM (tuned λ) minus FWM with λ = 0 "
                               "(paper: weight decay is part of the method, Prop. 4.2)", ">", 0.0, kind=P,
                               discriminates=comparison(FWM_NO_WD), testbed=TESTBED))
    report.declare(PairedClaim(f"fwm_beats_feedback_only_L{DEEP}", f"L={DEEP}: {acc}, FWM minus feedback matching only "
                               "(the ablation keeping the pretrained weights)", ">", 0.0, kind=P,
                               discriminates=comparison(FEEDBACK_ONLY), testbed=TESTBED))
    report.declare(PairedClaim(f"fwm_beats_weight_only_L{DEEP}", f"L={DEEP}: {acc}, FWM minus weight matching only "
                               "(the ablation training with random F)", ">", 0.0, kind=P,
                               discriminates=comparison(WEIGHT_ONLY), testbed=TESTBED))
    report.declare(PairedClaim(f"bp_above_fwm_L{DEEP}", f"L={DEEP}: {acc}, BP minus FWM (paper: BP fine-tuning stays "
                               "above FWM, an upper bound)", ">", 0.0, kind=P, discriminates=comparison(BP),
                               testbed=TESTBED))
    report.declare(PairedClaim(f"fwm_raises_ga_at_start_L{DEEP}", f"L={DEEP}: mean gradient alignment of the hidden "
                               "layers with BP at t = 0 (first batch), FWM minus DFA_fine (paper: FWM starts in the "
                               "strong-alignment regime)", ">", 0.0, kind=P, discriminates=comparison(DFA_FINE),
                               testbed=TESTBED))
    report.declare(Claim("wa_one_after_matching", "max |1 - WA| over the matched middle and output layers right after "
                         "feedback-weight matching (FWM runs, every depth and seed)", "<=", 1e-6, kind=ClaimKind.INVARIANT))
    report.declare(Claim("feedback_fixed", "max |F_end - F_start| over every DFA layer of every DFA run (F is never "
                         "updated)", "<=", 0.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("output_update_is_bp", "max |1 - GA| of the output layer at t = 0 over every DFA run (the "
                         "output layer's DFA update is BP's)", "<=", 1e-6, kind=ClaimKind.INVARIANT))
    report.declare(Claim("pretraining_learned", "held-out Fashion-MNIST accuracy of the least accurate pretrained FCN",
                         ">", 0.8, kind=ClaimKind.SANITY))
    report.declare(PairedClaim("finetuning_beats_head_only", f"L={DEEP}: test accuracy (points), BP fine-tuning minus "
                               "the fitted head on frozen features (there is something to fine-tune)", ">", 0.0,
                               kind=ClaimKind.SANITY))


def _points(runs: list[RunResult]) -> list[float]:
    return [100.0 * r.test_accuracy for r in runs]


def _measure(report: Report, results, pretrain_accuracy: dict[int, float], s: Settings) -> None:
    for depth in (DEEP, SHALLOW):
        r = results[depth]
        report.measure_paired(f"fwm_beats_dfa_fine_L{depth}", _points(r[FWM]), _points(r[DFA_FINE]))
    gap = {d: [a - b for a, b in zip(_points(results[d][FWM]), _points(results[d][DFA_FINE]))] for d in (DEEP, SHALLOW)}
    report.measure_paired("fwm_gap_grows_with_depth", gap[DEEP], gap[SHALLOW])
    deep = results[DEEP]
    for name, baseline in ((f"fwm_beats_dfa_scratch_L{DEEP}", DFA_SCRATCH), (f"weight_decay_helps_fwm_L{DEEP}", FWM_NO_WD),
                           (f"fwm_beats_feedback_only_L{DEEP}", FEEDBACK_ONLY),
                           (f"fwm_beats_weight_only_L{DEEP}", WEIGHT_ONLY)):
        report.measure_paired(name, _points(deep[FWM]), _points(deep[baseline]))
    report.measure_paired(f"bp_above_fwm_L{DEEP}", _points(deep[BP]), _points(deep[FWM]))
    report.measure_paired(f"fwm_raises_ga_at_start_L{DEEP}", [RunResult.hidden_mean(r.ga_start) for r in deep[FWM]],
                          [RunResult.hidden_mean(r.ga_start) for r in deep[DFA_FINE]])
    fwm_runs = [r for d in results for r in results[d][FWM] + results[d][FWM_NO_WD]]
    report.measure("wa_one_after_matching", max(abs(1.0 - v) for r in fwm_runs for v in r.wa_start.values()))
    dfa_runs = [r for d in results for a, runs in results[d].items() if a != BP for r in runs]
    report.measure("feedback_fixed", max(r.feedback_change for r in dfa_runs))
    report.measure("output_update_is_bp", max(abs(1.0 - r.head_ga) for r in dfa_runs))
    known = [v for v in pretrain_accuracy.values() if v == v]
    if not known:  # smoke: random stand-ins, nothing was pretrained
        report.get_claim("pretraining_learned").withhold("smoke run: the networks are random stand-ins, not pretrained")
    report.measure("pretraining_learned", min(known) if known else None)
    report.measure_paired("finetuning_beats_head_only", _points(deep[BP]), [100.0 * r.before_matching for r in deep[BP]])


# --------------------------------------------------------------------------------------------------- the report

def _mean_sd(xs: list[float], scale: float = 1.0) -> str:
    xs = [scale * x for x in xs if x == x]
    if not xs:
        return "-"
    return f"{st.fmean(xs):.2f} ± {st.pstdev(xs):.2f}" if scale != 1.0 else f"{st.fmean(xs):.3f} ± {st.pstdev(xs):.3f}"


def _tables(report: Report, results, s: Settings) -> None:
    t = report.table("Per depth and arm (mean ± sd over seeds; accuracies in points on the test split): the tuned rates, "
                     "accuracy before and right after matching (t = 0, no step yet), after fine-tuning; mean WA and GA "
                     "of the hidden layers at t = 0 and at the end",
                     ["L", "arm", "lr", "λ", "val acc", "test acc before matching", "test acc after matching",
                      "test acc after fine-tuning", "WA t=0", "WA end", "GA t=0", "GA end", "matched layers", "diverged seeds"])
    for depth, arms in results.items():
        for arm, runs in arms.items():
            dfa = arm != BP
            t.add(L=depth, arm=arm, lr=runs[0].lr, **{"λ": runs[0].lam if ARMS[arm].decay else 0.0,
                  "val acc": _mean_sd([r.val_accuracy for r in runs], 100.0),
                  "test acc before matching": _mean_sd([r.before_matching for r in runs], 100.0),
                  "test acc after matching": _mean_sd([r.after_matching for r in runs], 100.0),
                  "test acc after fine-tuning": _mean_sd([r.test_accuracy for r in runs], 100.0),
                  "WA t=0": _mean_sd([_mean(r.wa_start) for r in runs]) if dfa else "-",
                  "WA end": _mean_sd([_mean(r.wa_end) for r in runs]) if dfa else "-",
                  "GA t=0": _mean_sd([RunResult.hidden_mean(r.ga_start) for r in runs]) if dfa else "1 (BP)",
                  "GA end": _mean_sd([RunResult.hidden_mean(r.ga_end) for r in runs]) if dfa else "1 (BP)",
                  "matched layers": runs[0].matched_layers, "diverged seeds": sum(r.diverged for r in runs)})
    g = report.table("Gradient alignment with BP per hidden layer (mean over seeds), t = 0 / end",
                     ["L", "arm", *[f"layer {i + 1}" for i in range(max(s.depths) - 1)]])
    for depth, arms in results.items():
        for arm, runs in arms.items():
            if arm == BP:
                continue
            names = list(runs[0].ga_start)
            g.add(L=depth, arm=arm, **{f"layer {i + 1}": f"{st.fmean(r.ga_start[n] for r in runs):.3f} / "
                                       f"{st.fmean(r.ga_end.get(n, float('nan')) for r in runs):.3f}"
                                       for i, n in enumerate(names)})


def _mean(values: dict[str, float]) -> float:
    return st.fmean(values.values()) if values else float("nan")


def _notes(report: Report, s: Settings, splits, seeds, pretrain_accuracy) -> None:
    sizes = {k: len(v[1]) for k, v in zip(("train", "val", "test"), (splits[seeds[0]].train, splits[seeds[0]].val,
                                                                      splits[seeds[0]].test))}
    ft = s.ft
    report.note(f"Data: sklearn digits (8x8) upscaled to 28x28 (antialiased bilinear), a stratified split per seed: "
                f"{sizes['train']} train / {sizes['val']} validation / {sizes['test']} test. Pretraining: Fashion-MNIST "
                f"train part, all 10 classes, {s.pretrain_examples} images, {s.pretrain_epochs} epochs of AdamW "
                f"(lr 1e-3, batch 128); held-out accuracy {pretrain_accuracy}.")
    report.note(f"Networks: FCN 784-{s.hidden}x(L-1)-10, tanh, L in {list(s.depths)} weight layers (the card's 4- and "
                "6-layer FCNs; tanh, DFA's classic setting, fixed before any run). DFA trains every hidden Linear with "
                "its tanh fused (δ = (F e) ⊙ (1 - h²)) and the head with e hᵀ; random F ~ N(0, 1/10), seeded per run.")
    report.note(f"Fine-tuning: a new head fitted first on frozen features ({ft.head_steps} AdamW steps, lr {ft.head_lr}, "
                f"shared by every arm but DFA_scratch), then {ft.steps} steps of SGD (momentum {ft.momentum}, batch "
                f"{ft.batch}, {ft.warmup_ratio:.0%} warm-up + cosine, no clipping) on the same batches for every arm. "
                f"FWM: the card's least-squares reading (F̄_{{L-1}} = W_Lᵀ, F̄_{{l-1}} = (F̄_l⁺ W_l)ᵀ, W̄_l = F̄_l F̄_{{l-1}}ᵀ "
                "for the middle layers, W_1 and the fitted head kept); the authors' solver was not retrievable.")
    report.note(f"Tuning: lr grid {list(s.lr_grid)} for every arm, FWM's λ on {list(s.lam_grid)} (each λ at its best lr), "
                f"grids extended at their own step off an edge up to {s.max_extend} times, by validation accuracy at seed "
                f"{seeds[0]}; that run is seed {seeds[0]}'s measured run. The ablations use FWM's λ. Seeds {seeds} vary "
                "the digits split, the new head, the random feedback and the batch order; intervals are over those.")
    report.note("Weight matching sets each middle layer to rank <= 10 (the classes): the 'after matching' column shows "
                "what that projection costs before any step (the card's pitfall).")


def _plot(results, s: Settings):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results) + 1, figsize=(5 * (len(results) + 1), 3.8))
    for ax, (depth, arms) in zip(axes, results.items()):
        for arm, runs in arms.items():
            curves = [r.val_curve for r in runs if r.val_curve]
            if not curves:
                continue
            steps = [c[0] for c in curves[0]]
            mean = [st.fmean(100 * c[i][1] for c in curves) for i in range(len(curves[0]))]
            ax.plot(steps, mean, marker="o", ms=3, label=arm)
        ax.set_title(f"L = {depth}: validation accuracy (mean over seeds)")
        ax.set_xlabel("fine-tuning step")
        ax.set_ylabel("accuracy (points)")
        ax.legend(fontsize=7)
    ax = axes[-1]
    deep = results[max(results)]
    names = [a for a in deep if a != BP]
    ax.bar([i - 0.2 for i in range(len(names))], [st.fmean(RunResult.hidden_mean(r.ga_start) for r in deep[a]) for a in names],
           0.4, label="t = 0")
    ax.bar([i + 0.2 for i in range(len(names))], [st.fmean(RunResult.hidden_mean(r.ga_end) for r in deep[a]) for a in names],
           0.4, label="end")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
    ax.set_title(f"L = {max(results)}: mean hidden-layer GA with BP")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["run", "SIZES", "Settings"]
