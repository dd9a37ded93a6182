"""Fourier resampling of periodic fields: one field seen at several grid resolutions, by truncating (coarser) or
zero-padding (finer) its spectrum. The PDE data (`data.pdes`) samples every resolution of a trajectory from one fine
solution this way, and resolution-transfer methods (Frequency Representation Learning) compare grids with it."""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError


def fourier_resample(u: torch.Tensor, n: int, *, ndim: int) -> torch.Tensor:
    """Resample periodic fields u [..., N] (ndim=1) or [..., N, N] (ndim=2; no default: [B, N, N] could be either)
    onto n points per axis by Fourier truncation (n < N) or zero padding (n > N): the modes |m| < min(N, n) / 2 are
    kept on every axis, the rest (Nyquist included, whose sign is ambiguous on an even grid) dropped. Computed in
    float64, returned in u's dtype.

    Coarsening is therefore a projection: resample(resample(u, 64), 32) == resample(u, 32), and resampling a field
    without modes at or above n / 2 to n points and back is the identity (up to rounding)."""
    if ndim not in (1, 2) or u.dim() < ndim or (ndim == 2 and u.size(-1) != u.size(-2)):
        raise InvalidInputError(f"fourier_resample takes [..., N] (ndim=1) or [..., N, N] (ndim=2), got {tuple(u.shape)} with ndim={ndim}")
    N = u.size(-1)
    if n < 2 or n % 2 or N % 2:
        raise InvalidInputError(f"grid sizes must be even and >= 2, got {N} -> {n}")
    return from_spectrum(rfft(u.double(), ndim), N, n, ndim).to(u.dtype)


def from_spectrum(spectrum: torch.Tensor, N: int, n: int, ndim: int) -> torch.Tensor:
    """The n-point grid values (float64) of the field whose N-point rfft (rfft2) is `spectrum` [..., N/2+1] (or
    [..., N, N/2+1]), keeping the modes |m| < min(N, n) / 2 on every axis."""
    keep = min(N, n) // 2  # modes 0 .. keep - 1 (and their negatives) survive
    if ndim == 1:
        out = spectrum.new_zeros(*spectrum.shape[:-1], n // 2 + 1)
        out[..., :keep] = spectrum[..., :keep]
        return torch.fft.irfft(out, n=n) * (n / N)
    out = spectrum.new_zeros(*spectrum.shape[:-2], n, n // 2 + 1)
    out[..., :keep, :keep] = spectrum[..., :keep, :keep]
    if keep > 1:
        out[..., n - keep + 1 :, :keep] = spectrum[..., N - keep + 1 :, :keep]
    return torch.fft.irfft2(out, s=(n, n)) * (n * n / (N * N))


def rfft(x: torch.Tensor, ndim: int) -> torch.Tensor:
    return torch.fft.rfft(x) if ndim == 1 else torch.fft.rfft2(x)


def irfft(x: torch.Tensor, N: int, ndim: int) -> torch.Tensor:
    return torch.fft.irfft(x, n=N) if ndim == 1 else torch.fft.irfft2(x, s=(N, N))
