"""Perplexity over non-overlapping token windows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError, NumericalError


@dataclass(frozen=True)
class PerplexityResult:
    tokens: int  # predicted tokens counted (each window of T tokens predicts T - 1)
    mean_nll: float  # nats per token
    perplexity: float

    def __str__(self) -> str:
        return f"perplexity {self.perplexity:.3f} (mean NLL {self.mean_nll:.4f} nats over {self.tokens} tokens)"


def logits_of(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] from a `transformers` causal LM or a plain module returning logits."""
    out = model(input_ids=input_ids) if hasattr(model, "config") else model(input_ids)
    logits = out.logits if hasattr(out, "logits") else out
    if not isinstance(logits, torch.Tensor):
        raise InvalidInputError(f"{type(model).__name__} returns {type(out).__name__}, not logits: perplexity needs a causal language model")
    return logits


def check_causal_lm(model: nn.Module) -> None:
    """Refuse a transformers model without a language-model head (an encoder such as MiniLM) before any forward."""
    heads = getattr(model, "get_output_embeddings", None)
    if hasattr(model, "config") and callable(heads) and heads() is None:
        raise InvalidInputError(
            f"{type(model).__name__} has no language-model head (an encoder?): perplexity needs a causal language model, "
            "e.g. smollm2-135m"
        )


@torch.no_grad()
def perplexity(model: nn.Module, windows: torch.Tensor, batch_size: int = 4, desc: str = "perplexity") -> PerplexityResult:
    """exp(mean next-token NLL) over windows [W, T]; each window is scored independently (no carried context).

    The NLL is summed in float64 so the mean does not depend on batch size.
    """
    if windows.dim() != 2 or windows.size(1) < 2 or windows.size(0) == 0:
        raise InvalidInputError(f"windows must be a non-empty [W, T] tensor with T >= 2, got shape {tuple(windows.shape)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    check_causal_lm(model)
    was_training = model.training
    model.eval()
    total_nll = 0.0
    tokens = 0
    try:
        for start in progress(range(0, windows.size(0), batch_size), desc=desc):
            batch = windows[start : start + batch_size]
            logits = logits_of(model, batch)[:, :-1].float()
            targets = batch[:, 1:]
            nll = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum")
            if not torch.isfinite(nll):
                raise NumericalError(f"the model produced non-finite logits on windows {start}..{start + batch.size(0) - 1}")
            total_nll += float(nll.double())
            tokens += targets.numel()
    finally:
        model.train(was_training)
    mean = total_nll / tokens
    return PerplexityResult(tokens=tokens, mean_nll=mean, perplexity=math.exp(mean))
