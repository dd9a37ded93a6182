"""Reproduction `trady`: memory-constrained fine-tuning of a small ResNet with batch norm (SmallResNet, pretrained
here on all ten Fashion-MNIST classes at 14x14), TraDy against the paper's baselines at the same memory budget.

Card trady.md. Stage 1: the backbone's 15 conv layers are ranked by RGN during a short full-backprop fine-tuning on
a proxy task (Fashion-MNIST rotated by 90 degrees, never a target) and the top layers holding 97% of the score are
kept. Stage 2: each arm fine-tunes the backbone with a new head on each of three targets (Fashion-MNIST 5-9 warped, digits,
Fashion-MNIST 0-4 inverted) at B_mem = 5% of the full per-example cost Σ_i Σ_c Θ_space,c, with SGD without momentum,
warmup + cosine, a redraw every epoch for the dynamic arms. Every arm's learning rate is tuned per target on
validation images (seed `seed`, the grid extended off an edge); the other seeds rerun the choice. Claims pool the
paired (target, seed) differences of test accuracy, in points. The layer-ranking stability claim (the paper's
worst pairwise Spearman >= 0.8 across datasets) reruns the RGN ranking on the proxy and on every target, per seed;
its control is the same statistic on channel rankings, which the paper says depend on the task.
"""

from __future__ import annotations

import copy
import itertools
import statistics as st
from dataclasses import dataclass

import torch

from rankwise.core.arms import tune_then_seeds
from rankwise.core.discrimination import control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.core.training import TrainConfig
from rankwise.recipes.trady import build, rank_layers, spearman
from rankwise.repro.setup import BySize
from rankwise.repro.trady.arms import CLIP, LABELS, SPARSE_ARMS, ArmRun, accuracy, run_arm
from rankwise.repro.trady.data import Split, vision_tasks
from rankwise.repro.trady.memory import kept_activation_elements, memory_rows
from rankwise.training.image_tasks import ImageClassificationTask

ARMS = (*SPARSE_ARMS, "full")


@dataclass(frozen=True)
class Settings:
    n_train: int
    n_val: int
    n_test: int
    batch: int
    epochs: int
    lr_grid: tuple[float, ...]
    seeds: int
    budget: float  # share of the full per-example cost
    keep: float  # the layer ranking's cumulative share
    rank_epochs: int  # full-backprop epochs of a ranking run
    rank_lr: float
    oracle_examples: int
    velocity_examples: int
    max_extend: int
    pretrained: bool


SIZES = BySize(
    smoke=Settings(n_train=48, n_val=24, n_test=24, batch=16, epochs=2, lr_grid=(0.1,), seeds=1, budget=0.05, keep=0.97,
                   rank_epochs=1, rank_lr=0.05, oracle_examples=16, velocity_examples=16, max_extend=0, pretrained=False),
    full=Settings(n_train=640, n_val=400, n_test=1000, batch=32, epochs=8, lr_grid=(0.1, 0.3, 1.0), seeds=5,
                  budget=0.05, keep=0.97, rank_epochs=1, rank_lr=0.05, oracle_examples=200, velocity_examples=200,
                  max_extend=1, pretrained=True),
)
TITLE = "TraDy on a small ResNet pretrained on Fashion-MNIST: dynamic channel resampling vs the paper's baselines"


def _backbone(s: Settings, seed: int):
    """(SmallResNet, the Fashion-MNIST train-part indices it saw) — pretrained and cached at full, a seeded random
    stand-in at smoke."""
    if not s.pretrained:
        from rankwise.models.vision import stand_in

        return stand_in("resnet-small", seed)[0], torch.zeros(0, dtype=torch.long)
    from rankwise.models.vision import pretrained_backbone

    bb = pretrained_backbone("resnet-small-fmnist")
    return bb.module, torch.cat([bb.train_indices, bb.eval_indices])


def _task(split: Split) -> ImageClassificationTask:
    """Trains on the split's training images; its evaluation (the loop's final one) is the validation accuracy."""
    return ImageClassificationTask(split.name, split.train_x, split.train_y, split.val_x, split.val_y)


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("trady", TITLE, size, seed)
    _declare(report)
    backbone, excluded = _backbone(s, seed)
    proxy, targets = vision_tasks(s.n_train, s.n_val, s.n_test, excluded, seed)
    seeds = [seed + k for k in range(s.seeds)]
    steps_per_epoch = max(1, s.n_train // s.batch)

    # Stage 1 and the stability check: RGN rankings on the proxy and on every target, per seed.
    tasks = [proxy, *targets]
    rankings: dict[int, dict[str, object]] = {}
    for sd in seeds:
        rankings[sd] = {}
        for split in tasks:
            task = _task(split)
            set_seed(sd)
            module = task.wrap(copy.deepcopy(backbone))
            config = TrainConfig(steps=s.rank_epochs * steps_per_epoch, batch_size=s.batch, lr=s.rank_lr,
                                 warmup_ratio=0.0, max_grad_norm=CLIP, seed=sd)
            rankings[sd][split.name] = rank_layers(module, task, config)
        say(f"rankings for seed {sd}: {', '.join(rankings[sd])}")
    ranking = rankings[seed][proxy.name]
    ranked = ranking.select(s.keep)

    # Stage 2: every arm on every target, tuned on validation, 5 seeds.
    results: dict[str, dict[str, list[ArmRun]]] = {arm: {} for arm in ARMS}
    for split in targets:
        task = _task(split)
        make = lambda task=task: task.wrap(copy.deepcopy(backbone))  # noqa: E731
        test = lambda m, split=split: accuracy(m.eval(), split.test_x, split.test_y)  # noqa: E731
        extra = {"oracle_examples": s.oracle_examples, "velocity_examples": s.velocity_examples}
        for arm in ARMS:
            go = lambda lr, sd, arm=arm: run_arm(arm, make, task, test, lr, sd, s.epochs * steps_per_epoch,  # noqa: E731
                                                 s.batch, s.budget, ranked, steps_per_epoch, extra)
            tuned = tune_then_seeds(s.lr_grid, go, seeds, score=lambda r: r.val, higher_is_better=True, param="lr",
                                    max_extend=s.max_extend, label=f"{arm} on {split.name}", score_name="val accuracy")
            results[arm][split.name] = tuned.seed_runs
            runs = tuned.seed_runs
            report.record_arm(f"{LABELS[arm]} | {split.name}", tuned.selection,
                              {"steps": runs[0].steps, "batch": s.batch, "tuning_runs": len(tuned.runs)})
    report.check_budgets_matched(["steps", "batch"])

    _measure(report, results, rankings, targets, tasks, seeds, backbone, ranked, s)
    _tables(report, results, rankings, ranking, ranked, targets, tasks, seeds, backbone, s)
    _notes(report, s, proxy, targets, ranking, ranked, seeds)
    report.plots["trady_accuracy"] = _plot(results, rankings[seed], targets, tasks)
    return report.finish()


def _pairs(results: dict[str, dict[str, list[ArmRun]]], arm: str, targets: list[Split]) -> list[float]:
    """Test accuracies of `arm`, in (target, seed) order: the pairing of every claim."""
    return [r.test for split in targets for r in results[arm][split.name]]


def _declare(report: Report) -> None:
    what = "test accuracy (points), paired over (target, seed) at the same 5% budget:"
    for name, other, desc in [
        ("trady_beats_s_topk_random", "s-topk-random", "TraDy minus S-TopK Random (resampling vs one draw from the same layers)"),
        ("trady_beats_s_full_random", "s-full-random", "TraDy minus S-Full Random (one draw from every layer, ~PaCA)"),
        ("trady_beats_d_full_random", "d-full-random", "TraDy minus D-Full Random (the a-priori layer choice)"),
        ("trady_beats_velocity", "velocity", "TraDy minus Velocity (NEq neuron selection, weight-only budget)"),
        ("d_full_random_beats_s_full_random", "s-full-random", "D-Full Random minus S-Full Random (every dynamic variant beats its static one)"),
        ("d_det_rgn_beats_s_det_rgn", "s-det-rgn", "D-Det RGN minus S-Det RGN (every dynamic variant beats its static one)"),
    ]:
        report.declare(PairedClaim(name, f"{what} {desc}", ">", 0.0, kind=ClaimKind.PAPER, n_min=3))
    report.declare(PairedClaim("trady_matches_d_det_rgn", f"{what} TraDy minus the D-Det RGN oracle (full gradients every "
                               "epoch): not worse by more than 0.5 points; control: S-Full Random minus the oracle",
                               ">=", -0.5, kind=ClaimKind.PAPER, discriminates=control("s-full-random"), n_min=3))
    report.declare(SampleClaim("layer_ranking_stable", "per seed, the worst pairwise Spearman correlation of the RGN layer "
                               "scores across the proxy and the three targets (paper: >= 0.8 across datasets); control: "
                               "the same statistic on channel RGNs within layers", ">=", 0.8, kind=ClaimKind.PAPER,
                               discriminates=control("channel rankings"), n_min=3))
    report.declare(PairedClaim("full_beats_trady", f"{what} full fine-tuning (all weights, about 20x the memory) minus TraDy",
                               ">", 0.0, kind=ClaimKind.SANITY, n_min=3))
    report.declare(Claim("budget_respected", "largest excess of a draw's budgeted cost over B_mem, every draw of every "
                         "sparse run (elements per example)", "<=", 0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("kept_activations_equal_the_draw", "|activation elements the sparse layers' backward nodes keep in "
                         "one TraDy step - batch x the draw's activation cost|", "<=", 0, kind=ClaimKind.INVARIANT))


def _measure(report, results, rankings, targets, tasks, seeds, backbone, ranked, s) -> None:
    trady = _pairs(results, "trady", targets)
    for name, arm in [("trady_beats_s_topk_random", "s-topk-random"), ("trady_beats_s_full_random", "s-full-random"),
                      ("trady_beats_d_full_random", "d-full-random"), ("trady_beats_velocity", "velocity")]:
        report.measure_paired(name, trady, _pairs(results, arm, targets))
    report.measure_paired("d_full_random_beats_s_full_random", _pairs(results, "d-full-random", targets),
                          _pairs(results, "s-full-random", targets))
    report.measure_paired("d_det_rgn_beats_s_det_rgn", _pairs(results, "d-det-rgn", targets), _pairs(results, "s-det-rgn", targets))
    oracle = _pairs(results, "d-det-rgn", targets)
    report.measure_paired("trady_matches_d_det_rgn", trady, oracle)
    report.get_claim("trady_matches_d_det_rgn").measure_control(_pairs(results, "s-full-random", targets), oracle)
    layer_min, channel_min = _stability(rankings, tasks, seeds)
    report.measure("layer_ranking_stable", layer_min)
    report.get_claim("layer_ranking_stable").measure_control(channel_min)
    report.measure_paired("full_beats_trady", _pairs(results, "full", targets), trady)
    excess = max(d["budgeted"] - r.budget for arm in SPARSE_ARMS for runs in results[arm].values() for r in runs
                 for d in r.draws)
    report.measure("budget_respected", excess)
    report.measure("kept_activations_equal_the_draw", _kept_check(targets[0], backbone, ranked, s, seeds[0]))


def _stability(rankings, tasks, seeds) -> tuple[list[float], list[float]]:
    """Per seed, the worst pairwise Spearman over tasks of the layer scores, and of the channel RGNs (mean over the
    layers with at least 3 channels)."""
    layer_min, channel_min = [], []
    names = [t.name for t in tasks]
    for sd in seeds:
        r = rankings[sd]
        layer_min.append(min(spearman(r[a].scores, r[b].scores) for a, b in itertools.combinations(names, 2)))
        per_pair = []
        for a, b in itertools.combinations(names, 2):
            rs = [spearman({i: v for i, v in enumerate(r[a].channel_rgn[n].tolist())},
                           {i: v for i, v in enumerate(r[b].channel_rgn[n].tolist())})
                  for n in r[a].channel_rgn if r[a].channel_rgn[n].numel() >= 3]
            per_pair.append(st.fmean(rs))
        channel_min.append(min(per_pair))
    return layer_min, channel_min


def _kept_check(split: Split, backbone, ranked, s: Settings, seed: int) -> float:
    """One TraDy step's kept activations (the backward graph's saved tensors) against batch x the draw's cost."""
    task = _task(split)
    set_seed(seed)
    module = task.wrap(copy.deepcopy(backbone))
    procedure = build(module, task, seed, budget=s.budget, layers=tuple(ranked))
    batch = task.batch(torch.arange(s.batch))
    kept = kept_activation_elements(task.loss(module, batch))
    procedure.end_of_training(module)
    return abs(kept - s.batch * procedure.history[-1]["activations"])


def _tables(report, results, rankings, ranking, ranked, targets, tasks, seeds, backbone, s) -> None:
    cell = lambda xs: f"{st.fmean(xs):.2f} ± {st.pstdev(xs):.2f}"  # noqa: E731
    t = report.table("Test accuracy (points, mean ± std over seeds) at B_mem = 5% of the full cost; lr chosen on validation",
                     ["arm", *[f"{x.name}" for x in targets], "pooled", "lr per target"])
    for arm in ARMS:
        t.add(arm=LABELS[arm], **{x.name: cell([r.test for r in results[arm][x.name]]) for x in targets},
              pooled=cell(_pairs(results, arm, targets)), **{"lr per target": ", ".join(f"{results[arm][x.name][0].lr:g}" for x in targets)})
    m = report.table("Memory per draw (per example, mean over draws and runs): the budgeted cost, its split, sparsities "
                     "against full backprop of every conv, dW multiply-accumulates, and the share of the pool ever updated",
                     ["arm", "units", "budgeted", "weights", "activations", "activation sparsity", "weight-derivative sparsity",
                      "dW MACs vs full", "coverage"])
    geometries = _geometries(backbone, targets[0])
    for row in memory_rows(results, SPARSE_ARMS, LABELS, geometries):
        m.add(**row)
    r = report.table(f"RGN layer scores (seed {seeds[0]}), proxy and targets; kept = the proxy's top layers up to {s.keep:.0%}",
                     ["layer", "kept", *[x.name for x in tasks]])
    for name in ranking.order():
        r.add(layer=name, kept="yes" if name in ranked else "", **{x.name: f"{rankings[seeds[0]][x.name].scores[name]:.3g}" for x in tasks})
    sp = report.table(f"Spearman correlation of the layer scores between tasks (seed {seeds[0]})", ["task", *[x.name for x in tasks]])
    for a in tasks:
        sp.add(task=a.name, **{b.name: f"{spearman(rankings[seeds[0]][a.name].scores, rankings[seeds[0]][b.name].scores):.3f}" for b in tasks})


def _geometries(backbone, split: Split):
    from rankwise.recipes.trady import find_layers, measure_geometry

    task = _task(split)
    module = task.wrap(copy.deepcopy(backbone))
    return measure_geometry(module, find_layers(module), lambda: task.loss(module, task.batch(torch.arange(2))),
                            used_by_loss=True)


def _notes(report, s: Settings, proxy: Split, targets: list[Split], ranking, ranked, seeds) -> None:
    report.note(f"Backbone: SmallResNet (3x3 stem, 3 stages of 2 basic blocks at 16/32/64 channels, batch norm), "
                f"{'pretrained here on 20,000 Fashion-MNIST train images (all 10 classes, 14x14)' if s.pretrained else 'a random stand-in (smoke)'}"
                "; a new linear head per task. Batch-norm statistics and affine parameters and conv biases stay frozen in "
                "every sparse arm (the card leaves BN open); full fine-tuning trains every parameter, statistics frozen too.")
    report.note(f"Data per target: {s.n_train} training, {s.n_val} validation and up to {s.n_test} test images; "
                f"targets {[t.name for t in targets]} ({[t.num_classes for t in targets]} classes); proxy "
                f"{proxy.name}. Training: {s.epochs} epochs of {max(1, s.n_train // s.batch)} steps, batch {s.batch}, SGD "
                "without momentum, 10% warmup + cosine, gradient clipping at 1, no weight decay; dynamic arms redraw every epoch.")
    report.note(f"Budget: B_mem = {s.budget:.0%} of Σ_i Σ_c (C'·D·D + H·W) over the 15 convs, per example (the paper's "
                "batch-1 count); Velocity spends the same number on weights only (its own accounting), so it keeps far "
                "more activations (memory table). The head trains densely in every arm, outside the budget.")
    report.note(f"Ranking: RGN = ‖dW[:, c]‖ / (C'·D·D + H·W), layer score Σ_c RGN_c, averaged over {s.rank_epochs} epoch(s) "
                f"of full-backprop SGD (lr {s.rank_lr}, clipped at {CLIP}: the scores read the gradients before clipping); kept on the proxy at {s.keep:.0%}: {len(ranked)} of "
                f"{len(ranking.scores)} layers. Seeds {seeds}: head init, batch order and draws; the lr grid "
                f"{list(s.lr_grid)} is tuned per arm and target on seed {seeds[0]}.")


def _plot(results, rankings, targets, tasks):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    width = 0.8 / len(ARMS)
    for i, arm in enumerate(ARMS):
        means = [st.fmean(r.test for r in results[arm][x.name]) for x in targets]
        axes[0].bar([j + i * width for j in range(len(targets))], means, width, label=LABELS[arm])
    axes[0].set_xticks([j + 0.4 - width / 2 for j in range(len(targets))], [x.name for x in targets], fontsize=8)
    axes[0].set_ylabel("test accuracy (points)")
    axes[0].legend(fontsize=6)
    lo = min(st.fmean(r.test for r in results[a][x.name]) for a in ARMS for x in targets)
    axes[0].set_ylim(max(0.0, lo - 5), None)
    names = rankings[tasks[0].name].order()
    for x in tasks:
        sc = rankings[x.name].scores
        total = sum(sc.values())
        axes[1].plot(range(len(names)), [sc[n] / total for n in names], marker="o", label=x.name)
    axes[1].set_xticks(range(len(names)), [n.replace("model.", "") for n in names], rotation=80, fontsize=6)
    axes[1].set_ylabel("share of the RGN layer score")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["run", "SIZES", "Settings"]
