"""A differentiable parallel-beam Radon transform in torch: rotate the image (bilinear `grid_sample`), sum the rows.

It follows `skimage.transform.radon(image, theta, circle=True)`'s conventions (rotation about pixel N // 2, angles
in degrees, output [detector N, angles]), so an image fitted through it can be compared with skimage's sinograms and
filtered back-projection (`skimage.transform.iradon`). The image must be zero outside the inscribed circle, as
skimage's `circle=True` assumes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rankwise.errors import InvalidInputError, NumericalError


def rotation_grid(size: int, angles_deg: torch.Tensor) -> torch.Tensor:
    """The sampling grid [A, size, size, 2] (x = column, y = row, normalised for align_corners=True) that rotates a
    size x size image by each angle about pixel (size // 2, size // 2), skimage's `radon` convention."""
    c = size // 2
    theta = torch.deg2rad(angles_deg.to(torch.float64))
    cos, sin = torch.cos(theta)[:, None, None], torch.sin(theta)[:, None, None]
    idx = torch.arange(size, dtype=torch.float64, device=angles_deg.device) - c
    y, x = torch.meshgrid(idx, idx, indexing="ij")  # output pixel (row i, column j), centred
    col = cos * x + sin * y + c
    row = -sin * x + cos * y + c
    scale = 2.0 / (size - 1)
    return torch.stack((col * scale - 1.0, row * scale - 1.0), dim=-1)


def radon_transform(image: torch.Tensor, angles_deg: torch.Tensor | list[float]) -> torch.Tensor:
    """image [..., N, N] -> sinogram [..., N, A]: line integrals at each of the A angles (degrees), differentiable.

    Cost: A bilinear resamplings of the image, O(A N^2) per image; gradients flow to the image (not the angles).
    """
    if not isinstance(image, torch.Tensor) or not image.is_floating_point():
        raise InvalidInputError("radon_transform: image must be a floating torch.Tensor")
    if image.dim() < 2 or image.shape[-1] != image.shape[-2] or image.shape[-1] < 2:
        raise InvalidInputError(f"radon_transform: image must be square [..., N, N] with N >= 2, got {tuple(image.shape)}")
    angles = torch.as_tensor(angles_deg, dtype=torch.float64, device=image.device)
    if angles.dim() != 1 or angles.numel() == 0:
        raise InvalidInputError(f"radon_transform: angles must be a non-empty 1-D list, got shape {tuple(angles.shape)}")
    if not bool(torch.isfinite(image).all()) or not bool(torch.isfinite(angles).all()):
        raise NumericalError("radon_transform: image or angles have NaN or Inf entries")
    n, lead = image.shape[-1], image.shape[:-2]
    flat = image.reshape(1, -1, n, n)  # the images as channels: one grid_sample per angle serves them all
    grid = rotation_grid(n, angles).to(image.dtype)
    rotated = F.grid_sample(flat.expand(angles.numel(), -1, -1, -1), grid, mode="bilinear", padding_mode="zeros",
                            align_corners=True)  # [A, B, N, N]
    sino = rotated.sum(-2)  # integrate along rows -> [A, B, N]
    return sino.permute(1, 2, 0).reshape(*lead, n, angles.numel())


def circle_mask(size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[size, size] 1 inside skimage's reconstruction circle (radius size // 2 about pixel size // 2), 0 outside."""
    idx = torch.arange(size, dtype=torch.float64) - size // 2
    d2 = idx[:, None] ** 2 + idx[None, :] ** 2
    return (d2 <= (size // 2) ** 2).to(dtype)


__all__ = ["radon_transform", "rotation_grid", "circle_mask"]
