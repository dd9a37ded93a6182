"""The deployable-MLA reproduction: SmolLM2 at 50 % KV saving with a latent-only cache, absorbed decoding and a
DeepSeek-V3 export (invariants), and CARE's init against MHA2MLA's after the same 300 healing steps (the paper claim).

    rankwise repro care-mla:deploy --size full      # writes docs/results/care-mla/deploy/

The arms, the selection of their RoPE pairs and learning rates, and the healing are `heal_compare`'s (shared with
`deploy-palu`, CARE against Palu). Issue 24: the MHA2MLA arm now has MHA2MLA's joint latent (one SVD of
[W_K_nope; W_V]) and its 2-norm pairs, and healing is 10x longer; the earlier claims (30 steps, a Palu-equal
"MHA2MLA-style" arm) are retired with their verdicts, the Palu comparison moved to `deploy-palu`.
"""

from __future__ import annotations

import tempfile

import torch

from rankwise.compress.mla.convert import convert_to_mla
from rankwise.compress.mla_deploy.build import expected_cache_bytes_per_token
from rankwise.compress.mla_deploy.checks import absorbed_vs_expanded, generation_mismatches
from rankwise.compress.mla_deploy.export import export_deepseek_v3, load_deepseek_v3
from rankwise.core.evidence import Claim, ClaimKind
from rankwise.core.report import Report
from rankwise.eval import measured_kv_bytes_per_token, perplexity
from rankwise.repro.care_mla.heal_compare import CARE, MHA2MLA, SIZES, Settings, choose_rope, declare, heal_arms, setup

ARMS = (CARE, MHA2MLA)


def _declare(report: Report) -> None:
    for name, text, op, threshold in (
        ("cache_bytes_equal_expected", "|measured - expected| latent-cache bytes per token (cache tensors of a forward)", "<=", 0),
        ("kv_saving_50pct", "measured KV-cache saving vs the GQA model", ">=", 0.5),
        ("absorbed_equals_expanded", "max |logit| difference, absorbed vs expanded decoding (prefill + 4 cached steps), "
         "relative to the logits' max magnitude; bound: float32 rounding of a hidden-size (576-term) sum, 576 x 1.2e-7 ~ 1e-4", "<=", 1e-4),
        ("generate_equals_no_cache", "tokens where model.generate (latent cache) differs from no-cache greedy decoding", "<=", 0),
        ("export_perplexity_gap", "relative perplexity gap, exported DeepSeek-V3 checkpoint vs our module", "<=", 1e-3),
    ):
        report.declare(Claim(name, text, op, threshold, kind=ClaimKind.INVARIANT))


def run(size: str = "smoke", seed: int = 0) -> Report:
    """SmolLM2 (full) or a tiny random Llama (smoke) converted to deployable MLA at 50 % KV saving; see the claims."""
    report = Report("care-mla", "CARE deployable MLA: latent-only KV cache, absorbed decoding, DeepSeek-V3 export; CARE vs "
                    "MHA2MLA after equal healing", size, seed)
    sz = SIZES[size]
    declare(report, sz, MHA2MLA)
    _declare(report)
    bed, ppl = setup(report, sz, size, seed)
    oneshot = convert_to_mla(bed.teacher, kv_rank=bed.kv_width // 2, method="care", allocation="uniform", calibration=bed.moments)
    one = perplexity(oneshot, bed.evals).perplexity
    ppl.add(model=f"CARE one-shot r={bed.kv_width // 2} (RoPE after up-projection; not a latent cache)", kv_saving=0.5,
            perplexity=one, vs_original=one / bed.base)
    del oneshot
    chosen, first = choose_rope(report, bed, ARMS)
    # the invariants, on CARE's deployable model before healing
    model = first[CARE.label]
    before = perplexity(model, bed.evals).perplexity
    kv = report.table("kv cache bytes per token (measured from cache tensors)", ["model", "measured", "expected", "saving"])
    _invariants(report, model, bed.teacher, bed.tokenizer, bed.evals, ppl, kv, bed.base, before, bed.kv_width, sz)
    heal_arms(report, sz, bed, ARMS, chosen, first, ppl)
    report.note(
        "MHA2MLA is MHA2MLA's recipe inside the common deployable architecture: pairs by query-key 2-norm contribution and one "
        "unwhitened joint SVD of [W_K_nope; W_V] (a shared latent of width 2 kv_rank, the cache of the split arms). What differs "
        "from the MHA2MLA paper: it keeps frequencies per head with a rope key per KV head; here one rope key is shared by all "
        "heads (the same cache for every arm and a stock DeepSeek-V3 export), found by the RoRoPE concentration every arm gets, "
        "and the pairs are one global set, not one per head.")
    return report.finish()


def _invariants(report: Report, model, teacher, tokenizer, evals: torch.Tensor, ppl, kv, base: float, before: float, kv_width: int, sz: Settings) -> None:
    cfg = teacher.config
    gqa_bytes = measured_kv_bytes_per_token(teacher)
    mla_bytes = measured_kv_bytes_per_token(model)
    expected = expected_cache_bytes_per_token(model)
    kv.add(model="original GQA", measured=gqa_bytes, expected=2 * cfg.num_hidden_layers * kv_width * 4, saving=0.0)
    kv.add(model="deployable MLA", measured=mla_bytes, expected=expected, saving=1 - mla_bytes / gqa_bytes)
    report.measure("cache_bytes_equal_expected", abs(mla_bytes - expected))
    report.measure("kv_saving_50pct", 1 - mla_bytes / gqa_bytes)
    probe = evals[:2, : min(64, sz.eval_len)]
    with torch.no_grad():
        scale = float(model(input_ids=probe).logits.abs().max())
    report.measure("absorbed_equals_expanded", absorbed_vs_expanded(model, probe) / scale)
    report.measure("generate_equals_no_cache", generation_mismatches(model, evals[:1, :16], 12))
    with tempfile.TemporaryDirectory() as tmp:
        export_deepseek_v3(model, f"{tmp}/export", tokenizer)
        exported = load_deepseek_v3(f"{tmp}/export")
        with torch.no_grad():
            logit_gap = float((exported(input_ids=probe).logits - model(input_ids=probe).logits).abs().max())
        exp_ppl = perplexity(exported, evals).perplexity
        exp_bytes = measured_kv_bytes_per_token(exported)
    kv.add(model="exported DeepseekV3ForCausalLM", measured=exp_bytes, expected=expected, saving=1 - exp_bytes / gqa_bytes)
    ppl.add(model="exported DeepSeek-V3 checkpoint (stock transformers)", kv_saving=1 - exp_bytes / gqa_bytes, perplexity=exp_ppl, vs_original=exp_ppl / base)
    report.measure("export_perplexity_gap", abs(exp_ppl / before - 1))
    report.note(f"Exported checkpoint: max |logit| gap vs our module {logit_gap:.2e}; perplexity {exp_ppl:.4f} vs {before:.4f}.")
