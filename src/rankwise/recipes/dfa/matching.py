"""Feedback-weight matching (FWM; card dfa-feedback-matching.md, Def. 3.4 / 3.5, Eq. 6 / 7): the card's
least-squares reading, since the authors' solver (eai-lab/FeedbackWeightMatching) could not be retrieved.

A chain of weights W_1 .. W_L ([out, in] each, W_L the output layer [n_L, n_{L-1}], in_features of W_l equal to
out_features of W_{l-1}) and feedback matrices F_1 .. F_{L-1} (F_l [n_l, n_L]: the output error e [n_L] reaches
layer l as F_l e). "Strong weight alignment" is W_l ∝ F_l F_{l-1}ᵀ for 1 < l < L and W_L ∝ F_{L-1}ᵀ.

- feedback matching builds F̄ top-down: F̄_{L-1} = W_Lᵀ, then F̄_{l-1} = (F̄_l⁺ W_l)ᵀ for l = L-1 .. 2 (the
  least-squares solution of F̄_l X = W_l, `torch.linalg.lstsq`, rcond 1e-6, in float64);
- weight matching re-initialises the middle weights W̄_l = F̄_l F̄_{l-1}ᵀ (= P_l W_l with P_l = F̄_l F̄_l⁺ the
  projector onto the n_L-dimensional column space of F̄_l); W_1 and W_L are kept.

Indices below are 0-based: `weights[i]` is W_{i+1}, `feedbacks[i]` is F_{i+1}.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rankwise.errors import InvalidInputError

RCOND = 1e-6  # relative cut-off of the pseudo-inverse (the card's value)


def check_chain(weights: Sequence[torch.Tensor]) -> None:
    """InvalidInputError unless `weights` is a chain of >= 2 matrices [out, in] with in(W_{l+1}) = out(W_l)."""
    if len(weights) < 2:
        raise InvalidInputError(f"feedback matching needs at least one hidden layer below the output layer, got "
                                f"{len(weights)} weight(s)")
    for i, w in enumerate(weights):
        if w.dim() != 2:
            raise InvalidInputError(f"weight {i} must be a matrix [out, in], got shape {tuple(w.shape)}")
        if i and w.shape[1] != weights[i - 1].shape[0]:
            raise InvalidInputError(f"weights {i - 1} -> {i} do not chain: in_features {w.shape[1]} != the previous "
                                    f"layer's out_features {weights[i - 1].shape[0]}")


def feedback_matching(weights: Sequence[torch.Tensor], rcond: float = RCOND) -> list[torch.Tensor]:
    """F̄_1 .. F̄_{L-1} ([n_l, n_L] each, in the weights' dtype) from the chain W_1 .. W_L, top-down by least
    squares. W_1 enters only through its shape (the layer under it is unconstrained)."""
    check_chain(weights)
    dtype = weights[-1].dtype
    w64 = [w.detach().to(torch.float64) for w in weights]
    feedbacks: list[torch.Tensor] = [torch.empty(0)] * (len(weights) - 1)
    feedbacks[-1] = w64[-1].T.clone()  # F̄_{L-1} = W_Lᵀ exactly
    for i in range(len(weights) - 2, 0, -1):  # W_{i+1}: F̄_i = (F̄_{i+1}⁺ W_{i+1})ᵀ
        # gelsd: the SVD-based driver, the one that honours rcond on the CPU.
        solution = torch.linalg.lstsq(feedbacks[i], w64[i], rcond=rcond, driver="gelsd").solution  # [n_L, n_i]
        feedbacks[i - 1] = solution.T.contiguous()
    return [f.to(dtype) for f in feedbacks]


def weight_matching(weights: Sequence[torch.Tensor], feedbacks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """W̄_1 .. W̄_L: W̄_l = F̄_l F̄_{l-1}ᵀ for the middle layers (computed in float64), W_1 and W_L unchanged."""
    check_chain(weights)
    if len(feedbacks) != len(weights) - 1:
        raise InvalidInputError(f"{len(weights)} weights need {len(weights) - 1} feedback matrices, got {len(feedbacks)}")
    out = [weights[0].detach().clone()]
    for i in range(1, len(weights) - 1):
        product = feedbacks[i].to(torch.float64) @ feedbacks[i - 1].to(torch.float64).T
        if product.shape != weights[i].shape:
            raise InvalidInputError(f"F_{i + 1} F_{i}ᵀ has shape {tuple(product.shape)}, weight {i} {tuple(weights[i].shape)}")
        out.append(product.to(weights[i].dtype))
    out.append(weights[-1].detach().clone())
    return out


def projection_form(weight: torch.Tensor, feedback: torch.Tensor, rcond: float = RCOND) -> torch.Tensor:
    """P W with P = F F⁺ ([n, n], the projector onto F's column space), in float64 then the weight's dtype: what
    weight matching gives a middle layer when F̄ came from least squares (a cross-check of `weight_matching`)."""
    f = feedback.detach().to(torch.float64)
    projector = f @ torch.linalg.pinv(f, rtol=rcond)
    return (projector @ weight.detach().to(torch.float64)).to(weight.dtype)


def random_feedback(out_features: int, num_outputs: int, generator: torch.Generator,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A fixed random feedback matrix F [out_features, num_outputs] ~ N(0, 1/num_outputs) (the card's DFA default)."""
    return torch.randn(out_features, num_outputs, generator=generator, dtype=torch.float64).div_(num_outputs**0.5).to(dtype)
