"""The t-product algebra of third-order tensors (Kilmer & Martin), computed with the FFT along the third mode.

A tensor A [n1, n2, k] has frontal slices A[:, :, i]; its Fourier form is Â = fft(A, dim=-1). With the block
circulant matrix bcirc(A) [n1 k, n2 k] (block (i, j) = A[:, :, (i - j) mod k]) and unfold(B) = the frontal slices
of B stacked vertically:

    A * B = fold(bcirc(A) unfold(B)),  equivalently  (A * B)^ = Â^(i) B̂^(i) for every slice i,

so a t-product costs k matrix products and two FFTs instead of one (n1 k) x (n2 k) product. The t-transpose
transposes every slice and reverses slices 2..k; in the Fourier domain it is the conjugate transpose of each slice.
Every function accepts leading batch dimensions ([..., n1, n2, k]) and works in float64 unless given another real
floating dtype.
"""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError, NumericalError


def check_tensor(a: torch.Tensor, name: str = "tensor", *, batched: bool = True) -> torch.Tensor:
    """Validate a real third-order tensor [n1, n2, k] (with leading batch dimensions if `batched`)."""
    if not isinstance(a, torch.Tensor):
        raise InvalidInputError(f"{name} must be a torch.Tensor, got {type(a).__name__}")
    if a.is_complex() or not a.is_floating_point():
        raise InvalidInputError(f"{name} must be a real floating tensor, got dtype {a.dtype}")
    if a.dim() < 3 or (not batched and a.dim() != 3):
        want = "[..., n1, n2, k]" if batched else "[n1, n2, k]"
        raise InvalidInputError(f"{name} must be a third-order tensor {want}, got shape {tuple(a.shape)}")
    if any(s == 0 for s in a.shape):
        raise InvalidInputError(f"{name} has an empty dimension: shape {tuple(a.shape)}")
    if not bool(torch.isfinite(a).all()):
        raise NumericalError(f"{name} contains NaN or Inf")
    return a


def to_fourier(a: torch.Tensor) -> torch.Tensor:
    """Â = fft(A) along the third mode (the last dimension): [..., n1, n2, k] complex."""
    return torch.fft.fft(a, dim=-1)


def from_fourier(a_hat: torch.Tensor) -> torch.Tensor:
    """The real tensor whose Fourier form is `a_hat` (the imaginary part of the inverse FFT is rounding)."""
    return torch.fft.ifft(a_hat, dim=-1).real


def fourier_product(a_hat: torch.Tensor, b_hat: torch.Tensor) -> torch.Tensor:
    """Slice-wise matrix product in the Fourier domain: [..., n1, n2, k] x [..., n2, n3, k] -> [..., n1, n3, k]."""
    return torch.einsum("...ijk,...jlk->...ilk", a_hat, b_hat)


def t_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A * B for A [..., n1, n2, k] and B [..., n2, n3, k] -> [..., n1, n3, k]."""
    check_tensor(a, "A")
    check_tensor(b, "B")
    if a.shape[-2] != b.shape[-3] or a.shape[-1] != b.shape[-1]:
        raise InvalidInputError(f"t-product needs A [n1, n2, k] and B [n2, n3, k]; got A {tuple(a.shape)} and "
                                f"B {tuple(b.shape)}")
    return from_fourier(fourier_product(to_fourier(a), to_fourier(b)))


def t_transpose(a: torch.Tensor) -> torch.Tensor:
    """A^T [..., n2, n1, k]: every frontal slice transposed, slices 2..k in reverse order."""
    check_tensor(a, "A")
    return _transpose(a)


def _transpose(a: torch.Tensor) -> torch.Tensor:
    # unchecked: the solvers call it on iterates, where a diverging run must be reported, not raised on
    return torch.cat([a[..., :1], a[..., 1:].flip(-1)], dim=-1).transpose(-3, -2)


def t_identity(n: int, k: int, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The identity tensor [n, n, k]: the first frontal slice is I, the others are 0."""
    if n < 1 or k < 1:
        raise InvalidInputError(f"n and k must be >= 1, got n={n}, k={k}")
    eye = torch.zeros(n, n, k, dtype=dtype)
    eye[:, :, 0] = torch.eye(n, dtype=dtype)
    return eye


def symmetrize(a: torch.Tensor) -> torch.Tensor:
    """(A + A^T) / 2 with the t-transpose (no validation: used on solver iterates)."""
    return (a + _transpose(a)) / 2


def block_circulant(a: torch.Tensor) -> torch.Tensor:
    """bcirc(A) [n1 k, n2 k] of A [n1, n2, k]: block row i, block column j is the frontal slice (i - j) mod k."""
    check_tensor(a, "A", batched=False)
    n1, n2, k = a.shape
    idx = (torch.arange(k)[:, None] - torch.arange(k)[None, :]) % k  # [k, k]
    blocks = a.permute(2, 0, 1)[idx]  # [k, k, n1, n2]
    return blocks.permute(0, 2, 1, 3).reshape(n1 * k, n2 * k)


def unfold_slices(a: torch.Tensor) -> torch.Tensor:
    """The frontal slices of A [n1, n2, k] stacked vertically: [n1 k, n2]."""
    check_tensor(a, "A", batched=False)
    return a.permute(2, 0, 1).reshape(-1, a.shape[1])


def fold_slices(m: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of `unfold_slices`: [n1 k, n2] -> [n1, n2, k]."""
    if m.dim() != 2 or m.shape[0] % k:
        raise InvalidInputError(f"fold needs a matrix [n1 k, n2] with k={k} dividing its rows, got {tuple(m.shape)}")
    return m.reshape(k, m.shape[0] // k, m.shape[1]).permute(1, 2, 0)
