"""The reproduction's figure: held-out worst-task score per arm (seeds as dots) and the clean calibration scan
statistics against the threshold."""

from __future__ import annotations

import statistics as stats


def plot(worst: dict[str, list[float]], calibration, threshold: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    names = list(worst)
    ax1.bar(range(len(names)), [stats.mean(worst[n]) for n in names], color="#8fb3d9")
    for i, n in enumerate(names):
        ax1.plot([i] * len(worst[n]), worst[n], "k.", ms=6)
    ax1.set_xticks(range(len(names)), names, fontsize=7, rotation=20)
    ax1.set_ylabel("worst-task normalised score (points)")
    ax1.set_title("held-out, each arm at its validation-chosen lr")
    for sc in calibration:
        ax2.hist(sc.scores.numpy(), bins=20, alpha=0.4)
    ax2.set_xlabel("mean KL shift of an insertion (nats), clean calibration adapters")
    ax2.set_title(f"scan threshold (robust z) = {threshold:.1f}", fontsize=9)
    fig.tight_layout()
    return fig
