"""Cost of the emulated-bf16 tiled flash attention: against the same kernel in exact fp32 and torch's
scaled_dot_product_attention (the peer), forward + backward, as ratios. Its cost is reported, not a goal.

  .venv/bin/python benchmarks/bench_lowprec_flash_attention.py [--seqs 128 256 512] [--repeats 3] [--smoke]

q, k, v [1, 4, L, 32], causal, tiles 64 x 64, float32, one thread (--threads). Writes
docs/results/lowprec-flash-attention/benchmark.md (or --out; --smoke: short sequences, a temporary folder).
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F

from rankwise.core.threads import limit_threads
from rankwise.nn.lowprec_flash_attention import flash_attention
from common import benchmark_parser, parse_benchmark_args, threads_label
from output import write_benchmark
from timing import best_time

HEADS, HEAD_DIM = 4, 32
ARMS = {
    "SDPA (torch)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "tiled, exact fp32": lambda q, k, v: flash_attention(q, k, v, causal=True),
    "tiled, bf16 emulated": lambda q, k, v: flash_attention(q, k, v, causal=True, precision="bf16"),
    "tiled, bf16 + fix": lambda q, k, v: flash_attention(q, k, v, causal=True, precision="bf16", fix=True),
}


def _fwd_bwd(fn, q, k, v):
    def go():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).pow(2).mean().backward()
    return go


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__, "lowprec-flash-attention")
    parser.add_argument("--seqs", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_benchmark_args(parser, argv, {"seqs": [32, 64], "repeats": 1})
    with limit_threads(args.threads):
        run(args)


def run(args) -> None:
    gen = torch.Generator().manual_seed(0)
    lines = ["# Low-precision flash attention: benchmark", "",
             f"{threads_label().capitalize()}, float32 storage, q, k, v [1, {HEADS}, L, {HEAD_DIM}], causal, tiles "
             f"64 x 64; forward + backward, best of {args.repeats}. `{platform.processor() or platform.machine()}`, "
             f"torch {torch.__version__}, nothing else running (ratios are the robust numbers).", "",
             "| L | " + " | ".join(f"{a} ms" for a in ARMS) + " | bf16 / exact | bf16 / SDPA |",
             "|---|" + "---|" * (len(ARMS) + 2)]
    for L in args.seqs:
        q, k, v = (torch.randn(1, HEADS, L, HEAD_DIM, generator=gen, requires_grad=True) for _ in range(3))
        times = {a: best_time(_fwd_bwd(fn, q, k, v), args.repeats)[0] for a, fn in ARMS.items()}
        lines.append(f"| {L} | " + " | ".join(f"{t * 1e3:.1f}" for t in times.values())
                     + f" | {times['tiled, bf16 emulated'] / times['tiled, exact fp32']:.2f}"
                     f" | {times['tiled, bf16 emulated'] / times['SDPA (torch)']:.2f} |")
        print(lines[-1], flush=True)
    write_benchmark(args.out, lines, smoke=args.smoke)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
