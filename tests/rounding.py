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


def _config_of(model: torch.nn.Module):
    """The transformers config of `model` or of the model it wraps (a classifier, a PEFT or rankwise wrapper)."""
    seen = model
    for _ in range(6):
        config = getattr(seen, "config", None)
        if config is not None and hasattr(config, "num_hidden_layers"):
            return config
        inner = next((getattr(seen, a) for a in ("model", "base", "base_model", "encoder_model") if isinstance(getattr(seen, a, None), torch.nn.Module)), None)
        if inner is None:
            break
        seen = inner
    raise AssertionError(f"no transformers config found in {type(model).__name__}: pass depth and width")


def assert_rounding_close(actual: torch.Tensor, expected: torch.Tensor, model: torch.nn.Module) -> None:
    """`actual` equals `expected` up to the rounding of two evaluations of `model` that differ only in operation
    order (ours vs peft's adapter arithmetic): `network_tol` from its depth, width and the outputs' magnitude."""
    config = _config_of(model)
    tol = network_tol(expected.dtype, max_abs(expected), config.num_hidden_layers, config.hidden_size)
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol)


def product_tol(dtype: torch.dtype, *factors: torch.Tensor, slack: float = 2.0) -> float:
    """Absolute tolerance for a `dtype` evaluation of the chained product factors[0] @ factors[1] @ ... (in any
    association, with the factors themselves rounded to `dtype`) against the exact one, e.g. a float32 forward
    against a float64 reference. Higham's worst-case bound: each entry is off by at most n * u * (|F0| @ |F1| @ ...)
    (first order), with u = eps / 2 and n the roundings on its path (the inner dimensions, plus one per factor);
    `slack` multiplies n * u. It holds on any CPU and for any summation order; cancellation inside the product does
    not shrink it, and a wrong factor (a transpose, a missing term) moves the result by O(|product|)."""
    chain = factors[0].detach().double().abs()
    roundings = len(factors)
    for f in factors[1:]:
        roundings += chain.shape[-1]
        chain = chain @ f.detach().double().abs()
    return slack * roundings * torch.finfo(dtype).eps / 2 * float(chain.max())
