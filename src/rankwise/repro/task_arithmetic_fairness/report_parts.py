"""The tables and the figure of the task-arithmetic-fairness report (descriptive: no claim reads them)."""

from __future__ import annotations

import statistics as st

from rankwise.core.report import Report
from rankwise.repro.task_arithmetic_fairness.arms import Split
from rankwise.repro.task_arithmetic_fairness.seed_run import SeedResult, slope


def _ms(xs, scale: float = 100.0) -> str:
    xs = [scale * float(x) for x in xs]
    return f"{st.fmean(xs):.2f} ± {st.pstdev(xs):.2f}"


def tables(report: Report, results: list[SeedResult], split: Split, lam_grid, inject_grid, lrs: dict[str, float]) -> None:
    arms = list(results[0].test)
    lr_of = {"FFT": lrs["fft"], "LoRA": lrs["lora"], "task addition": lrs["ta"], "scaled FFT vector": lrs["fft"]}
    t = report.table("Arms on the test split (mean ± sd over seeds, points): accuracy, worst-group accuracy, DPD and EOD "
                     "(max - min over the groups), equal opportunity (TPR gap), macro and worst one-vs-rest gaps",
                     ["arm", "lr", "lambda (mean)", "val acc", "test acc", "worst-group acc", "DPD", "EOD", "EO",
                      "macro DPD", "macro EOD", "worst DPD", "worst EOD"])
    for arm in arms:
        te = [r.test[arm] for r in results]
        lam = [float(r.lam[arm].chosen) for r in results] if arm in results[0].lam else None
        t.add(arm=arm, lr=lr_of[arm], **{"lambda (mean)": f"{st.fmean(lam):.2f}" if lam else "-",
              "val acc": _ms(r.val[arm].accuracy for r in results), "test acc": _ms(m.accuracy for m in te),
              "worst-group acc": _ms(m.worst_group_accuracy for m in te), "DPD": _ms(m.dpd for m in te),
              "EOD": _ms(m.eod for m in te), "EO": _ms(m.equal_opportunity for m in te),
              "macro DPD": _ms(m.macro()[0] for m in te), "macro EOD": _ms(m.macro()[1] for m in te),
              "worst DPD": _ms(m.worst()[0] for m in te), "worst EOD": _ms(m.worst()[1] for m in te)})
    g = report.table(f"Per group (split of seed {results[0].seed} for the counts; test accuracy and selection rate "
                     "in points, mean over seeds; ||tau_g|| mean over seeds)",
                     ["group", "train rows", "test rows", "||tau_g||", *[f"acc {a}" for a in arms],
                      *[f"P(y^=1) {a}" for a in arms]])
    for k, name in enumerate(split.group_names):
        g.add(group=name, **{"train rows": int((split.train.g == k).sum()), "test rows": int((split.test.g == k).sum()),
              "||tau_g||": f"{st.fmean(r.norms[k] for r in results):.3f}",
              **{f"acc {a}": f"{100 * st.fmean(float(r.test[a].group_accuracy[k]) for r in results):.1f}" for a in arms},
              **{f"P(y^=1) {a}": f"{100 * st.fmean(float(r.test[a].selection_rate[k]) for r in results):.1f}"
                 for a in arms}})
    s = report.table("Task addition's lambda sweep on the test split at its tuned lr (mean over seeds, points; the sum "
                     "parametrisation theta_0 + lambda sum_g tau_g, G = 6)", ["lambda", "accuracy", "DPD", "EOD"])
    for lam in lam_grid:
        s.add(**{"lambda": lam, "accuracy": _ms(r.sweep_test[lam].accuracy for r in results),
                 "DPD": _ms(r.sweep_test[lam].dpd for r in results), "EOD": _ms(r.sweep_test[lam].eod for r in results)})
    names = split.group_names
    worst = [names[r.worst] for r in results]
    w = report.table("Worst-group injection theta_FFT + lambda tau_worst on the test split (worst group under FFT on "
                     f"validation by mean one-vs-rest DPD and EOD, 'Other' excluded; chosen: "
                     f"{ {n: worst.count(n) for n in sorted(set(worst))} })", ["lambda", "accuracy", "DPD", "EOD"])
    for i, lam in enumerate(inject_grid):
        w.add(**{"lambda": lam, "accuracy": _ms(r.worst_curve[i].accuracy for r in results),
                 "DPD": _ms(r.worst_curve[i].dpd for r in results), "EOD": _ms(r.worst_curve[i].eod for r in results)})
    j = report.table("Single-group injection into FFT: |slope| of test DPD in lambda (points per unit lambda, mean over "
                     "seeds) for tau_g and for a random direction of the same per-tensor norms",
                     ["group", "||tau_g||", "|slope| tau_g", "|slope| random"])
    for k, name in enumerate(names):
        j.add(group=name, **{"||tau_g||": f"{st.fmean(r.norms[k] for r in results):.3f}",
              "|slope| tau_g": f"{100 * st.fmean(abs(slope(inject_grid, r.inject_dpd[k])) for r in results):.2f}",
              "|slope| random": f"{100 * st.fmean(abs(slope(inject_grid, r.random_dpd[k])) for r in results):.2f}"})


def plot(results: list[SeedResult], inject_grid, arms):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    lams = sorted(results[0].sweep_test)
    for ax, metric, title in ((axes[0], "accuracy", "test accuracy"), (axes[1], "dpd", "test DPD")):
        ax.plot(lams, [100 * st.fmean(getattr(r.sweep_test[lam], metric) for r in results) for lam in lams],
                marker="o", ms=3, label="task addition (sweep)")
        if metric == "dpd":
            ax.plot(lams, [100 * st.fmean(r.sweep_test[lam].eod for r in results) for lam in lams], marker="s", ms=3,
                    label="task addition EOD (sweep)")
        for arm, style in zip(arms, ("--", ":", "-.", "-")):
            if arm != "task addition":
                ax.axhline(100 * st.fmean(getattr(r.test[arm], metric) for r in results), ls=style, color="gray",
                           label=arm)
        ax.set_xlabel("lambda (sum of the group vectors)")
        ax.set_ylabel("points")
        ax.set_title(f"{title} (mean over seeds)")
        ax.legend(fontsize=7)
    ax = axes[2]
    for k in range(len(results[0].norms)):
        ax.plot(inject_grid, [100 * st.fmean(r.inject_dpd[k][i] for r in results) for i in range(len(inject_grid))],
                marker="o", ms=3, label=f"group {k} (||tau|| {st.fmean(r.norms[k] for r in results):.2f})")
    ax.set_xlabel("lambda (theta_FFT + lambda tau_g)")
    ax.set_ylabel("test DPD (points)")
    ax.set_title("single-group injection into FFT")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
