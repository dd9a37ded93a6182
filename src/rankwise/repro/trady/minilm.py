"""Experiment `trady:minilm`: TraDy on the real pretrained MiniLM-L6 (the issue's transformer setting), wiki-topics.

The top two encoder layers are the trainable part (their twelve linears are the layers channels are drawn from; the
four below are frozen, so their outputs are computed once and cached: `training.cached_classification`), mean
pooling and a new linear head (trained densely in every arm). The layer ranking is computed on a proxy task, topics
0-5, and the target is topics 6-11 (disjoint classes; articles disjoint too). Arms at B_mem = 5% of the full
per-example cost of those twelve linears (a linear's input channel costs C' + T per example, T = 16 tokens): TraDy,
S-TopK Random (its one-draw ablation), D-Full Random (every linear, no ranking) and full fine-tuning of the two
layers; SGD without momentum, warmup + cosine, clipping at 1, a redraw every epoch; every arm's learning rate tuned
on validation articles of the training split (seed `seed`), 5 seeds, paired claims on the held-out articles.
Velocity (a conv-only method in its authors' code) and the Det-RGN arms run in the vision experiment only.
"""

from __future__ import annotations

import copy
import statistics as st
from dataclasses import dataclass

import torch

from rankwise.core.arms import tune_then_seeds
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.core.training import TrainConfig
from rankwise.data import topic_task
from rankwise.recipes.trady import build, rank_layers
from rankwise.repro.setup import BySize, experiment_model
from rankwise.repro.trady.arms import LABELS, SPARSE_ARMS, run_arm
from rankwise.repro.trady.memory import kept_activation_elements, memory_rows
from rankwise.training.cached_classification import CachedClassificationTask, CachedInputs, cache_encoder_inputs
from rankwise.training.encoder_top import EncoderTopClassifier

ARMS = ("trady", "s-topk-random", "d-full-random", "full")
PROXY_TOPICS, TARGET_TOPICS = tuple(range(6)), tuple(range(6, 12))
TITLE = "TraDy on MiniLM's top two layers (wiki-topics 6-11, ranked on topics 0-5) vs its baselines at the same budget"


@dataclass(frozen=True)
class Settings:
    n_train: int
    n_val: int
    n_test: int
    max_length: int
    top: int  # encoder layers trained (the rest cached)
    batch: int
    epochs: int
    lr_grid: tuple[float, ...]
    seeds: int
    budget: float
    keep: float
    rank_lr: float
    max_extend: int


SIZES = BySize(
    smoke=Settings(n_train=32, n_val=16, n_test=16, max_length=8, top=2, batch=8, epochs=2, lr_grid=(0.1,), seeds=1,
                   budget=0.05, keep=0.97, rank_lr=0.1, max_extend=0),
    full=Settings(n_train=480, n_val=240, n_test=480, max_length=16, top=2, batch=16, epochs=4, lr_grid=(0.1, 0.3, 1.0),
                  seeds=5, budget=0.05, keep=0.97, rank_lr=0.1, max_extend=1),
)


def _articles(topics: tuple[int, ...], split: str, n: int, offset: int = 0, stride_from: int | None = None):
    """(texts, labels relabelled 0..len(topics)-1): `n` articles of `topics`, evenly spaced (a second call with
    another `offset` takes the articles between)."""
    data = topic_task(split)
    idx = [i for i, y in enumerate(data.labels) if y in topics]
    stride = max(1, len(idx) // (stride_from or n))
    chosen = idx[offset::stride][:n]
    remap = {t: i for i, t in enumerate(topics)}
    return [data.texts[i] for i in chosen], [remap[data.labels[i]] for i in chosen]


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("trady", TITLE, size, seed)
    _declare(report)
    model, tokenizer = experiment_model("minilm-l6", size, seed)
    model.eval()
    start = len(model.encoder.layer) - s.top
    hidden = model.config.hidden_size

    def cache(texts, labels) -> CachedInputs:
        return cache_encoder_inputs(model, tokenizer, texts, labels, s.max_length, start)

    # Training-split articles evenly spaced, the validation ones between them (offset 1 of the same stride).
    proxy_train, proxy_val = (cache(*_articles(PROXY_TOPICS, "train", s.n_train, 0, s.n_train)),
                              cache(*_articles(PROXY_TOPICS, "train", s.n_val, 1, s.n_train)))
    train_set = cache(*_articles(TARGET_TOPICS, "train", s.n_train, 0, s.n_train))
    val_set = cache(*_articles(TARGET_TOPICS, "train", s.n_val, 1, s.n_train))
    test_set = cache(*_articles(TARGET_TOPICS, "eval", s.n_test))
    proxy = CachedClassificationTask(proxy_train, proxy_val, "wiki-topics 0-5 (cached prefix)")
    task = CachedClassificationTask(train_set, val_set, "wiki-topics 6-11 (cached prefix)")
    layers = model.encoder.layer[start:]

    def make(classes: int = len(TARGET_TOPICS)):
        return EncoderTopClassifier(copy.deepcopy(layers), hidden, classes)

    steps_per_epoch = max(1, s.n_train // s.batch)
    set_seed(seed)
    ranking = rank_layers(make(len(PROXY_TOPICS)), proxy, TrainConfig(steps=steps_per_epoch, batch_size=s.batch, lr=s.rank_lr,
                                                                       warmup_ratio=0.0, seed=seed))
    ranked = ranking.select(s.keep)
    target_ranking = rank_layers(make(), task, TrainConfig(steps=steps_per_epoch, batch_size=s.batch, lr=s.rank_lr,
                                                           warmup_ratio=0.0, seed=seed))
    seeds = [seed + k for k in range(s.seeds)]

    def test_accuracy(module) -> float:
        logits = task.logits(module, test_set)
        return 100.0 * float((logits.argmax(-1) == test_set.labels).float().mean())

    results = {}
    for arm in ARMS:
        go = lambda lr, sd, arm=arm: run_arm(arm, make, task, test_accuracy, lr, sd, s.epochs * steps_per_epoch,  # noqa: E731
                                             s.batch, s.budget, ranked, steps_per_epoch)
        tuned = tune_then_seeds(s.lr_grid, go, seeds, score=lambda r: r.val, higher_is_better=True, param="lr",
                                max_extend=s.max_extend, label=f"{arm} (MiniLM)", score_name="val accuracy")
        results[arm] = tuned.seed_runs
        report.record_arm(LABELS[arm], tuned.selection, {"steps": tuned.seed_runs[0].steps, "batch": s.batch,
                                                         "tuning_runs": len(tuned.runs)})
    report.check_budgets_matched(["steps", "batch"])
    test = {arm: [r.test for r in runs] for arm, runs in results.items()}
    report.measure_paired("trady_beats_s_topk_random", test["trady"], test["s-topk-random"])
    report.measure_paired("trady_beats_d_full_random", test["trady"], test["d-full-random"])
    report.measure_paired("full_beats_trady", test["full"], test["trady"])
    report.measure("budget_respected", max(d["budgeted"] - r.budget for arm in ARMS if arm != "full"
                                           for r in results[arm] for d in r.draws))
    set_seed(seed)
    module = make()
    procedure = build(module, task, seed, budget=s.budget, layers=tuple(ranked))
    kept = kept_activation_elements(task.loss(module, task.batch(torch.arange(s.batch))))
    report.measure("kept_activations_equal_the_draw", abs(kept - s.batch * procedure.history[-1]["activations"]))
    procedure.end_of_training(module)
    _tables(report, results, ranking, target_ranking, ranked, s, make, task)
    report.note(f"Model: all-MiniLM-L6-v2; layers {start}-{start + s.top - 1} trained on cached inputs of the layers "
                f"below, {s.max_length} tokens per article, mean pooling, a new head. Data: {s.n_train} training and "
                f"{s.n_val} validation articles of topics 6-11 (training split), {test_set.labels.numel()} held-out "
                f"articles (eval split); the ranking ran one epoch of full-backprop SGD (lr {s.rank_lr}) on topics 0-5.")
    report.note(f"Training: {s.epochs} epochs of {steps_per_epoch} steps, batch {s.batch}, SGD without momentum, 10% warmup + "
                f"cosine, clipping at 1; lr grid {list(s.lr_grid)} per arm on seed {seeds[0]}; seeds {seeds}. B_mem = "
                f"{s.budget:.0%} of Σ_c (C' + T) over the {len(ranking.scores)} linears, per example; LayerNorms, "
                "biases and embeddings frozen; dropout as the model has it (0.1) in every arm.")
    return report.finish()


def _declare(report: Report) -> None:
    what = "held-out accuracy (points), paired over seeds at the same 5% budget:"
    report.declare(PairedClaim("trady_beats_s_topk_random", f"{what} TraDy minus S-TopK Random (resampling vs one draw)",
                               ">", 0.0, kind=ClaimKind.PAPER))
    report.declare(PairedClaim("trady_beats_d_full_random", f"{what} TraDy minus D-Full Random (the a-priori layer choice)",
                               ">", 0.0, kind=ClaimKind.PAPER))
    report.declare(PairedClaim("full_beats_trady", f"{what} full fine-tuning of the two layers minus TraDy", ">", 0.0,
                               kind=ClaimKind.SANITY))
    report.declare(Claim("budget_respected", "largest excess of a draw's budgeted cost over B_mem (elements per example)",
                         "<=", 0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("kept_activations_equal_the_draw", "|activation elements the sparse linears' backward nodes keep "
                         "in one TraDy step - batch x the draw's activation cost|", "<=", 0, kind=ClaimKind.INVARIANT))


def _tables(report, results, ranking, target_ranking, ranked, s, make, task) -> None:
    from rankwise.recipes.trady import find_layers, measure_geometry, spearman

    cell = lambda xs: f"{st.fmean(xs):.2f} ± {st.pstdev(xs):.2f}"  # noqa: E731
    t = report.table("Held-out accuracy (points, mean ± std over seeds), B_mem = 5%", ["arm", "test", "validation", "lr"])
    for arm, runs in results.items():
        t.add(arm=LABELS[arm], test=cell([r.test for r in runs]), validation=cell([r.val for r in runs]), lr=runs[0].lr)
    module = make()
    geometries = measure_geometry(module, find_layers(module), lambda: task.loss(module, task.batch(torch.arange(2))),
                                  used_by_loss=True)
    m = report.table("Memory per draw (per example, mean over draws and runs), against full backprop of the twelve linears",
                     ["arm", "units", "budgeted", "weights", "activations", "activation sparsity",
                      "weight-derivative sparsity", "dW MACs vs full", "coverage"])
    for row in memory_rows({a: {"wiki": r} for a, r in results.items() if a != "full"},
                           {a: SPARSE_ARMS[a] for a in ARMS if a != "full"}, LABELS, geometries):
        m.add(**row)
    r = report.table(f"RGN layer scores: the proxy (topics 0-5) and the target (topics 6-11); kept: the proxy's top layers up "
                     f"to {s.keep:.0%}; Spearman {spearman(ranking.scores, target_ranking.scores):.3f}",
                     ["layer", "kept", "proxy", "target"])
    for name in ranking.order():
        r.add(layer=name, kept="yes" if name in ranked else "", proxy=f"{ranking.scores[name]:.3g}",
              target=f"{target_ranking.scores[name]:.3g}")
