"""Deployable MLA vs the original GQA SmolLM2, side by side in one run: KV-cache bytes, decode speed, perplexity.

    .venv/bin/python benchmarks/bench_mla_deploy.py [--heal-steps 30] [--contexts 512 2048 8192] [--batches 1 8] [--out docs/results/care-mla/deploy/benchmark.md] [--smoke]

* KV-cache bytes per token, measured from the cache tensors a forward returns (not from the config): GQA, our MLA,
  and the exported DeepSeek-V3 checkpoint.
* Decode tokens/s at each batch and context for GQA, MLA expanded (up-projecting every cached latent each step)
  and MLA absorbed (DeepSeek-V2), each with transformers' DynamicCache and GQA/absorbed MLA also with the in-place
  `preallocated_cache`, interleaved in one run so machine load hits all alike; ratios to GQA. Best of `--repeats`.
* Perplexity: original, CARE one-shot at the same cache size (issue 3; RoPE after the up-projection, so not a real
  latent cache), deployable MLA before healing, after `--heal-steps`, and the exported checkpoint.
One thread (--threads). --smoke: SmolLM2's tiny random stand-in (the same 50 % budget on its shapes), one short
context, two healing steps, written to a temporary folder.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from rankwise.compress.mla.calibration import DEFAULT_SAMPLES, DEFAULT_SEQ_LEN, calibration_windows
from rankwise.compress.mla.convert import convert_to_mla
from rankwise.compress.mla_deploy import convert_to_deployable_mla, export_deepseek_v3, load_deepseek_v3, mla_parameters, set_absorb
from rankwise.compress.mla_deploy.checks import decode_tokens_per_second
from rankwise.core.progress import say, set_quiet
from rankwise.core.threads import limit_threads
from rankwise.data import token_windows
from rankwise.eval import measured_kv_bytes_per_token, perplexity
from rankwise.repro.setup import experiment_model
from rankwise.training.healing import HealConfig, heal
from common import benchmark_parser, parse_benchmark_args
from output import write_benchmark

SMOKE = {"contexts": [16], "batches": [1], "new_tokens": 2, "repeats": 1, "heal_steps": 2, "eval_windows": 2,
         "calibration_samples": 16}


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "care-mla/deploy")
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=8, help="timed decode steps per measurement")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--heal-steps", type=int, default=30, help="healing steps of 2 x 64 tokens (as the full report)")
    parser.add_argument("--heal-dir", type=Path, default=None, help="resumable healing checkpoint folder")
    parser.add_argument("--eval-windows", type=int, default=12, help="256-token held-out windows for perplexity")
    parser.add_argument("--calibration-samples", type=int, default=DEFAULT_SAMPLES,
                        help=f"{DEFAULT_SEQ_LEN}-token calibration windows (default: %(default)s)")
    parser.add_argument("--no-perplexity", action="store_true", help="measure cache bytes and decode speed only")
    parser.add_argument("--quiet", action="store_true")
    args = parse_benchmark_args(parser, argv, SMOKE)
    set_quiet(args.quiet)
    with limit_threads(args.threads):
        return run(args)


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    model, tokenizer = experiment_model("smollm2-135m", "smoke" if args.smoke else "full")
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_width = cfg.num_key_value_heads * head_dim  # 192 on SmolLM2
    rope_dims = head_dim // 2  # 32 on SmolLM2
    kv_rank = (kv_width - rope_dims) // 2  # 2 r + rope = kv_width: half the GQA cache (80 on SmolLM2)
    calib = calibration_windows(token_windows(tokenizer, "calibration", DEFAULT_SEQ_LEN), args.calibration_samples)
    evals = token_windows(tokenizer, "eval", 256, args.eval_windows)
    mla = convert_to_deployable_mla(model, kv_rank=kv_rank, rope_dims=rope_dims, rope_selection="high", calibration=calib)

    lines = ["# Deployable MLA benchmark (SmolLM2-135M, 50 % KV saving)", ""]
    lines += [f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads. "
              f"r_K = r_V = {kv_rank} plus a {rope_dims}-dim shared rope key ('high' pairs) per layer.", ""]

    say("KV-cache bytes")
    gqa_bytes, mla_bytes = measured_kv_bytes_per_token(model), measured_kv_bytes_per_token(mla)
    with tempfile.TemporaryDirectory() as tmp:
        export_deepseek_v3(mla, f"{tmp}/ds", tokenizer)
        exported = load_deepseek_v3(f"{tmp}/ds")
    exp_bytes = measured_kv_bytes_per_token(exported)
    lines += ["## KV-cache bytes per token (measured from the cache tensors)", "", "| model | bytes/token | ratio to GQA |", "|---|---|---|"]
    for name, b in (("original GQA", gqa_bytes), ("deployable MLA", mla_bytes), ("exported DeepSeek-V3", exp_bytes)):
        lines.append(f"| {name} | {b:.0f} | {b / gqa_bytes:.3f} |")

    say("decode speed")
    lines += _decode_section(model, mla, args, gqa_bytes, mla_bytes)

    if args.no_perplexity:
        lines += ["", "Perplexity skipped (--no-perplexity); see the care-mla deploy report."]
        return _finish(args, lines, t0)
    say("perplexity")
    rows = [("original GQA", perplexity(model, evals).perplexity)]
    oneshot = convert_to_mla(model, kv_rank=kv_width // 2, method="care", allocation="uniform", calibration=calib)
    rows.append((f"CARE one-shot r={kv_width // 2} (RoPE after up-projection; not a latent cache)",
                 perplexity(oneshot, evals).perplexity))
    del oneshot
    rows.append(("deployable MLA, before healing", perplexity(mla, evals).perplexity))
    rows.append(("exported DeepSeek-V3 checkpoint (before healing)", perplexity(exported, evals).perplexity))
    del exported
    if args.heal_steps:
        train = token_windows(tokenizer, "train", 64, 2000)
        heal(mla, model, train, HealConfig(steps=args.heal_steps, batch_size=2), checkpoint_dir=args.heal_dir, trainable=mla_parameters)
        rows.append((f"deployable MLA, after {args.heal_steps} healing steps", perplexity(mla, evals).perplexity))
    lines += ["", f"## Perplexity ({args.eval_windows} x 256 held-out tokens)", "", "| model | perplexity | vs original |", "|---|---|---|"]
    lines += [f"| {name} | {p:.3f} | {p / rows[0][1]:.2f} |" for name, p in rows]
    return _finish(args, lines, t0)


VARIANTS = {  # name: (which model, absorb, cache kind)
    "GQA dynamic": ("gqa", None, "dynamic"),
    "GQA prealloc": ("gqa", None, "preallocated"),
    "MLA expanded dynamic": ("mla", False, "dynamic"),
    "MLA absorbed dynamic": ("mla", True, "dynamic"),
    "MLA absorbed prealloc": ("mla", True, "preallocated"),
}


def _decode_section(model, mla, args: argparse.Namespace, gqa_bytes: float, mla_bytes: float) -> list[str]:
    """Decode tokens/s of every variant at every (batch, context), interleaved round by round; best of repeats."""
    models = {"gqa": model, "mla": mla}
    speed: dict[tuple[str, int, int], float] = {}
    for _ in range(args.repeats):
        for batch in args.batches:
            for context in args.contexts:
                for name, (which, absorb, cache) in VARIANTS.items():  # interleaved: load drifts hit all alike
                    if absorb is not None:
                        set_absorb(mla, absorb)
                    tps = decode_tokens_per_second(models[which], context, args.new_tokens, batch=batch, cache=cache,
                                                   synthetic_context=True)
                    key = (name, batch, context)
                    speed[key] = max(speed.get(key, 0.0), tps)
                    say(f"  batch {batch} context {context} {name}: {tps:.1f} tok/s")
    set_absorb(mla, True)
    out = ["", f"## Decode tokens/s (batch x {args.new_tokens} greedy steps / s; best of {args.repeats})", "",
           "Every variant decodes after the same context, interleaved in one run. The context is one real token plus "
           "`context - 1` cached positions of random numbers in each layer's own cache shapes (`synthetic_context`): "
           "a decoding step does the same work as after a real prefill, and batch 8 x 8,192 needs no 65k-token "
           "prefill. `dynamic` = transformers' DynamicCache (appends by torch.cat: each step copies the whole "
           "cache); `prealloc` = `rankwise.compress.mla_deploy.cache.preallocated_cache` (appends in place). "
           f"GQA cache per token {gqa_bytes:,.0f} bytes, MLA {mla_bytes:,.0f}.", ""]
    out += ["| batch | context | cache MB (GQA / MLA) | " + " | ".join(VARIANTS)
            + " | absorbed / GQA, both dynamic | absorbed prealloc / best GQA |", "|---" * (len(VARIANTS) + 5) + "|"]
    for batch in args.batches:
        for c in args.contexts:
            v = {n: speed[n, batch, c] for n in VARIANTS}
            best_gqa = max(v["GQA dynamic"], v["GQA prealloc"])
            mb = batch * c / 2**20
            out.append(f"| {batch} | {c} | {mb * gqa_bytes:.0f} / {mb * mla_bytes:.0f} | " + " | ".join(f"{v[n]:.1f}" for n in VARIANTS)
                       + f" | {v['MLA absorbed dynamic'] / v['GQA dynamic']:.2f} | {v['MLA absorbed prealloc'] / best_gqa:.2f} |")
    return out


def _finish(args: argparse.Namespace, lines: list[str], t0: float) -> int:
    lines += ["", f"Total wall time {time.perf_counter() - t0:.0f} s."]
    print("\n".join(lines))
    write_benchmark(args.out, lines, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
