"""`rankwise convert mla`: convert a model's GQA attention to MLA, report perplexity and KV saving (care-mla).

    rankwise convert mla --model smollm2-135m --kv-rank 48 --method care --allocation adjusted --out DIR
    rankwise convert mla --model smollm2-135m --kv-rank 80 --deploy --heal 40 --out DIR

The first writes the one-shot form (`load_model(DIR)` reloads it); `--deploy` builds a real MLA model with a
latent-only cache and writes it as a stock DeepSeek-V3 checkpoint (`AutoModelForCausalLM.from_pretrained(DIR)` loads
it offline) whose cache holds 2 * kv-rank + rope-dims numbers per token and layer; `--heal STEPS` first recovers
quality by distilling from the original.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rankwise.compress.mla.allocation import ALLOCATIONS, SCORES
from rankwise.compress.mla.calibration import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN
from rankwise.compress.mla.factorize import ALIASES, METHODS
from rankwise.compress.mla_deploy.rope import SELECTIONS


def register(kinds: argparse._SubParsersAction) -> None:
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
    add_deploy_arguments(p)
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

    calibration = calibration_windows(token_windows(tokenizer, "calibration", args.calib_seq_len), args.calib_samples, args.seed)
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


def add_deploy_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("deployable MLA (latent-only KV cache, decoupled RoPE, DeepSeek-V3 export)")
    g.add_argument("--deploy", action="store_true", help="build a real MLA model with a latent-only cache and write it (--out) as a DeepSeek-V3 checkpoint")
    g.add_argument("--heal", type=int, default=0, metavar="STEPS", help="recovery fine-tune for STEPS steps, the original as teacher (implies --deploy)")
    g.add_argument("--rope-dims", type=int, default=None, help="width of the shared decoupled RoPE key (default: head_dim / 2)")
    g.add_argument("--rope-selection", default="high", choices=sorted(SELECTIONS), help="which rotary pairs keep RoPE (default %(default)s)")
    g.add_argument("--heal-dir", default=None, help="healing checkpoint folder (resumed if it holds a checkpoint)")


def wants_deploy(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "deploy", False) or getattr(args, "heal", 0))


def run_deploy(args: argparse.Namespace) -> int:
    from rankwise.compress.mla.calibration import calibration_windows
    from rankwise.compress.mla_deploy.build import convert_to_deployable_mla, deploy_info
    from rankwise.compress.mla_deploy.export import export_deepseek_v3
    from rankwise.training.healing import HealConfig, heal
    from rankwise.core.seed import set_seed
    from rankwise.data import token_windows
    from rankwise.errors import InvalidInputError
    from rankwise.eval import measure, measured_kv_bytes_per_token, perplexity
    from rankwise.models import load_model

    if args.heal < 0:
        raise InvalidInputError(f"--heal takes a number of steps >= 0, got {args.heal}")
    set_seed(args.seed)
    model, tokenizer = load_model(args.model)
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    rope_dims = args.rope_dims or head_dim // 2
    windows = token_windows(tokenizer, "eval", args.seq_len, args.eval_windows) if args.eval_windows > 0 else None
    before = perplexity(model, windows, desc="perplexity (original)") if windows is not None else None
    calibration = calibration_windows(token_windows(tokenizer, "calibration", args.calib_seq_len), args.calib_samples, args.seed)
    mla, took = measure(
        convert_to_deployable_mla, model, args.kv_rank, rope_dims, args.rope_selection, calibration,
        allocation=args.allocation, score=args.score, damping=args.damping,
    )
    info = deploy_info(mla)
    gqa, latent = measured_kv_bytes_per_token(model), measured_kv_bytes_per_token(mla)
    print(f"deployable MLA in {took.wall_s:.1f} s: r_K/r_V mean {args.kv_rank}, rope key {rope_dims} dims on pairs {info['rope_pairs']} ({args.rope_selection})")
    print(f"KV cache measured: {latent:.0f} bytes/token vs {gqa:.0f} for GQA (saving {100 * (1 - latent / gqa):.1f}%)")
    if windows is not None:
        print(f"perplexity: original {before.perplexity:.2f}, deployable MLA {perplexity(mla, windows, desc='perplexity (MLA)').perplexity:.2f}")
    if args.heal:
        train = token_windows(tokenizer, "train", 64, 2000)
        result = heal(mla, model, train, HealConfig(steps=args.heal, seed=args.seed), checkpoint_dir=args.heal_dir)
        print(f"healed steps {result.start_step}..{result.steps}: loss {result.losses[0] if result.losses else float('nan'):.3f} -> {result.losses[-1] if result.losses else float('nan'):.3f}")
        if windows is not None:
            print(f"perplexity after healing: {perplexity(mla, windows, desc='perplexity (healed)').perplexity:.2f}")
    if args.out:
        export_deepseek_v3(mla, args.out, tokenizer)
        print(f"wrote a DeepSeek-V3 checkpoint to {args.out} (AutoModelForCausalLM.from_pretrained or rankwise.models.load_model)")
    return 0
