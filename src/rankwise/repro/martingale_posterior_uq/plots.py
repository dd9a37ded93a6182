"""Plots of the martingale-posterior-uq reproductions: coverage against n with Wilson 95% bars, per panel."""

from __future__ import annotations

import numpy as np

from rankwise.repro.martingale_posterior_uq.coverage import LEVEL, METHODS, NResult, wilson

COLORS = {"MP forward": "tab:green", "DWS dp_mean": "tab:blue", "DWS single": "tab:cyan",
          "DWS dp_mean, alpha from the n": "tab:purple", "bootstrap": "tab:red", "Bayesian bootstrap": "tab:orange",
          "jackknife": "tab:brown"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_coverage(panels: dict[str, dict[int, NResult]], target: str, title: str):
    """One panel per study; lines: methods; y: coverage of `target` ("pred" or "true")."""
    plt = _pyplot()
    cols = min(2, len(panels))
    rows = int(np.ceil(len(panels) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, (name, results) in zip(axes.flat, panels.items()):
        for m in METHODS:
            pts = [(n, *wilson(getattr(r, target)[m])) for n, r in results.items() if m in getattr(r, target)]
            if not pts:
                continue
            ns, p, lo, hi = (np.array(v) for v in zip(*pts))
            ax.errorbar(ns, p, yerr=[p - lo, hi - p], marker="o", ms=3, capsize=2, lw=1, color=COLORS[m], label=m)
        ax.axhline(LEVEL, color="k", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_xticks(list(results), [str(n) for n in results])
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("n observed scores")
        ax.set_ylabel("coverage")
        ax.set_title(name, fontsize=9)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
