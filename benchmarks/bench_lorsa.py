"""Cost of a Lorsa layer against the attention layer it replaces: forward+backward time and activation memory.

  .venv/bin/python benchmarks/bench_lorsa.py [--seqs 128 512] [--batch 4] [--repeats 3] [--smoke]

Baseline: causal MHA with SmolLM2's width (d = 576, 9 heads of 64, RoPE), 4 d^2 parameters. Lorsa at equal
parameters: n_qk = 9 QK heads of 64 (2 d^2) and n_ov = d = 576 rank-1 OV heads (2 d^2), at K = 576 (dense: the
exact form of the MHA), 64 and 16; and the paper-sized layer of the R2 reproduction (n_ov = 4d, n_qk = 18, K = 32),
which has 3x the parameters. Time: the best of `repeats` forward+backward passes, one thread (--threads). Memory: bytes of
the activations autograd saves for the backward (storage-deduplicated, parameters excluded, via saved_tensors_hooks), the part of peak memory
that grows with batch and sequence; on CUDA also torch.cuda.max_memory_allocated. Writes
docs/results/lorsa/benchmark.md (or --out; --smoke: one short sequence, a temporary folder).
"""

from __future__ import annotations

import platform

import torch

from rankwise.core.threads import limit_threads
from rankwise.nn.lorsa import CausalSelfAttention, Lorsa, LorsaConfig, Rope
from common import benchmark_parser, parse_benchmark_args, threads_label
from memory import cuda_peak_bytes, saved_tensor_bytes
from output import write_benchmark
from timing import best_time

D, H, HD = 576, 9, 64


def saved_bytes(fn, layer: torch.nn.Module) -> int:
    """Bytes of activations autograd keeps for the backward of fn(): each storage once, the parameters excluded."""
    return saved_tensor_bytes(fn, exclude=layer.parameters())[0]


def layers() -> list[tuple[str, torch.nn.Module]]:
    rope = Rope(HD, 1e5)
    torch.manual_seed(0)
    out = [("MHA (9 x 64)", CausalSelfAttention(D, H, HD, rope=rope))]
    for k in (D, 64, 16):
        out.append((f"Lorsa n_ov=576 n_qk=9 K={k}", Lorsa(LorsaConfig(D, 9, D, HD, k, rope=rope))))
    out.append(("Lorsa n_ov=2304 n_qk=18 K=32 (R2)", Lorsa(LorsaConfig(D, 18, 4 * D, HD, 32, rope=rope))))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__, "lorsa")
    parser.add_argument("--seqs", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parse_benchmark_args(parser, argv, {"seqs": [16], "batch": 1, "repeats": 1})
    with limit_threads(args.threads):
        run(args)


def run(args) -> None:
    dev = torch.device(args.device)
    rows = []
    for seq in args.seqs:
        x = torch.randn(args.batch, seq, D, generator=torch.Generator().manual_seed(seq)).to(dev)
        base_t = base_m = None
        for name, layer in layers():
            layer = layer.to(dev)
            params = sum(p.numel() for p in layer.parameters())

            def step():
                layer.zero_grad(set_to_none=True)
                layer(x).pow(2).mean().backward()
                if dev.type == "cuda":
                    torch.cuda.synchronize()

            t, _ = best_time(step, args.repeats)
            mem = saved_bytes(lambda: layer(x).pow(2).mean(), layer)
            cuda_peak = cuda_peak_bytes(step) / 2**20 if dev.type == "cuda" else None
            if base_t is None:
                base_t, base_m = t, mem
            rows.append((seq, name, params, t, t / base_t, mem / 2**20, mem / base_m, cuda_peak))
            print(f"seq {seq} {name}: {params} params, {t * 1e3:.1f} ms ({t / base_t:.2f}x), saved "
                  f"{mem / 2**20:.1f} MiB ({mem / base_m:.2f}x)", flush=True)
    lines = ["# Lorsa vs the attention layer it replaces: forward+backward cost", "",
             f"batch {args.batch}, d = {D}, device {dev}, {threads_label()}, best of {args.repeats}; {platform.machine()}, "
             f"torch {torch.__version__}. Memory = tensors saved for the backward (activation memory).", "",
             "| seq | layer | params | fwd+bwd ms | time vs MHA | saved MiB | memory vs MHA |" + (" CUDA peak MiB |" if dev.type == "cuda" else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if dev.type == "cuda" else "")]
    for seq, name, params, t, rt, mem, rm, cp in rows:
        lines.append(f"| {seq} | {name} | {params:,} | {t * 1e3:.1f} | {rt:.2f}x | {mem:.1f} | {rm:.2f}x |"
                     + (f" {cp:.0f} |" if cp is not None else ""))
    write_benchmark(args.out, lines, smoke=args.smoke)


if __name__ == "__main__":
    main()
