"""Concept groups: the K groups (shape, colour, ...), the values of each, and one text embedding per value.

A concept bottleneck scores prototype k only against the text embeddings tau_{k, c} of its own group k (IVQ-CBM), so
the groups' structure is part of the model: `ConceptGroups` holds it and refuses inconsistent input before any work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class ConceptGroups:
    """`names[k]` the group, `values[k]` its candidate values, `embeddings[k]` float [len(values[k]), E] their text
    embeddings (any encoder; they are L2-normalised on use)."""

    names: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]
    embeddings: tuple[torch.Tensor, ...]

    def __post_init__(self) -> None:
        if not self.names:
            raise InvalidInputError("a concept bottleneck needs at least one concept group")
        if len(self.values) != len(self.names):
            raise InvalidInputError(f"{len(self.names)} group names but {len(self.values)} value lists")
        for name, vals in zip(self.names, self.values):
            if len(vals) == 0:
                raise InvalidInputError(f"concept group {name!r} has no values: give every group at least one value")
        if len(self.embeddings) != len(self.names):
            raise InvalidInputError(f"{len(self.names)} concept groups (= K Magnet queries) but text embeddings for "
                                    f"{len(self.embeddings)}: pass one [n_k, E] tensor per group")
        dims = set()
        for name, vals, emb in zip(self.names, self.values, self.embeddings):
            if emb.dim() != 2 or emb.shape[0] != len(vals):
                raise InvalidInputError(f"group {name!r}: text embeddings must be [{len(vals)}, E] (one per value), "
                                        f"got {tuple(emb.shape)}")
            if not emb.is_floating_point() or not bool(torch.isfinite(emb).all()):
                raise InvalidInputError(f"group {name!r}: text embeddings must be finite floats")
            dims.add(emb.shape[1])
        if len(dims) != 1:
            raise InvalidInputError(f"every group's text embeddings need the same width, got {sorted(dims)}")

    @property
    def num_groups(self) -> int:
        return len(self.names)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.values)

    @property
    def num_values(self) -> int:
        return sum(self.sizes)

    @property
    def text_dim(self) -> int:
        return int(self.embeddings[0].shape[1])

    def check_labels(self, concepts: torch.Tensor, n: int, what: str = "concept labels") -> None:
        """concepts int64 [n, K], entry k in 0..len(values[k]) - 1."""
        if concepts.dtype != torch.int64 or concepts.shape != (n, self.num_groups):
            raise InvalidInputError(f"{what} must be int64 [{n}, {self.num_groups}] (one value index per group), got "
                                    f"{concepts.dtype} {tuple(concepts.shape)}")
        sizes = torch.tensor(self.sizes)
        if bool((concepts < 0).any()) or bool((concepts >= sizes).any()):
            raise InvalidInputError(f"{what}: group k's index must be in 0..{[s - 1 for s in self.sizes]}[k]")
