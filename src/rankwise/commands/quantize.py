"""`rankwise quantize --model NAME --format fp4 --scale ue5m3 --block 16 --out DIR`: block-quantize every nn.Linear
weight, write the packed folder, reload it through `load_model(DIR)` and report quality and bytes per weight.

`--format codequant` instead runs CodeQuant on a causal LM (learned rotation, 16 centroids per row, A4 inputs on
q/k/v and the MLP's gate/up; commands/quantize_codequant.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rankwise.commands.common import check_output, positive_int, require_model
from rankwise.models import folders

ELEMENTS = ("fp4", "fp8-e4m3", "fp8-e5m2")
CODEQUANT = "codequant"
SCALES = ("e8m0", "ue4m3", "ue5m3", "ue5m3-ieee", "ue5m3-nospecials", "fp32")
# What `--model` may be: an original model (embedded, a transformers folder, or a deployable MLA, which is a stock
# DeepSeek-V3 model). Refused up front: a one-shot MLA (its factor pairs would not reload), an already quantized
# folder, an adapter or a run folder.
ACCEPTS = frozenset({folders.EMBEDDED, folders.MODEL, folders.MLA_DEPLOY})


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="block-quantize a model's linear weights (MXFP4, NVFP4, FP4 with UE5M3 scales, ...)",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="smollm2-135m, minilm-l6, or a saved transformers folder")
    p.add_argument("--format", default="fp4", choices=(*ELEMENTS, CODEQUANT),
                   help="element format (default fp4 = E2M1), or codequant")
    p.add_argument("--scale", choices=SCALES, help="block-scale format (default ue5m3; microscaling formats only)")
    p.add_argument("--block", type=positive_int, help="block size along the input dimension (even, 2..1024; default 16; "
                   "microscaling formats only)")
    p.add_argument("--global-scale", action="store_true", help="add the per-tensor fp32 scale (NVFP4-style)")
    p.add_argument("--scale-rule", choices=("floor", "ceil", "even", "rceil"), help="E8M0 scale rounding (default floor)")
    p.add_argument("--out", type=Path, required=True, help="folder to write (a new folder, or one rankwise wrote; written atomically)")
    p.add_argument("--overwrite", action="store_true", help="replace --out even if it holds files rankwise did not write")
    p.add_argument("--max-windows", type=positive_int, default=4, help="held-out 512-token windows for perplexity")
    p.add_argument("--sentences", type=positive_int, default=64, help="held-out sentences for embedding fidelity (encoders)")
    from rankwise.commands.quantize_codequant import add_arguments

    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.format == CODEQUANT:
        from rankwise.commands.quantize_codequant import run_codequant

        return run_codequant(args, ACCEPTS)
    from rankwise.commands.quantize_codequant import refuse_codequant_flags

    refuse_codequant_flags(args)
    require_model(args.model, "quantize", ACCEPTS)  # before any work: the kind of --model, then the output
    check_output(args.out, kind="microscaling", overwrite=args.overwrite, sources=(str(args.model),))
    args.scale = args.scale or "ue5m3"
    args.block = args.block or 16
    from rankwise.core.progress import say
    from rankwise.models import load_model
    from rankwise.quant import make_recipe, save_quantized

    recipe = make_recipe(args.format, args.scale, args.block, args.global_scale, args.scale_rule)
    model, tokenizer = load_model(args.model)
    say(f"quantizing {args.model}: {recipe.describe()}")
    summary = save_quantized(model, tokenizer, recipe, args.out, overwrite=args.overwrite)
    reloaded, _ = load_model(args.out)
    quality = _quality(model, reloaded, tokenizer, args)
    print(f"{args.model} -> {args.out} ({recipe.describe()})")
    print(f"  {summary.quantized_weights / 1e6:.2f}M linear weights stored in {summary.payload_bytes / 1e6:.2f} MB: "
          f"{summary.bytes_per_weight:.4f} bytes per weight measured ({summary.file_bytes_per_weight:.4f} with the "
          f"safetensors header; fp32 is 4); whole folder {summary.folder_bytes / 1e6:.1f} MB")
    print(f"  reloaded from disk: {quality}")
    return 0


def _quality(original, reloaded, tokenizer, args: argparse.Namespace) -> str:
    if hasattr(original, "lm_head"):
        from rankwise.data import token_windows
        from rankwise.eval import perplexity

        windows = token_windows(tokenizer, "eval", 512, args.max_windows)
        before, after = perplexity(original, windows).perplexity, perplexity(reloaded, windows).perplexity
        return f"perplexity {after:.3f} vs {before:.3f} unquantized ({windows.size(0)} held-out windows of 512 tokens)"
    from rankwise.data import articles
    from rankwise.models import embed_sentences

    texts = [a.text for a in articles("eval")[: args.sentences]]
    cos = (embed_sentences(original, tokenizer, texts) * embed_sentences(reloaded, tokenizer, texts)).sum(-1)
    return f"sentence-embedding cosine to the unquantized model: mean {cos.mean():.5f}, min {cos.min():.5f} ({len(texts)} held-out texts)"
