"""PALC's preference loss: -log sigmoid(l(y_w | x) - l(y_l | x)), no reference model and no beta, where l is the
log-probability of the response's tokens under the calibrated model, averaged over them (the authors' code; the
paper writes the sum, an option here: the sum favours short responses).

Every function takes flat rows (response positions only, `features.CachedSequences`): the prompt never enters the
loss, by construction."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_logprobs(base_logits: torch.Tensor, offsets: torch.Tensor | None, labels: torch.Tensor,
                   scale: float = 1.0) -> torch.Tensor:
    """log softmax(l + scale * m)[label] per row: base_logits, offsets [n, V], labels [n] -> [n] (float32)."""
    logits = base_logits.float()
    if offsets is not None and scale != 0:
        logits = logits + scale * offsets
    chosen = logits.gather(1, labels[:, None]).squeeze(1)
    return chosen - torch.logsumexp(logits, dim=1)


def sequence_logprobs(per_token: torch.Tensor, segment: torch.Tensor, n_sequences: int, mean: bool = True) -> torch.Tensor:
    """Sum (or mean) of per-token log-probabilities by sequence: [n], segment ids [n] -> [n_sequences]."""
    total = torch.zeros(n_sequences, dtype=per_token.dtype).index_add(0, segment, per_token)
    if not mean:
        return total
    counts = torch.zeros(n_sequences, dtype=per_token.dtype).index_add(0, segment, torch.ones_like(per_token))
    return total / counts


def preference_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """mean over pairs of -log sigmoid(chosen - rejected); log 2 when they are equal."""
    return -F.logsigmoid(chosen - rejected).mean()
