"""A Safe-LoRA-style post-hoc defence: project each trained LoRA delta with a fixed per-layer projector.

Safe LoRA (Hsu et al., NeurIPS 2024) builds, per layer, a projector from the aligned-minus-unaligned weight
difference and, after fine-tuning, replaces the LoRA update of every layer whose update is too far from that
subspace (cosine similarity below a threshold) by its projection. We implement the same recipe with the projector
GuardSpace's reproduction can build without an unaligned checkpoint (none ships offline for SmolLM2): the null space
of the protected inputs' second moment, P = Q^T Q with Q [k, in] orthonormal rows (`guardspace_split.null_space_basis`).
It acts on the input side, as GuardSpace's does, so the difference between the two defences is *when* the
projection happens (after training here, during training in GuardSpace), not what it protects.

For an orthogonal projector, <dW, dW P> / (||dW|| ||dW P||) = ||dW P|| / ||dW||, the similarity Safe LoRA thresholds.
With `threshold=1.0` every layer whose update is not already inside range(P) is projected.
A LoRA delta s B A [out, in] becomes s B (A P): still a rank-r LoRA of the same shape, so it saves and merges as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from rankwise.adapters.lora import LoraAdapter
from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class ProjectionRecord:
    """Per layer: Safe LoRA's similarity ||dW P|| / ||dW|| before projecting, and whether the layer was projected."""

    similarity: float
    projected: bool


@torch.no_grad()
def safe_project(adapters: Mapping[str, LoraAdapter], bases: Mapping[str, torch.Tensor],
                 threshold: float = 1.0) -> dict[str, ProjectionRecord]:
    """Project, in place, every adapter whose similarity is below `threshold`: A [r, in] <- A Q^T Q.

    `adapters`: module name -> trained plain `LoraAdapter` (not PiSSA: its frozen B0 A0 would not be projected);
    `bases`: module name -> Q [k, in] with orthonormal rows spanning the directions the update may keep.
    Returns the similarity and decision per module.
    """
    if not 0.0 <= threshold <= 1.0:
        raise InvalidInputError(f"threshold is a cosine similarity in [0, 1], got {threshold}")
    missing = sorted(set(adapters) - set(bases))
    if missing:
        raise InvalidInputError(f"no projector basis for {missing[:3]}{'...' if len(missing) > 3 else ''}")
    for name, adapter in adapters.items():
        if not isinstance(adapter, LoraAdapter) or adapter.pissa:
            raise InvalidInputError(f"{name}: safe_project takes plain LoRA adapters, got {type(adapter).__name__}"
                                    f"{' (PiSSA init)' if getattr(adapter, 'pissa', False) else ''}")
        q = bases[name]
        if q.dim() != 2 or q.size(1) != adapter.A.size(1):
            raise InvalidInputError(f"{name}: basis must be [k, {adapter.A.size(1)}], got {tuple(q.shape)}")
    records: dict[str, ProjectionRecord] = {}
    for name, adapter in adapters.items():
        q = bases[name].to(torch.float64)
        a, b = adapter.A.double(), adapter.B.double()
        a_proj = (a @ q.T) @ q
        full = torch.linalg.norm(b @ a)
        # ||dW P|| / ||dW||; an all-zero update is already "inside" any subspace.
        sim = 1.0 if float(full) == 0.0 else float(torch.linalg.norm(b @ a_proj) / full)
        project = sim < threshold
        if project:
            adapter.A.copy_(a_proj.to(adapter.A.dtype))
        records[name] = ProjectionRecord(sim, project)
    return records
