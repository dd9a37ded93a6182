"""Plots of the hybrid-online-learning reproduction."""

from __future__ import annotations

import numpy as np

COLORS = {"ftrl": "tab:blue", "ftl": "tab:red", "ftpl": "tab:orange", "ftrl-sklearn": "tab:green"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_regret_curves(horizons, regrets: dict, bounds: dict):
    """regrets[cell][arm] = [seeds, len(horizons)]; bounds[cell] = the theory curve [len(horizons)] or None."""
    plt = _pyplot()
    cells = list(regrets)
    ncol = min(3, len(cells))
    nrow = int(np.ceil(len(cells) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.6 * nrow), squeeze=False)
    T = np.asarray(horizons, dtype=float)
    for ax, cell in zip(axes.flat, cells):
        for arm, v in regrets[cell].items():
            v = np.asarray(v, dtype=float)
            for row in v:
                ax.plot(T, np.maximum(row, 0.5), color=COLORS[arm], alpha=0.2, lw=0.7)
            ax.plot(T, np.maximum(v.mean(0), 0.5), color=COLORS[arm], marker="o", ms=3, label=arm)
        if bounds.get(cell) is not None:
            ax.plot(T, bounds[cell], color="k", ls="--", lw=0.9, label="Thm 1.1 (constants 1)")
        ax.plot(T, np.sqrt(T), color="grey", ls=":", lw=0.9, label="sqrt(T)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(cell, fontsize=9)
        ax.set_xlabel("T")
        ax.set_ylabel("regret (clipped at 0.5)")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(cells):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def plot_game(ms, game: dict, eps: dict):
    """Duality gap of the averaged strategies against m, per learner, with eps(m)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.4, 4))
    m = np.asarray(ms, dtype=float)
    for name, per_m in game.items():
        v = np.asarray([per_m[k]["gap"] for k in ms]).T  # [seeds, len(ms)]
        for row in v:
            ax.plot(m, row, color=COLORS[name], alpha=0.2, lw=0.7)
        ax.plot(m, v.mean(0), color=COLORS[name], marker="o", label=f"{name} duality gap")
    ax.plot(m, [eps[k] for k in ms], color="k", ls="--", label="eps(m) = rad_m(F) + sqrt(log m / m)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("samples m")
    ax.set_ylabel("duality gap on D (vs linprog)")
    ax.set_title("Zero-sum game: thresholds vs intervals")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
