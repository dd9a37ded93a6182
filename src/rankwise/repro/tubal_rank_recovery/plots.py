"""Plots of the tubal-rank-recovery reproduction."""

from __future__ import annotations

import numpy as np

COLORS = {"small": "tab:green", "spectral": "tab:red"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_error_vs_rank(ranks, per_seed: dict):
    """Early-stopping RSE against R, mean and per-seed values, one line per initialisation."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4))
    for init, values in per_seed.items():
        v = np.asarray(values)  # [seeds, len(ranks)]
        for row in v:
            ax.plot(ranks, row, color=COLORS[init], alpha=0.25, lw=0.8)
        ax.plot(ranks, np.exp(np.log(v).mean(0)), color=COLORS[init], marker="o", label=f"{init} init (geo. mean)")
    ax.axhline(float(np.exp(np.log(np.asarray(per_seed["spectral"])[:, 0]).mean())), color="k", ls="--", lw=0.8,
               label="exact-rank FGD (R = r)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(list(ranks), [str(r) for r in ranks])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("over-estimated tubal rank R")
    ax.set_ylabel("RSE at the early-stopping step")
    ax.set_title("Recovery error against R")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_trajectories(trajectories: dict, r_max: int):
    """RSE_t at the largest R for each initialisation (first seed), early-stopping steps marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for init, res in trajectories.items():
        rse = res.rse.numpy()
        ax.semilogy(np.arange(rse.size), rse, color=COLORS[init], label=f"{init} init")
        es = int(res.es_step)
        ax.semilogy([es], [rse[es]], marker="v", color=COLORS[init], ms=8)
    ax.set_xlabel("iteration t")
    ax.set_ylabel("RSE_t")
    ax.set_ylim(top=10)
    ax.set_title(f"RSE along FGD at R = {r_max} (first seed; triangles: early stopping)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
