"""Demo headline for CARE: SmolLM2's GQA attention converted to MLA form at 75 % KV saving, plain SVD vs CARE."""

from __future__ import annotations

import time

from rankwise.demos import DemoContext

KV_RANK = 48  # of SmolLM2's 192 per matrix: a 75 % smaller KV cache
EVAL_WINDOWS = 2  # a subset of the shared held-out windows keeps the headline within its ~30 s
CALIBRATION_WINDOWS = 2  # 2 x 512 tokens, cut into 32-token windows as CARE calibrates


def headline(ctx: DemoContext) -> None:
    from rankwise.compress.mla import convert_to_mla, kv_input_moments
    from rankwise.eval import perplexity

    start = time.perf_counter()
    windows = ctx.eval_windows[:EVAL_WINDOWS]
    calibration = ctx.calibration_windows[:CALIBRATION_WINDOWS].reshape(-1, 32)
    moments = kv_input_moments(ctx.model, calibration)  # the hooks are removed afterwards; the model is not changed
    print(f"CARE (care-mla): GQA -> multi-head latent attention, one-shot, {KV_RANK} of 192 latent dims per K/V matrix = 75% smaller KV cache")
    results = {}
    for label, method, allocation in (("plain SVD (Palu)", "svd", "uniform"), ("CARE (sqrt(C)-whitened, adjusted ranks)", "care", "adjusted")):
        converted = convert_to_mla(ctx.model, KV_RANK, method, allocation, moments)  # a converted copy
        results[label] = perplexity(converted, windows, desc=f"perplexity ({method})").perplexity
        del converted
    print(f"  held-out perplexity on {EVAL_WINDOWS} windows: " + ", ".join(f"{label} {ppl:.2f}" for label, ppl in results.items()))
    print(f"  (the unconverted model: {ctx.baseline_ppl:.2f} on all {ctx.eval_windows.size(0)} windows)")
    print(f"  (`rankwise convert mla --kv-rank 48 --method care --allocation adjusted --out DIR`; {time.perf_counter() - start:.0f} s)")
