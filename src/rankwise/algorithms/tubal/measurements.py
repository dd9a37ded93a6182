"""Gaussian linear measurements of a tensor: M(Z)_i = <A_i, Z>, with A_i [n1, n2, k] i.i.d. N(0, 1) entries.

Stored as one dense float64 matrix [m, n1 n2 k] (row i = vec(A_i)), so M and its adjoint M*(z) = sum_i z_i A_i are
matrix products, batched over leading dimensions. E[(1/m) M*M] = I; on low-tubal-rank tensors it concentrates
around the identity (the t-RIP the theory needs) once m is a few times n k r.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.algorithms.tubal.tproduct import check_tensor
from rankwise.errors import InvalidInputError, NumericalError


@dataclass(frozen=True)
class GaussianMeasurements:
    """The operator M: R^{n1 x n2 x k} -> R^m. `matrix` [m, n1 n2 k] float64, `shape` (n1, n2, k)."""

    matrix: torch.Tensor
    shape: tuple[int, int, int]

    def __post_init__(self) -> None:
        if self.matrix.dim() != 2 or self.matrix.shape[1] != self.shape[0] * self.shape[1] * self.shape[2]:
            raise InvalidInputError(f"matrix must be [m, n1 n2 k] = [m, {self.shape[0] * self.shape[1] * self.shape[2]}]"
                                    f" for shape {self.shape}, got {tuple(self.matrix.shape)}")
        if self.matrix.shape[0] < 1:
            raise InvalidInputError("a measurement operator needs at least one measurement (m >= 1)")
        if not bool(torch.isfinite(self.matrix).all()):
            raise NumericalError("the measurement matrix contains NaN or Inf")

    @classmethod
    def draw(cls, m: int, shape: tuple[int, int, int], seed: int = 0) -> GaussianMeasurements:
        """m measurements of tensors of `shape`, entries i.i.d. N(0, 1) from `seed`."""
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise InvalidInputError(f"m must be a positive integer, got {m!r}")
        if len(shape) != 3 or any((not isinstance(s, int)) or s < 1 for s in shape):
            raise InvalidInputError(f"shape must be three positive integers (n1, n2, k), got {shape!r}")
        gen = torch.Generator().manual_seed(seed)
        n = shape[0] * shape[1] * shape[2]
        return cls(torch.randn(m, n, generator=gen, dtype=torch.float64), tuple(shape))

    @property
    def m(self) -> int:
        return int(self.matrix.shape[0])

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """M(Z): [..., n1, n2, k] -> [..., m]."""
        check_tensor(z, "Z")
        if tuple(z.shape[-3:]) != self.shape:
            raise InvalidInputError(f"Z must have shape [..., {', '.join(map(str, self.shape))}], got {tuple(z.shape)}")
        return z.reshape(*z.shape[:-3], -1).to(torch.float64) @ self.matrix.T

    def adjoint(self, z: torch.Tensor) -> torch.Tensor:
        """M*(z) = sum_i z_i A_i: [..., m] -> [..., n1, n2, k]."""
        if not isinstance(z, torch.Tensor) or z.dim() < 1 or z.shape[-1] != self.m:
            raise InvalidInputError(f"z must be a tensor [..., m={self.m}], got "
                                    f"{tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__}")
        return (z.to(torch.float64) @ self.matrix).reshape(*z.shape[:-1], *self.shape)

    def split(self, validation: int) -> tuple[GaussianMeasurements, GaussianMeasurements]:
        """(training, validation): the last `validation` measurements held out (for early stopping); split the
        observations the same way: y[:-validation], y[-validation:]."""
        if isinstance(validation, bool) or not isinstance(validation, int) or not 0 < validation < self.m:
            raise InvalidInputError(f"validation must be an integer in (0, m={self.m}), got {validation!r}")
        cut = self.m - validation
        return GaussianMeasurements(self.matrix[:cut], self.shape), GaussianMeasurements(self.matrix[cut:], self.shape)
