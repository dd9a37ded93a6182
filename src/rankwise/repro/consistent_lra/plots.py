"""Plots of the consistent-lra reproduction: recourse against t, and the promise against t."""

from __future__ import annotations

import numpy as np

from rankwise.repro.consistent_lra.runs import A, ALGORITHMS, B, B_SPARSE, D, FD, SVD

COLORS = {A: "tab:green", B: "tab:olive", B_SPARSE: "tab:purple", D: "tab:blue", SVD: "tab:red", FD: "tab:orange"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _thin(y: np.ndarray, points: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    t = np.unique(np.round(np.geomspace(1, y.size, points)).astype(np.int64))
    return t, y[t - 1]


def plot_recourse(runs: dict, eps: float):
    plt = _pyplot()
    fig, axes = plt.subplots(2, len(runs), figsize=(5 * len(runs), 7.2), squeeze=False)
    # top row: the squared recourse; bottom row: the number of steps at which the subspace moved
    for col, (stream, per_stream) in enumerate(runs.items()):
        first = per_stream[0]
        for row, (attr, label) in enumerate((("recourse", "sum ||P_t - P_{t-1}||_F^2"), ("changes", "subspace changes"))):
            ax = axes[row, col]
            for alg in ALGORITHMS:
                t, y = _thin(getattr(first[alg], attr).astype(np.float64))
                keep = y > 0
                ax.loglog(t[keep], y[keep], color=COLORS[alg], label=alg)
            ax.set_title(f"{stream}: cumulative {label.split()[-1]} (first seed)")
            ax.set_xlabel("rows t")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"Recourse against stream length (eps = {eps})")
    fig.tight_layout()
    return fig


def plot_guarantees(runs: dict, eps: float):
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs) + 1, figsize=(4.6 * (len(runs) + 1), 3.8))
    axes = np.atleast_1d(axes)
    for ax, (stream, per_stream) in zip(axes, runs.items()):
        first = per_stream[0]
        for alg in (B, B_SPARSE, D, SVD, FD):
            t, y = _thin(first[alg].ratio_curve)
            keep = np.isfinite(y)
            ax.semilogx(t[keep], y[keep], color=COLORS[alg], label=alg, lw=1)
        ax.axhline(1 + eps, color="k", ls="--", lw=0.8, label="1 + eps")
        ax.set_title(f"{stream}: cost_t / OPT_t")
        ax.set_xlabel("rows t")
    ax = axes[-1]
    for stream, per_stream in runs.items():
        t, y = _thin(per_stream[0][A].additive_curve)
        ax.semilogx(t, y, label=f"A on {stream}", lw=1)
    ax.axhline(eps, color="k", ls="--", lw=0.8, label="eps")
    ax.set_title("A: (cost_t - OPT_t) / ||A^(t)||_F^2")
    ax.set_xlabel("rows t")
    axes[0].legend(fontsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
