"""Chronological blocks of the MovieLens ratings as next-item sequences over item-ID tokens.

- Vocabulary: movies with at least `min_count` ratings (token = 1 + index in that list; 0 pads); ratings of rarer
  movies are dropped (the usual k-core filter on items).
- Blocks: the first `base_frac` of the interactions (by time) is block 0 (pretraining), the rest is cut into
  `incremental` blocks of equal size.
- Windows: a user's chronological token sequence is cut into windows of `history + 1` tokens (left-padded); a
  position is a target of block b when its interaction lies in block b and something precedes it. Training on block
  b uses its targets; evaluating on block b (a model trained through block b-1) ranks every target of b given up to
  `history` earlier items, and its leave-last-out cases are each user's last interaction in b.
- Users are split once into validation (tuning) and test users; a target's group is "returning" when its user rated
  something before block b and "new" otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.data.ratings import Ratings, check_known

PAD = 0
IGNORE = -100


@dataclass(frozen=True)
class Windows:
    """tokens [W, L] (0 pads), labels [W, L] (IGNORE off-target), and per target (row-major over labels != IGNORE):
    user, block, its position in the user's sequence, whether it is the user's last interaction in its block."""

    tokens: torch.Tensor
    labels: torch.Tensor
    target_user: torch.Tensor
    target_position: torch.Tensor
    target_last: torch.Tensor

    @property
    def num_targets(self) -> int:
        return int(self.target_user.numel())


@dataclass
class Sequences:
    """Per user: item tokens [n_u] and blocks [n_u], chronological."""

    tokens: list[torch.Tensor]
    blocks: list[torch.Tensor]
    num_items: int  # vocabulary size without the pad token
    num_blocks: int
    validation_users: torch.Tensor  # bool [num_users]
    block_starts: list[int]  # unix time of each block's first interaction

    @property
    def vocab_size(self) -> int:
        return self.num_items + 1

    def users_before(self, block: int) -> torch.Tensor:
        """bool [num_users]: rated something in a block < `block`."""
        return torch.tensor([bool((b < block).any()) for b in self.blocks])

    def active(self, block: int) -> torch.Tensor:
        return torch.tensor([bool((b == block).any()) for b in self.blocks])


def build_sequences(r: Ratings, min_count: int, base_frac: float, incremental: int, validation_frac: float,
                    split_seed: int = 0) -> Sequences:
    counts = torch.bincount(r.item, minlength=r.num_items)
    kept = torch.nonzero(counts >= min_count).flatten()
    token_of = torch.zeros(r.num_items, dtype=torch.long)
    token_of[kept] = torch.arange(1, kept.numel() + 1)
    keep = token_of[r.item] > 0
    user, item, time = r.user[keep], token_of[r.item[keep]], r.timestamp[keep]
    n = user.numel()
    base = int(base_frac * n)
    cuts = [0, base] + [base + (n - base) * k // incremental for k in range(1, incremental + 1)]
    block = torch.zeros(n, dtype=torch.long)
    for b in range(len(cuts) - 1):
        block[cuts[b] : cuts[b + 1]] = b
    order = torch.argsort(user, stable=True)  # stable: each user's interactions stay chronological
    user, item, block = user[order], item[order], block[order]
    sizes = torch.bincount(user, minlength=r.num_users).tolist()
    tokens, blocks = list(item.split(sizes)), list(block.split(sizes))
    g = torch.Generator().manual_seed(split_seed)
    validation = torch.rand(r.num_users, generator=g) < validation_frac
    return Sequences(tokens, blocks, int(kept.numel()), len(cuts) - 1, validation,
                     [int(time[cuts[b]]) for b in range(len(cuts) - 1)])


def block_windows(seqs: Sequences, block: int, history: int, users: torch.Tensor | None = None) -> Windows:
    """The windows holding every target of `block` (optionally of the users in the bool mask `users`)."""
    rows, labels, t_user, t_pos, t_last = [], [], [], [], []
    for u, (tok, blk) in enumerate(zip(seqs.tokens, seqs.blocks)):
        if users is not None and not bool(users[u]):
            continue
        positions = torch.nonzero((blk == block) & (torch.arange(tok.numel()) > 0)).flatten()
        if positions.numel() == 0:
            continue
        last_in_block = int(torch.nonzero(blk == block).flatten()[-1])
        # chunks of <= history targets, from the end, so the last target sees the full history window
        ends = list(range(positions.numel(), 0, -history))
        for end in reversed(ends):
            chunk = positions[max(0, end - history) : end]
            stop = int(chunk[-1]) + 1
            start = stop - (history + 1)
            window = tok[max(0, start) : stop]
            pad = history + 1 - window.numel()
            row = torch.cat([torch.full((pad,), PAD, dtype=torch.long), window])
            lab = torch.full((history + 1,), IGNORE, dtype=torch.long)
            cols = chunk - start
            lab[cols] = row[cols]
            rows.append(row)
            labels.append(lab)
            t_user.append(torch.full((chunk.numel(),), u, dtype=torch.long))
            t_pos.append(chunk)
            t_last.append(chunk == last_in_block)
    if not rows:
        empty = torch.zeros(0, history + 1, dtype=torch.long)
        z = torch.zeros(0, dtype=torch.long)
        return Windows(empty, empty.clone(), z, z.clone(), z.bool())
    return Windows(torch.stack(rows), torch.stack(labels), torch.cat(t_user), torch.cat(t_pos), torch.cat(t_last))


def seen_before(seqs: Sequences, users: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """bool [n, vocab]: the items each (user, position) target's user rated earlier (masked from its ranking)."""
    mask = torch.zeros(users.numel(), seqs.vocab_size, dtype=torch.bool)
    for u in users.unique().tolist():
        rows = torch.nonzero(users == u).flatten()
        tok = seqs.tokens[u]
        first = torch.full((seqs.vocab_size,), tok.numel(), dtype=torch.long)
        first.scatter_reduce_(0, tok, torch.arange(tok.numel()), reduce="amin")
        mask[rows] = first[None, :] < positions[rows, None]
    mask[:, PAD] = True
    return mask


def check_targets(seqs: Sequences, windows: Windows) -> None:
    """Evaluation data must only hold users and items the model knows (a clear error otherwise)."""
    items = windows.tokens[windows.tokens != PAD] - 1
    check_known(windows.target_user, items, len(seqs.tokens), seqs.num_items, "evaluation windows")
