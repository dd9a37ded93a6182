"""Reproduction `lorsa` (R1 of the card): Lorsa on a toy transformer with planted attention mechanisms.

Per seed: a 2-layer attention-only transformer (d = 64, 2 heads of 32 per layer, RoPE) learns four mechanisms that
all need layer 2 (`tasks.py`: induction, copy-first, two key/query recalls), so layer 2's two heads must pack four
attention units. Its layer-2 input X (after the pre-norm) and output Y are captured; a Lorsa (n_ov = 256 rank-1 OV
heads, n_qk = 8 QK heads of 32, K = 8) is fitted X -> Y and a Top-K SAE of the same width and K reconstructs Y.
Both arms run the same fit (steps, batches, K warmup); each arm's lr is chosen on validation FVU (first seed).

Measured on held-out sequences: FVU of both arms; the induction score of every QK head (Lorsa) and head (MHA) on
doubled random sequences; per mechanism, the largest fraction of one unit's top-100 activations that the mechanism
owns (over a pool with equal numbers of positions per mechanism and unlabelled positions), averaged over the four
mechanisms: a layer with a dedicated unit for every mechanism scores 1, two heads for four mechanisms cannot.

Issue 24 (like with like): the first purity claim set the best of 256 sparse units against the best of 2 dense heads,
which favours the many units by construction. It is retired. Lorsa is now compared, by the same rule, with the MHA
layer written exactly as its 64 rank-1 OV units (`lorsa_from_mha`, K = all), and with the Top-K SAE of Lorsa's
width and K, the paper's comparator for interpretability. Both claims are labelled post hoc. The induction claim is
also judged on the same Lorsa before fitting, a control for a probe that any QK head would pass.
"""

from __future__ import annotations

import statistics as st
from dataclasses import dataclass

import torch

from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.nn.lorsa import FitConfig, LorsaConfig, Rope, induction_score, lorsa_from_mha, mechanism_fractions
from rankwise.nn.lorsa.topk import scatter_dense
from rankwise.repro.lorsa.arms import LORSA, SAE, arm_fvu, build, fit_arm, tune_lr
from rankwise.repro.lorsa.tasks import MECHANISMS, doubled_random, planted_sequences
from rankwise.repro.lorsa.toy import capture_layer, mechanism_accuracy, train_toy
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    toy_sequences: int  # training sequences of the toy transformer
    toy_steps: int
    capture: tuple[int, int, int]  # sequences captured for Lorsa train / validation / test
    n_ov: int
    n_qk: int
    d_qk: int
    k: int
    fit_steps: int
    fit_batch: int
    lr_grid: tuple[float, ...]
    seeds: int
    n_top: int
    probes: int  # doubled random sequences for the induction score


SIZES = BySize(
    smoke=Settings(toy_sequences=256, toy_steps=20, capture=(32, 16, 32), n_ov=32, n_qk=4, d_qk=32, k=4,
                   fit_steps=10, fit_batch=8, lr_grid=(1e-3, 3e-3), seeds=1, n_top=10, probes=8),
    full=Settings(toy_sequences=20000, toy_steps=1000, capture=(3000, 300, 1000), n_ov=256, n_qk=8, d_qk=32, k=8,
                  fit_steps=1200, fit_batch=32, lr_grid=(3e-3, 1e-2, 3e-2, 1e-1), seeds=5, n_top=100, probes=200),
)
TOY_LR, TOY_BATCH, LAYER = 3e-3, 32, 1
INDUCTION_THRESHOLD = 0.8  # the card: "a few Lorsa heads have induction score > 0.8"
PURITY_MARGIN = 0.1  # Lorsa's per-mechanism coverage must beat the MHA's rank-1 units' by more than this
SAE_PURITY_MARGIN = -0.1  # "comparable to the SAE": Lorsa's coverage may trail the SAE's by at most this
TESTBED = "toy 2-layer attention-only transformer, four planted mechanisms, layer 2"
FVU_MARGIN = 0.1  # "slightly worse than the SAE": FVU(Lorsa) - FVU(SAE) at most this
EXACT_TOL = 1e-10  # float64 embedding of the MHA: rounding only


def _declare(report: Report, s: Settings) -> None:
    report.declare(SampleClaim("lorsa_has_induction_head", "per-seed max over Lorsa QK heads of the induction score "
                               "on doubled random sequences (distinct tokens within a half)", ">", INDUCTION_THRESHOLD,
                               kind=ClaimKind.PAPER, discriminates=control("the same Lorsa at initialisation")))
    coverage = (f"mean over the {len(MECHANISMS)} mechanisms of the best unit's share of its top-{s.n_top} activations "
                "owned by the mechanism")
    report.declare(PairedClaim("lorsa_units_purer_than_mha_rank1", f"{coverage}: Lorsa heads minus the MHA layer's "
                               "rank-1 OV units (the exact Lorsa form of its 2 heads, K = all), paired by seed", ">",
                               PURITY_MARGIN, kind=ClaimKind.PAPER, discriminates=comparison("MHA as rank-1 units"),
                               testbed=TESTBED, post_hoc=True))
    report.declare(PairedClaim("lorsa_purity_noninferior_to_sae", f"{coverage}: Lorsa heads minus the Top-K SAE's "
                               "latents (same width and K, same rule), paired by seed (the paper: comparable)", ">=",
                               SAE_PURITY_MARGIN, kind=ClaimKind.PAPER, discriminates=comparison(SAE), testbed=TESTBED,
                               post_hoc=True))
    report.declare(PairedClaim("lorsa_fvu_close_to_sae", f"held-out FVU at K = {s.k}: Lorsa minus Top-K SAE of the "
                               "same width, paired by seed (the paper: slightly worse)", "<=", FVU_MARGIN,
                               kind=ClaimKind.PAPER))
    report.declare(Claim("exact_mha_embedding", "max |Lorsa(x) - MHA(x)| / max |MHA(x)|, layer 2 written as a Lorsa "
                         "with K = all 64 rank-1 heads, float64", "<=", EXACT_TOL, kind=ClaimKind.INVARIANT))
    report.declare(Claim("toy_learned_mechanisms", "min over seeds and mechanisms of the toy's next-token accuracy on "
                         "held-out sequences", ">=", 0.9, kind=ClaimKind.SANITY))


def _pool(labels: torch.Tensor, n_mech: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices of a balanced pool (equal counts per mechanism and of unlabelled positions) and their labels."""
    flat = labels[:, 1:].flatten()
    g = torch.Generator().manual_seed(seed)
    groups = [torch.nonzero(flat == m).flatten() for m in (*range(n_mech), -1)]
    n = min(len(i) for i in groups)
    picked = torch.cat([i[torch.randperm(len(i), generator=g)[:n]] for i in groups])
    return picked, flat[picked]


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("lorsa", "Lorsa on a toy transformer with planted attention superposition (card R1)", size, seed)
    _declare(report, s)
    config = LorsaConfig(d_model=64, n_qk=s.n_qk, n_ov=s.n_ov, d_qk=s.d_qk, k=s.k, rope=Rope(s.d_qk, 1e4))
    fit_config = FitConfig(steps=s.fit_steps, lr=1e-3, batch_size=s.fit_batch, k_start=min(s.n_ov, 4 * s.k))
    rows, lrs, exact_err, min_acc = [], {}, 0.0, 1.0
    for i in range(s.seeds):
        sd = seed + i
        say(f"seed {i + 1}/{s.seeds}: toy transformer, capture, fits")
        toks, labs = planted_sequences(s.toy_sequences, 1000 * sd)
        model, _ = train_toy(toks, labs, s.toy_steps, TOY_BATCH, TOY_LR, sd)
        n_tr, n_va, n_te = s.capture
        cap_t, cap_l = planted_sequences(n_tr + n_va + n_te, 1000 * sd + 1)
        acc = mechanism_accuracy(model, cap_t[n_tr + n_va:], cap_l[n_tr + n_va:], len(MECHANISMS))
        min_acc = min(min_acc, *acc)
        x, y = capture_layer(model, cap_t, LAYER)
        train, val, test = ((x[a:b], y[a:b]) for a, b in ((0, n_tr), (n_tr, n_tr + n_va), (n_tr + n_va, None)))
        attn = model.attns[LAYER]
        with torch.no_grad():
            x64 = test[0][:16].double()
            ref = attn.double()(x64)
            exact_err = max(exact_err, float((lorsa_from_mha(attn)(x64) - ref).abs().max() / ref.abs().max()))
            attn.float()
        if i == 0:
            tune_fit = FitConfig(**{**fit_config.__dict__, "steps": max(1, s.fit_steps // 2)})
            for arm in (LORSA, SAE):
                sel = tune_lr(arm, config, tune_fit, s.lr_grid, train, val, seed=sd)
                report.record_arm(arm, sel, budget={"steps": s.fit_steps, "batch_sequences": s.fit_batch,
                                                     "width": s.n_ov, "k": s.k})
                lrs[arm] = float(sel.chosen)
            report.check_budgets_matched(["steps", "batch_sequences", "width", "k"])
        fitted = {arm: fit_arm(arm, config, FitConfig(**{**fit_config.__dict__, "lr": lrs[arm]}), *train, seed=sd)
                  for arm in (LORSA, SAE)}
        lorsa = fitted[LORSA]
        row = {"seed": sd, **{f"acc_{m}": a for m, a in zip(MECHANISMS, acc)},
               "fvu_lorsa": arm_fvu(LORSA, lorsa, *test), "fvu_sae": arm_fvu(SAE, fitted[SAE], *test)}
        with torch.no_grad():
            probe = doubled_random(s.probes, 31, 1000 * sd + 2)
            px, _ = capture_layer(model, probe, LAYER)
            ind_lorsa = induction_score(lorsa.patterns(px), probe)
            with torch.random.fork_rng():  # the same seed's Lorsa before its fit, leaving the global stream as it was
                ind_init = induction_score(build(LORSA, config, sd).patterns(px), probe)
            ind_mha = induction_score(attn.patterns(px), probe)
            pool, pool_labels = _pool(cap_l[n_tr + n_va:], len(MECHANISMS), sd)
            tx = test[0]
            lorsa_acts = lorsa.sparse_activations(tx)[:, 1:].reshape(-1, s.n_ov)[pool]
            mha_acts = attn.head_outputs(tx).norm(dim=-1)[:, 1:].reshape(-1, attn.n_heads)[pool]
            f_lorsa = mechanism_fractions(lorsa_acts, pool_labels, s.n_top)  # [U, n_mech]
            f_mha = mechanism_fractions(mha_acts, pool_labels, s.n_top)
            rank1 = lorsa_from_mha(attn)  # every rank-1 OV unit of the two heads, all active (K = all)
            f_rank1 = mechanism_fractions(rank1.sparse_activations(tx)[:, 1:].reshape(-1, rank1.config.n_ov)[pool],
                                          pool_labels, s.n_top)
            sae = fitted[SAE]
            sae_acts = scatter_dense(*sae.encode(test[1]), sae.n_latents)[:, 1:].reshape(-1, s.n_ov)[pool]
            f_sae = mechanism_fractions(sae_acts, pool_labels, s.n_top)
            used = (lorsa.sparse_activations(tx)[:, 1:] != 0).flatten(0, 1).any(0)
        row.update(ind_lorsa_max=float(ind_lorsa.max()), ind_init_max=float(ind_init.max()),
                   ind_mha=" ".join(f"{v:.3f}" for v in ind_mha.tolist()),
                   cover_lorsa=float(f_lorsa.max(0).values.mean()), cover_mha=float(f_mha.max(0).values.mean()),
                   cover_mha_rank1=float(f_rank1.max(0).values.mean()), cover_sae=float(f_sae.max(0).values.mean()),
                   best_lorsa=" ".join(f"{v:.2f}" for v in f_lorsa.max(0).values.tolist()),
                   best_mha=" ".join(f"{v:.2f}" for v in f_mha.max(0).values.tolist()),
                   dead_heads=float(1 - used.double().mean()), pool=int(pool.numel()))
        rows.append(row)

    report.measure("lorsa_has_induction_head", [r["ind_lorsa_max"] for r in rows])
    report.get_claim("lorsa_has_induction_head").measure_control([r["ind_init_max"] for r in rows])
    cover = lambda key: [r[key] for r in rows]  # noqa: E731
    report.measure_paired("lorsa_units_purer_than_mha_rank1", cover("cover_lorsa"), cover("cover_mha_rank1"))
    report.measure_paired("lorsa_purity_noninferior_to_sae", cover("cover_lorsa"), cover("cover_sae"))
    report.measure_paired("lorsa_fvu_close_to_sae", [r["fvu_lorsa"] for r in rows], [r["fvu_sae"] for r in rows])
    report.measure("exact_mha_embedding", exact_err)
    report.measure("toy_learned_mechanisms", min_acc)

    t = report.table("Per seed (held-out sequences)", list(rows[0]))
    for r in rows:
        t.add(**r)
    t2 = report.table("Means over seeds", ["arm", "fvu", "max_induction_score", "mechanism_coverage"])
    t2.add(arm=LORSA, fvu=st.fmean(r["fvu_lorsa"] for r in rows), max_induction_score=st.fmean(r["ind_lorsa_max"] for r in rows),
           mechanism_coverage=st.fmean(r["cover_lorsa"] for r in rows))
    t2.add(arm="MHA heads (2)", fvu=0.0, max_induction_score=st.fmean(max(map(float, r["ind_mha"].split())) for r in rows),
           mechanism_coverage=st.fmean(r["cover_mha"] for r in rows))
    t2.add(arm="MHA as rank-1 units (64)", fvu=0.0, max_induction_score="n/a",
           mechanism_coverage=st.fmean(r["cover_mha_rank1"] for r in rows))
    t2.add(arm=SAE, fvu=st.fmean(r["fvu_sae"] for r in rows), max_induction_score="n/a",
           mechanism_coverage=st.fmean(r["cover_sae"] for r in rows))
    report.note(f"Mechanisms (order of the best_* columns): {', '.join(MECHANISMS)}. best_lorsa / best_mha: per "
                f"mechanism, the largest share of one unit's top-{s.n_top} activations (Lorsa: |z| after the top-K; MHA: "
                "the norm of a head's output) that the mechanism owns; coverage = their mean. The pool holds equal "
                "numbers of positions of each mechanism and of unlabelled positions, so chance is 0.2.")
    report.note("The best-unit statistic is a maximum over units, so more units are favoured: Lorsa's 256 heads "
                "against the MHA's 2 heads (cover_mha, the retired claim's comparator) was not like with like. The "
                "claims compare Lorsa with the MHA's 64 rank-1 OV units and with the SAE's 256 latents (its "
                "activations are the ReLU latents after its top-K, on the layer's output). dead_heads is the fraction "
                "of Lorsa heads never selected on the test sequences.")
    report.note("History: the first full run (lr grid 1e-3..1e-2, both arms chose its high edge) drew the induction probes "
                "with repeats inside a half, so 'the token after the previous occurrence' pointed at random tokens "
                "for ~20% of the scored positions; both MHA heads and the best Lorsa QK head scored 0.60 there. The "
                "probes now use distinct tokens within a half. The second run (grid 3e-3..3e-2) left the SAE on the "
                "grid's high edge (Lorsa chose 1e-2 inside it); the grid was extended to 1e-1 (this run).")
    report.note(f"Toy: {s.toy_steps} Adam steps (lr {TOY_LR}, batch {TOY_BATCH}) on {s.toy_sequences} sequences, loss "
                f"on planted positions. Lorsa: n_ov {s.n_ov}, n_qk {s.n_qk} (G = {s.n_ov // s.n_qk}), d_qk {s.d_qk}, "
                f"K {s.k} (annealed from {min(s.n_ov, 4 * s.k)} over the first 10% of steps), {s.fit_steps} steps of "
                f"{s.fit_batch} sequences of 64 tokens; the SAE runs the same schedule. lr tuned on the first seed's "
                f"validation FVU with half-length runs, grid {list(s.lr_grid)}.")
    return report.finish()


__all__ = ["run", "SIZES", "Settings"]
