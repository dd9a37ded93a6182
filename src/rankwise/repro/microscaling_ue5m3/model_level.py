"""C. Model level at the same operating points: MiniLM sentence-embedding fidelity (paired over sentences) and SmolLM2
perplexity (paired over eval windows)."""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from rankwise.core.progress import progress, say
from rankwise.core.report import Report
from rankwise.quant.block import get_recipe
from rankwise.repro.microscaling_ue5m3.model_eval import quantize_at_regime_, restore_, window_nlls
from rankwise.repro.microscaling_ue5m3.plan import EMBED_REGIMES, MODEL_SCALES, SCALES, Settings


@torch.no_grad()
def embedding_fidelity(report: Report, plan: Settings, bert, tokenizer) -> None:
    from rankwise.data import articles
    from rankwise.models import embed_sentences

    texts = [a.text for a in articles("eval")[: plan.sentences]]
    reference = embed_sentences(bert, tokenizer, texts)
    table = report.table(f"C. MiniLM sentence embeddings: mean cosine to the fp32 embeddings ({len(texts)} held-out "
                         "Wikipedia summaries)", ["point", "scale", *[f"cos k={k}" for k in plan.model_ks]])
    cos = {}  # (regime, scale, k) -> per-sentence cosine
    for regime in EMBED_REGIMES:
        for scale in progress(MODEL_SCALES, desc=f"embeddings {regime}"):
            for k in plan.model_ks:
                model = copy.deepcopy(bert)
                quantize_at_regime_(model, get_recipe(SCALES[scale], k), regime, ("pooler.dense",))
                cos[regime, scale, k] = (embed_sentences(model, tokenizer, texts) * reference).sum(-1).double()
            table.add(point=regime, scale=scale, **{f"cos k={k}": float(cos[regime, scale, k].mean()) for k in plan.model_ks})
    loss = lambda r, s, k: (1 - cos[r, s, k]).tolist()  # noqa: E731
    for claim, scale, other in (("minilm-embedding-anomaly", "UE4M3", "UE5M3"),
                                ("minilm-embedding-no-anomaly-ue5m3", "UE5M3", "UE4M3")):
        report.measure_paired(claim, loss("subnormal", scale, 8), loss("subnormal", scale, 16))
        report.get_claim(claim).measure_control(loss("subnormal", other, 8), loss("subnormal", other, 16))
    mean_loss = lambda r, s, k: float(np.mean(loss(r, s, k)))  # noqa: E731
    report.measure("ue5m3-near-ue4m3-s-embeddings",
                   mean_loss("subnormal", "UE5M3", 8) / max(mean_loss("subnormal", "UE4M3-S", 8), 1e-12))
    report.measure("minilm-embedding-lost-when-flushed", max(float(cos["flush", "UE4M3", k].mean()) for k in plan.model_ks))
    report.plots["minilm_embedding_vs_block"] = _plot_model(plan.model_ks, {key: float(1 - v.mean()) for key, v in cos.items()},
                                                            EMBED_REGIMES, "1 - mean cosine")


@torch.no_grad()
def perplexity_sweep(report: Report, plan: Settings, llama, tokenizer) -> None:
    from rankwise.data import token_windows

    windows = token_windows(tokenizer, "eval", plan.seq_len, plan.ppl_windows)
    base = window_nlls(llama, windows)
    original = {n: p.detach().clone() for n, p in llama.named_parameters()}
    k = min(plan.ppl_ks)
    runs = [("as-is", s, kk) for s in MODEL_SCALES for kk in plan.ppl_ks]
    runs += [("subnormal", s, kk) for s in ("UE4M3", "UE5M3") for kk in (k, 2 * k)]
    runs += [("saturate", s, k) for s in ("UE4M3", "UE5M3")] + [("flush", "UE4M3", k)]
    nll = {}
    for regime, scale, kk in progress(runs, desc="perplexity"):
        quantize_at_regime_(llama, get_recipe(SCALES[scale], kk), regime, ("lm_head",))
        nll[regime, scale, kk] = window_nlls(llama, windows)
        restore_(llama, original)
        say(f"  {regime} {scale} k={kk}: perplexity {_ppl(nll[regime, scale, kk]):.3f} (fp32 {_ppl(base):.3f})")
    table = report.table(f"C. SmolLM2 perplexity ({windows.size(0)} held-out windows x {plan.seq_len} tokens; fp32 "
                         f"{_ppl(base):.3f})", ["point", "scale", *[f"ppl k={kk}" for kk in plan.ppl_ks]])
    for regime in ("as-is", "subnormal", "saturate", "flush"):
        for scale in MODEL_SCALES:
            if any((regime, scale, kk) in nll for kk in plan.ppl_ks):
                table.add(point=regime, scale=scale, **{f"ppl k={kk}": _ppl(nll[regime, scale, kk]) if (regime, scale, kk) in nll
                                                         else "" for kk in plan.ppl_ks})
    report.measure("ue5m3-near-ue4m3-s-perplexity", _ppl(nll["as-is", "UE5M3", k]) / _ppl(nll["as-is", "UE4M3-S", k]))
    report.measure_paired("smollm2-subnormal-ue4m3-vs-ue5m3", nll["subnormal", "UE4M3", k], nll["subnormal", "UE5M3", k])
    for claim, scale, other in (("smollm2-subnormal-anomaly-ue4m3", "UE4M3", "UE5M3"),
                                ("smollm2-subnormal-no-anomaly-ue5m3", "UE5M3", "UE4M3")):
        report.measure_paired(claim, nll["subnormal", scale, k], nll["subnormal", scale, 2 * k])
        report.get_claim(claim).measure_control(nll["subnormal", other, k], nll["subnormal", other, 2 * k])
    report.measure_paired("smollm2-saturate-ue4m3-loses", nll["saturate", "UE4M3", k], nll["saturate", "UE5M3", k])
    report.measure("smollm2-flush-lost", _ppl(nll["flush", "UE4M3", k]) / _ppl(base))
    ppl = {key: _ppl(v) for key, v in nll.items() if key[0] == "as-is"}
    report.plots["smollm2_perplexity_vs_block"] = _plot_model(plan.ppl_ks, ppl, ("as-is",), "perplexity", _ppl(base))


def _ppl(nlls: list[float]) -> float:
    return math.exp(float(np.mean(nlls)))


def _plot_model(ks, values: dict, regimes, ylabel: str, baseline: float | None = None):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(regimes), figsize=(4.5 * len(regimes), 3.6), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        for scale in MODEL_SCALES:
            ax.plot(ks, [values[regime, scale, k] for k in ks], "o-", label=scale)
        if baseline is not None:
            ax.axhline(baseline, color="gray", ls="--", label="fp32")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{regime} point")
        ax.set_xlabel("block size")
        ax.set_ylabel(ylabel)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig
