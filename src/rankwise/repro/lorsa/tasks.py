"""Synthetic sequences with planted attention mechanisms for the toy transformer (card R1).

Vocabulary: 0 BOS, 1 M (copy-first marker), 2 K1, 3 Q1, 4 K2, 5 Q2 (key / query markers), 8..63 content. A sequence
of 64 tokens is BOS, then an early half holding a random segment S and the pairs (K1 v1), (K2 v2), then a late
half holding S again and the pairs (Q1 v1), (Q2 v2), (M x_1), all at random places among random content tokens.
Every planted mechanism needs the layer-1 previous-token information and a layer-2 lookup, so layer 2 (two heads)
must pack four attention units:

  0 induction   at a token of the second S, the next token is the one after its first occurrence;
  1 copy-first  at M, the next token is x_1 (the token after BOS);
  2 recall-1    at Q1, the next token is the one after K1;
  3 recall-2    at Q2, the next token is the one after K2.

`labels[b, t]` names the mechanism that predicts token t + 1 (-1: none).
"""

from __future__ import annotations

import numpy as np
import torch

BOS, M, K1, Q1, K2, Q2 = 0, 1, 2, 3, 4, 5
FIRST_CONTENT, VOCAB, SEQ = 8, 64, 64
MECHANISMS = ("induction", "copy-first", "recall-1", "recall-2")
SEGMENT = 8


def _half(rng: np.random.Generator, length: int, chunks: list[list[int]], tags: list[int]) -> tuple[list[int], list[int]]:
    """Chunks (with their tags) in random order among random content tokens, to `length` tokens; starts with content."""
    fill = length - sum(len(c) for c in chunks) - 1
    items = [("c", i) for i in range(len(chunks))] + [("f", None)] * fill
    order = rng.permutation(len(items))
    toks = [int(rng.integers(FIRST_CONTENT, VOCAB))]
    where = [-2]
    for j in order:
        kind, i = items[j]
        if kind == "f":
            toks.append(int(rng.integers(FIRST_CONTENT, VOCAB)))
            where.append(-2)
        else:
            toks.extend(chunks[i])
            where.extend([tags[i]] * len(chunks[i]))
    return toks, where


def planted_sequences(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n sequences -> (tokens [n, 64] int64, labels [n, 64] int64 in {-1, 0..3})."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((n, SEQ), dtype=np.int64)
    labels = np.full((n, SEQ), -1, dtype=np.int64)
    early_len = (SEQ - 1) // 2
    for b in range(n):
        seg = rng.integers(FIRST_CONTENT, VOCAB, SEGMENT).tolist()
        v1, v2 = rng.integers(FIRST_CONTENT, VOCAB, 2).tolist()
        early, _ = _half(rng, early_len, [seg, [K1, v1], [K2, v2]], [10, 11, 12])
        x1 = early[0]
        late, where = _half(rng, SEQ - 1 - early_len, [seg, [Q1, v1], [Q2, v2], [M, x1]], [0, 2, 3, 1])
        seq = [BOS] + early + late
        tokens[b] = seq
        base = 1 + early_len
        # The label sits on the query token: the one whose next token the mechanism predicts.
        seen: dict[int, int] = {}
        for j, tag in enumerate(where):
            t = base + j
            if tag == 0:
                seen[0] = seen.get(0, -1) + 1
                if seen[0] < SEGMENT - 1:
                    labels[b, t] = 0
            elif tag in (1, 2, 3) and seq[t] in (M, Q1, Q2):
                labels[b, t] = tag
    return torch.from_numpy(tokens), torch.from_numpy(labels)


def doubled_random(n: int, half: int, seed: int) -> torch.Tensor:
    """BOS + `half` distinct random content tokens + the same again: [n, 1 + 2 * half] (induction probes).

    Distinct within a half, so the previous occurrence of every second-half token is its copy in the first half:
    with repeats inside a half, "attend to the token after the previous occurrence" would point at random tokens.
    """
    g = torch.Generator().manual_seed(seed)
    n_content = VOCAB - FIRST_CONTENT
    if half > n_content:
        raise ValueError(f"a half of {half} distinct tokens needs at least that many content tokens ({n_content})")
    r = torch.stack([torch.randperm(n_content, generator=g)[:half] for _ in range(n)]) + FIRST_CONTENT
    return torch.cat([torch.full((n, 1), BOS), r, r], dim=1)
