"""Tolerances that follow from floating-point rounding, not from what one CPU happened to print.

Two computations of the same network that differ only in the order of their floating-point operations (an absorbed
vs an expanded attention, a factorized vs a dense weight, one kernel vs another) each carry a rounding error of
about `eps * |value|` per operation. Through `depth` layers whose inner products have `width` terms, the standard
probabilistic bound on accumulated rounding grows like `eps * |value| * sqrt(depth * width)`. `slack` covers the
constant in front (softmax, normalisation and residual amplification); a real bug (a wrong rotation, a missing
term, a transposed factor) shows up as an O(|value|) difference, orders of magnitude above the bound.
"""

from __future__ import annotations

import math

import torch


def network_tol(dtype: torch.dtype, magnitude: float, depth: int, width: int, slack: float = 64.0) -> float:
    """Absolute tolerance for two rounding-only-different evaluations of a `depth`-layer, `width`-wide network
    whose outputs have max |value| about `magnitude`."""
    return slack * torch.finfo(dtype).eps * max(magnitude, 1.0) * math.sqrt(depth * width)


def max_abs(t: torch.Tensor) -> float:
    return float(t.detach().abs().max())


def logits_tol(model: torch.nn.Module, reference_logits: torch.Tensor) -> float:
    """`network_tol` for a transformers causal LM: depth and width from its config, magnitude from the logits."""
    config = model.config
    dtype = reference_logits.dtype
    return network_tol(dtype, max_abs(reference_logits), config.num_hidden_layers, config.hidden_size)
