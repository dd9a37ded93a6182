"""Splitting a labelled training set across federated clients: label-skewed Dirichlet (non-IID) or IID.

Dirichlet(beta) over labels (Hsu et al. 2019): for each class, the shares of its examples going to each client are
drawn from Dir(beta * 1); small beta (0.1) gives clients dominated by one or two classes. A draw that leaves a client
with fewer than `min_size` examples is redrawn (a client needs at least one batch: the card's pitfall), up to a limit.
"""

from __future__ import annotations

import numpy as np
import torch

from rankwise.errors import InvalidInputError

MAX_DRAWS = 1000


def dirichlet_partition(labels: torch.Tensor, num_clients: int, beta: float, min_size: int = 1, seed: int = 0) -> list[torch.Tensor]:
    """Indices [n_i] of each client's examples (sorted, disjoint, covering all of `labels` [N])."""
    labels = torch.as_tensor(labels).reshape(-1)
    _check(labels.numel(), num_clients, min_size)
    if not beta > 0:
        raise InvalidInputError(f"the Dirichlet concentration beta must be positive, got {beta}")
    rng = np.random.default_rng(seed)
    y = labels.numpy()
    for _ in range(MAX_DRAWS):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for c in np.unique(y):
            idx = np.flatnonzero(y == c)
            rng.shuffle(idx)
            shares = rng.dirichlet(np.full(num_clients, beta))
            cuts = (np.cumsum(shares)[:-1] * idx.size).astype(int)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [torch.tensor(sorted(p), dtype=torch.long) for p in parts]
    raise InvalidInputError(f"{MAX_DRAWS} Dirichlet(beta={beta}) draws all left a client with fewer than {min_size} of the "
                            f"{labels.numel()} examples: use fewer clients, a larger beta or a smaller batch")


def iid_partition(num_examples: int, num_clients: int, min_size: int = 1, seed: int = 0) -> list[torch.Tensor]:
    """A random split into `num_clients` near-equal parts."""
    _check(num_examples, num_clients, min_size)
    perm = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed))
    return [p.sort().values for p in perm.tensor_split(num_clients)]


def _check(n: int, num_clients: int, min_size: int) -> None:
    if not isinstance(num_clients, int) or num_clients < 1:
        raise InvalidInputError(f"the number of clients must be a positive integer, got {num_clients!r}")
    if n < num_clients * min_size:
        raise InvalidInputError(f"{n} examples cannot give {num_clients} clients at least {min_size} each (one batch): "
                                "use fewer clients or a smaller batch")
