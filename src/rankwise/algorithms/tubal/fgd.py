"""Factorised gradient descent (FGD) for symmetric low-tubal-rank recovery, with validation early stopping.

Objective f(U) = (1 / 4m) ||y - M(U * U^T)||^2 over U [n, R, k] (R may over-estimate the tubal rank r). Its gradient
is Gs * U with G = (1/m) M*(M(U * U^T) - y) and Gs = (G + G^T) / 2 (t-transpose; the symmetrisation matters because
the A_i are not symmetric), so

    U_{t+1} = U_t - eta * Gs_t * U_t.

Early stopping (the paper's Theorem 4): hold out some measurements, track e_t = 1/4 ||y_val - M_val(U_t * U_t^T)||^2
and output U_t * U_t^T at t = argmin_t e_t (over the iterations run).

Several runs that share the measurements (different initialisations, ranks or step sizes) go in one batch
U0 [B, n, R, k]: each iteration then costs two matrix-matrix products with the measurement matrix instead of 2B
matrix-vector products. Runs of smaller rank can be zero-padded to a common R: zero columns of U stay zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rankwise.algorithms.tubal.measurements import GaussianMeasurements
from rankwise.algorithms.tubal.tproduct import check_tensor, from_fourier, symmetrize, to_fourier
from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError, NumericalError


def gram_from_factor(u: torch.Tensor) -> torch.Tensor:
    """U * U^T [..., n, n, k] for U [..., n, R, k] (every Fourier slice Û Û^H: Hermitian PSD)."""
    u_hat = to_fourier(u)
    return from_fourier(torch.einsum("...ijk,...ljk->...ilk", u_hat, u_hat.conj()))


def fgd_objective(measurements: GaussianMeasurements, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """f(U) = (1 / 4m) ||y - M(U * U^T)||^2 (differentiable; [...] for U [..., n, R, k])."""
    return (measurements(gram_from_factor(u)) - y).pow(2).sum(-1) / (4 * measurements.m)


def fgd_gradient(measurements: GaussianMeasurements, y: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The analytic gradient of `fgd_objective`: Gs * U, with Gs = sym((1/m) M*(M(U * U^T) - y))."""
    residual = measurements(gram_from_factor(u)) - y
    g_sym = symmetrize(measurements.adjoint(residual) / measurements.m)
    return from_fourier(torch.einsum("...ijk,...jrk->...irk", to_fourier(g_sym), to_fourier(u)))


@dataclass(frozen=True)
class FGDResult:
    """What a run returns; tensors carry a leading batch dimension B when U0 had one.

    `factor`/`estimate`: U and U * U^T at the early-stopping step (the last step without validation data);
    `es_step` [B]; `train_loss`, `val_loss` (or None), `rse` (relative squared error to `truth`, or None): one row
    per iteration [T + 1, B] (row 0 is the initialisation).
    """

    factor: torch.Tensor
    estimate: torch.Tensor
    final_factor: torch.Tensor
    es_step: torch.Tensor
    train_loss: torch.Tensor
    val_loss: torch.Tensor | None
    rse: torch.Tensor | None
    diverged: torch.Tensor

    def _need_rse(self) -> torch.Tensor:
        if self.rse is None:
            raise InvalidInputError("no RSE recorded: pass truth=X_star to factorized_gd")
        return self.rse

    @property
    def best_step(self) -> torch.Tensor:
        """argmin_t RSE_t (the oracle's best iterate) [B]."""
        r = self._need_rse()
        return torch.nan_to_num(r, nan=math.inf).argmin(0)

    @property
    def best_rse(self) -> torch.Tensor:
        r = self._need_rse()
        return torch.nan_to_num(r, nan=math.inf).min(0).values

    @property
    def es_rse(self) -> torch.Tensor:
        """RSE at the early-stopping step [B]."""
        r = self._need_rse()
        return r.gather(0, self.es_step[None]).squeeze(0)

    @property
    def final_rse(self) -> torch.Tensor:
        return self._need_rse()[-1]


def _steps(step: float | torch.Tensor, batch: int) -> torch.Tensor:
    s = torch.as_tensor(step, dtype=torch.float64)
    if s.dim() == 0:
        s = s.expand(batch)
    if s.shape != (batch,) or not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
        raise InvalidInputError(f"step must be a positive number or a tensor [B={batch}] of them, got {step!r}")
    return s.clone()


def factorized_gd(measurements: GaussianMeasurements, y: torch.Tensor, init: torch.Tensor, *, step: float | torch.Tensor = 0.1,
                  iterations: int = 1000, validation: tuple[GaussianMeasurements, torch.Tensor] | None = None,
                  truth: torch.Tensor | None = None, desc: str = "FGD") -> FGDResult:
    """Run FGD from `init` U0 [n, R, k] (or a batch [B, n, R, k]) on the measurements `y` [m].

    `step`: eta, a number or one per run [B]; `validation`: (M_val, y_val) for early stopping; `truth`: X* [n, n, k]
    to record the relative squared error ||U U^T - X*||_F^2 / ||X*||_F^2 at every iteration. A run whose iterates
    overflow is marked `diverged` (its losses become non-finite and early stopping never picks them).
    """
    n, n2, k = measurements.shape
    if n != n2:
        raise InvalidInputError(f"symmetric recovery needs square slices, got measurement shape {measurements.shape}")
    check_tensor(init, "init")
    batched = init.dim() == 4
    if init.dim() not in (3, 4) or init.shape[-3] != n or init.shape[-1] != k:
        raise InvalidInputError(f"init must be [n={n}, R, k={k}] or [B, n, R, k], got {tuple(init.shape)}")
    u = (init if batched else init[None]).to(torch.float64).clone()
    b = u.shape[0]
    if not isinstance(y, torch.Tensor) or y.shape != (measurements.m,) or not bool(torch.isfinite(y).all()):
        raise InvalidInputError(f"y must be a finite tensor [m={measurements.m}]")
    if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 0:
        raise InvalidInputError(f"iterations must be a non-negative integer, got {iterations!r}")
    eta = _steps(step, b)[:, None, None, None]
    if validation is not None:
        m_val, y_val = validation
        if not isinstance(m_val, GaussianMeasurements) or m_val.shape != measurements.shape:
            raise InvalidInputError("validation must be (GaussianMeasurements of the same shape, y_val)")
        if not isinstance(y_val, torch.Tensor) or y_val.shape != (m_val.m,) or not bool(torch.isfinite(y_val).all()):
            raise InvalidInputError(f"y_val must be a finite tensor [m_val={m_val.m}]")
    if truth is not None:
        check_tensor(truth, "truth", batched=False)
        if tuple(truth.shape) != (n, n, k):
            raise InvalidInputError(f"truth must be [n, n, k] = {(n, n, k)}, got {tuple(truth.shape)}")
        truth_norm2 = float(truth.pow(2).sum())
        if truth_norm2 == 0:
            raise NumericalError("truth is the zero tensor: the relative error is undefined")

    a_train, y = measurements.matrix, y.to(torch.float64)
    m = measurements.m
    train_loss, val_loss, rse = [], [], []
    best_val = torch.full((b,), math.inf, dtype=torch.float64)
    es_step = torch.zeros(b, dtype=torch.int64)
    best_u = u.clone()
    for t in progress(range(iterations + 1), desc=desc):
        u_hat = to_fourier(u)
        z = from_fourier(torch.einsum("bijk,bljk->bilk", u_hat, u_hat.conj()))
        flat = z.reshape(b, -1)
        residual = flat @ a_train.T - y
        train_loss.append(residual.pow(2).sum(1) / (4 * m))
        if truth is not None:
            rse.append((z - truth).pow(2).sum((1, 2, 3)) / truth_norm2)
        if validation is not None:
            e = (flat @ m_val.matrix.T - y_val).pow(2).sum(1) / 4
            val_loss.append(e)
            better = e < best_val  # NaN compares False: a diverged run is never chosen
            best_val = torch.where(better, e, best_val)
            es_step = torch.where(better, torch.full_like(es_step, t), es_step)
            best_u = torch.where(better[:, None, None, None], u, best_u)
        if t == iterations:
            break
        g_sym = symmetrize((residual @ a_train).reshape(b, n, n, k) / m)
        u = u - eta * from_fourier(torch.einsum("bijk,bjrk->birk", to_fourier(g_sym), u_hat))
    if validation is None:
        best_u, es_step = u, torch.full((b,), iterations, dtype=torch.int64)
    diverged = ~torch.isfinite(u).reshape(b, -1).all(1) | ~torch.isfinite(torch.stack(train_loss)).all(0)
    squeeze = (lambda x: x) if batched else (lambda x: x[0])
    stack = (lambda xs: torch.stack(xs)) if batched else (lambda xs: torch.stack(xs)[:, 0])
    return FGDResult(
        factor=squeeze(best_u), estimate=squeeze(gram_from_factor(best_u)), final_factor=squeeze(u),
        es_step=squeeze(es_step), train_loss=stack(train_loss), val_loss=stack(val_loss) if val_loss else None,
        rse=stack(rse) if rse else None, diverged=squeeze(diverged))
