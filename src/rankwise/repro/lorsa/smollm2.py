"""Reproduction `lorsa:smollm2` (R2 of the card): Lorsa on the middle attention layer of SmolLM2-135M.

X (after the pre-norm) and Y (after o_proj) of layer 15 of 30 are captured on Wikipedia windows of 128 tokens
(train split for fitting, eval split for validation and test). For each K, a Lorsa (n_ov = 4d = 2304 rank-1 heads,
n_qk = 18 QK heads of 64 = the model's head dim, RoPE copied from the model) is fitted X -> Y and a Top-K SAE of the
same width and K reconstructs Y; same steps, batches and K warmup. Most units of both arms end dead in these
2e5-token fits (the paper's are 8e8): the FVU claims are then withheld as INCONCLUSIVE (`lorsa_heads_alive`). Each arm's lr is chosen at the middle K on
validation FVU (first seed, half-length runs). Three seeds vary initialisation and batch order on the same
captured activations. The exact Lorsa form of the layer (K = all 576 rank-1 pieces) is checked against the model's
own attention in float64, which pins down the RoPE convention and the GQA layout.
"""

from __future__ import annotations

import copy
import statistics as st
from dataclasses import dataclass

import numpy as np
import torch

from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import say
from rankwise.core.report import Report
from rankwise.data import token_windows
from rankwise.nn.lorsa import FitConfig, LorsaConfig, induction_score, top_activating_contexts
from rankwise.repro.lorsa.arms import LORSA, SAE, arm_fvu, fit_arm, tune_lr
from rankwise.repro.lorsa.capture import capture_attention, exact_lorsa, rope_of
from rankwise.repro.setup import BySize, experiment_model


@dataclass(frozen=True)
class Settings:
    windows: tuple[int, int, int]  # train / validation / test windows
    seq_len: int
    n_ov_per_d: int
    n_qk: int
    ks: tuple[int, ...]
    fit_steps: int
    fit_batch: int
    lr_grid: tuple[float, ...]
    seeds: int
    probes: int
    # The auxiliary loss on dead units (`nn.lorsa.auxk`), both arms; 0 = off. A probe on validation windows
    # (2026-12-03; K = 32, 200 steps): k_aux 256 / 512 left 83% of Lorsa's heads and 80% of the SAE's latents dead
    # (83% / 79% without it) at the same FVU, so the full run leaves it off.
    aux_k: int
    dead_steps: int


SIZES = BySize(
    smoke=Settings(windows=(8, 4, 4), seq_len=32, n_ov_per_d=2, n_qk=2, ks=(4, 8), fit_steps=6, fit_batch=4,
                   lr_grid=(1e-3, 3e-3), seeds=1, probes=2, aux_k=8, dead_steps=2),
    full=Settings(windows=(256, 24, 48), seq_len=128, n_ov_per_d=4, n_qk=18, ks=(16, 32, 64), fit_steps=200,
                  fit_batch=8, lr_grid=(1e-3, 3e-3, 1e-2, 3e-2), seeds=3, probes=8, aux_k=0, dead_steps=10),
)
FVU_MARGIN = 0.1
EXACT_TOL = 1e-10
DEAD_MAX = 0.25  # issue 24: "fewer than a quarter of heads dead"


def _declare(report: Report, s: Settings) -> None:
    # The SAE's FVU falls with K too (any top-K model's does), so the slope claim's control is the SAE: it is
    # reported, and cannot make the method reproduced.
    report.declare(SampleClaim("lorsa_fvu_falls_with_k", f"per-seed slope of log FVU(Lorsa) against log K, K in "
                               f"{list(s.ks)} (the paper: FVU-vs-L0 follows the SAE's trend)", "<", 0.0,
                               kind=ClaimKind.PAPER, discriminates=control(SAE)))
    report.declare(PairedClaim("lorsa_fvu_close_to_sae", f"held-out FVU averaged over K in {list(s.ks)}: Lorsa minus "
                               "Top-K SAE of the same width, paired by seed (the paper: slightly worse)", "<=",
                               FVU_MARGIN, kind=ClaimKind.PAPER, discriminates=comparison(SAE)))
    report.declare(Claim("lorsa_heads_alive", "fraction of the Lorsa's heads never active on the test windows (first "
                         "seed, middle K); above a quarter the FVU claims are withheld (INCONCLUSIVE): they would "
                         "measure a partly dead Lorsa", "<=", DEAD_MAX, kind=ClaimKind.SANITY))
    report.declare(Claim("exact_embedding_real_layer", "max |Lorsa(x) - attention(x)| / max |attention(x)|, the "
                         "layer's GQA attention written as a Lorsa with K = all rank-1 heads vs the model's own "
                         "attention module, float64", "<=", EXACT_TOL, kind=ClaimKind.INVARIANT))
    report.declare(Claim("lorsa_beats_mean_predictor", "max over seeds and K of held-out FVU(Lorsa)", "<", 1.0,
                         kind=ClaimKind.SANITY))


def _uses(encoded: tuple[torch.Tensor, torch.Tensor], n: int) -> torch.Tensor:
    """Per unit, how many (token, position > 0) selections with a non-zero value: encode's (vals, idx) [B, T, k] -> [n]."""
    vals, idx = (t[:, 1:] for t in encoded)
    return torch.zeros(n).index_add_(0, idx.reshape(-1), (vals.reshape(-1) != 0).float())


@torch.no_grad()
def _exact_error(model, layer: int, x: torch.Tensor) -> float:
    """The exact Lorsa form against the HF attention module, both in float64, on x [B, T, d]."""
    attn = copy.deepcopy(model.model.layers[layer].self_attn).double()
    # HF computes the RoPE angles in fp32 whatever the dtype; build its cos/sin layout (the angles repeated over
    # both halves) in float64, so that what is compared is the RoPE convention and the GQA layout, not fp32 angles.
    r = rope_of(model.config)
    x64 = x.double()
    inv_freq = r.base ** (-torch.arange(0, r.rotary_dim, 2, dtype=torch.float64) / r.rotary_dim)
    angles = torch.arange(x.size(1), dtype=torch.float64)[:, None] * inv_freq[None]
    emb = torch.cat([angles, angles], dim=-1)[None].expand(x.size(0), -1, -1)
    cos, sin = emb.cos(), emb.sin()
    ref = attn(hidden_states=x64, position_embeddings=(cos, sin), attention_mask=None)[0]
    ours = exact_lorsa(model, layer).double()(x64)
    return float((ours - ref).abs().max() / ref.abs().max())


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("lorsa", "Lorsa on SmolLM2-135M's middle attention layer: FVU against K vs a Top-K SAE (card R2)",
                    size, seed)
    _declare(report, s)
    model, tokenizer = experiment_model("smollm2-135m", size, seed)
    layer = model.config.num_hidden_layers // 2
    n_tr, n_va, n_te = s.windows
    train_w = token_windows(tokenizer, "train", s.seq_len, n_tr)
    eval_w = token_windows(tokenizer, "eval", s.seq_len, n_va + n_te)
    say(f"capturing layer {layer} on {n_tr + n_va + n_te} windows of {s.seq_len} tokens")
    train = capture_attention(model, train_w, layer, desc="capture train")
    xe, ye = capture_attention(model, eval_w, layer, desc="capture eval")
    val, test = (xe[:n_va], ye[:n_va]), (xe[n_va:], ye[n_va:])
    report.measure("exact_embedding_real_layer", _exact_error(model, layer, test[0][:2]))

    d = model.config.hidden_size
    rope = rope_of(model.config)
    scale = float(model.model.layers[layer].self_attn.scaling)

    def config(k: int) -> LorsaConfig:
        return LorsaConfig(d_model=d, n_qk=s.n_qk, n_ov=s.n_ov_per_d * d, d_qk=rope.rotary_dim, k=k, rope=rope,
                           attn_scale=scale)

    def fit_config(k: int, lr: float, steps: int) -> FitConfig:
        return FitConfig(steps=steps, lr=lr, batch_size=s.fit_batch, k_start=min(s.n_ov_per_d * d, 4 * k),
                         aux_k=s.aux_k, dead_steps=s.dead_steps)

    k_mid = s.ks[len(s.ks) // 2]
    lrs = {}
    for arm in (LORSA, SAE):
        sel = tune_lr(arm, config(k_mid), fit_config(k_mid, 1e-3, max(1, s.fit_steps // 2)), s.lr_grid, train, val, seed)
        report.record_arm(arm, sel, budget={"steps": s.fit_steps, "batch_windows": s.fit_batch, "width": s.n_ov_per_d * d,
                                             "train_tokens": n_tr * s.seq_len})
        lrs[arm] = float(sel.chosen)
    report.check_budgets_matched(["steps", "batch_windows", "width", "train_tokens"])

    fvus = {(arm, k): [] for arm in (LORSA, SAE) for k in s.ks}
    keep: dict[str, torch.nn.Module] = {}  # the first seed's fits at the middle K, for the probes below
    for i in range(s.seeds):
        for k in s.ks:
            say(f"seed {i + 1}/{s.seeds}, K = {k}")
            for arm in (LORSA, SAE):
                m = fit_arm(arm, config(k), fit_config(k, lrs[arm], s.fit_steps), *train, seed=seed + i)
                fvus[(arm, k)].append(arm_fvu(arm, m, *test))
                if i == 0 and k == k_mid:
                    keep[arm] = m

    def slope(arm: str, i: int) -> float:
        return float(np.polyfit(np.log(s.ks), np.log([fvus[(arm, k)][i] for k in s.ks]), 1)[0])

    report.measure("lorsa_fvu_falls_with_k", [slope(LORSA, i) for i in range(s.seeds)])
    report.get_claim("lorsa_fvu_falls_with_k").measure_control([slope(SAE, i) for i in range(s.seeds)])
    mean_over_k = {arm: [st.fmean(fvus[(arm, k)][i] for k in s.ks) for i in range(s.seeds)] for arm in (LORSA, SAE)}
    report.measure_paired("lorsa_fvu_close_to_sae", mean_over_k[LORSA], mean_over_k[SAE])
    report.measure("lorsa_beats_mean_predictor", max(max(fvus[(LORSA, k)]) for k in s.ks))

    t = report.table("Held-out FVU against K (mean and per seed)", ["K", "fvu_lorsa", "fvu_sae", "lorsa_per_seed", "sae_per_seed"])
    for k in s.ks:
        t.add(K=k, fvu_lorsa=st.fmean(fvus[(LORSA, k)]), fvu_sae=st.fmean(fvus[(SAE, k)]),
              lorsa_per_seed=" ".join(f"{v:.4f}" for v in fvus[(LORSA, k)]),
              sae_per_seed=" ".join(f"{v:.4f}" for v in fvus[(SAE, k)]))

    with torch.no_grad():  # induction probe: doubled random token sequences
        g = torch.Generator().manual_seed(seed)
        half = torch.randint(100, tokenizer.vocab_size, (s.probes, s.seq_len // 2 - 1), generator=g)
        probe = torch.cat([torch.full((s.probes, 1), tokenizer.bos_token_id or 0), half, half], dim=1)
        px, _ = capture_attention(model, probe, layer, desc="induction probe")
        ind_lorsa = induction_score(keep[LORSA].patterns(px), probe)
        ind_mha = induction_score(exact_lorsa(model, layer).patterns(px), probe)
        used = _uses(keep[LORSA].encode(test[0]), s.n_ov_per_d * d)
        sae_used = _uses(keep[SAE].encode(test[1]), s.n_ov_per_d * d)
    t2 = report.table(f"Induction scores on doubled random sequences (Lorsa at K = {k_mid}, first seed)",
                      ["units", "max", "top3"])
    t2.add(units=f"Lorsa QK heads ({s.n_qk})", max=float(ind_lorsa.max()),
           top3=" ".join(f"{v:.3f}" for v in ind_lorsa.topk(min(3, s.n_qk)).values.tolist()))
    t2.add(units=f"MHA heads ({model.config.num_attention_heads})", max=float(ind_mha.max()),
           top3=" ".join(f"{v:.3f}" for v in ind_mha.topk(3).values.tolist()))
    t3 = report.table("Top-activating test contexts of the three most used Lorsa heads (first seed)",
                      ["head", "rank", "activation", "context", "top_source"])
    for head in used.topk(3).indices.tolist():
        for r, c in enumerate(top_activating_contexts(keep[LORSA], test[0], head, n=3)):
            ids = eval_w[n_va + c.window]
            t3.add(head=head, rank=r + 1, activation=c.value,
                   context=repr(tokenizer.decode(ids[max(0, c.position - 8): c.position + 1])),
                   top_source=repr(tokenizer.decode(ids[c.source: c.source + 1])))
    dead = float((used == 0).double().mean())
    report.measure("lorsa_heads_alive", dead)
    if not dead <= DEAD_MAX:
        for name in ("lorsa_fvu_falls_with_k", "lorsa_fvu_close_to_sae"):
            report.get_claim(name).withhold(f"{dead:.0%} of the Lorsa's heads are dead on the test windows (more "
                                            f"than {DEAD_MAX:.0%}): {s.fit_steps * s.fit_batch * s.seq_len:,} "
                                            "tokens per fit are too few")
    report.note(f"Layer {layer} of {model.config.num_hidden_layers}; Lorsa n_ov = {s.n_ov_per_d * d}, n_qk = {s.n_qk} "
                f"(G = {s.n_ov_per_d * d // s.n_qk}), d_qk = {rope.rotary_dim}, RoPE base {rope.base:g} ('half' pairing), "
                f"scale {scale:.4f}; {s.fit_steps} steps of {s.fit_batch} windows x {s.seq_len} tokens "
                f"({s.fit_steps * s.fit_batch * s.seq_len} tokens per fit, over {n_tr * s.seq_len} captured tokens); "
                f"K annealed from 4K over the first 10% of steps; lrs {lrs}. Dead Lorsa heads on the test windows "
                f"(first seed, K = {k_mid}): {dead:.1%}; the SAE's dead latents: {float((sae_used == 0).double().mean()):.1%}. "
                f"Auxiliary dead-unit loss (AuxK, k_aux = {s.aux_k}; 0 = off): a validation probe found it revived "
                "nothing at this budget.")
    report.note("The card asks for n_qk = 36 (G = 64) and the paper for 800M tokens per layer; at 1 CPU thread a fit "
                "here gets ~2e5 tokens, so n_qk is halved (G = 128, QK width still the model's 64) and the FVUs are those "
                "of short fits, for both arms alike.")
    report.note(f"Windows: {n_tr} train-split windows for fitting, {n_va} eval-split windows for lr selection, {n_te} "
                "other eval-split windows for the held-out FVU; FVU excludes the first position (attention sink).")
    return report.finish()


__all__ = ["run", "SIZES", "Settings"]
