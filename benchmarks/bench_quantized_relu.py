"""Cost growth of the exact d-QNNT solvers per parameter: rankwise's layer DP against brute-force enumeration.

  .venv/bin/python benchmarks/bench_quantized_relu.py [--repeats 3] [--seed 0] [--quick] [--smoke]

For each parameter in turn (number of samples n, hidden layers, hidden width, input dimension alpha, and d), with the
others fixed, times both solvers on one planted instance per point (minimum of `--repeats` runs, DP without early
stop) and counts their operations (neuron evaluations on the distinct inputs). Fits the growth: a log-log slope
(polynomial degree) for n and depth, a per-unit factor (exponential rate) for width, alpha, d and, for brute force,
per parameter. Writes docs/results/quantized-relu-training/benchmark.md and benchmark.png (or --out; --smoke: the
quick sweeps, one run each, a temporary folder). One run, no asserts; one torch thread (--threads).
"""

from __future__ import annotations

import math
import platform

import numpy as np

from rankwise.algorithms.quantized_relu import (
    QuantizedArchitecture, brute_force, brute_force_assignments, layer_dp, planted_instance,
)
from rankwise.core.threads import limit_threads
from common import benchmark_parser, parse_benchmark_args
from output import png_bytes, pyplot, write_benchmark
from timing import best_time

BRUTE_WORK = 1 << 23  # brute force runs where d^params * distinct inputs <= this


def sweeps(quick: bool):
    n_values = (100, 1000, 10_000) if quick else (100, 1000, 10_000, 100_000, 1_000_000)
    return {
        "n (alpha 3, hidden (2,))": ("loglog", [(n, QuantizedArchitecture(3, (2,), 1, 2), n) for n in n_values]),
        "hidden layers (alpha 2, width 2)": ("loglog", [(k, QuantizedArchitecture(2, (2,) * k, 1, 2), 1000)
                                                        for k in ((1, 2, 3) if quick else (1, 2, 3, 4, 6, 8))]),
        "width (alpha 2, 1 layer)": ("exp", [(w, QuantizedArchitecture(2, (w,), 1, 2), 1000)
                                             for w in ((1, 2, 3) if quick else (1, 2, 3, 4, 5, 6, 7))]),
        "alpha (hidden (2, 2))": ("exp", [(a, QuantizedArchitecture(a, (2, 2), 1, 2), 10_000)
                                          for a in ((2, 3) if quick else (2, 3, 4, 5, 6))]),
        "d (alpha 2, hidden (2,))": ("exp", [(d, QuantizedArchitecture(2, (2,), 1, d), 1000)
                                             for d in ((2, 3) if quick else (2, 3, 4, 5))]),
    }


def fit(kind: str, xs, ys) -> float:
    xs, ys = np.asarray(xs, float), np.log(np.asarray(ys, float))
    if len(xs) < 2:
        return math.nan
    if kind == "loglog":
        return float(np.polyfit(np.log(xs), ys, 1)[0])
    return float(math.exp(np.polyfit(xs, ys, 1)[0]))


def main(argv: list[str] | None = None) -> None:
    parser = benchmark_parser(__doc__, "quantized-relu-training")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small sweeps (seconds)")
    args = parse_benchmark_args(parser, argv, {"quick": True, "repeats": 1})
    with limit_threads(args.threads):
        run(args)


def run(args) -> None:
    rng = np.random.default_rng(args.seed)
    lines = ["# Exact d-QNNT solver cost per parameter: layer DP vs brute force", "",
             f"One planted instance per point, seed {args.seed}, minimum of {args.repeats} runs; DP without early stop. "
             f"Brute force where d^params x distinct inputs <= {BRUTE_WORK:,}. {platform.processor() or platform.machine()}, "
             f"numpy {np.__version__}.", ""]
    results = {}
    for name, (kind, points) in sweeps(args.quick).items():
        rows = []
        for value, arch, n in points:
            _, x, y = planted_instance(arch, n, rng)
            t_dp, sol = best_time(lambda: layer_dp(arch, x, y, early_stop=False), args.repeats, warmup=False)
            row = {"value": value, "params": arch.n_params, "p": sol.p, "dp_s": t_dp, "dp_ops": sol.operations,
                   "states": sum(sol.stats["states_per_layer"]), "bf_s": None, "bf_ops": None}
            if brute_force_assignments(arch) * min(n, arch.d ** arch.inputs) <= BRUTE_WORK:
                t_bf, bsol = best_time(lambda: brute_force(arch, x, y), args.repeats, warmup=False)
                assert bsol.errors == sol.errors
                row["bf_s"], row["bf_ops"] = t_bf, bsol.operations
            rows.append(row)
            print(name, row, flush=True)
        results[name] = (kind, rows)
        brute = [r for r in rows if r["bf_s"] is not None and r["params"] >= 13] or [r for r in rows if r["bf_s"]]
        label = "log-log slope" if kind == "loglog" else "factor per +1"
        lines += [f"## {name}", "", "| value | params | distinct inputs | DP states | DP time (s) | DP ops | brute time (s) | brute ops |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            bf = (f"{r['bf_s']:.3g}", f"{r['bf_ops']:.3g}") if r["bf_s"] is not None else ("", "")
            lines.append(f"| {r['value']} | {r['params']} | {r['p']} | {r['states']} | {r['dp_s']:.3g} | {r['dp_ops']:.3g} "
                         f"| {bf[0]} | {bf[1]} |")
        lines += ["", f"- DP time: {label} {fit(kind, [r['value'] for r in rows], [r['dp_s'] for r in rows]):.3g}; "
                  f"DP operations: {label} {fit(kind, [r['value'] for r in rows], [r['dp_ops'] for r in rows]):.3g}"]
        if len({r['params'] for r in brute}) >= 2:
            lines.append(f"- brute force time: factor {fit('exp', [r['params'] for r in brute], [r['bf_s'] for r in brute]):.3g} "
                         "per parameter (fit over n_params >= 13 where available)")
        lines.append("")
    write_benchmark(args.out, lines, plot(results), smoke=args.smoke)


def plot(results) -> bytes:
    plt = pyplot()

    fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 3.5))
    for ax, (name, (kind, rows)) in zip(np.atleast_1d(axes), results.items()):
        xs = [r["value"] for r in rows]
        ax.plot(xs, [r["dp_s"] for r in rows], "o-", label="layer DP")
        b = [(r["value"], r["bf_s"]) for r in rows if r["bf_s"] is not None]
        if b:
            ax.plot(*zip(*b), "s--", label="brute force")
        ax.set_yscale("log")
        if kind == "loglog":
            ax.set_xscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("time (s)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return png_bytes(fig)


if __name__ == "__main__":
    main()
