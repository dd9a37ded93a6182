"""Batch-norm statistics during sparse fine-tuning: frozen (eval mode) in every arm.

The card leaves BN open ("keep eval mode"; whether the affine parameters train is not said). Here the running mean
and variance stay the pretrained ones (eval mode at every micro-batch, whatever the loop sets), and the affine
parameters are frozen with every other parameter that is not a selected channel or the head. Updating statistics
would change every later layer's input, a change the channel budget does not count."""

from __future__ import annotations

from torch import nn

NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def batch_norms(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, NORMS)]


def freeze_statistics(norms: list[nn.Module]) -> None:
    for m in norms:
        m.eval()
