"""Reproduction `lrnn:multiplicative`: a separation-rank-1 target, f(x) = prod_{i<6} sin(pi x_i) on [-1, 1]^6, fitted
by a shallow LRNN (r = 4, D = 6) and by a tanh MLP with the same number of parameters (card lrnn.md E2).

4,000 training points (10% of them the validation split that tunes each arm's learning rate) and 4,000 test points,
uniform on the cube; full-batch Adam; metric: test MSE. An MLP must build the 6-way product by adding its neurons; one
LRNN neuron is that product.
"""

from __future__ import annotations

import math
import statistics as st
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.core.evidence import Claim, ClaimKind, PairedClaim
from rankwise.core.report import Report
from rankwise.nn.lrnn import LRNN, lrnn_parameter_count
from rankwise.repro.lrnn.fitting import Arm, compare_arms, fit, matched_width, parameter_count
from rankwise.repro.setup import BySize


@dataclass(frozen=True)
class Settings:
    dim: int
    n_train: int
    n_test: int
    rank: int
    hidden: int
    steps: int
    lr_grid: tuple[float, ...]
    seeds: int


SIZES = BySize(
    smoke=Settings(dim=3, n_train=200, n_test=200, rank=2, hidden=2, steps=30, lr_grid=(3e-3, 1e-2), seeds=3),
    full=Settings(dim=6, n_train=4000, n_test=4000, rank=4, hidden=4, steps=2000, lr_grid=(3e-3, 1e-2, 3e-2, 1e-1, 3e-1),
                  seeds=5),
)
ORDERS_MARGIN = 1.0  # the card: "orders of magnitude better"; one order is its least reading
PARAM_TOL = 0.05


def target(x: torch.Tensor) -> torch.Tensor:
    """[n, d] -> [n, 1], prod_i sin(pi x_i)."""
    return torch.sin(math.pi * x).prod(-1, keepdim=True)


def tanh_mlp(dim: int, width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1))


def run(size: str = "smoke", seed: int = 0) -> Report:
    s = SIZES[size]
    report = Report("lrnn", "Separation-rank-1 target: shallow LRNN vs tanh MLP at equal parameters", size, seed)
    report.declare(PairedClaim("lrnn_orders_better_than_mlp", "log10 test MSE(MLP) - log10 test MSE(LRNN), paired by "
                               "seed", ">", ORDERS_MARGIN, kind=ClaimKind.PAPER))
    report.declare(Claim("parameters_matched", "|params(MLP) / params(LRNN) - 1|", "<=", PARAM_TOL,
                         kind=ClaimKind.SANITY))
    report.declare(Claim("no_run_diverged", "non-finite losses over all fits", "<=", 0, kind=ClaimKind.SANITY))

    gen = torch.Generator().manual_seed(seed)
    x_all = torch.rand(s.n_train + s.n_test, s.dim, generator=gen) * 2 - 1
    y_all = target(x_all)
    n_val = s.n_train // 10
    x_tr, y_tr = x_all[: s.n_train - n_val], y_all[: s.n_train - n_val]
    x_val, y_val = x_all[s.n_train - n_val: s.n_train], y_all[s.n_train - n_val: s.n_train]
    x_te, y_te = x_all[s.n_train:], y_all[s.n_train:]

    n_lrnn = lrnn_parameter_count(s.dim, 1, (s.rank,), s.dim, s.hidden, layer_norm=False)
    width = matched_width(n_lrnn, lambda w: parameter_count(tanh_mlp(s.dim, w)), hi=256)
    arm_list = (Arm("LRNN", lambda sd: LRNN(s.dim, 1, (s.rank,), proj_dim=s.dim, hidden=s.hidden, omega0=3.0,
                                            layer_norm=False)),
                Arm(f"tanh MLP (2 x {width})", lambda sd: tanh_mlp(s.dim, width)))
    counts = {a.name: parameter_count(a.build(0)) for a in arm_list}
    diverged = 0

    def train(model, lr):
        nonlocal diverged
        res = fit(model, lambda m: (m(x_tr) - y_tr).pow(2).mean(), s.steps, lr, log_every=s.steps)
        diverged += int(res.diverged)
        return res

    def mse(m, x, y):
        with torch.no_grad():
            return float((m(x) - y).double().pow(2).mean())

    chosen, results = compare_arms(
        report, arm_list, s.lr_grid, train, lambda m: mse(m, x_val, y_val),
        lambda res: {"test_mse": mse(res.model, x_te, y_te), "train_mse": mse(res.model, x_tr, y_tr)}, s.seeds, seed,
        lambda a: {"steps": s.steps, "train_points": len(x_tr), "params": counts[a.name]}, higher_is_better=False)
    report.check_budgets_matched(["steps", "train_points"])
    report.check_budgets_matched(["params"], rel_tol=PARAM_TOL)

    lr_name, mlp_name = (a.name for a in arm_list)
    neg_log = {a: [-math.log10(max(v, 1e-300)) for v in results[a]["test_mse"]] for a in results}
    report.measure_paired("lrnn_orders_better_than_mlp", neg_log[lr_name], neg_log[mlp_name])
    report.measure("parameters_matched", abs(counts[mlp_name] / counts[lr_name] - 1.0))
    report.measure("no_run_diverged", diverged)
    var = float(y_te.double().var())
    t = report.table("Test MSE over seeds", ["arm", "params", "lr", "test_mse_mean", "test_mse_over_var",
                                             "train_mse_mean", "per_seed_test_mse"])
    for a in arm_list:
        r = results[a.name]
        t.add(arm=a.name, params=counts[a.name], lr=chosen[a.name], test_mse_mean=st.fmean(r["test_mse"]),
              test_mse_over_var=st.fmean(r["test_mse"]) / var, train_mse_mean=st.fmean(r["train_mse"]),
              per_seed_test_mse=" ".join(f"{v:.3g}" for v in r["test_mse"]))
    report.note(f"d = {s.dim}; {len(x_tr)} fitting + {n_val} validation + {s.n_test} test points (one draw per base "
                f"seed); LRNN: one product layer, r = {s.rank}, D = {s.dim}, component width {s.hidden}, sine "
                f"components with omega0 = 3, no LayerNorm; {s.steps} full-batch Adam steps; target variance {var:.4g}.")
    return report.finish()


__all__ = ["run", "SIZES", "Settings", "target"]
