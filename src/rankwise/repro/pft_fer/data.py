"""The faces world and the source model of the PFT reproduction.

- One population of 50 rendered subjects (`rankwise.data.faces`, drawn from the run's seed): subjects 0-29 train the
  source model and stage 1 (the paper's 30 source subjects), 30-39 are *validation* subjects (held-out source-like
  people treated as targets: every arm is tuned on them), 40-49 are the 10 evaluated target subjects (never used
  for tuning). Each repetition seed re-renders every frame (new expressions, jitter
  and noise) and retrains the source model from a new initialisation, so all arms of a seed share one world.
- Per validation / target subject: `adapt` neutral frames (what stage 2 and every baseline may see) and a separate
  labelled test set of `test` frames per class (neutral and expressive), rendered from another seed.
- Source model (F -> B -> C, the card's shape at toy size): F = three stride-2 conv + BN + ReLU blocks (12/24/48
  channels) and global average pooling (D = 48), B = Linear(48, 24) + BatchNorm1d, C = a weight-normalised
  Linear(24, 2); Adam on the source subjects' labelled frames with the one `fit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.apps.vision.pft import SourceModel, expression_metrics
from rankwise.core.training import fit
from rankwise.data.faces import NEUTRAL, FaceSet, render_faces, sample_subjects

SOURCE = tuple(range(30))
VALIDATION = tuple(range(30, 40))
TARGETS = tuple(range(40, 50))


@dataclass(frozen=True)
class Person:
    """One validation or target subject: neutral adaptation frames [n, 1, 48, 48] and a labelled test set."""

    subject: int
    adapt: torch.Tensor
    test: FaceSet


@dataclass(frozen=True)
class World:
    source: FaceSet
    validation: list[Person]
    targets: list[Person]


def make_world(population_seed: int, frames_seed: int, per_class_source: int, adapt: int, test: int) -> World:
    subjects = sample_subjects(len(SOURCE) + len(VALIDATION) + len(TARGETS), population_seed)
    src = render_faces([subjects[k] for k in SOURCE], per_class_source, frames_seed, subject_ids=list(SOURCE))

    def person(k: int) -> Person:
        neutral = render_faces([subjects[k]], adapt, frames_seed + 50_000, labels=(NEUTRAL,), subject_ids=[k])
        return Person(k, neutral.images, render_faces([subjects[k]], test, frames_seed + 90_000, subject_ids=[k]))

    return World(src, [person(k) for k in VALIDATION], [person(k) for k in TARGETS])


def build_source_model(seed: int) -> SourceModel:
    torch.manual_seed(seed)

    def block(i: int, o: int, k: int) -> list[nn.Module]:
        return [nn.Conv2d(i, o, k, 2, k // 2), nn.BatchNorm2d(o), nn.ReLU()]

    features = nn.Sequential(*block(1, 12, 5), *block(12, 24, 3), *block(24, 48, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    bottleneck = nn.Sequential(nn.Linear(48, 24), nn.BatchNorm1d(24))
    classifier = nn.utils.parametrizations.weight_norm(nn.Linear(24, 2))
    return SourceModel(features, bottleneck, classifier)


def train_source_model(data: FaceSet, seed: int, steps: int, batch: int = 64, lr: float = 3e-3) -> tuple[SourceModel, float]:
    """(the trained model in eval mode, its accuracy in points on a held-out 15% of the source frames)."""
    model = build_source_model(seed)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(data), generator=g)
    n_hold = max(1, len(data) * 15 // 100)
    held, train = data.take(order[:n_hold]), data.take(order[n_hold:])

    def loss_at(step: int) -> torch.Tensor:
        idx = torch.randint(0, len(train), (batch,), generator=g)
        return F.cross_entropy(model(train.images[idx]), train.labels[idx])

    model.train()
    # Cosine decay to 0: with a constant rate the last step's noise decided the held-out accuracy (77-97% by seed).
    fit(model, loss_at, steps, torch.optim.Adam(model.parameters(), lr=lr),
        schedule=lambda step: lr * 0.5 * (1 + math.cos(math.pi * step / steps)))
    model.eval()
    return model, expression_metrics(model, held.images, held.labels)["accuracy"]
