"""Reproduction `escape-directions`: deep ReLU nets leave the origin saddle along a low-rank direction.

Card escape-directions.md (Bantzis, Simon, Jacot, ICLR 2026), on sklearn's digits (N = 1,797, 64 pixels scaled to
[0, 1] and centred per feature, one-hot targets Y* [10, N], MSE, G = -Y*/N), bias-free ReLU MLPs:

- E2 (training): depth 6, width 200, full-batch GD from small init (N(0, (0.1)^2 / fan_in), the card's sigma_0) and
  from PyTorch's default init (U(+-1/sqrt(fan_in))), same step rule, same seeds. Top-5 singular values of every
  layer are logged over training; at the escape (the first step whose loss is <= 0.98 C(0)) the per-layer ratios
  s1/s2 give the depth gap g = min over the deeper layers l in {4, 5, 6} of (s1/s2)(W_l) / l^(1/4).
- E1 (the optimal escape direction): projected gradient descent of L_0 on ||theta||^2 = L, depth 6, width 128,
  restarts, best speed kept; its per-layer rank-1 shares and ratios. Baselines: a random point on the sphere and the
  deep linear net's escape direction.
- E3 (the paper's Example 1): best escape speed over random restarts at widths 4, 20, 100 against sqrt(2) - 1, the
  best any all-rank-1 direction reaches.

Issue 24 added the depth trend (post hoc, after the earlier runs' tables): at the escape of small-init training, the
first layer is far less rank-1 than the deeper layers, which is the theorem's picture of a ReLU net (the first layer
may keep rank, the deeper ones collapse to rank 1). Its control is the deep linear net of the same widths, trained
from the same small init. Gradient flow keeps a linear net's layers balanced, so all of its layers share one spectrum,
and the same test must fail there. E1's two claims do not discriminate (the deep linear escape direction passes
them too): they stay as they are, reported as such.
"""

from __future__ import annotations

import math
import statistics as stats_
from dataclasses import dataclass

import numpy as np
import torch

from rankwise.algorithms.escape_directions import (
    RANK_ONE_SPEED, deep_layers, depth_gap, escape_speed, fixed_point_alignment, init_weights, layer_ratios,
    layer_shares, layer_widths, local_loss, local_loss_gradient, mse_gradient_at_zero, optimal_escape_direction,
    relu_gap, to_sphere, toy_data, toy_rank_two_escape, train_from_init,
)
from rankwise.core.discrimination import comparison, control
from rankwise.core.evidence import Claim, ClaimKind, PairedClaim, SampleClaim
from rankwise.core.progress import progress, say
from rankwise.core.report import Report
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    seeds: int
    samples: int | None  # None: all 1,797 digits
    depth: int
    train_width: int
    max_steps: int
    steps_after_escape: int
    eta: float  # relative step: each GD step moves theta by eta * ||theta||
    log_every: int
    extra_depths: tuple[int, ...]  # depths also trained from small init (table only)
    extra_depth_seeds: int
    opt_width: int
    opt_steps: int
    opt_restarts: int
    toy_widths: tuple[int, ...]
    toy_restarts: int
    toy_steps: int


SIZES = BySize(
    smoke=Settings(seeds=3, samples=200, depth=6, train_width=16, max_steps=150, steps_after_escape=10, eta=0.02,
                   log_every=5, extra_depths=(), extra_depth_seeds=0, opt_width=16, opt_steps=40, opt_restarts=1,
                   toy_widths=(4, 20), toy_restarts=2, toy_steps=60),
    full=Settings(seeds=5, samples=None, depth=6, train_width=200, max_steps=1500, steps_after_escape=300, eta=0.01,
                  log_every=10, extra_depths=(4, 8), extra_depth_seeds=3, opt_width=128, opt_steps=400,
                  opt_restarts=3, toy_widths=(4, 20, 100), toy_restarts=20, toy_steps=500),
)
SMALL_SCALE = 0.1  # the card's sigma_0 = 0.1 / sqrt(fan_in)
ESCAPE_DROP = 0.02
GAP_MARGIN = 0.5  # small init's depth gap must exceed standard init's by more than this
NEAR_RANK_ONE = 0.9
FIRST_LAYER_TREND = 0.5  # (s1/s2)(W_1) / min over deeper layers (s1/s2)(W_l) at most this: the first layer keeps rank
DEEP_LINEAR = "the deep linear net's escape direction"  # the control of the two E1 claims (the audit's)
TOY_WIDTH = 20
TOP_K = 5


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("escape-directions", "Low-rank escape directions of deep ReLU nets from the origin saddle "
                    "(small-init training, optimal escape direction, Example 1)", size, seed)
    _declare(report, s)
    x, y_star = _digits(s.samples)
    seeds = [seed + k for k in range(s.seeds)]
    _invariants(report, x, y_star, seed)
    best_speeds = _optimal(report, s, x, y_star, seeds)
    small, standard = _training(report, s, x, y_star, seeds, best_speeds)
    _extra_depths(report, s, x, y_star, seeds)
    _toy(report, s, seeds)
    report.plots["spectra_small_init"] = _plot_spectra(small[0], s.depth, "small init (0.1/sqrt(fan_in))")
    report.plots["spectra_standard_init"] = _plot_spectra(standard[0], s.depth, "PyTorch default init")
    report.plots["loss_curves"] = _plot_losses(small, standard)
    n = x.shape[1]
    report.note(f"Data: sklearn digits, N = {n}, pixels / 16 centred per feature, columns are samples; one-hot "
                f"targets; C(Y) = ||Y - Y*||^2 / (2N), C(0) = 0.5; G = -Y*/N. Networks: bias-free, ReLU on hidden "
                "layers only, weights [out, in].")
    report.note(f"E2: GD with the relative step lr_t = {s.eta} ||theta_t|| / ||grad C(theta_t)|| (uncapped; a "
                "scalar time change of gradient flow, so the path is the flow's for small eta) for both inits; "
                f"escape = first step with C <= {1 - ESCAPE_DROP} C(0); deeper layers = "
                f"{deep_layers(s.depth)} of {s.depth}. Runs stop {s.steps_after_escape} steps after the escape "
                f"(at most {s.max_steps}). Float32 training, float64 SVDs.")
    report.note(f"E1: projected GD on the sphere with normalised steps (lr 0.1 * sqrt(L), cosine decay to 1e-4) for "
                f"{s.opt_steps} steps, {s.opt_restarts} restarts per seed, float64. The card's plain step "
                "theta - 0.05 L grad L_0 barely moves from a random start on digits (|grad L_0| ~ 1e-8 there).")
    return report.finish()


def _declare(report: Report, s: Settings) -> None:
    deep = deep_layers(s.depth)
    report.declare(SampleClaim("depth_gap_at_escape", f"small-init training, depth {s.depth}: per seed, min over "
                               f"deeper layers l in {deep} of (s1/s2)(W_l) / l^(1/4) at the escape step", ">=", 1.0,
                               kind=ClaimKind.PAPER, discriminates=control("PyTorch's default init")))
    report.declare(SampleClaim("first_layer_less_rank_one", f"small-init training, depth {s.depth}: per seed, "
                               "(s1/s2)(W_1) / min over deeper layers of (s1/s2)(W_l) at the escape step (the depth "
                               "trend)", "<=", FIRST_LAYER_TREND, kind=ClaimKind.PAPER,
                               discriminates=control("the deep linear net from the same small init"),
                               testbed=f"sklearn digits, bias-free MLP depth {s.depth} width {s.train_width}",
                               post_hoc=True))
    report.declare(PairedClaim("gap_small_vs_standard_init", "per seed, the depth gap at the escape of small init "
                               "minus that of PyTorch's default init (same data, step rule, seed)", ">", GAP_MARGIN,
                               kind=ClaimKind.PAPER, discriminates=comparison("PyTorch's default init")))
    report.declare(SampleClaim("optimal_escape_near_rank_one", "optimal escape direction (E1), per seed: min over "
                               "deeper layers of the rank-1 energy share s1^2 / sum s_i^2 of W_l", ">=",
                               NEAR_RANK_ONE, kind=ClaimKind.PAPER, discriminates=control(DEEP_LINEAR)))
    report.declare(SampleClaim("optimal_escape_depth_gap", "optimal escape direction (E1), per seed: min over deeper "
                               "layers of (s1/s2)(W_l) / l^(1/4)", ">=", 1.0, kind=ClaimKind.PAPER,
                               discriminates=control(DEEP_LINEAR)))
    report.declare(SampleClaim("toy_rank_two_escape_faster", f"Example 1, width {TOY_WIDTH}: per seed, best escape "
                               "speed over restarts minus sqrt(2) - 1 (the best all-rank-1 speed)", ">", 0.0,
                               kind=ClaimKind.PAPER, discriminates=comparison("the best all-rank-1 direction")))
    report.declare(Claim("toy_construction_speed", "|s - 1/2| for the paper's rank-2 construction (float64)", "<=",
                         1e-12, kind=ClaimKind.INVARIANT))
    report.declare(Claim("euler_identity", "max relative error of <grad L_0(theta), theta> = L L_0(theta) over 3 "
                         "random theta on digits (float64)", "<=", 1e-9, kind=ClaimKind.INVARIANT))
    report.declare(Claim("optimal_escape_is_fixed_point", "min over seeds of cos(grad L_0(rho), -rho) at the E1 "
                         "direction", ">=", 0.999, kind=ClaimKind.SANITY))
    report.declare(Claim("all_small_init_runs_escaped", "fraction of small-init runs that escaped within the step "
                         "budget", ">=", 1.0, kind=ClaimKind.SANITY))
    report.declare(SampleClaim("standard_init_has_no_gap", "depth gap at the escape of PyTorch's default init, per "
                               "seed (no low-rank bias)", "<", 1.0, kind=ClaimKind.SANITY))


def _digits(samples: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data.astype(np.float64) / 16.0
    labels = digits.target
    if samples is not None:
        x, labels = x[:samples], labels[:samples]
    x = x - x.mean(axis=0, keepdims=True)
    y = np.eye(10)[labels]
    return torch.tensor(x.T.copy()), torch.tensor(y.T.copy())


def _invariants(report: Report, x: torch.Tensor, y_star: torch.Tensor, seed: int) -> None:
    tx, tg = toy_data()
    report.measure("toy_construction_speed", abs(-float(local_loss(toy_rank_two_escape(), tx, tg)) - 0.5))
    g = mse_gradient_at_zero(y_star)
    gen = torch.Generator().manual_seed(seed)
    errs = []
    for _ in range(3):
        ws = init_weights(layer_widths(x.shape[0], 32, y_star.shape[0], 6), 1.0, gen)
        value, grads = local_loss_gradient(ws, x, g)
        inner = sum(float((gr * w).sum()) for gr, w in zip(grads, ws))
        errs.append(abs(inner - 6 * value) / abs(6 * value))
    report.measure("euler_identity", max(errs))


def _optimal(report: Report, s: Settings, x: torch.Tensor, y_star: torch.Tensor, seeds: list[int]) -> list[float]:
    g = mse_gradient_at_zero(y_star)
    widths = layer_widths(x.shape[0], s.opt_width, y_star.shape[0], s.depth)
    deep = deep_layers(s.depth)
    t = report.table(f"E1: optimal escape direction, depth {s.depth}, width {s.opt_width} (per layer, mean over "
                     "seeds; baselines: a random point on the sphere, the deep linear net's escape direction)",
                     ["direction", "layer", "s1_over_s2", "log10_s1_over_s2", "rank1_share", "relu_gap",
                      "l_pow_quarter"])
    per_layer: dict[str, list[list[float]]] = {"optimal (ReLU)": [], "random point": [], "deep linear": []}
    shares_seen: dict[str, list[list[float]]] = {k: [] for k in per_layer}
    gaps_relu: dict[str, list[list[float]]] = {k: [] for k in per_layer}
    near, gap, align, speeds = [], [], [], []
    near_linear, gap_linear = [], []  # the deep linear net's escape direction judged by the same two claims
    for sd in progress(seeds, desc="E1 optimal escape"):
        gen = torch.Generator().manual_seed(sd)
        rho = optimal_escape_direction(x, g, widths, steps=s.opt_steps, restarts=s.opt_restarts, generator=gen)
        ratios, shares = layer_ratios(rho.weights), layer_shares(rho.weights)
        near.append(min(shares[l - 1] for l in deep))
        gap.append(depth_gap(ratios))
        align.append(rho.alignment)
        speeds.append(rho.speed)
        random_point = to_sphere(init_weights(widths, 1.0, gen))
        linear = optimal_escape_direction(x, g, widths, steps=s.opt_steps, restarts=1, generator=gen,
                                          relu=False).weights
        near_linear.append(min(layer_shares(linear)[l - 1] for l in deep))
        gap_linear.append(depth_gap(layer_ratios(linear)))
        for name, ws, rat, sh in (("optimal (ReLU)", rho.weights, ratios, shares),
                                  ("random point", random_point, layer_ratios(random_point), layer_shares(random_point)),
                                  ("deep linear", linear, layer_ratios(linear), layer_shares(linear))):
            per_layer[name].append(rat)
            shares_seen[name].append(sh)
            gaps_relu[name].append(relu_gap(ws, x) + [math.nan] if name != "deep linear" else [math.nan] * s.depth)
    for name in per_layer:
        for l in range(1, s.depth + 1):
            r = [v[l - 1] for v in per_layer[name]]
            rg = [v[l - 1] for v in gaps_relu[name]]
            t.add(direction=name, layer=l, s1_over_s2=stats_.fmean(r), log10_s1_over_s2=stats_.fmean(_log10(v) for v in r),
                  rank1_share=stats_.fmean(v[l - 1] for v in shares_seen[name]),
                  relu_gap=stats_.fmean(rg) if all(math.isfinite(v) for v in rg) else "",
                  l_pow_quarter=l ** 0.25)
    t2 = report.table("E1: escape speed s = -L_0(rho) per seed (best of restarts)", ["seed", "speed", "alignment",
                                                                                      "depth_gap"])
    for sd, sp, al, gp in zip(seeds, speeds, align, gap):
        t2.add(seed=sd, speed=sp, alignment=al, depth_gap=gp)
    report.measure("optimal_escape_near_rank_one", near)
    report.get_claim("optimal_escape_near_rank_one").measure_control(near_linear)
    report.measure("optimal_escape_depth_gap", gap)
    report.get_claim("optimal_escape_depth_gap").measure_control(gap_linear)
    report.measure("optimal_escape_is_fixed_point", min(align))
    report.plots["optimal_escape_layers"] = _plot_layers(per_layer, shares_seen, s.depth)
    return speeds


def _log10(v: float) -> float:
    return math.log10(v) if 0 < v < math.inf else (math.inf if v == math.inf else math.nan)


def _train(x, y_star, s: Settings, depth: int, seed: int, scale: float, distribution: str, relu: bool = True):
    gen = torch.Generator().manual_seed(seed)
    w0 = init_weights(layer_widths(x.shape[0], s.train_width, y_star.shape[0], depth), scale, gen, torch.float32,
                      distribution)
    return train_from_init(x.float(), y_star.float(), w0, s.max_steps, s.eta, rule="relative", log_every=s.log_every,
                           top_k=TOP_K, escape_drop=ESCAPE_DROP, steps_after_escape=s.steps_after_escape,
                           desc=f"E2 depth {depth} seed {seed}", relu=relu)


def _first_layer_trend(ratios: list[float]) -> float:
    """(s1/s2)(W_1) / min over the deeper layers of (s1/s2)(W_l): small when the first layer keeps rank."""
    return ratios[0] / min(ratios[l - 1] for l in deep_layers(len(ratios)))


def _training(report: Report, s: Settings, x, y_star, seeds: list[int], best_speeds: list[float]):
    g = mse_gradient_at_zero(y_star)
    t = report.table(f"E2: at the escape step, depth {s.depth}, width {s.train_width} (s1/s2 per layer 1..L)",
                     ["init", "seed", "escape_step", "loss_at_escape", *[f"s1/s2 W{l}" for l in range(1, s.depth + 1)],
                      "deep_rank1_share", "depth_gap", "first_layer_trend", "escape_dir_speed", "escape_dir_alignment",
                      "optimal_speed_E1"])
    runs: dict[str, list] = {"small": [], "standard": [], "deep linear, small": []}
    gaps: dict[str, list[float]] = {arm: [] for arm in runs}
    trends: dict[str, list[float]] = {arm: [] for arm in runs}
    for k, sd in enumerate(seeds):
        for arm, scale, dist, relu in (("small", SMALL_SCALE, "normal", True), ("standard", 1.0, "uniform", True),
                                       ("deep linear, small", SMALL_SCALE, "normal", False)):
            traj = _train(x, y_star, s, s.depth, sd, scale, dist, relu)
            runs[arm].append(traj)
            ws = traj.escape_weights if traj.escape_weights is not None else traj.final_weights
            ratios, shares = layer_ratios(ws), layer_shares(ws)
            gaps[arm].append(depth_gap(ratios))
            trends[arm].append(_first_layer_trend(ratios))
            w64 = [w.double() for w in ws]
            t.add(init=arm, seed=sd, escape_step=traj.escape_step if traj.escape_step is not None else "none",
                  loss_at_escape=traj.losses[traj.escape_step] if traj.escape_step is not None else traj.losses[-1],
                  **{f"s1/s2 W{l}": ratios[l - 1] for l in range(1, s.depth + 1)},
                  deep_rank1_share=stats_.fmean(shares[l - 1] for l in deep_layers(s.depth)),
                  depth_gap=gaps[arm][-1], first_layer_trend=trends[arm][-1],
                  escape_dir_speed=escape_speed(w64, x, g, relu), escape_dir_alignment=fixed_point_alignment(w64, x, g, relu),
                  optimal_speed_E1=best_speeds[k])
    say("E2 done")
    report.measure("depth_gap_at_escape", gaps["small"])
    report.get_claim("depth_gap_at_escape").measure_control(gaps["standard"])
    report.measure_paired("gap_small_vs_standard_init", gaps["small"], gaps["standard"])
    report.measure("first_layer_less_rank_one", trends["small"])
    report.get_claim("first_layer_less_rank_one").measure_control(trends["deep linear, small"])
    report.measure("all_small_init_runs_escaped", stats_.fmean(r.escape_step is not None for r in runs["small"]))
    report.measure("standard_init_has_no_gap", gaps["standard"])
    return runs["small"], runs["standard"]


def _extra_depths(report: Report, s: Settings, x, y_star, seeds: list[int]) -> None:
    if not s.extra_depths:
        return
    t = report.table("E2 at other depths (small init): s1/s2 per layer at the escape, mean over seeds",
                     ["depth", "seeds", "escape_step_mean", "s1_over_s2_per_layer", "depth_gap_mean"])
    for depth in s.extra_depths:
        ratios, gaps, steps = [], [], []
        for sd in seeds[:s.extra_depth_seeds]:
            traj = _train(x, y_star, s, depth, sd, SMALL_SCALE, "normal")
            ws = traj.escape_weights if traj.escape_weights is not None else traj.final_weights
            r = layer_ratios(ws)
            ratios.append(r)
            gaps.append(depth_gap(r))
            steps.append(traj.escape_step if traj.escape_step is not None else math.nan)
        t.add(depth=depth, seeds=len(ratios), escape_step_mean=stats_.fmean(steps),
              s1_over_s2_per_layer=" ".join(f"{stats_.fmean(v[l] for v in ratios):.2f}" for l in range(depth)),
              depth_gap_mean=stats_.fmean(gaps))


def _toy(report: Report, s: Settings, seeds: list[int]) -> None:
    x, g = toy_data()
    t = report.table(f"E3: Example 1, best escape speed over {s.toy_restarts} restarts (sqrt(2) - 1 = "
                     f"{RANK_ONE_SPEED:.4f} is the best all-rank-1 speed; 1/2 is reached by a rank-2 first layer)",
                     ["width", "seed", "best_speed", "fraction_above_rank1_bound", "first_layer_s1_over_s2"])
    diffs = []
    for width in s.toy_widths:
        for sd in seeds:
            gen = torch.Generator().manual_seed(sd)
            rho = optimal_escape_direction(x, g, [2, width, width, 1], steps=s.toy_steps, restarts=s.toy_restarts,
                                           generator=gen)
            frac = stats_.fmean(v > RANK_ONE_SPEED + 1e-6 for v in rho.restart_speeds)
            t.add(width=width, seed=sd, best_speed=rho.speed, fraction_above_rank1_bound=frac,
                  first_layer_s1_over_s2=layer_ratios(rho.weights)[0])
            if width == TOY_WIDTH:
                diffs.append(rho.speed - RANK_ONE_SPEED)
    report.measure("toy_rank_two_escape_faster", diffs)


def _plot_spectra(traj, depth: int, title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, depth + 1, figsize=(3.0 * (depth + 1), 3.2))
    steps = traj.logged_steps
    for l in range(depth):
        ax = axes[l]
        sv = torch.stack([sp[l] for sp in traj.spectra]).numpy()
        for i in range(sv.shape[1]):
            ax.plot(steps, sv[:, i], lw=1.5 if i == 0 else 0.9, label=f"s{i + 1}")
        if traj.escape_step is not None:
            ax.axvline(traj.escape_step, color="k", ls="--", lw=0.8)
        ax.set_yscale("log")
        ax.set_title(f"W{l + 1}")
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    axes[-1].plot(range(len(traj.losses)), traj.losses, color="k")
    axes[-1].set_title("loss")
    axes[-1].set_xlabel("step")
    fig.suptitle(f"Top-{TOP_K} singular values per layer over training, {title} (dashed: escape)")
    fig.tight_layout()
    return fig


def _plot_losses(small, standard):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for k, (a, b) in enumerate(zip(small, standard)):
        ax.plot(a.losses, color="tab:blue", lw=1, label="small init" if k == 0 else None)
        ax.plot(b.losses, color="tab:orange", lw=1, label="PyTorch default init" if k == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("MSE loss")
    ax.legend()
    ax.set_title("Loss over training, all seeds")
    fig.tight_layout()
    return fig


def _plot_layers(per_layer, shares, depth: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    layers = np.arange(1, depth + 1)
    for k, name in enumerate(per_layer):
        r = np.array(per_layer[name]).mean(axis=0)
        sh = np.array(shares[name]).mean(axis=0)
        axes[0].bar(layers + (k - 1) * 0.27, np.log10(np.minimum(r, 1e300)), width=0.27, label=name)
        axes[1].bar(layers + (k - 1) * 0.27, sh, width=0.27, label=name)
    axes[0].plot(layers, np.log10(layers ** 0.25), "k--", label="l^(1/4)")
    axes[0].set_ylabel("log10 s1/s2")
    axes[1].set_ylabel("rank-1 share s1^2 / sum s^2")
    for ax in axes:
        ax.set_xlabel("layer l")
        ax.legend(fontsize=7)
    fig.suptitle("E1: per-layer structure of the optimal escape direction vs baselines")
    fig.tight_layout()
    return fig
