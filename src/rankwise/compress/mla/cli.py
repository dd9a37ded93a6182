"""`rankwise convert mla`: convert a model's GQA attention to one-shot MLA form, report perplexity and KV saving.

    rankwise convert mla --model smollm2-135m --kv-rank 48 --method care --allocation adjusted --out DIR

`load_model(DIR)` reloads the result.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rankwise.compress.mla.allocation import ALLOCATIONS, SCORES
from rankwise.compress.mla.calibration import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN
from rankwise.compress.mla.factorize import ALIASES, METHODS
from rankwise.compress.mla_deploy.cli import add_deploy_arguments, run_deploy, wants_deploy


def register_converter(kinds: argparse._SubParsersAction) -> None:
    p = kinds.add_parser("mla", help="GQA/MHA -> multi-head latent attention, one-shot (CARE and baselines)")
    p.add_argument("--model", required=True, help="smollm2-135m, or a saved Llama-family transformers folder")
    p.add_argument("--kv-rank", type=int, required=True, help="latent dims per matrix per layer (mean, if adjusted); 48 of 192 saves 75%% of SmolLM2's KV cache")
    p.add_argument("--method", default="care", choices=sorted([*METHODS, *ALIASES]))
    p.add_argument("--allocation", default="uniform", choices=ALLOCATIONS, help="uniform ranks, or CARE's water-filling ('adjusted')")
    p.add_argument("--score", default="paper", choices=SCORES, help="adjusted allocation's score: the paper's formula or the authors' code")
    p.add_argument("--damping", type=float, default=None, help="relative damping of C (default: 0.1 for care, 0.01 for svd-llm)")
    p.add_argument("--calib-samples", type=int, default=DEFAULT_SAMPLES, help="calibration windows (default %(default)s)")
    p.add_argument("--calib-seq-len", type=int, default=DEFAULT_SEQ_LEN, help="tokens per calibration window (default %(default)s)")
    p.add_argument("--eval-windows", type=int, default=8, help="held-out 512-token windows for perplexity; 0 skips it (default %(default)s)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--seed", type=int, default=0, help="seeds the choice of calibration windows")
    p.add_argument("--out", type=Path, help="write the converted model here (a transformers folder)")
    add_deploy_arguments(p)  # --deploy / --heal STEPS: the deployable MLA path (rankwise.compress.mla_deploy)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if wants_deploy(args):
        return run_deploy(args)
    from rankwise.compress.mla.calibration import calibration_windows
    from rankwise.compress.mla.convert import convert_to_mla
    from rankwise.compress.mla.io import save_mla
    from rankwise.compress.mla.layout import kv_layout, kv_saving, mla_info
    from rankwise.core.seed import set_seed
    from rankwise.data import token_windows
    from rankwise.eval import measure, perplexity
    from rankwise.models import load_model

    set_seed(args.seed)
    model, tokenizer = load_model(args.model)
    layout = kv_layout(model)
    windows = token_windows(tokenizer, "eval", args.seq_len, args.eval_windows) if args.eval_windows > 0 else None
    before = perplexity(model, windows, desc="perplexity (original)") if windows is not None else None

    calibration = calibration_windows(tokenizer, args.calib_samples, args.calib_seq_len, args.seed)
    converted, took = measure(
        convert_to_mla, model, args.kv_rank, args.method, args.allocation, calibration,
        score=args.score, damping=args.damping, inplace=True,
    )
    info = mla_info(converted)
    print(f"converted {args.model} ({layout.num_layers} layers, KV width {layout.kv_width}) with {info['method']}, "
          f"{info['allocation']} ranks{' (' + info['score'] + ' score)' if info['allocation'] == 'adjusted' else ''}, "
          f"mean rank {args.kv_rank}, in {took.wall_s:.1f} s (calibration {args.calib_samples} x {args.calib_seq_len} tokens)")
    if info["allocation"] == "adjusted":
        print(f"  K ranks per layer: {info['k_ranks']}")
        if not info["joint"]:
            print(f"  V ranks per layer: {info['v_ranks']}")
    print(f"KV-cache saving: {100 * kv_saving(converted):.1f}% (latent r_K + r_V per token vs 2 x {layout.kv_width}; "
          "one-shot form: RoPE is applied after the up-projection, so this is the saving a latent cache would give)")
    if before is not None:
        after = perplexity(converted, windows, desc="perplexity (converted)")
        print(f"perplexity on {windows.size(0)} held-out windows of {args.seq_len} tokens: "
              f"{before.perplexity:.2f} before -> {after.perplexity:.2f} after")
    if args.out:
        save_mla(converted, args.out, tokenizer)
        print(f"saved to {args.out} (reload with rankwise.models.load_model({str(args.out)!r}))")
    return 0
