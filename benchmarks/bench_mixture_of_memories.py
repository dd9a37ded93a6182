"""Cost of the Mixture-of-Memories layer: against single-memory linear attention and softmax attention at equal
parameters, and against softmax attention as the sequence grows (linear vs quadratic, with the crossover).

  .venv/bin/python benchmarks/bench_mixture_of_memories.py [--seqs 256 512 ... 8192] [--repeats 3] [--smoke]

Forward + backward of one layer (d_model 64, 2 heads of size 32, batch 1, float32, one thread: --threads) on x [1, L, 64]:
  - equal parameters at L = 1024 and 4096: MoM (4 memories, top-2, shared memory, chunks of 64); the single memory
    with its key size expanded until it has >= MoM's parameters; softmax attention with its key size expanded the
    same way (torch's scaled_dot_product_attention); and the plain single memory.
  - time against L for MoM and softmax attention (both at their default sizes): fitted log-log exponents and the
    first L at which MoM is faster (interpolated on log-log axes).
Memory: the bytes autograd saves for the backward (the activation memory of training, which is what grows with L;
captured with saved-tensor hooks), and torch.cuda's peak allocation where a GPU is present.
Writes docs/results/mixture-of-memories/benchmark.md and benchmark.png (or --out; --smoke: short sequences, a
temporary folder).
"""

from __future__ import annotations

import math
import platform

import torch

from rankwise.core.threads import limit_threads
from rankwise.nn.mixture_of_memories import CausalSoftmaxAttention, LinearAttention, MixtureOfMemories
from common import benchmark_parser, parse_benchmark_args, threads_label
from memory import cuda_peak_bytes, saved_tensor_bytes
from output import png_bytes, pyplot, write_benchmark
from timing import best_time, loglog_slope

D, HEADS, HEAD_DIM = 64, 2, 32


def _params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _layers() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    mom = MixtureOfMemories(D, HEADS, HEAD_DIM, HEAD_DIM, num_memories=4, top_k=2, chunk_size=64)
    target = _params(mom)
    out = {"MoM (4 mem, top-2, shared)": mom}
    for name, make in (("single memory, expanded", lambda e: LinearAttention(D, HEADS, e * HEAD_DIM, HEAD_DIM)),
                       ("softmax attention, expanded", lambda e: CausalSoftmaxAttention(D, HEADS, e * HEAD_DIM, HEAD_DIM))):
        e = next(e for e in range(1, 64) if _params(make(e)) >= target)
        out[f"{name} (key x{e})"] = make(e)
    out["single memory"] = LinearAttention(D, HEADS, HEAD_DIM, HEAD_DIM)
    return out


def _saved_bytes(layer: torch.nn.Module, x: torch.Tensor) -> int:
    """Every saved tensor's numel x element size, repeats included (not by storage: the committed numbers' count)."""
    return saved_tensor_bytes(lambda: layer(x).pow(2).mean(), by_storage=False)[0]


def _fwd_bwd(layer: torch.nn.Module, x: torch.Tensor):
    def go():
        layer.zero_grad(set_to_none=True)
        layer(x).pow(2).mean().backward()
    return go


def _cuda_peak(layer: torch.nn.Module, L: int) -> float | None:
    if not torch.cuda.is_available():
        return None
    gpu = layer.cuda()
    x = torch.randn(1, L, D, device="cuda", requires_grad=True)
    peak = cuda_peak_bytes(_fwd_bwd(gpu, x)) / 2**20
    layer.cpu()
    return peak


def _crossover(seqs, t_mom, t_soft) -> float | None:
    """The first L where MoM is faster, interpolated on log-log axes between the measured points."""
    r = [math.log(a / b) for a, b in zip(t_mom, t_soft)]  # > 0: MoM slower
    for i in range(1, len(seqs)):
        if r[i - 1] > 0 >= r[i]:
            f = r[i - 1] / (r[i - 1] - r[i])
            return math.exp(math.log(seqs[i - 1]) + f * (math.log(seqs[i]) - math.log(seqs[i - 1])))
    return float(seqs[0]) if r[0] <= 0 else None


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__, "mixture-of-memories")
    parser.add_argument("--seqs", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--equal-seqs", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_benchmark_args(parser, argv, {"seqs": [64, 128, 256, 512], "equal_seqs": [128], "repeats": 1})
    with limit_threads(args.threads):
        run(args)


def run(args) -> None:
    gen = torch.Generator().manual_seed(0)
    layers = _layers()
    lines = ["# Mixture-of-Memories: benchmark", "",
             f"{threads_label().capitalize()}, float32, batch 1, d_model {D}, {HEADS} heads of size {HEAD_DIM}; "
             "forward + backward of one "
             f"layer, best of {args.repeats}. `{platform.processor() or platform.machine()}`, torch {torch.__version__}, "
             "on a machine shared with other jobs (ratios are the robust numbers). Memory: bytes autograd saves for "
             "the backward (activation memory).", "",
             "## Equal parameters", "",
             "| layer | params | L | fwd+bwd ms | x MoM | saved MiB | CUDA peak MiB |", "|---|---|---|---|---|---|---|"]
    for L in args.equal_seqs:
        x = torch.randn(1, L, D, generator=gen, requires_grad=True)
        base = None
        for name, layer in layers.items():
            t, _ = best_time(_fwd_bwd(layer, x), args.repeats)
            base = t if base is None else base
            mib = _saved_bytes(layer, x) / 2**20
            peak = _cuda_peak(layer, L)
            lines.append(f"| {name} | {_params(layer)} | {L} | {t * 1e3:.1f} | {t / base:.2f} | {mib:.1f} | "
                         f"{'-' if peak is None else f'{peak:.1f}'} |")
            print(name, L, f"{t * 1e3:.1f} ms, saved {mib:.1f} MiB", flush=True)
    torch.manual_seed(0)
    mom = MixtureOfMemories(D, HEADS, HEAD_DIM, HEAD_DIM, num_memories=4, top_k=2, chunk_size=64)
    soft = CausalSoftmaxAttention(D, HEADS, HEAD_DIM, HEAD_DIM)
    t_mom, t_soft, m_mom, m_soft = [], [], [], []
    lines += ["", "## Against the sequence length (default sizes: MoM "
              f"{_params(mom)} params, softmax attention {_params(soft)})", "",
              "| L | MoM ms | softmax ms | MoM / softmax | MoM saved MiB | softmax saved MiB |", "|---|---|---|---|---|---|"]
    for L in args.seqs:
        x = torch.randn(1, L, D, generator=gen, requires_grad=True)
        t_mom.append(best_time(_fwd_bwd(mom, x), args.repeats)[0])
        t_soft.append(best_time(_fwd_bwd(soft, x), args.repeats)[0])
        m_mom.append(_saved_bytes(mom, x) / 2**20)
        m_soft.append(_saved_bytes(soft, x) / 2**20)
        lines.append(f"| {L} | {t_mom[-1] * 1e3:.1f} | {t_soft[-1] * 1e3:.1f} | {t_mom[-1] / t_soft[-1]:.2f} | "
                     f"{m_mom[-1]:.1f} | {m_soft[-1]:.1f} |")
        print(L, f"MoM {t_mom[-1] * 1e3:.1f} ms, softmax {t_soft[-1] * 1e3:.1f} ms", flush=True)
    half = len(args.seqs) // 2
    cross = _crossover(args.seqs, t_mom, t_soft)
    lines += ["", f"Fitted exponent of time in L (all points): MoM {loglog_slope(args.seqs, t_mom):.2f}, softmax "
              f"attention {loglog_slope(args.seqs, t_soft):.2f}; over the upper half (L >= {args.seqs[half]}): MoM "
              f"{loglog_slope(args.seqs[half:], t_mom[half:]):.2f}, softmax "
              f"{loglog_slope(args.seqs[half:], t_soft[half:]):.2f}.",
              "Crossover (first L where MoM's forward + backward is faster than softmax attention's): "
              + ("not reached in the measured range" if cross is None else f"L ~ {cross:.0f}") + "."]
    write_benchmark(args.out, lines, _plot(args.seqs, t_mom, t_soft), smoke=args.smoke)
    print("\n".join(lines))


def _plot(seqs, t_mom, t_soft) -> bytes:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.loglog(seqs, [t * 1e3 for t in t_mom], "o-", label="MoM (chunked)")
    ax.loglog(seqs, [t * 1e3 for t in t_soft], "s-", label="softmax attention")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("forward + backward (ms)")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return png_bytes(fig, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
