"""Benchmark: decoding speed with PALC's logit calibration, beside base decoding and a reward-guided decoder.

PALC's run-time cost is one bottleneck per generated token (h [H] -> B -> V offsets), on top of the frozen model's
step; the goal is >= 0.95x the base's tokens/s. The guided-decoding peer (ARGS-style, the paper's ARGS / GenARM
family) scores the top-k candidate tokens of every step with a reward model (here: the same model with a linear
reward head on its last hidden state, its own KV cache repeated over the k candidates), which is what makes guided
decoding 3-4x slower in the paper. All arms use one greedy loop with the KV cache (`recipes.palc.greedy_decode`;
the guided loop is written here), on SmolLM2-135M, prompts of ~12 tokens, batch 1 and 8, interleaved rounds.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_palc.py [--threads 1] [--rounds 5] [--smoke]

Writes docs/results/palc/benchmark.md (or --out); --smoke: the tiny stand-in, 4 tokens, a temporary folder.
"""

from __future__ import annotations

import copy

import torch
from common import benchmark_parser, parse_benchmark_args, threads_label
from output import write_benchmark
from timing import interleaved_times

from rankwise.core.threads import limit_threads
from rankwise.recipes.palc import LogitCalibrator, PalcConfig, greedy_decode, left_pad
from rankwise.repro.setup import experiment_model

PROMPTS = ["Human: Tell me about the river Danube.\n\nAssistant:", "Human: Tell me about Johann Sebastian Bach.\n\nAssistant:",
           "Human: Tell me about photosynthesis.\n\nAssistant:", "Human: Tell me about the Roman Empire.\n\nAssistant:",
           "Human: Tell me about volcanoes.\n\nAssistant:", "Human: Tell me about chess.\n\nAssistant:",
           "Human: Tell me about Mount Everest.\n\nAssistant:", "Human: Tell me about jazz.\n\nAssistant:"]


@torch.no_grad()
def guided_decode(model, reward_model, reward_head, prompts, new_tokens: int, k: int, weight: float = 1.0, pad_id: int = 0):
    """ARGS-style greedy: each step, the policy's top-k tokens are scored by logit + weight * reward(prefix + token),
    the reward from the reward model's last hidden state; the best is kept (both caches advance with it)."""
    ids, mask = left_pad(prompts, pad_id)
    b = ids.shape[0]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    r_out = reward_model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    r_cache = r_out.cache
    tokens = []
    for _ in range(new_tokens):
        top = out.logits[:, -1].topk(k, dim=-1)  # [b, k]
        cand_cache = copy.deepcopy(r_cache)
        cand_cache.batch_repeat_interleave(k)
        cand_mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1).repeat_interleave(k, 0)
        cand_pos = (positions[:, -1:] + 1).repeat_interleave(k, 0)
        r_step = reward_model(input_ids=top.indices.reshape(b * k, 1), attention_mask=cand_mask, position_ids=cand_pos,
                              cache=cand_cache, use_cache=True, output_hidden_states=True)
        reward = reward_head(r_step.hidden_states[-1][:, -1]).view(b, k)
        best = (top.values + weight * reward).argmax(-1)  # [b]
        token = top.indices.gather(1, best[:, None])  # [b, 1]
        cand_cache.batch_select_indices(torch.arange(b) * k + best)
        r_cache = cand_cache
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=token, attention_mask=mask, position_ids=positions, cache=out.cache, use_cache=True)
        tokens.append(token)
    return torch.cat(tokens, 1)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "palc")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--k", type=int, default=8, help="guided decoding's candidates per step")
    args = parse_benchmark_args(parser, argv, smoke={"rounds": 1, "new_tokens": 4, "batches": [2]})
    size = "smoke" if args.smoke else "full"
    with limit_threads(args.threads):
        model, tok = experiment_model("smollm2-135m", size)
        model.eval()
        reward_model, _ = experiment_model("smollm2-135m", size, seed=1)
        reward_model.eval()
        out_w = model.get_output_embeddings().weight
        H, V = out_w.shape[1], out_w.shape[0]
        reward_head = torch.nn.Linear(H, 1)
        modules = {B: LogitCalibrator(H, V, PalcConfig(bottleneck=B), seed=0).eval() for B in (64, 256)}
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        rows = []
        for batch in args.batches:
            prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in (PROMPTS * 8)[:batch]]
            n = args.new_tokens
            fns = {"base": lambda: greedy_decode(model, prompts, n, pad_id=pad),
                   **{f"PALC B={B}": (lambda m=m: greedy_decode(model, prompts, n, m, 1.0, pad_id=pad)) for B, m in modules.items()},
                   f"guided (ARGS-style, k={args.k})": lambda: guided_decode(model, reward_model, reward_head, prompts, n, args.k, pad_id=pad)}
            times = interleaved_times(fns, args.rounds, warmup=1)
            base_med = times.median("base")
            for name in fns:
                med, best = times.median(name), min(times.timed[name])
                rows.append((batch, name, batch * n / med, batch * n / best, base_med / med))
    lines = ["# PALC: decoding speed beside base decoding and reward-guided decoding", "",
             f"SmolLM2-135M-Instruct (fp32), {threads_label()}, greedy, {args.new_tokens} new tokens per prompt, "
             f"prompts of ~12 tokens, {args.rounds} interleaved rounds after one warm-up (median and best). Measured "
             "with nothing else running on the machine. Goal (issue): PALC >= 0.95x the base's tokens/s.", "",
             "| batch | decoder | tokens/s (median) | tokens/s (best) | speed vs base (median) |", "|---|---|---|---|---|"]
    for batch, name, med, best, ratio in rows:
        lines.append(f"| {batch} | {name} | {med:.1f} | {best:.1f} | {ratio:.3f}x |")
    lines += ["", "PALC's extra work per token: B (H + V) multiply-adds (B = 64: 3.2M; B = 256: 12.7M) against the "
              "frozen model's ~135M (of which its own output layer is 28M). The guided decoder runs its reward model "
              "on k candidates per step and copies its cache, as ARGS does; GenARM's autoregressive reward model "
              "costs about the same."]
    write_benchmark(args.out, lines, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
