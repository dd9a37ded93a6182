"""The streams and the source model of the EMAC reproduction (Fashion-MNIST stand-in, 14x14 grey).

- Source model: SmallResNet (3x3 stem, one basic block per stage at 16/32/64 channels, batch norm, feature dim
  D = 64 > C = 6, its linear head on the raw pooled features) pretrained here on the clean images of classes 0-5
  (T-shirt, trouser, pullover, dress, coat, sandal) of Fashion-MNIST's train part, cached
  (`rankwise.models.vision.pretrained_backbone`); at smoke, a seeded random one of the same shape. A head on
  L2-normalised features (the card's suggestion) was tried on the validation stream while designing this: its
  energy split was worse (X_old pseudo-label error 57% vs 29%, source H-score 47 vs 57), so the plain head stays.
- A stream: four domains arriving in sequence (gaussian noise, blur, contrast inversion, affine, severity 3), each
  `per_domain` images drawn stratified from all ten classes (about 60% known, 40% new: shirt, sneaker, bag, ankle
  boot), shuffled within its domain; oracle labels are the class for 0-5 and UNKNOWN (-1) for 6-9.
- The evaluated stream of seed s comes from the official test part (its draw, order and corruption noise from s);
  the validation stream (tuning only) from train-part images the backbone never saw, with its own seed: different
  images, never the evaluated ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.data.vision import ImageSet, corrupt, load_fashion_mnist, resize, subset

KNOWN = tuple(range(6))
DOMAINS = ("gaussian_noise", "blur", "contrast_inversion", "affine")
SEVERITY = 3
SIZE = 14
UNKNOWN = -1
VALIDATION_SEED = 10_007


@dataclass(frozen=True)
class Stream:
    """images [N, 1, 14, 14] in [0, 1], oracle labels [N] (0..5 or UNKNOWN), domain index [N] (into DOMAINS)."""

    name: str
    images: torch.Tensor
    oracle: torch.Tensor
    domain: torch.Tensor


def source_recipe():
    """The source pretraining: SmallResNet with one basic block per stage on 12,000 clean train-part images of
    classes 0-5 at 14x14, 3 epochs (cached by `pretrained_backbone`)."""
    from rankwise.models.vision import BackboneRecipe

    return BackboneRecipe(name="resnet-small-fmnist-0to5", architecture="resnet-small", model={"blocks_per_stage": 1},
                          classes=KNOWN, image_size=SIZE, num_train=12_000, num_eval=1_200, epochs=3, lr=2e-3,
                          weight_decay=1e-4)


def source_model(pretrained: bool, seed: int):
    """(model, held-out accuracy in points or None, Fashion-MNIST train indices it saw)."""
    if not pretrained:
        from rankwise.models.vision import SmallResNet

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return SmallResNet(num_classes=len(KNOWN), blocks_per_stage=1).eval(), None, torch.zeros(0, dtype=torch.long)
    from rankwise.models.vision import pretrained_backbone

    bb = pretrained_backbone(source_recipe())
    return bb.module, 100.0 * bb.held_out_accuracy, torch.cat([bb.train_indices, bb.eval_indices])


def _stream(name: str, pool: ImageSet, per_domain: int, seed: int) -> Stream:
    images, oracle, domain = [], [], []
    for k, corruption in enumerate(DOMAINS):
        part = subset(pool, per_domain, seed * 31 + k)
        order = torch.randperm(len(part), generator=torch.Generator().manual_seed(seed * 31 + k + 7))
        part = resize(corrupt(part.take(order), corruption, SEVERITY, seed * 31 + k), SIZE)
        images.append(part.images)
        oracle.append(torch.where(part.labels < len(KNOWN), part.labels, torch.full_like(part.labels, UNKNOWN)))
        domain.append(torch.full((len(part),), k, dtype=torch.int64))
    return Stream(name, torch.cat(images), torch.cat(oracle), torch.cat(domain))


def evaluated_stream(per_domain: int, seed: int) -> Stream:
    return _stream(f"test-stream-seed{seed}", load_fashion_mnist("test"), per_domain, seed)


def validation_stream(per_domain: int, excluded: torch.Tensor) -> Stream:
    train = load_fashion_mnist("train")
    free = torch.ones(len(train), dtype=torch.bool)
    free[excluded] = False
    return _stream("validation-stream", train.take(free), per_domain, VALIDATION_SEED)
