"""Plots of the loss-curve-collapse experiments: raw and normalised curves, LR transfer, fault residuals, early
stopping."""

from __future__ import annotations

import numpy as np

from rankwise.recipes.loss_curve_collapse import fit_divisor, residual
from rankwise.repro.loss_curve_collapse import analysis as A

COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_raw(fam, seed_index: int):
    """Raw per-step training loss against tokens, one panel per family, one line per width (one seed)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(fam), figsize=(4.2 * len(fam), 3.6), sharey=True)
    for ax, (name, per_seed) in zip(np.atleast_1d(axes), fam.items()):
        for k, r in enumerate(per_seed[seed_index]):
            ax.plot(r.curve.t_hat * r.steps, r.curve.loss, lw=0.6,
                    color=COLORS[k % len(COLORS)], label=f"d={r.spec.width}, TPP {r.spec.tpp:g}")
        ax.set_xscale("log")
        ax.set_xlabel("step")
        ax.set_title(f"raw: {name}")
        ax.legend(fontsize=7)
    np.atleast_1d(axes)[0].set_ylabel("training loss (nats/byte)")
    fig.tight_layout()
    return fig


def plot_normalised(fam, window: float, lo: float):
    """Smoothed normalised curves l(t_hat) = L / L(T), every seed, one panel per family."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(fam), figsize=(4.2 * len(fam), 3.6), sharey=True)
    for ax, (name, per_seed) in zip(np.atleast_1d(axes), fam.items()):
        for runs in per_seed:
            for k, r in enumerate(runs):
                c = A.normalised(r, window)
                ax.plot(c.t_hat, c.loss, lw=0.8, alpha=0.7, color=COLORS[k % len(COLORS)],
                        label=f"d={r.spec.width}, TPP {r.spec.tpp:g}" if runs is per_seed[0] else None)
        ax.axvline(lo, color="k", lw=0.5, ls=":")
        ax.set_ylim(0.98, 1.25)
        ax.set_xlabel("t_hat (fraction of training tokens)")
        ax.set_title(f"normalised: {name}")
        ax.legend(fontsize=7)
    np.atleast_1d(axes)[0].set_ylabel("l(t_hat) = L / L(T)")
    fig.tight_layout()
    return fig


def plot_residuals(ref, band, clean, faulty, window: float, fit, fault_at: float):
    """rho(t_hat) of the clean and faulted large runs against the declared band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    groups = [("clean", clean, "tab:gray")] + [(f, rs, c) for (f, rs), c in zip(faulty.items(), ("tab:red", "tab:blue"))]
    for name, rs, color in groups:
        for j, r in enumerate(rs):
            sm = A.smoothed(r, window)
            rho = residual(sm, ref, fit_divisor(sm, ref, upto=fit[1], start=fit[0]))
            ax.plot(rho.t_hat, rho.loss, color=color, lw=0.8, alpha=0.8, label=name if j == 0 else None)
    ax.axhspan(-band, band, color="tab:green", alpha=0.15, label="band")
    ax.axvline(fault_at, color="k", lw=0.6, ls="--")
    ax.axvspan(*fit, color="tab:olive", alpha=0.08, label="divisor fit")
    ax.set_ylim(-6 * band, 6 * band)
    ax.set_xlabel("t_hat")
    ax.set_ylabel("rho = L / c_hat - l_ref")
    ax.set_title("Deviation from collapse, largest width")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_early(early, lr_grid):
    """Predicted (from the prefix) against true final loss of every sweep run, per arm."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    for (arm, es), color in zip(early.items(), ("tab:green", "tab:red")):
        for j, e in enumerate(es):
            ax.scatter(e.true, e.predicted, color=color, s=14, alpha=0.8, label=f"{arm} fixed" if j == 0 else None)
    lo = min(min(min(e.true), min(e.predicted)) for es in early.values() for e in es)
    hi = max(max(max(e.true), max(e.predicted)) for es in early.values() for e in es)
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.6)
    ax.set_xlabel("true final training loss")
    ax.set_ylabel("predicted from the prefix")
    ax.set_title(f"Early stopping over {len(lr_grid)} LRs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_lr_transfer(selections, widths):
    """Mean held-out eval loss against the peak LR at each swept width (muP transfer: the minima should line up)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.8))
    for k, (sel, width) in enumerate(zip(selections, widths)):
        color = COLORS[k % len(COLORS)]
        ax.plot(sel.grid, sel.scores, marker="o", color=color, label=f"d={width}")
        ax.scatter([sel.chosen], [sel.chosen_score], s=80, facecolors="none", edgecolors=color)
    ax.set_xscale("log")
    ax.set_xlabel("peak base LR (hidden matrices x 32/d)")
    ax.set_ylabel("held-out eval loss (mean over seeds)")
    ax.set_title("LR transfer across widths, tau fixed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
