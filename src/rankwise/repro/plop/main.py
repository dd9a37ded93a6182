"""Reproduction `plop`: LoRA on the lowest-NFN module types matches the best heuristic placement and beats PLoP^-1.

Card plop.md, scaled to CPU:
- Part 1 (scores): NFN of SmolLM2-135M-Instruct's 7 module types over all 30 layers on the task's training text;
  ranking stability between two disjoint halves of the texts and across 3 random-baseline seeds (Kendall tau).
- Part 2 (placement): generative fine-tuning of SmolLM2's top layers (the prefix below them frozen and cached) by
  next-token loss on the wiki articles of one topic. PLoP's choice is the 3 lowest-NFN types of the adaptable layers;
  arms: PLoP, PLoP^-1 (the 3 highest), attention (Q, K, V) and MLP (gate, up, down), at equal trainable parameters
  (ranks set to the budget of rank `base_rank` on PLoP's types), each with its own learning rate chosen by validation
  NLL (the topic's calibration-split articles) on a grid extended off an edge, same steps, batch and seeds. Metric:
  held-out NLL on the topic's eval-split articles; claims on paired per-seed NLL gains over the base model.
"""

from __future__ import annotations

import statistics as stats_
from dataclasses import dataclass

import torch

from rankwise.adapters import AdaptedModel
from rankwise.adapters.plop import (
    NFNScores, kendall_tau, lora_parameters_per_rank, nfn_scores_for_seeds, plop_targets, rank_for_budget, type_label,
)
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.data.topic_windows import topic_stream, topic_windows
from rankwise.data.windows import cut_windows
from rankwise.repro.plop.arms import ArmResult, ArmRunner, Placement
from rankwise.repro.setup import BySize, experiment_model
from rankwise.training.frozen_prefix import FrozenPrefixRunner
from rankwise.training.top_layers_lm import CachedWindows, TopLayersLM


@dataclass(frozen=True)
class Settings:
    topic: str
    score_examples: int  # windows NFN is scored on (Part 1 and PLoP's choice)
    score_len: int
    score_batch: int
    top_layers: int  # adaptable layers (the rest is a frozen, cached prefix)
    seq_len: int  # fine-tuning window length
    train_windows: int
    val_windows: int
    test_windows: int
    steps: int
    batch: int
    base_rank: int  # LoRA rank on PLoP's types; it sets the shared trainable-parameter budget
    lr_grid: tuple[float, ...]  # every arm's starting grid
    max_extensions: int  # extra grid points an arm may add off an edge
    seeds: int


SIZES = BySize(
    smoke=Settings(topic="Technology", score_examples=8, score_len=16, score_batch=4, top_layers=1, seq_len=8,
                   train_windows=8, val_windows=4, test_windows=4, steps=3, batch=2, base_rank=4,
                   lr_grid=(1e-3, 3e-3), max_extensions=0, seeds=2),
    full=Settings(topic="Physical sciences", score_examples=64, score_len=64, score_batch=16, top_layers=2, seq_len=33,
                  train_windows=400, val_windows=128, test_windows=192, steps=200, batch=4, base_rank=16,
                  lr_grid=(1e-3, 3e-3, 1e-2), max_extensions=2, seeds=6),
)
# Declared before any run. "Matches" is non-inferiority: PLoP's NLL gain may trail the best heuristic's by at most
# this many nats per token (about 1% perplexity).
MATCH_MARGIN = -0.01
# The SmolLM2 testbed replaced MiniLM classification after plop_beats_inverse FAILed and plop_matches_best_heuristic
# was INCONCLUSIVE there (2026-12-01); protocol 2 kept the old names. Issue 24 gives the SmolLM2 claims their own
# names, labelled post hoc, and restores the MiniLM verdicts as retired claims, which keep counting.
TESTBED = "SmolLM2-135M top-2-layer LM, one wiki topic"
MINILM_RETIRED = "MiniLM classification testbed (the first full run); the claim's name moved to the SmolLM2 testbed"
BUDGET_TOLERANCE = 0.05  # relative spread of trainable parameters across arms that still counts as "equal"
ATTENTION = ("q_proj", "k_proj", "v_proj")
MLP_TYPES = ("gate_proj", "up_proj", "down_proj")
PLOP, INVERSE, ATTN, MLP = "PLoP (lowest 3)", "PLoP^-1 (highest 3)", "attention (Q,K,V)", "MLP (gate,up,down)"
HEURISTICS = (ATTN, MLP)


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("plop", "PLoP: LoRA on the lowest-NFN module types vs heuristic placements at equal budget", size, seed)
    _declare_claims(report)
    set_seed(seed)
    model, tok = experiment_model("smollm2-135m", size, seed)
    return _run(report, s, seed, model, tok)


def _declare_claims(report: Report) -> None:
    paper = dict(kind=ClaimKind.PAPER, testbed=TESTBED, post_hoc=True)
    report.declare(PairedClaim("smollm2_plop_matches_best_heuristic", "per-seed test-NLL gain over the base model "
                               "(nats/token) of PLoP minus that of the better heuristic (attention / MLP, the one with the "
                               "lower validation NLL); non-inferior within the margin", ">=", MATCH_MARGIN, **paper))
    report.declare(PairedClaim("smollm2_plop_noninferior_to_mlp", "per-seed test-NLL gain of PLoP minus the MLP "
                               "placement's (nats/token); non-inferior within the margin", ">=", MATCH_MARGIN, **paper))
    report.declare(PairedClaim("smollm2_plop_beats_inverse", "per-seed test-NLL gain of PLoP minus PLoP^-1's "
                               "(nats/token)", ">", 0.0, **paper))
    for name in ("plop_beats_inverse", "plop_matches_best_heuristic"):
        report.recall_hidden_verdict(name, MINILM_RETIRED)
    # A precondition of using NFN to place adapters, not the paper's result: a check (re-kinded from paper in issue 24).
    report.declare(Claim("nfn_ranking_stable_across_halves", "Kendall tau of SmolLM2 type rankings (all layers) from "
                         "two disjoint halves of the texts", ">=", 0.7, kind=ClaimKind.SANITY, post_hoc=True))
    report.declare(Claim("ranking_stable_across_seeds", "min Kendall tau of SmolLM2 type rankings across 3 random-baseline seeds",
                         ">=", 0.9, kind=ClaimKind.SANITY))
    report.declare(Claim("every_arm_improves", "min over arms and seeds of the test-NLL gain over the base model (nats/token)",
                         ">", 0.0, kind=ClaimKind.SANITY))
    report.declare(Claim("frozen_prefix_exact", "max |full-model logits - cached-prefix logits| / max |logits| on a test window",
                         "<=", 1e-5, kind=ClaimKind.INVARIANT))


def _run(report: Report, s: Settings, seed: int, model, tok) -> Report:
    n_layers = model.config.num_hidden_layers
    top = list(range(n_layers - s.top_layers, n_layers))
    seeds = [seed + k for k in range(s.seeds)]

    # ---- Part 1: NFN on the task's training text, all layers ------------------------------------------------------
    say("Part 1: NFN scores on SmolLM2")
    score_windows = cut_windows(topic_stream(tok, "train", s.topic), s.score_len, s.score_examples)
    batches = list(score_windows.split(s.score_batch))
    by_seed = nfn_scores_for_seeds(model, batches, [seed, seed + 1, seed + 2], desc="NFN SmolLM2")
    scores = by_seed[seed]
    half = len(batches) // 2
    first, second = (scores.subset(range(half)), scores.subset(range(half, len(batches)))) if half else (scores, scores)
    tau_halves = kendall_tau(first.ranking(), second.ranking()) if half else float("nan")
    tau_seeds = min(kendall_tau(scores.ranking(), by_seed[sd].ranking()) for sd in (seed + 1, seed + 2))
    top_scores = scores.for_layers(top)
    t1 = report.table(f"Part 1: NFN per module type, SmolLM2 on {s.topic} text (lowest first)",
                      ["type", "NFN_all_layers", "NFN_first_half", "NFN_second_half", "NFN_top_layers", "chosen_by_PLoP"])
    chosen = set(top_scores.lowest(3))
    for t in scores.ranking():
        t1.add(type=type_label(t), NFN_all_layers=scores.per_type[t], NFN_first_half=first.per_type[t],
               NFN_second_half=second.per_type[t], NFN_top_layers=top_scores.per_type[t], chosen_by_PLoP="yes" if t in chosen else "")

    # ---- Part 2: fine-tuning the top layers on the topic --------------------------------------------------------
    say("Part 2: caching prefix states")
    data = topic_windows(tok, s.topic, s.seq_len, s.train_windows, s.val_windows, s.test_windows)
    vocab = data.vocabulary()
    runner = FrozenPrefixRunner(model, top[0])
    index = TopLayersLM.token_index(vocab, model.lm_head.weight.size(0))
    task = TopLayersLM(runner, vocab, model.lm_head.weight)
    task.train_set = CachedWindows(runner, data.train, index)
    task.eval_set = CachedWindows(runner, data.validation, index)
    test = CachedWindows(runner, data.test, index)
    with torch.no_grad():  # the cached path must compute what the full model computes
        full = model(input_ids=data.test[:1, :-1]).logits[0]
        part = model.lm_head(runner.top(test.h[:1]))[0]
        prefix_error = float((full - part).abs().max() / full.abs().max())
    base_val, base_test = task.nll(task.eval_set), task.nll(test)

    placements = _placements(model, top_scores, top, s.base_rank)
    adapted = AdaptedModel(model)
    arms_runner = ArmRunner(adapted, task, test, top, s.steps, s.batch)
    results: dict[str, ArmResult] = {}
    for p in placements:
        say(f"Part 2: {p.name} ({', '.join(p.targets)}, rank {p.rank})")
        twin = next((r for r in results.values() if set(r.placement.targets) == set(p.targets) and r.placement.rank == p.rank), None)
        # The same targets and rank as an arm already run is the same arm: reuse it rather than train it twice.
        results[p.name] = ArmResult(p, twin.selection, twin.runs_by_lr, twin.seed_runs) if twin else \
            arms_runner.tune_and_run(p, s.lr_grid, seeds, s.max_extensions)
        a = results[p.name]
        report.record_arm(p.name, a.selection, budget={"trainable_params": a.trainable, "steps": s.steps, "batch": s.batch,
                                                       "tokens_per_step": s.batch * (s.seq_len - 1)})
    report.check_budgets_matched(["steps", "batch", "tokens_per_step"])
    report.check_budgets_matched(["trainable_params"], rel_tol=BUDGET_TOLERANCE)

    gains = {n: [base_test - r.test_nll for r in a.seed_runs] for n, a in results.items()}
    best = min(HEURISTICS, key=lambda n: results[n].selection.chosen_score)  # by validation, never by test
    report.measure_paired("smollm2_plop_matches_best_heuristic", gains[PLOP], gains[best])
    report.measure_paired("smollm2_plop_noninferior_to_mlp", gains[PLOP], gains[MLP])
    report.measure_paired("smollm2_plop_beats_inverse", gains[PLOP], gains[INVERSE])
    report.measure("nfn_ranking_stable_across_halves", tau_halves)
    report.measure("ranking_stable_across_seeds", tau_seeds)
    report.measure("every_arm_improves", min(min(g) for g in gains.values()))
    report.measure("frozen_prefix_exact", prefix_error)
    _tables(report, results, gains, base_val, base_test)
    _notes(report, s, top, n_layers, vocab.numel(), data, base_val, base_test, best, placements, top_scores)
    report.plots["nfn_types"] = _plot(scores, top_scores, gains)
    return report.finish()


def _placements(model, top_scores: NFNScores, top: list[int], base_rank: int) -> list[Placement]:
    targets = {PLOP: plop_targets(top_scores, 3), INVERSE: plop_targets(top_scores, 3, inverse=True),
               ATTN: list(ATTENTION), MLP: list(MLP_TYPES)}
    budget = base_rank * lora_parameters_per_rank(model, targets[PLOP], top)
    return [Placement(n, tuple(t), rank_for_budget(model, t, budget, top)) for n, t in targets.items()]


def _tables(report: Report, results: dict[str, ArmResult], gains: dict[str, list[float]], base_val: float, base_test: float) -> None:
    t2 = report.table("Part 2: placements, equal trainable budget, each at its validation-chosen learning rate",
                      ["placement", "types", "rank", "trainable", "lr", "val_NLL", "test_NLL_mean", "test_NLL_std",
                       "gain_mean", "per_seed_gain"])
    for n, a in results.items():
        nll = [r.test_nll for r in a.seed_runs]
        t2.add(placement=n, types=", ".join(a.placement.targets), rank=a.placement.rank, trainable=a.trainable, lr=a.lr,
               val_NLL=a.selection.chosen_score, test_NLL_mean=stats_.fmean(nll), test_NLL_std=stats_.pstdev(nll),
               gain_mean=stats_.fmean(gains[n]), per_seed_gain=" ".join(f"{g:.4f}" for g in gains[n]))
    t2.add(placement="base (no fine-tuning)", types="", rank=0, trainable=0, lr=float("nan"), val_NLL=base_val,
           test_NLL_mean=base_test, test_NLL_std=0.0, gain_mean=0.0, per_seed_gain="")
    t3 = report.table("Part 2: learning-rate grids (validation NLL, first seed; * = chosen)", ["placement", "grid"])
    for n, a in results.items():
        cells = [f"{lr:.3g}: {r.val_nll:.4f}{'*' if lr == a.lr else ''}" for lr, r in sorted(a.runs_by_lr.items())]
        t3.add(placement=n, grid="; ".join(cells))
    # Paired differences of every arm against PLoP, for the reader (only the declared claims above are evidence).
    t4 = report.table("Part 2: PLoP's gain minus each arm's, per seed (nats/token; descriptive)", ["arm", "mean", "per_seed"])
    for n in results:
        if n != PLOP:
            d = [a - b for a, b in zip(gains[PLOP], gains[n])]
            t4.add(arm=n, mean=stats_.fmean(d), per_seed=" ".join(f"{x:+.4f}" for x in d))


def _notes(report: Report, s: Settings, top: list[int], n_layers: int, vocab_size: int, data, base_val: float, base_test: float,
           best: str, placements: list[Placement], top_scores: NFNScores) -> None:
    tokens = lambda w: w.size(0) * (w.size(1) - 1)  # noqa: E731 (targets per split)
    report.note(f"Task: next-token fine-tuning on the '{s.topic}' wiki articles: {data.train.size(0)} training windows of "
                f"{s.seq_len} tokens ({tokens(data.train):,} targets) from the topic's train split; validation "
                f"{tokens(data.validation):,} targets from its calibration-split articles; test {tokens(data.test):,} "
                f"targets from its eval-split articles (all disjoint by article). Base model NLL: validation "
                f"{base_val:.4f}, test {base_test:.4f} nats/token.")
    report.note(f"Adaptable layers {top[0]}..{top[-1]} of {n_layers}: the hidden states entering layer {top[0]} are computed "
                f"once (rankwise.training.frozen_prefix). The LM head's softmax is over the {vocab_size:,} token ids that "
                f"occur in the topic's windows (all splits), the same for every arm: the full 49,152-way head would cost "
                f"more than the adapted layers.")
    budget = {p.name: p.rank for p in placements}
    report.note(f"PLoP's choice on the top layers: {', '.join(type_label(t) for t in top_scores.lowest(3))}; PLoP^-1: "
                f"{', '.join(type_label(t) for t in top_scores.highest(3))}. Ranks for the budget of rank {s.base_rank} on "
                f"PLoP's types: {budget}. LoRA alpha = 2 x rank, dropout 0; {s.steps} AdamW steps, batch {s.batch}, warmup "
                f"10% + cosine, clip 1.0, weight decay 0; seeds {s.seeds}.")
    report.note(f"Learning rates: starting grid {list(s.lr_grid)} for every arm, chosen by validation NLL at the first "
                f"seed; an edge choice extends the grid by one point on that side (up to {s.max_extensions} times). The "
                f"first seed's final run is that tuning run (same training); the other seeds are new runs. Best heuristic "
                f"by validation: {best}.")
    report.note("The intervals are over training seeds (LoRA init and batch order) on one fixed test text; they do not "
                "include the sampling variance of the test articles.")
    report.note(f"Part 1: {s.score_examples} training windows of {s.score_len} tokens of the topic, random baseline from "
                f"256 Gaussian rows per module and batch; type NFN = mean of per-layer NFNs; halves = the first and "
                f"second half of the batches.")


def _plot(scores: NFNScores, top_scores: NFNScores, gains: dict[str, list[float]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    low = set(top_scores.lowest(3))
    for ax, sc, title in ((axes[0], scores, "all layers"), (axes[1], top_scores, "adaptable top layers")):
        order = sc.ranking()
        ax.bar(range(len(order)), [sc.per_type[t] for t in order], color=["tab:green" if t in low else "tab:gray" for t in order])
        ax.set_xticks(range(len(order)), [type_label(t).split(".")[-1] for t in order], rotation=35, ha="right", fontsize=8)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_title(f"NFN per type, {title} (green: PLoP)", fontsize=9)
    names = list(gains)
    for i, n in enumerate(names):
        axes[2].scatter([i] * len(gains[n]), gains[n], s=14)
        axes[2].plot([i - 0.25, i + 0.25], [stats_.fmean(gains[n])] * 2, color="k")
    axes[2].set_xticks(range(len(names)), [n.split(" (")[0] for n in names], fontsize=8)
    axes[2].set_ylabel("test NLL gain over base (nats/token)")
    axes[2].set_title("per-seed gains at equal budget", fontsize=9)
    fig.tight_layout()
    return fig
