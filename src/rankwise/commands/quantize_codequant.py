"""`rankwise quantize --model NAME --format codequant --out DIR`: CodeQuant on a Llama-style causal LM.

Fold the norms, learn the rotation (AOS) on calibration text, cluster q/k/v and the MLP's gate/up (the router and
experts' for an MoE) into 16 centroids per row, fine-tune the centroids, write the `codequant` folder, reload it
through `load_model(DIR)` and report perplexity and bytes. Calibration text is the wiki corpus's calibration split,
disjoint from the eval split the perplexity is measured on.
"""

from __future__ import annotations

import argparse

from rankwise.commands.common import check_output, positive_float, positive_int, require_model
from rankwise.errors import InvalidInputError

MICROSCALING_FLAGS = {"scale": "--scale", "block": "--block", "global_scale": "--global-scale", "scale_rule": "--scale-rule"}
CODEQUANT_FLAGS = {"calibration_windows": "--calibration-windows", "seq_len": "--seq-len", "rotation": "--rotation",
                   "aos_steps": "--aos-steps", "aos_lr": "--aos-lr", "accf_steps": "--accf-steps", "accf_lr": "--accf-lr",
                   "no_finetune": "--no-finetune", "group": "--group", "act_bits": "--act-bits", "seed": "--seed"}
# Defaults: the smollm2 experiment's settings and the values its validation tuning chose (docs/methods/codequant.md):
# 16 windows of 256 tokens, AOS 100 steps at lr 3e-3, 8 fine-tuning batches of 2 windows at lr 0.1.
DEFAULTS = {"calibration_windows": 16, "seq_len": 256, "rotation": "learned", "aos_steps": 100, "aos_lr": 3e-3,
            "accf_steps": 8, "accf_lr": 0.1, "act_bits": 4, "seed": 0}
ACCF_BATCH = 2  # windows per fine-tuning batch (the smollm2 experiment's)
AOS_BATCH, AOS_TOKENS = 64, 1024  # tokens per norm output per AOS step, and captured per norm output


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("CodeQuant (--format codequant)")
    g.add_argument("--calibration-windows", type=positive_int, help="calibration windows of the calibration split (default 16)")
    g.add_argument("--seq-len", type=positive_int, help="tokens per calibration window (default 256)")
    g.add_argument("--rotation", choices=("learned", "random"), help="learned (AOS, the paper; the default) or random "
                   "orthogonal")
    g.add_argument("--aos-steps", type=positive_int, help="Adam steps of the rotation (default 100)")
    g.add_argument("--aos-lr", type=positive_float, help="the rotation's learning rate (default 3e-3)")
    g.add_argument("--accf-steps", type=positive_int, help="centroid fine-tuning batches of 2 windows (default 8)")
    g.add_argument("--accf-lr", type=positive_float, help="centroid fine-tuning SGD step on the mean gradient (default "
                   "0.1; the relative-MSE loss, see the method page)")
    g.add_argument("--no-finetune", action="store_true", default=None, help="k-means centroids only")
    g.add_argument("--group", type=positive_int, help="centroids per group of this many inputs (default: whole rows)")
    g.add_argument("--act-bits", type=positive_int, help="per-token input bits of the quantized linears (default 4)")
    g.add_argument("--seed", type=int, help="rotation, calibration draw and k-means seed (default 0)")


def refuse_codequant_flags(args: argparse.Namespace) -> None:
    given = [flag for dest, flag in CODEQUANT_FLAGS.items() if getattr(args, dest, None) not in (None, False)]
    if given:
        raise InvalidInputError(f"{', '.join(given)} apply to --format codequant only, not --format {args.format}")


def run_codequant(args: argparse.Namespace, accepts: frozenset[str]) -> int:
    given = [flag for dest, flag in MICROSCALING_FLAGS.items() if getattr(args, dest, None) not in (None, False)]
    if given:
        raise InvalidInputError(f"{', '.join(given)} are microscaling options: --format codequant has codebooks, not "
                                "block scales")
    require_model(args.model, "quantize --format codequant", accepts, causal=True)  # before any work
    check_output(args.out, kind="codequant", overwrite=args.overwrite, sources=(str(args.model),))
    opts = {k: (v if (v := getattr(args, k, None)) is not None else DEFAULTS.get(k)) for k in CODEQUANT_FLAGS}
    from rankwise.compress.codequant import ACCFConfig, AOSConfig, QuantSpec, quantize_, save_codequant

    spec = QuantSpec(rotation=opts["rotation"], weights="kmeans", group=opts["group"], act_bits=opts["act_bits"],
                     aos=AOSConfig(steps=opts["aos_steps"], lr=opts["aos_lr"], batch_tokens=AOS_BATCH),
                     aos_tokens=AOS_TOKENS, seed=opts["seed"],
                     finetune=None if opts["no_finetune"] else ACCFConfig(steps=opts["accf_steps"], lr=opts["accf_lr"],
                                                                          batch_size=ACCF_BATCH))
    from rankwise.core.progress import say
    from rankwise.data import token_windows
    from rankwise.eval import perplexity
    from rankwise.models import load_model

    model, tokenizer = load_model(args.model)
    calibration = token_windows(tokenizer, "calibration", opts["seq_len"], opts["calibration_windows"])
    evaluation = token_windows(tokenizer, "eval", 512, args.max_windows)
    before = perplexity(model, evaluation).perplexity
    say(f"CodeQuant on {args.model}: {spec.rotation} rotation, {spec.k} centroids per "
        f"{'row' if spec.group is None else f'{spec.group} inputs'}, A{spec.act_bits}, {calibration.shape[0]} calibration "
        f"windows of {calibration.shape[1]} tokens")
    result = quantize_(model, calibration, spec)
    summary = save_codequant(model, tokenizer, args.out, spec, overwrite=args.overwrite)
    reloaded, _ = load_model(args.out)
    after = perplexity(reloaded, evaluation).perplexity
    print(f"{args.model} -> {args.out} (CodeQuant: {spec.rotation} rotation, {spec.k} centroids, A{spec.act_bits})")
    print(f"  {len(result.quantized)} linears, {summary.clustered_weights / 1e6:.2f}M weights as codes + centroids: "
          f"{summary.bytes_per_weight:.4f} bytes per weight ({summary.compression:.2f}x smaller than fp32)")
    if result.aos is not None:
        print(f"  rotation objective (activation quantization MSE): {result.aos.initial_loss:.5f} -> {result.aos.final_loss:.5f}")
    if result.accf is not None and result.accf.losses:
        print(f"  centroid fine-tuning loss: {result.accf.losses[0]:.5f} -> {result.accf.losses[-1]:.5f}")
    print(f"  reloaded from disk: perplexity {after:.3f} vs {before:.3f} unquantized ({evaluation.shape[0]} held-out "
          "windows of 512 tokens; o_proj, down_proj and lm_head stay fp32)")
    return 0
