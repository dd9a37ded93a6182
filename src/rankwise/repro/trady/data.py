"""The vision tasks of the TraDy reproduction, all at 14x14 (the SmallResNet backbone's pretraining size):

- proxy (the a-priori layer ranking; never a target): Fashion-MNIST, all 10 classes, rotated by 90 degrees;
- targets: Fashion-MNIST classes 5-9 (relabelled 0-4) under a random affine warp per image (severity 5: up to 30
  degrees, 20% zoom and shear, 15% shift), scikit-learn's digits (8x8 upsampled to 14x14, 10 classes), and
  Fashion-MNIST classes 0-4 under contrast inversion (severity 1: the plain negative).
  Clean classes 5-9 are no test of sparse fine-tuning for this backbone, pretrained on all ten classes: every arm,
  at any budget, reaches about 96% (measured while designing this experiment), so the warp moves them off its domain.

Fashion-MNIST images come from the official train part, none of them seen in the backbone's pretraining (its
train and held-out indices are excluded), drawn disjointly for the proxy and the targets; test images from the
official test part. Digits are split train / validation / test, stratified, by the split seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.data.splits import stratified_split
from rankwise.data.vision import (ImageSet, corrupt, load_digits_images, load_fashion_mnist, resize, select_classes,
                                  split_indices, subset)

SIZE = 14


@dataclass(frozen=True)
class Split:
    """Images [N, 1, 14, 14] and labels [N] for training, validation (tuning) and test (the claims)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @property
    def num_classes(self) -> int:
        return int(torch.cat([self.train_y, self.val_y, self.test_y]).max()) + 1


def _rotate(data: ImageSet) -> ImageSet:
    return ImageSet(torch.rot90(data.images, 1, dims=(2, 3)).contiguous(), data.labels, data.class_names, data.name + "/rot90")


def _invert(data: ImageSet) -> ImageSet:
    return corrupt(data, "contrast_inversion", 1, 0)


def _warp(seed: int):
    return lambda data: corrupt(data, "affine", 5, seed + len(data))  # each part its own draws


def vision_tasks(n_train: int, n_val: int, n_test: int, excluded: torch.Tensor, seed: int) -> tuple[Split, list[Split]]:
    """(proxy, [targets]): each with `n_train` / `n_val` training and validation images and `n_test` test images
    (digits: at most what its split holds). `excluded`: Fashion-MNIST train-part indices the backbone saw."""
    train_part, test_part = load_fashion_mnist("train"), load_fashion_mnist("test")
    free = torch.ones(len(train_part), dtype=torch.bool)
    free[excluded] = False
    pool = train_part.take(free)
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))
    per = len(pool) // 3  # three disjoint shares: proxy, classes 5-9, classes 0-4 inverted
    shares = [pool.take(torch.sort(order[i * per:(i + 1) * per]).values) for i in range(3)]

    def fmnist(name: str, share: ImageSet, classes: range | None, transform=None) -> Split:
        train_val = share if classes is None else select_classes(share, classes)
        test = test_part if classes is None else select_classes(test_part, classes)
        train_val = subset(train_val, n_train + n_val, seed)
        tr, va = stratified_split(train_val.labels, (n_train / (n_train + n_val), n_val / (n_train + n_val)), seed)
        test = subset(test, min(n_test, len(test)), seed + 1)
        sets = [resize(train_val.take(tr), SIZE), resize(train_val.take(va), SIZE), resize(test, SIZE)]
        if transform is not None:
            sets = [transform(s) for s in sets]
        return Split(name, sets[0].images, sets[0].labels, sets[1].images, sets[1].labels, sets[2].images, sets[2].labels)

    proxy = fmnist("fmnist-rot90", shares[0], None, _rotate)
    targets = [fmnist("fmnist-5to9-affine", shares[1], range(5, 10), _warp(seed)), _digits(n_train, n_val, n_test, seed),
               fmnist("fmnist-0to4-inverted", shares[2], range(5), _invert)]
    return proxy, targets


def _digits(n_train: int, n_val: int, n_test: int, seed: int) -> Split:
    data = resize(load_digits_images(), SIZE)
    total = len(data)
    n_train, n_val = min(n_train, int(0.6 * total)), min(n_val, int(0.15 * total))
    n_test = min(n_test, total - n_train - n_val)
    fractions = (n_train / total, n_val / total, 1.0 - (n_train + n_val) / total)
    parts = split_indices(data.labels, seed, fractions)
    test = data.take(parts["test"])
    test = subset(test, n_test, seed + 1) if n_test < len(test) else test
    tr, va = data.take(parts["train"]), data.take(parts["val"])
    return Split("digits", tr.images, tr.labels, va.images, va.labels, test.images, test.labels)
