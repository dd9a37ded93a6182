"""CodeQuant's LUT matmul on the CPU against fp32 F.linear and torch's int4 weight-only kernel (torchao's CPU path),
at MoE expert shapes and decode batches, 1 and 2 threads, as ratios to fp32; plus the weight bytes of each format.

  .venv/bin/python benchmarks/bench_codequant.py [--shapes ...] [--batches 1 4 16] [--thread-counts 1 2]
                                                 [--groups row 128] [--rounds 30] [--smoke | --quick]

Peers, same random layer per shape (timings do not depend on the values):
  fp32      F.linear(x, W), W fp32 [out, in]
  int4      torch.ops.aten._weight_int4pack_mm_for_cpu, the kernel torchao's Int4WeightOnlyConfig uses on the CPU
            (Int4CPULayout): asymmetric int4, group 128, bf16 activations and scales (its fast path; with fp32
            activations it is ~30x slower here)
  LUT       rankwise.compress.codequant.lut.lut_matmul: 4-bit codes into 16 fp32 centroids per (row, group),
            activations quantized per token to 4 bits inside the call (the layer's whole cost); on an AVX-512 CPU
            also its AVX2 path forced, the one CPUs without AVX-512 take
  reference lut_matmul_reference, the pure-torch float64 definition (timed once per case: it is slow by design)
Times are medians of interleaved rounds (each round calls every peer), per call. Writes docs/results/codequant/
benchmark.md (or --out; --smoke / --quick: the Qwen3 expert shapes, batches 1 and 4, a few rounds, a temporary folder).
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

from rankwise.compress.codequant import lut
from rankwise.core.threads import limit_threads
from common import benchmark_parser, parse_benchmark_args
from output import write_benchmark
from timing import best_time, interleaved_times

# name: (in, out) of one expert linear, torch's [out, in] layout
SHAPES = {
    "qwen3-30b-a3b gate/up": (2048, 768),
    "qwen3-30b-a3b down": (768, 2048),
    "deepseek-v2-lite gate/up": (2048, 1408),
    "mixtral-8x7b gate/up": (4096, 14336),
}
INT4_GROUP, INT4_INNER_K_TILES = 128, 8  # torchao's defaults for Int4CPULayout
MIN_CALL_S = 2e-3  # repeat a fast call inside one timed sample so a sample lasts at least this long


def main(argv: list[str] | None = None) -> None:
    argv = ["--smoke" if a == "--quick" else a for a in (sys.argv[1:] if argv is None else argv)]
    parser = benchmark_parser(__doc__, "codequant", threads=None)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), metavar="SHAPE",
                        help=f"expert linears to time, of {list(SHAPES)} (default: all)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16], help="tokens per call (default: %(default)s)")
    parser.add_argument("--thread-counts", type=int, nargs="+", default=[1, 2],
                        help="torch intra-op thread counts to compare (default: %(default)s; --threads N: only N)")
    parser.add_argument("--groups", nargs="+", default=["row", "128"],
                        help="LUT centroid group sizes G: 'row' (G = in, the paper's embedding-wise) or an integer "
                             "(default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds (default: %(default)s)")
    args = parse_benchmark_args(parser, argv, {"shapes": list(SHAPES)[:2], "batches": [1, 4], "rounds": 5})
    if args.threads is not None:
        args.thread_counts = [args.threads]
    run(args)


def make_layer(in_f: int, out_f: int, groups: list[str], seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_f, in_f, generator=g) * in_f**-0.5
    layer = {"fp32": w}
    codes = torch.randint(0, 16, (out_f, in_f), generator=g, dtype=torch.uint8)
    packed = lut.pack_codes(codes)
    for name in groups:
        size = in_f if name == "row" else int(name)
        if in_f % size:
            continue  # e.g. G = 1024 on a 768-wide input: not this shape's
        layer[f"LUT G={name}"] = (packed, torch.randn(out_f, in_f // size, 16, generator=g) * in_f**-0.5)
    layer["int4"] = int4_weight(w)
    return layer


def int4_weight(w: torch.Tensor) -> tuple | str:
    """(packed int4, bf16 scales and zeros [in / 128, out, 2]) for _weight_int4pack_mm_for_cpu, or why it cannot."""
    try:
        out_f, in_f = w.shape
        wg = w.view(out_f, in_f // INT4_GROUP, INT4_GROUP)
        lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp_min(1e-6)
        q = torch.clamp(torch.round((wg - lo) / scale), 0, 15).to(torch.int32).view(out_f, in_f)
        zero = lo + 8 * scale  # the kernel's convention: w = (q - 8) * scale + zero
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INT4_INNER_K_TILES)
        sz = torch.stack([scale.squeeze(-1).t(), zero.squeeze(-1).t()], -1).contiguous().to(torch.bfloat16)
        torch.ops.aten._weight_int4pack_mm_for_cpu(torch.zeros(1, in_f, dtype=torch.bfloat16), packed, INT4_GROUP, sz)
        return packed, sz
    except Exception as exc:  # an op missing from this torch build: say why in the report
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"


def weight_bytes(layer: dict, name: str) -> int:
    if name == "fp32":
        return layer["fp32"].numel() * 4
    value = layer[name]
    return sum(t.numel() * t.element_size() for t in value) if isinstance(value, tuple) else 0


def calls(layer: dict, x: torch.Tensor) -> dict:
    """name -> a no-argument function running that peer once on the batch x [B, in]."""
    fns = {"fp32": lambda: F.linear(x, layer["fp32"])}
    if isinstance(layer["int4"], tuple):
        packed4, sz = layer["int4"]
        xb = x.to(torch.bfloat16)  # a bf16 model's activations: the conversion is not the kernel's cost
        fns["int4"] = lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed4, INT4_GROUP, sz)
    for name, value in layer.items():
        if name.startswith("LUT"):
            fns[name] = (lambda p, c: lambda: lut.lut_matmul(x, p, c))(*value)
    first = next((n for n in layer if n.startswith("LUT")), None)
    if first and lut.kernel_available() and "avx512" in lut.kernel_status() and lut._supports("avx2"):
        # the path CPUs without AVX-512 take (most AMD before Zen 4, Intel client parts)
        fns[f"{first} avx2"] = (lambda p, c: lambda: lut.lut_matmul(x, p, c, impl="avx2"))(*layer[first])
    return fns


def repeated(fn, seconds: float):
    """fn repeated k times (k from one timed call) so a sample lasts ~`seconds`; returns (wrapped fn, k)."""
    fn()
    t0 = time.perf_counter()
    fn()
    k = max(1, math.ceil(seconds / max(time.perf_counter() - t0, 1e-7)))
    return (lambda: [fn() for _ in range(k)]), k


def run(args) -> None:
    status = lut.kernel_status()  # compiles the kernel on first use (tens of seconds), outside every timing
    print(status)
    rows, notes, bytes_rows = [], [], []
    for shape in args.shapes:
        in_f, out_f = SHAPES[shape]
        layer = make_layer(in_f, out_f, args.groups)
        if isinstance(layer["int4"], str):
            notes.append(f"int4 peer unavailable on {shape}: {layer['int4']}")
        lut_names = [n for n in layer if n.startswith("LUT")]
        bytes_rows.append((shape, in_f, out_f, {n: weight_bytes(layer, n) for n in ["fp32", "int4", *lut_names]}))
        for threads in args.thread_counts:
            with limit_threads(threads):
                for batch in args.batches:
                    x = torch.randn(batch, in_f, generator=torch.Generator().manual_seed(batch))
                    fns, per = {}, {}
                    for name, fn in calls(layer, x).items():
                        fns[name], per[name] = repeated(fn, MIN_CALL_S)
                    times = interleaved_times(fns, args.rounds)
                    med = {n: times.median(n) / per[n] for n in fns}
                    packed, cent = layer[lut_names[0]]
                    med["reference"], ref = best_time(lambda: lut.lut_matmul_reference(x, packed, cent), 1)
                    err = (lut.lut_matmul(x, packed, cent) - ref).abs().max().item() / ref.abs().max().item()
                    rows.append((shape, batch, threads, med, err))
                    print(shape, f"B={batch}", f"{threads}t", {n: f"{t * 1e3:.3f} ms" for n, t in med.items()})
    write_benchmark(args.out, report(args, status, rows, bytes_rows, notes), smoke=args.smoke)


def report(args, status: str, rows: list, bytes_rows: list, notes: list) -> list[str]:
    names = [n for n in rows[0][3] if n != "fp32"] if rows else []
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "# Benchmark: CodeQuant LUT matmul vs fp32 F.linear and int4 weight-only (CPU, MoE expert shapes)", "",
        f"Kernel: {status}. torch {torch.__version__}, {platform.machine()} {platform.processor() or ''}, "
        f"{os.cpu_count()} CPUs, 1-minute load average {load:.1f} at the end of the run (a shared machine inflates "
        "every time alike; read the ratios). Median of "
        f"{args.rounds} interleaved rounds per call; the reference is timed once.", "",
        "Ratios are fp32 time / peer time: above 1 is faster than fp32. LUT includes the per-token 4-bit activation "
        "quantization; int4 runs on bf16 activations (its fast path); the last column is the LUT (first group "
        "setting) vs the float64 reference, max |diff| / max |y|.", "",
        "| shape (in -> out) | batch | threads | fp32 ms | " + " | ".join(f"{n} ms (x fp32)" for n in names)
        + " | LUT vs reference |",
        "|---|---|---|---|" + "---|" * len(names) + "---|",
    ]
    for shape, batch, threads, med, err in rows:
        in_f, out_f = SHAPES[shape]
        cells = [f"{med[n] * 1e3:.3f} ({med['fp32'] / med[n]:.2f}x)" if n in med else "n/a" for n in names]
        lines.append(f"| {shape} ({in_f} -> {out_f}) | {batch} | {threads} | {med['fp32'] * 1e3:.3f} | "
                     + " | ".join(cells) + f" | {err:.1e} |")
    lines += ["", "Weight bytes (fp32 / format: how many times smaller than fp32):", "",
              "| shape | fp32 MB | int4 + bf16 scales MB | LUT codes + fp32 centroids MB |", "|---|---|---|---|"]
    for shape, in_f, out_f, sizes in bytes_rows:
        fp32 = sizes["fp32"]
        luts = ", ".join(f"{n[4:]}: {b / 1e6:.2f} ({fp32 / b:.2f}x)" for n, b in sizes.items() if n.startswith("LUT"))
        int4 = f"{sizes['int4'] / 1e6:.2f} ({fp32 / sizes['int4']:.2f}x)" if sizes["int4"] else "n/a"
        lines.append(f"| {shape} ({in_f} -> {out_f}) | {fp32 / 1e6:.2f} | {int4} | {luts} |")
    lines += ["", *[f"- {n}" for n in notes]]
    return lines


if __name__ == "__main__":
    main()
