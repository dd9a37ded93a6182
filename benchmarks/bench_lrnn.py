"""Cost of an LRNN forward + backward against SIREN and a ReLU MLP with the same number of parameters.

  .venv/bin/python benchmarks/bench_lrnn.py [--batches 1024 4096 16384] [--repeats 3] [--smoke]

The INR shapes of the camera reproduction: 2 -> LRNN(ranks (32, 32), D = 8, component width 4) -> 1, against
SIREN 2 -> w -> w -> w -> 1 and a ReLU MLP of the same widths (w matched to the LRNN's parameter count). Time: best
of `repeats` of one forward + backward of the MSE on a batch of coordinates (1 thread: --threads; float32). Memory: the bytes
autograd saves for the backward (counted with saved-tensor hooks; the activation memory that dominates the peak on
large batches, and deterministic where an allocator's peak on a shared CPU is not). Ratios are LRNN / baseline.
Writes docs/results/lrnn/benchmark.md (or --out; --smoke: small batches, a temporary folder).
"""

from __future__ import annotations

import os
import platform

import torch
from torch import nn

from rankwise.core.threads import limit_threads
from rankwise.nn.lrnn import LRNN, Siren, lrnn_parameter_count, siren_parameter_count
from common import benchmark_parser, parse_benchmark_args, threads_label
from memory import saved_tensor_bytes
from output import write_benchmark
from timing import best_time, loglog_slope


def saved_bytes(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """Bytes of the tensors autograd keeps for the backward of mse(model(x), y) (each storage counted once)."""
    saved, loss = saved_tensor_bytes(lambda: (model(x) - y).pow(2).mean())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return saved


def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    (model(x) - y).pow(2).mean().backward()


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__, "lrnn")
    parser.add_argument("--batches", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_benchmark_args(parser, argv, {"batches": [64, 128], "repeats": 1})
    with limit_threads(args.threads):
        run(args)


def run(args) -> None:
    torch.manual_seed(0)
    target = lrnn_parameter_count(2, 1, (32, 32), 8, 4)
    w = min(range(8, 512), key=lambda k: abs(siren_parameter_count(2, 1, k, 3) - target))
    models = {"LRNN": LRNN(2, 1, (32, 32), 8, 4), f"SIREN (w {w})": Siren(2, 1, w, 3),
              f"ReLU MLP (w {w})": nn.Sequential(nn.Linear(2, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                                                 nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 1))}
    params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    rows = {k: [] for k in models}
    for b in args.batches:
        x, y = torch.rand(b, 2) * 2 - 1, torch.rand(b, 1)
        for k, m in models.items():
            sec = best_time(lambda: step(m, x, y), args.repeats)[0]
            rows[k].append((b, sec, saved_bytes(m, x, y)))
            print(k, b, f"{sec * 1e3:.2f} ms, {rows[k][-1][2] / 2**20:.1f} MiB saved", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = ["# Benchmark: LRNN forward + backward against SIREN and a ReLU MLP at equal parameters (CPU, float32, "
             f"{threads_label()})", "",
             f"Best of {args.repeats}; torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, "
             f"1-minute load average {load:.1f} at the end (the machine is shared: ratios are the numbers to read).",
             "Parameters: " + ", ".join(f"{k} {v}" for k, v in params.items()) + ".", "",
             "| model | batch | fwd+bwd ms | saved for backward MiB | time / LRNN's | memory / LRNN's |",
             "|---|---|---|---|---|---|"]
    for k, pts in rows.items():
        for (b, sec, mem), (_, lsec, lmem) in zip(pts, rows["LRNN"]):
            lines.append(f"| {k} | {b} | {sec * 1e3:.3g} | {mem / 2**20:.3g} | {sec / lsec:.3f} | {mem / lmem:.3f} |")
    lines.append("")
    for k in list(models)[1:]:
        lines.append(f"- LRNN / {k}: time " + ", ".join(f"{l[1] / o[1]:.1f}x" for l, o in zip(rows['LRNN'], rows[k]))
                     + "; memory " + ", ".join(f"{l[2] / o[2]:.1f}x" for l, o in zip(rows["LRNN"], rows[k]))
                     + f" (batches {' '.join(map(str, args.batches))})")
    lines.append(f"- fitted exponent of LRNN time in the batch: {loglog_slope(args.batches, [p[1] for p in rows['LRNN']]):.2f}")
    lines += ["", "An LRNN layer evaluates r * D * h = 1,024 scalar sinusoids per point and keeps them (and every factor "
              "of the product) for the backward; SIREN and the MLP keep three activations of width w. The card's "
              "pitfall (\"memory exceeds a same-size MLP\") is this ratio."]
    write_benchmark(args.out, lines, smoke=args.smoke)


if __name__ == "__main__":
    main()
