"""PALC at run time on a live causal LM: calibrated logits for a batch, and batched greedy decoding with the KV
cache where each step adds gamma * m(h_t) to the next-token logits.

The base model is run as it is (no hook, no change to its modules); its last hidden state is read from its output
(`output_hidden_states`, whose last entry is what the output layer sees: tested for Llama). The same loop decodes
the base model (module None or scale 0), so that a speed comparison differs only by the module's cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rankwise.errors import InvalidInputError


def calibrated_logits(model, module: nn.Module | None, input_ids: torch.Tensor,
                      attention_mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """[b, T] ids -> [b, T, V] logits l + scale * m(h) (the base's logits exactly when module is None or scale 0);
    gradients flow into the module only."""
    with torch.no_grad():  # the base is frozen: no gradient reaches its parameters, whatever their requires_grad
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=module is not None)
    if module is None or scale == 0:
        return out.logits
    return out.logits + scale * module(out.hidden_states[-1])


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [b, T], mask [b, T]) padded on the left, so that every row's next token is at T."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InvalidInputError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask


@torch.no_grad()
def greedy_decode(model, prompts: Sequence[Sequence[int]], max_new_tokens: int, module: nn.Module | None = None,
                  scale: float = 1.0, pad_id: int = 0, eos_id: int | None = None) -> list[list[int]]:
    """Greedy continuations (token ids, at most `max_new_tokens` each, cut after `eos_id`) of a batch of prompts,
    under base + scale * module. Positions follow each row's own tokens (left padding does not shift them)."""
    if max_new_tokens < 1:
        raise InvalidInputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if module is not None:
        module.eval()
    use_module = module is not None and scale != 0
    ids, mask = left_pad(prompts, pad_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                output_hidden_states=use_module)
    new = torch.empty((ids.shape[0], max_new_tokens), dtype=torch.long)
    for step in range(max_new_tokens):
        logits = out.logits[:, -1]
        if use_module:
            logits = logits + scale * module(out.hidden_states[-1][:, -1])
        token = logits.argmax(-1)
        new[:, step] = token
        if step + 1 == max_new_tokens:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=positions,
                    cache=out.cache, use_cache=True, output_hidden_states=use_module)
    result = []
    for row in new.tolist():
        if eos_id is not None and eos_id in row:
            row = row[:row.index(eos_id) + 1]
        result.append(row)
    return result
