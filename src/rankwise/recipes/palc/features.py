"""The frozen model read once: for each (prompt, response) its last hidden states and base logits at the positions
that predict the response's tokens, so that training PALC (or a steering vector) touches only the small module.

Layout, flat over every cached sequence: `hidden` [N, H] float32, `base_logits` [N, V] (float16 by default: a 135M
model's logits are below ~40 in magnitude, where float16's step is <= 2^-5, far under the margins that decide a
preference; float32 where exactness matters), `labels` [N] (the token each position predicts), and per sequence the
slice [start, end) of its rows. A preference pair is two sequences (chosen, rejected) sharing the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


@dataclass
class CachedSequences:
    """What the frozen model computed on each (prompt, response), response positions only."""

    hidden: torch.Tensor  # [N, H]
    base_logits: torch.Tensor  # [N, V]
    labels: torch.Tensor  # [N] long
    starts: torch.Tensor  # [S] long
    ends: torch.Tensor  # [S] long

    def __len__(self) -> int:
        return int(self.starts.numel())

    def rows(self, sequences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row indices [n], the position of each row's sequence within `sequences` [n]) for a batch of sequences."""
        lengths = self.ends[sequences] - self.starts[sequences]
        segment = torch.repeat_interleave(torch.arange(len(sequences)), lengths)
        first = torch.repeat_interleave(self.starts[sequences], lengths)
        within = torch.arange(int(lengths.sum())) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
        return first + within, segment


@dataclass
class CachedPairs:
    """Sequences 2i (chosen) and 2i + 1 (rejected) of `sequences` are pair i."""

    sequences: CachedSequences

    def __len__(self) -> int:
        return len(self.sequences) // 2


def _response_ids(tokenizer, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """Prompt ids and response ids, tokenised apart so that the boundary is exact (a response starting with a
    space keeps its own tokens whatever the prompt ends with)."""
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r = tokenizer(response, add_special_tokens=False)["input_ids"]
    return p, r


@torch.no_grad()
def cache_sequences(model, tokenizer, items: Sequence[tuple[str, str]], batch_size: int = 16,
                    logits_dtype: torch.dtype = torch.float16) -> CachedSequences:
    """Run the frozen causal LM once over each (prompt, response) and keep its response positions.

    The prompt must be non-empty (the first response token is predicted from the prompt's last position) and the
    response must have at least one token. Batches are right-padded; padding rows are never kept.
    """
    if not items:
        raise InvalidInputError("no (prompt, response) items to cache")
    encoded = []
    for i, (prompt, response) in enumerate(items):
        p, r = _response_ids(tokenizer, prompt, response)
        if not p or not r:
            raise InvalidInputError(f"item {i}: the prompt and the response must each have at least one token")
        encoded.append((p, r))
    out_layer = model.get_output_embeddings()
    if out_layer is None:
        raise InvalidInputError("the model has no output layer (get_output_embeddings() is None): not a causal LM")
    hidden, logits, labels, lengths = [], [], [], []
    was_training = model.training
    model.eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for b in range(0, len(encoded), batch_size):
        chunk = encoded[b:b + batch_size]
        width = max(len(p) + len(r) for p, r in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, (p, r) in enumerate(chunk):
            seq = p + r
            ids[j, :len(seq)] = torch.tensor(seq)
            mask[j, :len(seq)] = 1
        last = _last_hidden(model, ids, mask)
        for j, (p, r) in enumerate(chunk):
            positions = torch.arange(len(p) - 1, len(p) + len(r) - 1)
            h = last[j, positions]
            hidden.append(h.float())
            logits.append(out_layer(h).to(logits_dtype))  # the output layer on the kept rows only
            labels.append(torch.tensor(r, dtype=torch.long))
            lengths.append(len(r))
    model.train(was_training)
    lengths_t = torch.tensor(lengths)
    ends = torch.cumsum(lengths_t, 0)
    return CachedSequences(torch.cat(hidden), torch.cat(logits), torch.cat(labels), ends - lengths_t, ends)


def _last_hidden(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The last hidden states [b, T, H], without computing the logits of every position where the model allows it
    (transformers' `logits_to_keep`): the output layer is most of a small model's cost per token."""
    try:
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1)
    except TypeError:  # a model without the argument: its full logits are computed and dropped
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    return out.hidden_states[-1]


def cache_pairs(model, tokenizer, pairs: Sequence[PreferencePair], batch_size: int = 16,
                logits_dtype: torch.dtype = torch.float16) -> CachedPairs:
    if not pairs:
        raise InvalidInputError("no preference pairs")
    items = [(p.prompt, r) for p in pairs for r in (p.chosen, p.rejected)]
    return CachedPairs(cache_sequences(model, tokenizer, items, batch_size, logits_dtype))
