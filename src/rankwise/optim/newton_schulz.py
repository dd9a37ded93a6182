"""Quintic Newton-Schulz orthogonalisation, the step direction of Muon (and of LoRA-Pre's Muon variant).

For a matrix m = U S V^T the exact "orthogonal part" is U V^T (every singular value set to 1). Muon approximates it
with a few iterations of the odd polynomial x -> a x + b x^3 + c x^5 applied to the singular values, after scaling m
so that they all lie in (0, 1]. The coefficients (a, b, c) = (3.4445, -4.7750, 2.0315) trade exactness for speed: the
slope 3.4445 at zero lifts small singular values quickly, and the iteration then oscillates around 1 (roughly within
[0.7, 1.2]) instead of converging to it, which Muon's updates tolerate.
"""

from __future__ import annotations

import torch

from rankwise.errors import InvalidInputError

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# Added to the Frobenius norm before dividing, so an all-zero matrix stays zero instead of becoming NaN.
NS_NORM_EPS = 1e-7


@torch.no_grad()
def newton_schulz5(m: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Approximate U V^T of m = U S V^T by `steps` quintic Newton-Schulz iterations.

    Args:
        m: a matrix [p, q], any floating dtype.
        steps: number of iterations (5 is Muon's choice).

    Returns:
        [p, q], the same dtype as m, with singular values near 1 and m's singular vectors. Computed in float32 (or
        float64 for a float64 input): the polynomial of a Gram matrix loses too much in bf16/fp16.
    """
    if m.dim() != 2:
        raise InvalidInputError(f"newton_schulz5 needs a matrix, got a tensor of shape {tuple(m.shape)}")
    if steps < 0:
        raise InvalidInputError(f"steps must be >= 0, got {steps}")
    a, b, c = NS_COEFFICIENTS
    x = m.double() if m.dtype == torch.float64 else m.float()
    # Iterate on the wide orientation [min, max]: the Gram matrix x x^T is then the smaller of the two.
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    # Frobenius norm >= spectral norm, so every singular value starts in [0, 1], where the polynomial pushes it up.
    x = x / (x.norm() + NS_NORM_EPS)
    for _ in range(steps):
        gram = x @ x.T  # [min, min]
        x = a * x + (b * gram + c * (gram @ gram)) @ x  # a x + b (x x^T) x + c (x x^T)^2 x
    if tall:
        x = x.T
    return x.to(m.dtype)
