"""`rankwise convert mla ... --deploy [--heal STEPS]`: the deployable path of the `convert mla` command.

    rankwise convert mla --model smollm2-135m --kv-rank 80 --deploy --heal 40 --out DIR

writes DIR as a stock DeepSeek-V3 checkpoint (`AutoModelForCausalLM.from_pretrained(DIR)` loads it offline) whose
cache holds 2 * kv-rank + rope-dims numbers per token and layer. The `convert mla` parser (owned by the one-shot CARE
code) calls `add_deploy_arguments` and hands over to `run_deploy` when --deploy or --heal is given.
"""

from __future__ import annotations

import argparse

from rankwise.compress.mla_deploy.rope import SELECTIONS


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
    from rankwise.compress.mla_deploy.heal import HealConfig, heal
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
    calibration = calibration_windows(tokenizer, args.calib_samples, args.calib_seq_len, args.seed)
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
