"""Reproduction `peso`: continual LoRA on MovieLens time blocks — PESO (softmax-KL proximal to the previous stage's
adapter) vs a single evolving LoRA (lam = 0), a cumulative LoRA and the L2 proximal.

Card peso.md, on real data: the MovieLens ratings (dslabs), items with >= `min_count` ratings as tokens. A small causal
Llama over item IDs is pretrained (all weights) on block 0 (the first half of the interactions by time); LoRA stages
then train on blocks 1..T-2, the model after stage t being tested on block t+1 (next-block evaluation). Metrics:
Hit@10 / NDCG@10 of each user's last interaction in the block (leave-last-out, the paper's protocol) and of every
interaction in the block, items the user already rated masked; split by returning users (rated before the block) and
new users. Users are split once: validation users tune each arm (lr; lam for PESO and L2) on all their next-block
interactions, test users carry the claims. Seeds vary the adapters' initialisation and the batch order; the
pretrained model is shared by all seeds and arms.
"""

from __future__ import annotations

import statistics as st
from dataclasses import dataclass

import torch

from rankwise.core.arms import select_from_scores
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.data.ratings import load_movielens
from rankwise.repro.peso.arms import ARMS, ContinualRun, StageSettings, pretrain, run_continual, stage_steps
from rankwise.repro.peso.data import IGNORE, Sequences, Windows, block_windows, build_sequences, check_targets, seen_before
from rankwise.repro.peso.model import hit_at, ndcg_at, target_ranks
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    min_count: int  # items with fewer ratings are dropped
    base_frac: float  # block 0's share of the interactions
    incremental: int  # blocks after block 0
    history: int  # items of history a prediction sees
    validation_frac: float
    stage: StageSettings
    pretrain_steps: int
    pretrain_lr: float
    lr_grid: tuple[float, ...]
    lam_grid_kl: tuple[float, ...]
    lam_grid_l2: tuple[float, ...]
    max_extensions: int  # extra grid points per parameter when a choice sits on an edge
    seeds: int


SIZES = BySize(
    smoke=Settings(min_count=60, base_frac=0.5, incremental=3, history=8, validation_frac=0.25,
                   stage=StageSettings(hidden=16, layers=1, rank=2, epochs=1, batch=64, weight_decay=0.0),
                   pretrain_steps=4, pretrain_lr=3e-3, lr_grid=(3e-3,), lam_grid_kl=(10.0, 1000.0),
                   lam_grid_l2=(1.0, 10.0), max_extensions=0, seeds=2),
    full=Settings(min_count=10, base_frac=0.5, incremental=6, history=20, validation_frac=0.25,
                  stage=StageSettings(hidden=64, layers=2, rank=4, epochs=3, batch=32, weight_decay=0.0),
                  pretrain_steps=600, pretrain_lr=3e-3, lr_grid=(1e-3, 3e-3, 1e-2),
                  lam_grid_kl=(10.0, 100.0, 1000.0), lam_grid_l2=(0.1, 1.0, 10.0),
                  max_extensions=1, seeds=5),
)
LABELS = {"single": "single evolving LoRA (lam=0)", "peso": "PESO (softmax-KL)", "l2": "L2 proximal", "cumulative": "cumulative LoRA"}
K = 10


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("peso", "PESO: continual LoRA on MovieLens time blocks vs single, cumulative and L2-proximal LoRA", size, seed)
    _declare(report)
    ratings = load_movielens()
    seqs = build_sequences(ratings, s.min_count, s.base_frac, s.incremental, s.validation_frac, split_seed=seed)
    blocks = list(range(seqs.num_blocks))
    train_w = {b: block_windows(seqs, b, s.history) for b in blocks}
    eval_w = train_w  # evaluation on block b uses every target of b; who counts is decided by the masks below
    for b in blocks[1:]:
        check_targets(seqs, eval_w[b])
    stages = blocks[1:-1]
    scored = blocks[3:]  # after stage 2 onwards: stage 1 has no previous adapter, so every arm is the same there
    say(f"pretraining on block 0 ({train_w[0].num_targets:,} targets, {seqs.num_items:,} items)")
    base = pretrain(seqs, train_w[0], s.stage, s.pretrain_steps, s.pretrain_lr, seed)
    base_state = {k: v.detach().clone() for k, v in base.state_dict().items()}
    pre_ranks = {b: target_ranks(base, eval_w[b], seqs) for b in blocks[1:]}
    masks = {b: _masks(seqs, eval_w[b], b) for b in blocks[1:]}

    def go(arm: str, lr: float, lam: float, sd: int) -> ContinualRun:
        return run_continual(arm, lr, lam, sd, base_state, seqs, train_w, eval_w, s.stage, stages)

    def val_score(r: ContinualRun) -> float:  # all next-block interactions of validation users, every stage
        return ndcg_at(torch.cat([r.ranks[b][masks[b]["val"]] for b in r.ranks]), K)

    seeds = [seed + k for k in range(s.seeds)]
    chosen: dict[str, ContinualRun] = {}
    lam_tables: dict[str, dict[tuple[float, float], float]] = {}
    for arm in ARMS:
        lam_grid = {"peso": s.lam_grid_kl, "l2": s.lam_grid_l2}.get(arm, (0.0,))
        say(f"tuning {LABELS[arm]}: lr {list(s.lr_grid)} x lam {list(lam_grid)}")
        runs, lr_sel, lam_sel = _tune(go, val_score, arm, s.lr_grid, lam_grid, seeds[0], s.max_extensions)
        lam_tables[arm] = {k: val_score(r) for k, r in runs.items()}
        best = runs[(lr_sel.chosen, lam_sel.chosen if lam_sel else 0.0)]
        chosen[arm] = best
        budget = {"steps": best.steps, "trainable_per_stage": best.trainable, "batch": s.stage.batch,
                  "tuning_runs": len(runs)}
        report.record_arm(LABELS[arm], lr_sel, budget)
        if lam_sel is not None:
            report.record_arm(f"{LABELS[arm]}: lam", lam_sel, budget)
    report.check_budgets_matched(["steps", "trainable_per_stage", "batch"])

    per_seed: dict[str, list[ContinualRun]] = {}
    for arm in ARMS:
        c = chosen[arm]
        per_seed[arm] = [c] + [go(arm, c.lr, c.lam, sd) for sd in seeds[1:]]
        say(f"{LABELS[arm]}: {len(seeds)} seeds done")
    lam0 = go("peso", chosen["single"].lr, 0.0, seeds[0])

    def metric(r_ranks: dict[int, torch.Tensor], group: str, last: bool, fn=ndcg_at) -> float:
        sel = [r_ranks[b][masks[b]["test"] & masks[b][group] & (masks[b]["last"] if last else True)] for b in scored]
        return fn(torch.cat(sel), K)

    values = {arm: {g: [metric(r.ranks, g, True) for r in runs] for g in ("all", "returning", "new")} for arm, runs in per_seed.items()}
    report.measure_paired("peso_beats_single", values["peso"]["all"], values["single"]["all"])
    report.measure_paired("peso_beats_single_returning", values["peso"]["returning"], values["single"]["returning"])
    report.measure_paired("peso_beats_cumulative_new", values["peso"]["new"], values["cumulative"]["new"])
    pre_all = metric(pre_ranks, "all", False)
    report.measure_paired("updating_beats_pretrain", [metric(r.ranks, "all", False) for r in per_seed["single"]],
                          [pre_all] * len(seeds))
    report.measure("pretrain_beats_popularity", ndcg_at(torch.cat([pre_ranks[b][masks[b]["test"]] for b in scored]), K)
                   - _popularity_ndcg(seqs, eval_w, masks, scored))
    report.measure("lam0_equals_single", sum(int((lam0.ranks[b] != chosen["single"].ranks[b]).sum()) for b in lam0.ranks))
    report.measure("proximal_zero_at_stage_start", max([abs(v) for r in per_seed["peso"] + per_seed["l2"] for v in r.kl_at_start] or [0.0]))

    _tables(report, per_seed, pre_ranks, masks, scored, lam_tables, metric, s)
    _notes(report, s, seqs, train_w, scored, masks, seeds)
    report.plots["peso_blocks"] = _plot(per_seed, pre_ranks, masks, lam_tables, s)
    return report.finish()


def _declare(report: Report) -> None:
    what = "leave-last-out NDCG@10 on test users, blocks where the arms can differ (3..T-1)"
    report.declare(PairedClaim("peso_beats_single", f"{what}: PESO minus single evolving LoRA (paper: PESO better overall)",
                               ">", 0.0, kind=ClaimKind.PAPER))
    report.declare(PairedClaim("peso_beats_single_returning", f"{what}, returning users (rated before the block): "
                               "PESO minus single evolving LoRA", ">", 0.0, kind=ClaimKind.PAPER))
    report.declare(PairedClaim("peso_beats_cumulative_new", f"{what}, new users: PESO minus cumulative LoRA", ">", 0.0,
                               kind=ClaimKind.PAPER))
    report.declare(PairedClaim("updating_beats_pretrain", "NDCG@10 over all next-block interactions of test users: single "
                               "evolving LoRA minus the frozen pretrained model", ">", 0.0, kind=ClaimKind.SANITY))
    report.declare(Claim("pretrain_beats_popularity", "NDCG@10 (all next-block interactions, test users): pretrained model "
                         "minus block-0 popularity ranking", ">", 0.0, kind=ClaimKind.SANITY))
    report.declare(Claim("lam0_equals_single", "targets ranked differently by PESO with lam = 0 and by the single evolving "
                         "LoRA (same seed and lr), every block", "<=", 0, kind=ClaimKind.INVARIANT))
    report.declare(Claim("proximal_zero_at_stage_start", "max |proximal term| at the first step of every regularised stage "
                         "(PESO and L2 runs, all seeds)", "<=", 0.0, kind=ClaimKind.INVARIANT))


def _tune(go, val_score, arm, lr_grid, lam_grid, seed, max_extensions):
    """Grid over (lr, lam) on validation; a choice on an edge of either grid extends it by one point (x ~3 for lr,
    x10 for lam) up to `max_extensions` times per parameter. Returns the runs and the two selections."""
    lrs, lams = list(lr_grid), list(lam_grid)
    runs: dict[tuple[float, float], ContinualRun] = {}
    ext = {"lr": 0, "lam": 0}
    while True:
        for lr in lrs:
            for lam in lams:
                if (lr, lam) not in runs:
                    runs[(lr, lam)] = go(arm, lr, lam, seed)
        score = {k: val_score(r) for k, r in runs.items()}
        best_lr, best_lam = max(score, key=lambda k: (score[k], -k[0], -k[1]))
        lr_scores = [max(score[(lr, lam)] for lam in lams) for lr in lrs]
        lr_sel = select_from_scores(lrs, lr_scores, True, "lr")
        lam_sel = select_from_scores(lams, [score[(best_lr, lam)] for lam in lams], True, "lam") if len(lams) > 1 else None
        grew = False
        if lr_sel.edge and ext["lr"] < max_extensions:
            lrs = sorted(lrs + [lrs[0] / 3.16 if lr_sel.edge == "low" else lrs[-1] * 3.16])
            ext["lr"] += 1
            grew = True
        if lam_sel is not None and lam_sel.edge and ext["lam"] < max_extensions:
            lams = sorted(lams + [lams[0] / 10 if lam_sel.edge == "low" else lams[-1] * 10])
            ext["lam"] += 1
            grew = True
        if not grew:
            return runs, lr_sel, lam_sel


def _masks(seqs: Sequences, w: Windows, block: int) -> dict[str, torch.Tensor]:
    val = seqs.validation_users[w.target_user]
    before = seqs.users_before(block)[w.target_user]
    return {"val": val, "test": ~val, "last": w.target_last, "returning": before, "new": ~before,
            "all": torch.ones_like(val)}


def _popularity_ndcg(seqs: Sequences, eval_w: dict[int, Windows], masks, scored) -> float:
    """Rank items by their block-0 counts (ties broken by id), seen items masked as for the models."""
    counts = torch.zeros(seqs.vocab_size, dtype=torch.float64)
    for tok, blk in zip(seqs.tokens, seqs.blocks):
        counts.index_add_(0, tok[blk == 0], torch.ones(int((blk == 0).sum()), dtype=torch.float64))
    ranks = []
    for b in scored:
        w = eval_w[b]
        sel = masks[b]["test"]
        users, pos = w.target_user[sel], w.target_position[sel]
        target = w.labels[w.labels != IGNORE][sel]
        score = counts[None, :].expand(users.numel(), -1).clone()
        seen = seen_before(seqs, users, pos)
        seen[torch.arange(target.numel()), target] = False
        score[seen] = -1.0
        ranks.append((score > score.gather(1, target[:, None])).sum(1) + 1)
    return ndcg_at(torch.cat(ranks), K)


def _tables(report, per_seed, pre_ranks, masks, scored, lam_tables, metric, s) -> None:
    t = report.table("Test users, blocks 3..T-1: leave-last-out (LLO) and all next-block interactions (mean over seeds; "
                     "± std)", ["arm", "lr", "lam", "NDCG@10_LLO", "Hit@10_LLO", "NDCG@10_LLO_returning",
                                "NDCG@10_LLO_new", "NDCG@10_all", "Hit@10_all", "NDCG@10_all_returning", "NDCG@10_all_new"])
    cell = lambda xs: f"{st.fmean(xs):.4f} ± {st.pstdev(xs):.4f}"  # noqa: E731
    for arm, runs in per_seed.items():
        m = lambda g, last, fn=ndcg_at: cell([metric(r.ranks, g, last, fn) for r in runs])  # noqa: E731
        t.add(arm=LABELS[arm], lr=runs[0].lr, lam=runs[0].lam, **{"NDCG@10_LLO": m("all", True), "Hit@10_LLO": m("all", True, hit_at),
              "NDCG@10_LLO_returning": m("returning", True), "NDCG@10_LLO_new": m("new", True),
              "NDCG@10_all": m("all", False), "Hit@10_all": m("all", False, hit_at),
              "NDCG@10_all_returning": m("returning", False), "NDCG@10_all_new": m("new", False)})
    p = lambda g, last, fn=ndcg_at: f"{metric(pre_ranks, g, last, fn):.4f}"  # noqa: E731
    t.add(arm="PRETRAIN (frozen, block 0 only)", lr="", lam="", **{"NDCG@10_LLO": p("all", True), "Hit@10_LLO": p("all", True, hit_at),
          "NDCG@10_LLO_returning": p("returning", True), "NDCG@10_LLO_new": p("new", True), "NDCG@10_all": p("all", False),
          "Hit@10_all": p("all", False, hit_at), "NDCG@10_all_returning": p("returning", False), "NDCG@10_all_new": p("new", False)})
    blocks = sorted(per_seed["single"][0].ranks)
    tb = report.table("Per block (test users, mean over seeds): NDCG@10 all interactions / leave-last-out",
                      ["arm", *[f"block {b}" for b in blocks]])
    for arm, runs in per_seed.items():
        tb.add(arm=LABELS[arm], **{f"block {b}": f"{st.fmean(_block(r.ranks, masks, b, False) for r in runs):.4f} / "
                                                 f"{st.fmean(_block(r.ranks, masks, b, True) for r in runs):.4f}" for b in blocks})
    tb.add(arm="PRETRAIN", **{f"block {b}": f"{_block(pre_ranks, masks, b, False):.4f} / {_block(pre_ranks, masks, b, True):.4f}"
                              for b in blocks})
    tl = report.table("Validation NDCG@10 over the (lr, lam) grid, tuning seed (the lam curve; * = chosen)", ["arm", "lr", "scores by lam"])
    for arm, table in lam_tables.items():
        chosen = (per_seed[arm][0].lr, per_seed[arm][0].lam)
        for lr in sorted({k[0] for k in table}):
            tl.add(arm=LABELS[arm], lr=lr, **{"scores by lam": "; ".join(
                f"{lam:g}: {v:.4f}{'*' if (lr, lam) == chosen else ''}" for (l_, lam), v in sorted(table.items()) if l_ == lr)})
    tc = report.table("Evaluation cases per block (test users): leave-last-out returning / new, all interactions",
                      ["block", "LLO_returning", "LLO_new", "all_interactions"])
    for b in blocks:
        mk = masks[b]
        tc.add(block=b, LLO_returning=int((mk["test"] & mk["last"] & mk["returning"]).sum()),
               LLO_new=int((mk["test"] & mk["last"] & mk["new"]).sum()), all_interactions=int(mk["test"].sum()))


def _block(ranks, masks, b, last) -> float:
    m = masks[b]["test"] & (masks[b]["last"] if last else True)
    return ndcg_at(ranks[b][m], K)


def _notes(report, s: Settings, seqs: Sequences, train_w, scored, masks, seeds) -> None:
    st_ = s.stage
    report.note(f"Data: dslabs MovieLens (100,004 ratings), movies with >= {s.min_count} ratings as tokens ({seqs.num_items:,} "
                f"items); block 0 = the first {s.base_frac:.0%} of the kept interactions by time, then {s.incremental} equal "
                f"blocks; training targets per block: {[w.num_targets for w in train_w.values()]}. History window "
                f"{s.history} items. Validation users {int(seqs.validation_users.sum())} of {len(seqs.tokens)}.")
    report.note(f"Model: Llama, hidden {st_.hidden}, {st_.layers} layers, 4/2 heads, tied item embeddings; pretrained on "
                f"block 0 for {s.pretrain_steps} AdamW steps (lr {s.pretrain_lr}). LoRA r={st_.rank}, alpha={2 * st_.rank} "
                f"on q,k,v,o,gate,up,down; embeddings trained fully in every stage and never regularised (paper: "
                f"modules_to_save); {st_.epochs} epochs per block, batch {st_.batch}, AdamW, 5% warmup + cosine, clip 1.0.")
    report.note(f"Tuning: every arm on the same lr grid {list(s.lr_grid)} (PESO lam {list(s.lam_grid_kl)}, L2 lam "
                f"{list(s.lam_grid_l2)}; an edge choice extends a grid by one point, up to {s.max_extensions} per "
                f"parameter) by validation users' NDCG@10 over all next-block interactions, seed {seeds[0]}; that "
                f"run is also seed {seeds[0]}'s measured run. Seeds {seeds}: adapter init and batch order; the pretrained "
                "model is shared.")
    report.note("Claims read blocks 3..T-1: stage 1 has no previous adapter, so every arm computes the same model there "
                "(its block-2 numbers are in the per-block table). 'Returning' = rated something before the block "
                "(mostly users active in the previous block too: MovieLens users who go dormant for a whole block and "
                "come back are a handful per block); 'new' = first seen in the block.")
    report.note("The intervals are over training seeds on one fixed set of test users; they do not include the "
                "sampling variance of the test users.")


def _plot(per_seed, pre_ranks, masks, lam_tables, s):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    blocks = sorted(per_seed["single"][0].ranks)
    for arm, runs in per_seed.items():
        axes[0].plot(blocks, [st.fmean(_block(r.ranks, masks, b, False) for r in runs) for b in blocks], marker="o", label=LABELS[arm])
    axes[0].plot(blocks, [_block(pre_ranks, masks, b, False) for b in blocks], ls="--", color="k", label="PRETRAIN")
    axes[0].set_xlabel("evaluated block")
    axes[0].set_ylabel("NDCG@10, all interactions (test users)")
    axes[0].legend(fontsize=7)
    for arm in ("peso", "l2"):
        lr = per_seed[arm][0].lr
        pts = sorted((lam, v) for (l_, lam), v in lam_tables[arm].items() if l_ == lr)
        axes[1].semilogx([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{LABELS[arm]} (lr {lr:g})")
    single = max(lam_tables["single"].values())
    axes[1].axhline(single, color="gray", ls=":", label="single LoRA (lam = 0)")
    axes[1].set_xlabel("lam")
    axes[1].set_ylabel("validation NDCG@10")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["run", "SIZES", "Settings", "stage_steps"]
