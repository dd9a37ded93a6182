"""Analytic memory and FLOPs of one training step of a linear layer, as the paper counts them.

Memory is in numbers (multiply by the element size for bytes), per layer, for an input [B, N, I]:
- activations: what the backward keeps of the input -- B N I for backprop (and LoRA), the Tucker core and factors
  r0 r1 r2 + B r0 + N r1 + I r2 for ASI (LoRA also keeps its rank-r intermediate, B N r);
- weights: the weight the step computes with -- O I (+ O bias) dense, K (O + I) (+ O) for L and R (the paper counts
  only these, also for its dense-master variant, which holds O I more: reported apart as `dense_master`);
  LoRA: the frozen O I (+ O) and its r (O + I);
- gradients: one number per trained number.

FLOPs count a multiply-add as 2, per step: the forward, the backward (input and weight gradients), the compression
(ASI's power step and core, once per step) and the WSI refresh (once per optimizer step). Vanilla: forward 2 T I O
and backward 4 T I O with T = B N tokens.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearGeometry:
    """One linear layer's shape and form: `weights` in ("vanilla", "lora", "factored", "master", "dense"),
    `activations` in ("exact", "tucker"); `rank` K (low-rank forms) or the LoRA rank; Tucker `activation_ranks`."""

    out_features: int
    in_features: int
    bias: bool
    weights: str
    activations: str = "exact"
    rank: int = 0
    activation_ranks: tuple[int, int, int] | None = None


def _tucker(b: int, n: int, d: int, ranks: tuple[int, int, int]) -> int:
    r0, r1, r2 = min(ranks[0], b), min(ranks[1], n), min(ranks[2], d)
    return r0 * r1 * r2 + b * r0 + n * r1 + d * r2


def memory_numel(g: LinearGeometry, batch: int, tokens: int) -> dict[str, int]:
    """{"activations", "weights", "gradients", "dense_master"} in numbers for an input [batch, tokens, in]."""
    o, i, k, bias = g.out_features, g.in_features, g.rank, int(g.bias) * g.out_features
    if g.activations == "tucker":
        if g.activation_ranks is None:
            raise ValueError("the Tucker ranks are not known yet (they are fixed on the first training batch)")
        acts = _tucker(batch, tokens, i, g.activation_ranks)
    else:
        acts = batch * tokens * i
    master = 0
    if g.weights == "lora":
        acts += batch * tokens * k
        weights, grads = o * i + bias + k * (o + i), k * (o + i)
    elif g.weights in ("factored", "master"):
        weights = k * (o + i) + bias
        grads = weights if g.weights == "factored" else o * i + bias
        master = o * i if g.weights == "master" else 0
    else:  # vanilla, dense
        weights = grads = o * i + bias
    return {"activations": acts, "weights": weights, "gradients": grads, "dense_master": master}


def training_flops(g: LinearGeometry, batch: int, tokens: int) -> dict[str, int]:
    """{"forward", "backward", "compression", "refresh"} FLOPs of one step for an input [batch, tokens, in]."""
    o, i, k, t = g.out_features, g.in_features, g.rank, batch * tokens
    low_rank = g.weights in ("factored", "master")
    forward = 2 * t * k * (i + o) if low_rank else 2 * t * i * o
    if g.weights == "lora":
        forward += 2 * t * k * (i + o)
    grad_input = forward  # the transposed products
    if g.activations == "tucker":
        r0, r1, r2 = (min(r, d) for r, d in zip(g.activation_ranks, (batch, tokens, i)))
        # gradient_against: batch mode, token mode, feature contraction -> M [O, r2]
        grad_weight = 2 * (t * o * r0 + r0 * r1 * r2 * tokens + tokens * o * r0 * r2)
        # then G R^T and L^T G for the factors (R U_2, M (R U_2)^T, L^T M, (L^T M) U_2^T), or G = M U_2^T
        grad_weight += 4 * r2 * k * (i + o) if g.weights == "factored" else 2 * o * r2 * i
        numel = t * i
        compression = sum(4 * numel * r + 4 * d * r * r for r, d in zip((r0, r1, r2), (batch, tokens, i)))
        compression += 2 * (numel * r0 + r0 * tokens * i * r1 + r0 * r1 * i * r2)  # the core
    else:
        grad_weight = 2 * t * o * i if g.weights != "factored" else 2 * t * k * (i + o) + 2 * t * i * k
        if g.weights == "lora":
            grad_weight = 2 * t * k * (i + o)  # only the adapter is trained (the frozen W needs no gradient)
        compression = 0
    if g.weights == "factored":
        grad_weight += 2 * k * k * (o + i) + 2 * k ** 3  # the tangent split (K x K pseudo-inverse)
        refresh = 6 * k * k * (o + i) + 8 * o * k * k
    elif g.weights == "master":
        refresh = 6 * o * i * k + 4 * o * k * k
    else:
        refresh = 0
    return {"forward": forward, "backward": grad_input + grad_weight, "compression": compression, "refresh": refresh}
