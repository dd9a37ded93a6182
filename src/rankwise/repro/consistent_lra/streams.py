"""The row streams of the consistent-lra reproduction: the card's S1 (adversarial alternation), S2 (scikit-learn's
digits, scikit-image's camera), each as one float64 array per seed, and S3 (the lower-bound phases)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwise.algorithms.consistent_lra import adversarial_alternation


@dataclass(frozen=True)
class StreamSpec:
    name: str
    rank: int
    what: str


ADVERSARIAL = StreamSpec("adversarial", 5, "S1: rank-4 Gaussian base + alternating bursts on two more directions, d=40")
DIGITS = StreamSpec("digits", 10, "sklearn load_digits rows (8x8 images, d=64), random order per seed")
CAMERA = StreamSpec("camera", 20, "rows of skimage data.camera(), random order per seed")
# The long real stream: digits and camera are shorter than the ~k log(n) / eps^2 rows ridge-leverage sampling needs
# before it can skip rows, so only here can B's sampling be sparse while it keeps its promise.
FASHION = StreamSpec("fashion", 10, "Fashion-MNIST training images, average-pooled to 7x7 (d=49), random order")


def adversarial_rows(n: int, seed: int) -> np.ndarray:
    return adversarial_alternation(n, 40, ADVERSARIAL.rank, seed=seed)


def digits_rows(n: int | None, seed: int) -> np.ndarray:
    from sklearn.datasets import load_digits

    x = load_digits().data.astype(np.float64)  # [1797, 64], integer pixel values 0..16
    order = np.random.default_rng(seed).permutation(x.shape[0])
    return x[order[:n]] if n else x[order]


def camera_rows(n: int | None, column_stride: int, seed: int) -> np.ndarray:
    """Rows of the 512 x 512 camera image; columns averaged in groups of `column_stride` (d = 512 / stride)."""
    from skimage import data

    img = data.camera().astype(np.float64)
    img = img.reshape(img.shape[0], img.shape[1] // column_stride, column_stride).mean(2)
    order = np.random.default_rng(seed).permutation(img.shape[0])
    return img[order[:n]] if n else img[order]


def fashion_rows(n: int, pool: int, seed: int) -> np.ndarray:
    """`n` Fashion-MNIST training images in a random order, average-pooled `pool` x `pool` (d = (28 / pool)^2)."""
    import torch

    from rankwise.data.vision import load_fashion_mnist

    images = load_fashion_mnist("train").images  # [60000, 1, 28, 28] float32 in [0, 1]
    order = torch.from_numpy(np.random.default_rng(seed).permutation(images.shape[0])[:n])
    x = torch.nn.functional.avg_pool2d(images[order], pool).flatten(1)
    return x.double().numpy()
