"""core.entropy_losses against their definitions in float64."""

import math

import torch

from rankwise.core.entropy_losses import entropy, information_maximization


def test_entropy_of_uniform_and_peaked_rows():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    h = entropy(logits)
    assert abs(float(h[0]) - math.log(4)) < 1e-15 and float(h[1]) < 1e-40


def test_information_maximization_equals_its_definition():
    logits = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = logits.softmax(1)
    mean_p = p.mean(0)
    expected = -(p * p.log()).sum(1).mean() + (mean_p * mean_p.log()).sum()
    assert abs(float(information_maximization(logits) - expected)) < 1e-14
    # its minimum: confident rows spread evenly over the classes
    confident = torch.eye(5, dtype=torch.float64) * 200
    assert abs(float(information_maximization(confident)) + math.log(5)) < 1e-12
