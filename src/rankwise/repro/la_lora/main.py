"""Reproduction `la-lora`: LA-LoRA vs DP-LoRA, FFA-LoRA and RoLoRA in differentially private federated learning.

Set-up (CPU scale of the paper's NLP experiment): all-MiniLM-L6-v2 on the 12-class wiki topics; LoRA (r=8) on the
query and value projections of the top 2 encoder layers, the frozen prefix below them cached (`features`). The
12-way head is fitted non-privately on a small *public* split of the training pool (disjoint from every client's
data, a common assumption of DP fine-tuning) and then frozen for the LoRA arms, so the private training has to move
the features. The private training articles are split across clients by a label-skewed Dirichlet(beta); Flower runs
the federation (in-process engine), FedAvg over the sampled clients each round. For each target epsilon (1 and 3,
the paper's strictest and loosest budgets; delta 1e-5, per client, Opacus RDP accountant over every local step)
each client's noise multiplier is computed from its sampling rate and step count.

Arms (`arms`; the same DP machinery, clipping, noise and frozen head): LA-LoRA (alternate B/A per local step +
binomial filter), DP-LoRA (A and B together), FFA-LoRA (A frozen), RoLoRA (alternate per round). Controls through
the same federation: head-only DP (LoRA off, the head trained privately from the same pre-trained head) at each
epsilon, and non-private LoRA (no clipping, no noise). Each arm (and epsilon) gets its own learning-rate grid
scored by validation accuracy (training articles held out of every client and of the public split) at the first
seed (non-private LoRA, whose unclipped updates can diverge at one seed and not another: on the mean over seeds);
an edge choice extends the grid at its own step. Held-out test accuracy over seeds (LoRA init, Poisson
batches, noise, client sampling), paired by seed.

Issue 24 (audit): the first testbed (LoRA on the top FFN output projection plus a trained new head) could not show
the mechanism: a head-only DP run scored like every LoRA arm, so what was compared was the head. Its paper claims
are retired (the report's history keeps them); the comparisons on this testbed carry new names, labelled post hoc.
"""

from __future__ import annotations

import statistics as st
from dataclasses import dataclass

import torch

from rankwise.core.arms import Selection, grid_step_neighbour, select_from_scores, select_with_extension
from rankwise.core.discrimination import comparison
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.core.seed import set_seed
from rankwise.data import topic_task
from rankwise.repro.la_lora.arms import ALL_ARMS, HEAD_ONLY, NAMES, NON_PRIVATE, PRIVATE_ARMS, Runner, RunSpec
from rankwise.repro.la_lora.features import (TopTail, cache_inputs, check_tail, first_tail_layer, fit_public_head,
                                             pooled_features)
from rankwise.repro.setup import BySize, experiment_model
from rankwise.training.federated.partition import dirichlet_partition

DATA_SEED = 4321
DELTA = 1e-5
PAPER_MAX_EPSILON = 3.0  # the paper's budgets are epsilon in {1, 2, 3}
HEADROOM_MARGIN = 2.0  # points: non-private LoRA must beat head-only DP by more than this for the testbed to be fit
BASELINES = ("dp-lora", "ffa-lora", "rolora")
SUFFIX = "-frozen-head"  # the claims of this testbed (issue 24); the first testbed's claims are retired


@dataclass(frozen=True)
class Settings:
    train: int  # private examples spread over the clients
    val: int
    test: int
    public: int  # the public split the head is fitted on (disjoint from train and val)
    max_length: int
    top: int  # adapted top encoder layers (the tail)
    targets: tuple[str, ...]  # LoRA projections in each tail layer
    clients: int
    per_round: int
    beta: float  # Dirichlet label skew
    rounds: int
    local_steps: int
    batch: int
    rank: int
    clip: float
    epsilons: tuple[float, ...]
    lora_grid: tuple[float, ...]  # SGD rate of the DP LoRA arms
    head_grid: tuple[float, ...]  # SGD rate of head-only DP
    non_private_grid: tuple[float, ...]  # SGD rate of non-private LoRA (unclipped gradients: smaller)
    max_extend: int  # grid extensions of the LoRA arms
    head_max_extend: int  # of head-only DP (a run takes 0.4 s)
    head_decays: tuple[float, ...]  # L2 strengths of the public head, chosen on validation
    seeds: int


QV = ("attention.self.query", "attention.self.value")
SIZES = BySize(
    smoke=Settings(train=96, val=24, test=24, public=24, max_length=12, top=2, targets=QV, clients=3, per_round=2,
                   beta=1.0, rounds=2, local_steps=2, batch=8, rank=2, clip=1.0, epsilons=(8.0,), lora_grid=(0.5, 1.0),
                   head_grid=(0.5, 1.0), non_private_grid=(0.1, 0.2), max_extend=0, head_max_extend=1,
                   head_decays=(1e-2, 1e-1), seeds=1),
    # full, timed at 1 thread on the 2-core machine beside two other 1-thread full runs: one LoRA run (8 rounds x 3
    # clients x K=4 steps x Poisson batch 12 = 1,152 per-sample gradients through 2 MiniLM layers at 16 tokens, with
    # Flower and the accountant) 11.5-14.1 s wall (= its CPU time; the first run of a seed adds ~2 s of noise
    # calibration); scoring it on validation 1.2 s, on test 2.4 s; a head-only run 0.4 s; loading, caching and
    # pooling the 3,540 texts ~50 s. 9 LoRA configurations (4 arms x 2 epsilons + non-private) x (3 grid points + at
    # most 1 extension + 4 more seeds: 8 runs at worst, ~7.4 expected) x 11.8 s = 790 s expected / 850 s worst;
    # scoring 9 x (<= 4 x 1.2 s + 5 x 2.4 s) ~ 150 s; head-only 2 x (<= 7 + 4) x 0.4 s < 10 s; noise calibration of
    # 10 (epsilon, seed) pairs ~20 s: ~1,020 s expected, ~1,080 s worst (17-18 minutes). Under heavier contention
    # (a third job on the 2 cores) runs took 1.4-1.5x longer: ~25 minutes. Choosing non-private LoRA on every seed's
    # validation adds 4 seeds x (3 grid points + at most 1 extension - the chosen one) ~ 12 runs, ~150 s.
    full=Settings(train=2400, val=300, test=600, public=240, max_length=16, top=2, targets=QV, clients=8, per_round=3,
                  beta=0.5, rounds=8, local_steps=4, batch=12, rank=8, clip=1.0, epsilons=(1.0, 3.0),
                  lora_grid=(0.25, 0.5, 1.0), head_grid=(0.125, 0.25, 0.5, 1.0), non_private_grid=(0.05, 0.1, 0.2),
                  max_extend=1, head_max_extend=3, head_decays=(1e-4, 1e-3, 1e-2), seeds=5),
)


def testbed(s: Settings) -> str:
    """The set-up the paper claims are judged on (part of their fingerprint)."""
    projections = "+".join(t.rsplit(".", 1)[-1] for t in s.targets)
    return (f"all-MiniLM-L6-v2, 12 wiki topics, {s.max_length} tokens; LoRA r={s.rank} on {projections} of the top "
            f"{s.top} layers (prefix cached); 12-way head fitted on a public split of {s.public} pool articles and frozen; "
            f"{s.train} private texts over {s.clients} Dirichlet({s.beta:g}) clients, {s.per_round} per round, "
            f"{s.rounds} rounds, K={s.local_steps}, Poisson batch {s.batch}, C={s.clip:g}, SGD")


def _declare(report: Report, s: Settings) -> None:
    # the paper's budgets are epsilon in {1, 2, 3}: a comparison there is a paper claim; another budget (the smoke
    # size's 8) is reported without deciding anything
    bed = testbed(s)
    for eps in s.epsilons:
        within = eps <= PAPER_MAX_EPSILON
        outside = "" if within else "; the paper reports epsilon <= 3 only"
        for base in (*BASELINES, HEAD_ONLY):
            what = ("the adapter adds something under DP" if base == HEAD_ONLY else "the paper's comparison")
            report.declare(PairedClaim(
                f"la-lora-vs-{base}@eps{eps:g}{SUFFIX}", f"per-seed test accuracy LA-LoRA - {NAMES[base]} at "
                f"epsilon={eps:g} (points), head pre-trained on public data and frozen ({what}){outside}", ">", 0.0,
                kind=ClaimKind.PAPER if within else None, discriminates=comparison(NAMES[base]) if within else None,
                testbed=bed, post_hoc=True))
    top = max(s.epsilons)
    report.declare(PairedClaim(f"headroom-{NON_PRIVATE}-vs-{HEAD_ONLY}@eps{top:g}", f"per-seed test accuracy "
                               f"non-private LoRA - head-only DP at epsilon={top:g} (points): the testbed leaves the "
                               f"adapter room (> {HEADROOM_MARGIN:g} points)", ">", HEADROOM_MARGIN,
                               kind=ClaimKind.SANITY, testbed=bed))
    # unchanged definitions (the invariants and the sanity floor keep their names and tests)
    for eps in s.epsilons:
        report.declare(Claim(f"privacy-ledger@eps{eps:g}", f"max over private runs (LoRA arms and head-only DP) and "
                             f"clients of the epsilon spent (RDP accountant, delta={DELTA:g}) / the target {eps:g}",
                             "<=", 1.0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("prefix-cache-exact", f"max |full MiniLM+LoRA logits - cached-tail logits| / max |logits| "
                         f"(LoRA on the top {s.top} layers)", "<=", 1e-4, kind=ClaimKind.INVARIANT))
    report.declare(Claim("learns-above-chance", f"min over private arms and seeds of test accuracy at epsilon={top:g} "
                         "(chance 1/12 = 0.083)", ">", 0.2, kind=ClaimKind.SANITY))


def _data(tok, s: Settings) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], int]:
    """(split -> (ids [N, T], mask [N, T], labels [N]), number of labels): train, val and public from the shuffled
    pool (disjoint), test from the eval split."""
    pool, test = topic_task("train"), topic_task("eval", s.test)
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(DATA_SEED)).tolist()
    cuts = {"train": order[: s.train], "val": order[s.train : s.train + s.val],
            "public": order[s.train + s.val : s.train + s.val + s.public]}

    def enc(texts, labels):
        e = tok(list(texts), truncation=True, max_length=s.max_length, padding="max_length", return_tensors="pt")
        return e["input_ids"], e["attention_mask"], torch.tensor(labels)

    out = {name: enc([pool.texts[i] for i in idx], [pool.labels[i] for i in idx]) for name, idx in cuts.items()}
    out["test"] = enc(test.texts, test.labels)
    return out, len(pool.label_names)


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("la-lora", "LA-LoRA vs DP-LoRA, FFA-LoRA, RoLoRA: DP federated LoRA on MiniLM wiki topics", size, seed)
    _declare(report, s)
    set_seed(seed)
    model, tok = experiment_model("minilm-l6", size, seed, num_layers=s.top + 1)  # smoke: a prefix layer to cache
    encoded, n_labels = _data(tok, s)
    say(f"la-lora repro: caching MiniLM below layer {first_tail_layer(model, s.top)}")
    feats = {name: {**cache_inputs(model, ids, mask, s.top), "labels": y} for name, (ids, mask, y) in encoded.items()}
    layers = model.encoder.layer[first_tail_layer(model, s.top):]
    d = model.config.hidden_size

    # the adapter-off features (B = 0): the public head's input and the head-only control's
    off = TopTail(layers, torch.nn.Linear(d, n_labels), s.rank, float(s.rank), s.targets)
    pooled = {name: pooled_features(off, f) for name, f in feats.items()}
    head, head_sel = _public_head(pooled, feats, s, n_labels)

    torch.manual_seed(seed)
    probe = TopTail(layers, head, s.rank, float(s.rank), s.targets)
    with torch.no_grad():
        for lora in probe.loras().values():
            lora.B.normal_(std=0.05)  # a non-zero delta on every adapted projection, so the check covers them all
    ids, mask, _ = encoded["test"]
    tail_error = check_tail(model, probe, ids[:16], mask[:16], {k: v[:16] for k, v in feats["test"].items()})

    parts = dirichlet_partition(feats["train"]["labels"], s.clients, s.beta, min_size=s.batch, seed=DATA_SEED)
    spec = RunSpec(s.rounds, s.per_round, s.local_steps, s.batch, s.clip, DELTA)
    runner = Runner(layers, head, s.rank, s.targets, feats, pooled, parts, spec)
    seeds = [seed + k for k in range(s.seeds)]
    chosen, tests = _tune_and_test(report, runner, s, seeds)

    top = max(s.epsilons)
    for eps in s.epsilons:
        for base in (*BASELINES, HEAD_ONLY):
            report.measure_paired(f"la-lora-vs-{base}@eps{eps:g}{SUFFIX}", tests[("la-lora", eps)], tests[(base, eps)])
        spent = [r["eps"] for (arm, e, _, _), r in runner.runs.items() if e == eps]
        report.measure(f"privacy-ledger@eps{eps:g}", max(spent) / eps)
    report.measure_paired(f"headroom-{NON_PRIVATE}-vs-{HEAD_ONLY}@eps{top:g}", tests[(NON_PRIVATE, None)],
                          tests[(HEAD_ONLY, top)])
    report.measure("prefix-cache-exact", tail_error)
    report.measure("learns-above-chance", min(min(tests[(a, top)]) for a in PRIVATE_ARMS) / 100)
    _tables(report, chosen, tests, runner, seeds, parts, feats["train"]["labels"], head_sel, n_labels)
    _notes(report, s, parts, head_sel)
    report.plots["accuracy"] = _plot(s, tests)
    return report.finish()


Key = tuple[str, float | None]  # (arm, target epsilon; None for the non-private arm)


def _tune_and_test(report: Report, runner: Runner, s: Settings,
                   seeds: list[int]) -> tuple[dict[Key, Selection], dict[Key, list[float]]]:
    """Each arm (and epsilon): its rate chosen on validation at the first seed (the grid extended at its own step
    off an edge), then test accuracy (%) at that rate for every seed; the choice and budget recorded.

    Non-private LoRA is chosen on the mean validation accuracy over every seed: its updates are not clipped, so a
    rate that is stable at one seed can diverge at another (the first redesign's lr 0.2 scored best at seed 0 and
    fell to 18% test accuracy at seed 4), which a clipped DP arm's bounded updates do not do."""
    chosen: dict[Key, Selection] = {}
    tests: dict[Key, list[float]] = {}
    for arm, eps in [(arm, eps) for eps in s.epsilons for arm in PRIVATE_ARMS] + [(NON_PRIVATE, None)]:
        grid = _grid(arm, s)
        on = seeds if arm == NON_PRIVATE else seeds[:1]
        sel = select_with_extension(grid, lambda lr: st.fmean(runner.score(arm, eps, lr, sd, "val") for sd in on),
                                    True, "lr",
                                    s.head_max_extend if arm == HEAD_ONLY else s.max_extend,
                                    neighbour=grid_step_neighbour(grid))
        chosen[(arm, eps)] = sel
        tests[(arm, eps)] = [100 * runner.score(arm, eps, sel.chosen, sd, "test") for sd in seeds]
        budget = {"rounds": s.rounds, "clients_per_round": s.per_round, "local_steps": s.local_steps, "batch": s.batch,
                  "trainable_params": runner.run(arm, eps, sel.chosen, seeds[0])["trainable"]}
        report.record_arm(_label(arm, eps), sel, budget={**budget, **({} if eps is None else {"epsilon": eps})})
    # trainable_params differ by design between the LoRA arms (all equal) and head-only DP: recorded, not matched
    report.check_budgets_matched(["rounds", "clients_per_round", "local_steps", "batch"])
    return chosen, tests


def _grid(arm: str, s: Settings) -> tuple[float, ...]:
    return s.head_grid if arm == HEAD_ONLY else s.non_private_grid if arm == NON_PRIVATE else s.lora_grid


def _label(arm: str, eps: float | None) -> str:
    return NAMES[arm] if eps is None else f"{NAMES[arm]} @eps{eps:g}"


def _public_head(pooled, feats, s: Settings, n_labels: int) -> tuple[torch.nn.Linear, Selection]:
    """The head every arm starts from: fitted on the public split's adapter-off features, its L2 strength chosen by
    validation accuracy."""
    heads = {wd: fit_public_head(pooled["public"], feats["public"]["labels"], n_labels, wd) for wd in s.head_decays}
    scores = [_head_accuracy(heads[wd], pooled["val"], feats["val"]["labels"]) for wd in s.head_decays]
    sel = select_from_scores(s.head_decays, scores, True, "weight_decay")
    return heads[sel.chosen], sel


@torch.no_grad()
def _head_accuracy(head: torch.nn.Linear, pooled: torch.Tensor, labels: torch.Tensor) -> float:
    return float((head(pooled).argmax(-1) == labels).float().mean())


def _tables(report: Report, chosen, tests, runner: Runner, seeds, parts, labels: torch.Tensor, head_sel: Selection,
            n_labels: int) -> None:
    t = report.table("Test accuracy (%) at each arm's validation-chosen learning rate",
                     ["epsilon", "arm", "lr", "val_acc", "test_mean", "test_std", "per_seed", "noise_multiplier_range",
                      "wall_s_per_run"])
    for (arm, eps), sel in chosen.items():
        runs = [runner.run(arm, eps, sel.chosen, sd) for sd in seeds]
        sig = [x for x in runs[0]["sigma"] if x > 0]
        t.add(epsilon="-" if eps is None else eps, arm=NAMES[arm], lr=sel.chosen, val_acc=sel.chosen_score,
              test_mean=st.fmean(tests[(arm, eps)]), test_std=st.pstdev(tests[(arm, eps)]),
              per_seed=" ".join(f"{v:.1f}" for v in tests[(arm, eps)]),
              noise_multiplier_range=f"{min(sig):.2f}-{max(sig):.2f}" if sig else "-",
              wall_s_per_run=st.fmean(r["wall"] for r in runs))
    h = report.table("Public head (fitted on the public split, then frozen for the LoRA arms)",
                     ["weight_decay", "val_acc", "chosen"])
    for wd, score in zip(head_sel.grid, head_sel.scores):
        h.add(weight_decay=wd, val_acc=score, chosen="yes" if wd == head_sel.chosen else "")
    c = report.table("Clients (Dirichlet label skew)", ["client", "examples", "classes_present", "largest_class_share"])
    for i, p in enumerate(parts):
        counts = torch.bincount(labels[p], minlength=n_labels)
        c.add(client=i, examples=len(p), classes_present=int((counts > 0).sum()), largest_class_share=float(counts.max()) / len(p))


def _notes(report: Report, s: Settings, parts, head_sel: Selection) -> None:
    report.note(f"Data: {s.train} private wiki-topic training texts split over {s.clients} clients by Dirichlet(beta={s.beta}) "
                f"over labels (sizes {[len(p) for p in parts]}, at least one batch each); a public split of {s.public} other "
                f"training-pool articles; validation {s.val} further pool articles; test {s.test} eval-split articles; "
                f"{s.max_length} tokens.")
    report.note(f"Head: a 12-way linear head fitted non-privately (full-batch L-BFGS, L2 {head_sel.chosen:g} chosen on "
                "validation) on the public split's frozen-model features, the common DP assumption of a small public "
                "set disjoint from the private data (no privacy is spent on it). The LoRA arms keep it frozen, so their "
                "private training must move the features; head-only DP starts from it and trains only it.")
    report.note(f"Federation: Flower (flwr.server.Server, in-process clients), {s.rounds} rounds, {s.per_round} of {s.clients} "
                f"clients per round (sampled from the seed), uniform FedAvg of the trained tensors. Local: {s.local_steps} DP-SGD "
                f"steps, Poisson batches of expected size {s.batch}, clipping C={s.clip} over all trained tensors jointly, "
                "plain SGD; LA-LoRA's 5-tap binomial filter on the A/B gradients, the baselines without it (the paper's "
                "setup). Non-private LoRA: DP-LoRA's update without clipping or noise (same sampling and steps), its rate "
                "chosen on the mean validation accuracy over all seeds (unclipped, it diverged at one seed of five at the "
                "rate one seed's validation chose).")
    report.note(f"Privacy: example-level (epsilon, delta={DELTA:g}) per client, Opacus RDP accountant over every noisy local "
                "step of the rounds the client takes part in; each client's noise multiplier from opacus.get_noise_multiplier. "
                "The batches and noise are drawn from the seed so that a rerun repeats them (not private in deployment).")
    report.note(f"Model: all-MiniLM-L6-v2 frozen; LoRA r={s.rank}, alpha={s.rank} on {', '.join(s.targets)} of the top "
                f"{s.top} encoder layers, mean pooling; the prefix below those layers is cached (exactness is an invariant "
                "claim). The paper adapts the attention of every layer of RoBERTa/Swin: this is a CPU-scale stand-in.")
    report.note("Controls: head-only DP (LoRA off, the head trained privately from the same public head, on the frozen "
                "model's pooled features) is the arm every LoRA arm must beat for the adapter to add anything under DP; "
                f"non-private LoRA minus head-only DP above {HEADROOM_MARGIN:g} points is the sanity check that the "
                "testbed leaves the adapter room at all (issue 24: on the first testbed a head-only run matched every arm).")
    report.note(f"Paper claims are the comparisons at epsilon <= {PAPER_MAX_EPSILON:g} (the paper's budgets), declared on "
                f"this testbed after the first testbed's verdicts (post hoc, suffix '{SUFFIX}'); another epsilon is "
                "reported as an unclassified claim. Intervals are over training seeds on one fixed test set.")


def _plot(s: Settings, tests):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(s.epsilons), figsize=(5.5 * len(s.epsilons), 3.6), squeeze=False)
    for ax, eps in zip(axes[0], s.epsilons):
        for i, arm in enumerate(ALL_ARMS):
            v = tests[(arm, None if arm == NON_PRIVATE else eps)]
            ax.scatter([i] * len(v), v, s=14)
            ax.plot([i - 0.25, i + 0.25], [st.fmean(v)] * 2, color="k")
        ax.set_xticks(range(len(ALL_ARMS)), [NAMES[a] for a in ALL_ARMS], fontsize=7, rotation=20)
        ax.set_title(f"epsilon = {eps:g} (non-private LoRA: no budget)", fontsize=9)
        ax.set_ylabel("test accuracy (%)")
    fig.tight_layout()
    return fig
