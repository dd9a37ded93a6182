"""Quantization throughput of rankwise.quant against torchao's emulated MX / NVFP4 path, same inputs, one run.

  .venv/bin/python benchmarks/bench_microscaling.py [--rows 4096] [--cols 4096] [--repeats 5] [--threads N] [--smoke]

Measures elements per second of quantize (scales + packed FP4 codes) for MXFP4 (E8M0, block 32, floor) and NVFP4
(UE4M3, block 16, per-tensor scale), plus rankwise's UE5M3 recipe (torchao has no equivalent), at 1 thread and at
torch's default thread count (or --threads), and checks the outputs are bit-identical. Writes
docs/results/microscaling-ue5m3/benchmark.md (or --out; --smoke: a 64 x 64 input, a temporary folder).
"""

from __future__ import annotations

import os
import platform
import statistics
import warnings

import torch

import rankwise.quant.block as block
from rankwise.core.threads import limit_threads
from rankwise.quant import get_recipe, pack_nibbles, quantize
from common import benchmark_parser, parse_benchmark_args
from output import write_benchmark
from timing import best_time


def main(argv: list[str] | None = None) -> None:
    # --threads: the thread count compared with one thread (default: torch's)
    parser = benchmark_parser(__doc__, "microscaling-ue5m3", threads=None)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    args = parse_benchmark_args(parser, argv, {"rows": 64, "cols": 64, "repeats": 1})
    with limit_threads(args.threads):
        run(args)


def run(args) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize, per_tensor_amax_to_scale

    x = torch.randn(args.rows, args.cols, generator=torch.Generator().manual_seed(0)) * 0.02
    n = x.numel()
    s = per_tensor_amax_to_scale(x.abs().max())

    def packed(recipe):
        q = quantize(x, recipe)
        return q.scales, pack_nibbles(q.codes)

    cases = {
        "MXFP4 (E8M0, k=32, floor)": (lambda: packed(get_recipe("mxfp4")),
                                      lambda: to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)),
        "NVFP4 (UE4M3, k=16, per-tensor scale)": (lambda: packed(get_recipe("nvfp4")),
                                                  lambda: nvfp4_quantize(x, 16, s)),
        "FP4 + UE5M3 (k=16, no global scale)": (lambda: packed(get_recipe("fp4-ue5m3")), None),
    }
    # the outputs agree bit for bit (the tests check this on adversarial inputs too)
    q, (ts, td) = quantize(x, get_recipe("mxfp4")), to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR)
    same_mx = torch.equal(q.scales, ts.view(torch.uint8)) and torch.equal(pack_nibbles(q.codes), td.view(torch.uint8))
    q, (ts, td) = quantize(x, get_recipe("nvfp4")), nvfp4_quantize(x, 16, s)
    same_nv = torch.equal(q.scales, ts.view(torch.uint8)) and torch.equal(pack_nibbles(q.codes), td)

    default_threads = torch.get_num_threads()
    rows = []
    for threads in sorted({1, default_threads}):
        with limit_threads(threads):
            block.QUANT_NUM_THREADS = None  # both libraries run on the same thread count here
            for name, (ours, theirs) in cases.items():
                t_ours = best_time(ours, args.repeats)[0]
                t_theirs = best_time(theirs, args.repeats)[0] if theirs else None
                rows.append((threads, name, n / t_ours, n / t_theirs if t_theirs else None))
                print(rows[-1])

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "# Benchmark: block-quantization throughput, rankwise.quant vs torchao (emulated, CPU)", "",
        f"Input: {args.rows} x {args.cols} fp32 Gaussian (sigma 0.02), {n / 1e6:.1f}M elements; best of {args.repeats}. "
        f"Quantize = block scales + FP4 codes packed two per byte. torch {torch.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs, 1-minute load average {load:.1f} at the end of the run "
        "(the machine is shared: a load above the core count inflates every time, and the ratio is the number to read).", "",
        f"Outputs bit-identical to torchao: MXFP4 {same_mx}, NVFP4 {same_nv}.", "",
        "| threads | recipe | rankwise (M elem/s) | torchao (M elem/s) | rankwise / torchao |", "|---|---|---|---|---|",
    ]
    for threads, name, ours, theirs in rows:
        ratio = f"{ours / theirs:.2f}x" if theirs else "n/a (torchao has no UE5M3)"
        lines.append(f"| {threads} | {name} | {ours / 1e6:.1f} | {'' if theirs is None else f'{theirs / 1e6:.1f}'} | {ratio} |")
    ratios = [o / t for _, _, o, t in rows if t]
    lines += ["", f"Geometric-mean ratio over the comparable rows: {statistics.geometric_mean(ratios):.2f}x.", "",
              "rankwise rounds FP4 by counting comparisons against the 7 midpoints (uint8 arithmetic) and 8-bit scales "
              "by exact frexp arithmetic; torchao uses fp32 bit manipulation. By default rankwise runs this work on one "
              "thread (`rankwise.quant.block.QUANT_NUM_THREADS`), which on this shared machine is the faster choice; "
              "here both libraries run on the thread count in the first column."]
    write_benchmark(args.out, lines, smoke=args.smoke)


if __name__ == "__main__":
    main()
