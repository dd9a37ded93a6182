"""Tables and the plot of the CAR-LoRA reproduction (descriptive: only the declared claims are evidence)."""

from __future__ import annotations

import statistics

from rankwise.core.report import Report
from rankwise.repro.portable_adapter.runs import ArmResult

Table = dict[str, list[dict[str, float]]]  # arm -> per seed -> operator -> test NLL


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def add_tables(report: Report, results: dict[str, ArmResult], nll: Table, drift_nll: Table, zero: dict[str, float],
               zero_drift: dict[str, float], all_ops: list[str], train_ops: tuple[str, ...], drift_ops: tuple[str, ...]) -> None:
    fp, fp_long, car = "FP LoRA", "FP LoRA (long)", "CAR-LoRA"
    t1 = report.table("Test NLL (nats/token, mean over seeds) of each adapter on each compressed base C(θ₀); "
                      "held-out operators marked *", ["base", "no adapter", "FP LoRA", "FP LoRA (long)", "per-operator",
                                                      "CAR-LoRA", "CAR - per-operator", "FP (long) - CAR"])
    for op in all_ops:
        per = f"per-operator {op}"
        po = _mean([d[op] for d in nll[per]]) if per in nll else float("nan")
        c, f, fl = (_mean([d[op] for d in nll[a]]) for a in (car, fp, fp_long))
        label = op if op in train_ops or op == "identity" else f"{op}*"
        t1.add(**{"base": label, "no adapter": zero[op], "FP LoRA": f, "FP LoRA (long)": fl, "per-operator": po,
                  "CAR-LoRA": c, "CAR - per-operator": c - po, "FP (long) - CAR": fl - c})
    t2 = report.table("Drifted base θ₀': test NLL on C(θ₀') of the adapters trained on θ₀", ["base", "no adapter",
                      "FP LoRA", "FP LoRA (long)", "CAR-LoRA", "FP (long) - CAR", "per_seed FP (long) - CAR"])
    for op in drift_ops:
        f, fl, c = ([d[op] for d in drift_nll[a]] for a in (fp, fp_long, car))
        t2.add(**{"base": op, "no adapter": zero_drift[op], "FP LoRA": _mean(f), "FP LoRA (long)": _mean(fl),
                  "CAR-LoRA": _mean(c), "FP (long) - CAR": _mean(fl) - _mean(c),
                  "per_seed FP (long) - CAR": " ".join(f"{a - b:+.4f}" for a, b in zip(fl, c))})
    t3 = report.table("Arms: learning-rate grids (validation NLL of the arm's objective, first seed; * = chosen)",
                      ["arm", "operators", "steps", "lr", "grid", "micro-batches per operator (first seed)"])
    for name, a in results.items():
        cells = [f"{lr:.3g}: {r.val_nll:.4f}{'*' if lr == a.lr else ''}" for lr, r in sorted(a.tuning.items())]
        counts = ", ".join(f"{k} {v}" for k, v in a.seed_runs[0].counts.items())
        t3.add(arm=name, operators=", ".join(a.spec.operators), steps=a.spec.steps, lr=a.lr, grid="; ".join(cells),
               **{"micro-batches per operator (first seed)": counts})
    t4 = report.table("Per-operator adapters on the uncompressed base θ₀ (what specialising costs there)",
                      ["arm", "NLL on θ₀", "NLL on its own operator"])
    for name, per_seed in nll.items():
        if name.startswith("per-operator"):
            op = name.split()[-1]
            t4.add(arm=name, **{"NLL on θ₀": _mean([d["identity"] for d in per_seed]),
                                "NLL on its own operator": _mean([d[op] for d in per_seed])})


def plot(nll: Table, drift_nll: Table, zero: dict[str, float], all_ops: list[str], drift_ops: tuple[str, ...],
         arms: tuple[str, ...]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    width = 0.8 / (len(arms) + 1)
    for ax, table, ops, title in ((axes[0], nll, all_ops, "compressed bases C(θ₀)"),
                                  (axes[1], drift_nll, list(drift_ops), "drifted bases C(θ₀')")):
        xs = range(len(ops))
        for k, arm in enumerate(arms):
            ax.bar([x + (k - len(arms) / 2) * width for x in xs], [_mean([d[o] for d in table[arm]]) for o in ops], width,
                   label=arm)
        if table is nll:
            per = [_mean([d[o] for d in nll[f"per-operator {o}"]]) if f"per-operator {o}" in nll else float("nan") for o in ops]
            ax.scatter([x + (len(arms) / 2) * width for x in xs], per, color="k", marker="_", s=200, label="per-operator")
            ax.plot(list(xs), [zero[o] for o in ops], "x", color="gray", label="no adapter")
        ax.set_xticks(list(xs), ops, rotation=30, fontsize=8)
        ax.set_ylabel("test NLL (nats/token)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
