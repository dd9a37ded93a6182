"""Reproduction `lowprec-flash-attention` (main): the card's rounding-bias microbenchmark (A) of the emulated bf16
flash-attention forward, without and with the paper's fix, against float64, over shapes and value ranges, 5 seeds.

Per seed, each tie configuration (2-4 keys at the row max, V of one sign) is drawn afresh and run through: the
unfixed bf16 kernel (the control), the fixed one (β = 2), fp32 accumulation and stochastic rounding (the
alternatives). The per-seed value of an arm is its mean magnitude bias b (units of u = 2^-8, see `bias`) over the
tie configurations.

Experiment (B), the card's qualitative trend test: a 2-layer byte-level GPT (d 64, 4 heads, T 64) whose attention is
the tiled kernel, trained with AdamW at lr 3e-3, no warmup, clip 1.0, in three arms sharing init and batch order per
seed: exact fp32 attention (reference), emulated bf16 (unfixed) and bf16 + fix. Tracked: layer 2's max per-head
‖W_Q‖₂ and ‖W_K‖₂, losses. The loss blow-up is not expected at this scale: its claim is withheld (INCONCLUSIVE) when no
unfixed run blows up, with the measured drift reported.
"""

from __future__ import annotations

import math
import statistics as st
from dataclasses import dataclass

import torch

from rankwise.core.discrimination import control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.report import Report
from rankwise.data import token_windows
from rankwise.data.compact_vocab import byte_tokenizer
from rankwise.nn.lowprec_flash_attention import BiasCase, FlashConfig, measure_bias, synthetic_rows
from rankwise.nn.lowprec_flash_attention.kernel import forward_from_scores, rounders
from rankwise.repro.lowprec_flash_attention.gpt import GPTShape, train_gpt
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    rows: int
    seeds: int
    gpt: GPTShape
    gpt_steps: int
    gpt_seeds: int
    gpt_batch: int = 16
    gpt_lr: float = 3e-3


SIZES = BySize(smoke=Settings(rows=512, seeds=3, gpt=GPTShape(d_model=32, heads=2, seq_len=32), gpt_steps=3,
                              gpt_seeds=3),
               full=Settings(rows=100_000, seeds=5, gpt=GPTShape(), gpt_steps=1000, gpt_seeds=3))
GPT_ARMS = {"fp32 attention": {"precision": "exact"}, "bf16 (unfixed)": {"precision": "bf16"},
            "bf16 + fix (beta 2)": {"precision": "bf16", "fix": True}}
DRIFT_MARGIN = 0.01  # log-norm growth of layer 2's W_Q: unfixed must exceed fixed by 1%
BLOWUP_MARGIN = 0.1  # nats of held-out loss
BLOWUP = 0.5  # a run "blows up" when it diverges or ends this many nats above the fp32 run of its seed
GAP = (12.0, 20.0)  # below-max scores: residue sum under half an ulp (the card's 6-12 swamps the tie: see the page)
# (name, case, key tile): the shapes and value ranges; "tie" cases carry the mechanism, the others are controls
CASES = (
    ("tie, N 256, D 16, V~N(-0.5, 0.05), one tile", BiasCase(gap=GAP), 256, True),
    ("tie, N 256, D 16, V~N(-0.5, 0.05), tiles of 64", BiasCase(gap=GAP), 64, True),
    ("tie, N 128, D 64, V~N(+0.5, 0.05), one tile", BiasCase(keys=128, head_dim=64, v_mean=0.5, gap=GAP), 128, True),
    ("tie, N 256, D 16, V~N(-2, 0.2), one tile", BiasCase(v_mean=-2.0, v_std=0.2, gap=GAP), 256, True),
    ("single max, V~N(-0.5, 0.05)", BiasCase(ties=(1, 1), gap=GAP), 256, False),
)
ARMS = {"bf16 (unfixed)": {}, "bf16 + fix (beta 2)": {"fix": True},
        "bf16, fp32 accumulation": {"accumulation": "fp32"}, "bf16, stochastic rounding": {"rounding": "stochastic"}}
PRESENT_MARGIN_U = 0.05  # b(unfixed) - b(fixed) must exceed this, in u
ABSENT_BOUND_U = 0.05  # |b| below this counts as small (chosen after a pilot run: descriptive claims only)
ABSENT_T = 3.0  # the card's criterion for "no bias": |t| of the mean signed error below 3


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("lowprec-flash-attention", "bf16 flash-attention rounding bias without and with the fix", size,
                    seed)
    testbed = (f"synthetic rows, {s.rows} per configuration, 2-4 ties at the row max m ~ U(0.5, 3), other scores "
               f"{GAP[0]:g}-{GAP[1]:g} below, one-signed V; emulated bf16 FA2 forward vs float64")
    report.declare(PairedClaim("bias_present_without_fix", "b(unfixed) - b(fixed), mean magnitude bias over the tie "
                               "configurations in u = 2^-8, paired by seed", ">", PRESENT_MARGIN_U,
                               kind=ClaimKind.PAPER, testbed=testbed))
    absent = report.declare(SampleClaim("bias_absent_with_fix", "max over tie configurations of |t| of the fixed "
                                        "kernel's mean signed error, per seed (the card's test: |t| < 3)", "<",
                                        ABSENT_T, kind=ClaimKind.PAPER, testbed=testbed,
                                        discriminates=control("bf16 (unfixed)")))
    report.declare(SampleClaim("bias_small_with_fix", "max over tie configurations of |b(fixed)| in u, per "
                                       "seed (bound chosen after a pilot run: descriptive, no kind)", "<",
                                       ABSENT_BOUND_U, testbed=testbed))
    report.declare(SampleClaim("no_bias_single_max", "|b(unfixed)| on rows with a single max, in u (the mechanism "
                               "needs ties)", "<", ABSENT_BOUND_U, kind=ClaimKind.SANITY, testbed=testbed))
    gpt_bed = (f"byte-level GPT {s.gpt.layers} layers, d {s.gpt.d_model}, {s.gpt.heads} heads, T {s.gpt.seq_len}, "
               f"wiki corpus, batch {s.gpt_batch}, {s.gpt_steps} AdamW steps at lr {s.gpt_lr:g}, clip 1")
    drift = report.declare(PairedClaim("fix_reduces_wq_drift", "log(‖W_Q‖₂ end / start) of layer 2 (max over heads), "
                               "unfixed bf16 minus bf16 + fix, paired by seed", ">", DRIFT_MARGIN,
                               kind=ClaimKind.PAPER, testbed=gpt_bed))
    blowup = report.declare(PairedClaim("fix_prevents_loss_blowup", "held-out loss, unfixed bf16 minus bf16 + fix, "
                                        "nats, paired by seed", ">", BLOWUP_MARGIN, kind=ClaimKind.PAPER,
                                        testbed=gpt_bed))
    report.declare(Claim("fixed_tracks_fp32", "max over seeds |held-out loss(bf16 + fix) - loss(fp32)|, nats", "<=",
                         0.1, kind=ClaimKind.SANITY, testbed=gpt_bed))
    report.declare(Claim("fix_keeps_float64_output", "max |O(fix) - O(no fix)| in float64 exact arithmetic on the "
                         "first tie configuration", "<=", 1e-12, kind=ClaimKind.INVARIANT))

    per_arm: dict[str, dict[str, list[float]]] = {a: {c[0]: [] for c in CASES} for a in ARMS}
    tstats: dict[str, dict[str, list[float]]] = {a: {c[0]: [] for c in CASES} for a in ARMS}
    for i in range(s.seeds):
        for ci, (name, case, tile, _) in enumerate(CASES):
            sc, v = synthetic_rows(case, s.rows, torch.Generator().manual_seed(1000 * (seed + i) + ci))
            for arm, opts in ARMS.items():
                cfg = FlashConfig("bf16", tile_q=case.rows_per_group, tile_k=tile, **opts)
                b = measure_bias(sc, v, cfg, torch.Generator().manual_seed(seed + i))
                per_arm[arm][name].append(b.magnitude_bias_u)
                tstats[arm][name].append(b.t_stat)

    tie_names = [c[0] for c in CASES if c[3]]

    def tie_mean(arm: str) -> list[float]:
        return [st.fmean(per_arm[arm][n][i] for n in tie_names) for i in range(s.seeds)]

    def tie_max_abs(arm: str, values: dict[str, dict[str, list[float]]] = per_arm) -> list[float]:
        return [max(abs(values[arm][n][i]) for n in tie_names) for i in range(s.seeds)]

    report.measure_paired("bias_present_without_fix", tie_mean("bf16 (unfixed)"), tie_mean("bf16 + fix (beta 2)"))
    report.measure("bias_absent_with_fix", tie_max_abs("bf16 + fix (beta 2)", tstats))
    absent.measure_control(tie_max_abs("bf16 (unfixed)", tstats))
    report.measure("bias_small_with_fix", tie_max_abs("bf16 + fix (beta 2)"))
    report.measure("no_bias_single_max", [abs(x) for x in per_arm["bf16 (unfixed)"][CASES[-1][0]]])

    sc, v = synthetic_rows(CASES[0][1], 2048, torch.Generator().manual_seed(seed))
    outs = []
    for fix in (False, True):
        cfg = FlashConfig("exact", fix=fix, tile_q=256, tile_k=64)
        outs.append(forward_from_scores(lambda i0, i1, j0, j1: sc.double()[..., i0:i1, j0:j1], v.double(),
                                        sc.shape[-2], cfg, rounders(cfg))[0])
    report.measure("fix_keeps_float64_output", float((outs[0] - outs[1]).abs().max()))

    _gpt(report, s, seed, blowup, drift)

    t = report.table("Magnitude bias b (u = 2^-8; > 0: away from zero) over seeds",
                     ["configuration", "arm", "b_mean", "b_std", "t_stat_mean"])
    for name, *_ in CASES:
        for arm in ARMS:
            vals = per_arm[arm][name]
            t.add(configuration=name, arm=arm, b_mean=st.fmean(vals), b_std=st.stdev(vals) if len(vals) > 1 else 0.0,
                  t_stat_mean=st.fmean(tstats[arm][name]))
    report.note(f"{s.rows} rows per configuration and seed, {s.seeds} seeds; rows in groups of 256 sharing one V. "
                "Thresholds (0.05 u) were set after a pilot run of the same code (unfixed ~0.2 u, fixed ~0.03 u); "
                "the card's |t| < 3 for the fixed kernel is not met there (the fix leaves a small residual bias). "
                "Score gaps 12-20 instead of the card's 6-12: with 6-12 the residue sum of ~250 keys exceeds half an "
                "ulp and the tie mechanism does not arise (pilot: b ~ 0 for every arm). Experiment (B): the three "
                "GPT arms share one lr (a precision comparison of one recipe, not tuned per arm).")
    return report.finish()


def _gpt(report: Report, s: Settings, seed: int, blowup: PairedClaim, drift_claim: PairedClaim) -> None:
    tok = byte_tokenizer()
    train = token_windows(tok, "train", s.gpt.seq_len + 1)
    val = token_windows(tok, "eval", s.gpt.seq_len + 1, 64)
    log_every = max(1, s.gpt_steps // 10)
    runs = {a: [train_gpt(opts, s.gpt, train, val, s.gpt_steps, s.gpt_batch, s.gpt_lr, seed + i, log_every)
                for i in range(s.gpt_seeds)] for a, opts in GPT_ARMS.items()}
    drift = {a: [math.log(r.wq_norms[-1] / r.wq_norms[0]) for r in rs] for a, rs in runs.items()}
    ev = {a: [r.eval_loss if r.diverged is None else float("inf") for r in rs] for a, rs in runs.items()}
    report.measure_paired("fix_reduces_wq_drift", drift["bf16 (unfixed)"], drift["bf16 + fix (beta 2)"])
    blown = [i for i, (u, f) in enumerate(zip(ev["bf16 (unfixed)"], ev["fp32 attention"])) if not u < f + BLOWUP]
    report.measure_paired("fix_prevents_loss_blowup", [min(x, 1e6) for x in ev["bf16 (unfixed)"]],
                          [min(x, 1e6) for x in ev["bf16 + fix (beta 2)"]])
    if not blown:  # the paper's drift and blow-up belong to a failing run: without one, both are reported, not judged
        why = f"no unfixed run blew up at this scale (none ended {BLOWUP} nats above fp32 or diverged)"
        blowup.withhold(why)
        drift_claim.withhold(why)
    report.measure("fixed_tracks_fp32", max(abs(a - b) for a, b in zip(ev["bf16 + fix (beta 2)"],
                                                                       ev["fp32 attention"])))
    t = report.table("GPT runs (layer 2, max over heads)", ["arm", "seed", "eval_loss", "final_train_loss",
                                                             "wq_start", "wq_end", "wk_end", "log_wq_growth",
                                                             "diverged"])
    for arm, rs in runs.items():
        for i, r in enumerate(rs):
            t.add(arm=arm, seed=seed + i, eval_loss=r.eval_loss, final_train_loss=r.losses[-1] if r.losses else None,
                  wq_start=r.wq_norms[0], wq_end=r.wq_norms[-1], wk_end=r.wk_norms[-1],
                  log_wq_growth=math.log(r.wq_norms[-1] / r.wq_norms[0]), diverged=r.diverged or "")


__all__ = ["run", "SIZES", "Settings", "CASES", "ARMS"]
