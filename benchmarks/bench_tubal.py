"""Cost of the tubal toolkit on growing tensors: FFT t-product vs the direct block-circulant product, t-SVD, and one
FGD iteration.

  .venv/bin/python benchmarks/bench_tubal.py [--sizes 16 32 64 128] [--tubes 4 8 16 32] [--repeats 3] [--smoke]

t-product of A [n, n, k] and B [n, n, k]: rankwise's FFT form (k slice products + 2 FFTs, O(n^3 k + n^2 k log k))
against bcirc(A) @ unfold(B) (one (nk) x (nk) by (nk) x n product, O(n^3 k^2)); t-SVD (k/2 + 1 slice SVDs); one
FGD iteration for n x n x 3 tensors with m = 5 n r k Gaussian measurements (dominated by the two products with the
m x n^2 k measurement matrix, O(m n^2 k)). Fitted exponents of time against the growing size; ratios. One thread
(--threads). Writes docs/results/tubal-rank-recovery/benchmark.md and benchmark.png (or --out; --smoke: small
tensors, a temporary folder).
"""

from __future__ import annotations

import os
import platform

import torch

from rankwise.algorithms.tubal import (
    GaussianMeasurements, block_circulant, factorized_gd, fold_slices, low_tubal_rank_psd, small_init, t_product,
    t_svd, unfold_slices,
)
from rankwise.core.threads import limit_threads
from common import benchmark_parser, parse_benchmark_args, threads_label
from output import png_bytes, pyplot, write_benchmark
from timing import best_time, loglog_slope


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__, "tubal-rank-recovery")
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--tubes", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--fgd-sizes", type=int, nargs="+", default=[10, 20, 30, 40])
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_benchmark_args(parser, argv, {"sizes": [4, 8], "tubes": [2, 4], "fgd_sizes": [4, 6], "repeats": 1})
    with limit_threads(args.threads):
        run(args)


def run(args) -> None:
    gen = torch.Generator().manual_seed(0)
    rows: dict[str, list[tuple[int, float, float | None]]] = {}

    def product_case(n, k):
        a = torch.randn(n, n, k, generator=gen, dtype=torch.float64)
        b = torch.randn(n, n, k, generator=gen, dtype=torch.float64)
        ours = best_time(lambda: t_product(a, b), args.repeats)[0]
        direct = best_time(lambda: fold_slices(block_circulant(a) @ unfold_slices(b), k), args.repeats)[0]
        err = float((t_product(a, b) - fold_slices(block_circulant(a) @ unfold_slices(b), k)).abs().max())
        return ours, direct, err, best_time(lambda: t_svd(a), args.repeats)[0]

    for name, points in (("n (k = 8)", [(n, 8) for n in args.sizes]), ("k (n = 32)", [(32, k) for k in args.tubes])):
        for label in ("t-product FFT", "t-product bcirc", "t-SVD"):
            rows[f"{label} vs {name}"] = []
        for n, k in points:
            ours, direct, err, svd = product_case(n, k)
            size = n if name.startswith("n") else k
            rows[f"t-product FFT vs {name}"].append((size, ours, err))
            rows[f"t-product bcirc vs {name}"].append((size, direct, None))
            rows[f"t-SVD vs {name}"].append((size, svd, None))
            print(name, size, f"fft {ours * 1e3:.3f} ms, bcirc {direct * 1e3:.3f} ms, tsvd {svd * 1e3:.3f} ms", flush=True)

    rows["FGD iteration vs n (k = 3, r = 3, R = n, m = 5nrk)"] = []
    for n in args.fgd_sizes:
        x = low_tubal_rank_psd(n, 3, 3, seed=0)
        ops = GaussianMeasurements.draw(5 * n * 3 * 3, (n, n, 3), seed=1)
        y = ops(x)
        u0 = small_init(n, n, 3, 1e-3, seed=0)
        sec = best_time(lambda: factorized_gd(ops, y, u0, step=0.1, iterations=20, desc=""), 1)[0] / 21
        rows["FGD iteration vs n (k = 3, r = 3, R = n, m = 5nrk)"].append((n, sec, None))
        print("fgd", n, f"{sec * 1e3:.3f} ms/iter", flush=True)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [f"# Benchmark: tubal toolkit cost on growing tensors (CPU, float64, {threads_label()})", "",
             f"Best of {args.repeats}; torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs, "
             f"1-minute load average {load:.1f} at the end (the machine is shared: ratios are the numbers to read).",
             "", "| what | sizes | ms | fitted exponent | max abs difference FFT vs bcirc |", "|---|---|---|---|---|"]
    for what, pts in rows.items():
        sizes, secs = [p[0] for p in pts], [p[1] for p in pts]
        errs = [p[2] for p in pts if p[2] is not None]
        lines.append(f"| {what} | {' '.join(map(str, sizes))} | {' '.join(f'{s * 1e3:.3g}' for s in secs)} | "
                     f"{loglog_slope(sizes, secs):.2f} | {max(errs):.1e} |" if errs else
                     f"| {what} | {' '.join(map(str, sizes))} | {' '.join(f'{s * 1e3:.3g}' for s in secs)} | "
                     f"{loglog_slope(sizes, secs):.2f} | |")
    lines.append("")
    for name in ("n (k = 8)", "k (n = 32)"):
        ratio = [d[1] / f[1] for f, d in zip(rows[f"t-product FFT vs {name}"], rows[f"t-product bcirc vs {name}"])]
        lines.append(f"- block-circulant / FFT time against {name}: " + ", ".join(f"{r:.2f}x" for r in ratio))
    lines += ["", "The FFT form's cost grows like k (times log k for the transforms); the block-circulant product like "
              "k^2, so the gap widens with the tube length. One FGD iteration is dominated by the measurement "
              "products (m n^2 k = 135 n^3 here: exponent ~3; below 3 at these small sizes)."]
    write_benchmark(args.out, lines, plot(rows), smoke=args.smoke)


def plot(rows) -> bytes:
    plt = pyplot()

    groups = {"n (k = 8)": [], "k (n = 32)": [], "FGD": []}
    for what, pts in rows.items():
        key = "FGD" if what.startswith("FGD") else ("n (k = 8)" if what.endswith("n (k = 8)") else "k (n = 32)")
        groups[key].append((what, pts))
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for ax, (key, series) in zip(axes, groups.items()):
        for what, pts in series:
            ax.loglog([p[0] for p in pts], [p[1] * 1e3 for p in pts], marker="o", label=what.split(" vs ")[0])
        ax.set_xlabel(key)
        ax.set_ylabel("ms")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)


if __name__ == "__main__":
    main()
