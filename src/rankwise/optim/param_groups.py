"""Which parameters of a model get a low-rank optimizer state, and the param groups that say so.

Low-rank optimizers (LoRA-Pre, GaLore) are applied, as in their papers, to the weight matrices of the transformer
blocks (attention and MLP projections). Embeddings, the output head, norms and biases keep full AdamW states.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rankwise.errors import InvalidInputError


# Module names of output layers (causal-LM heads, classification heads of transformers and of rankwise.training):
# their states stay dense, as the embeddings' do — they are few parameters with a different gradient structure.
OUTPUT_HEAD_NAMES = frozenset({"lm_head", "head", "classifier", "score"})


def default_low_rank_filter(name: str, module: nn.Module, param: torch.Tensor) -> bool:
    """2-D weights of nn.Linear layers, except an output head (a module named lm_head, head, classifier or score,
    or tied to an embedding)."""
    module_name = name.rsplit(".", 1)[0] if "." in name else ""
    is_head = module_name.rsplit(".", 1)[-1] in OUTPUT_HEAD_NAMES
    return isinstance(module, nn.Linear) and param.dim() == 2 and not is_head


def split_low_rank_params(
    model: nn.Module, low_rank_filter: Callable[[str, nn.Module, torch.Tensor], bool] = default_low_rank_filter
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(low_rank, dense) lists of (name, parameter) over the trainable parameters, each parameter once.

    A parameter shared by several modules (tied embeddings) is low-rank only if the filter accepts it everywhere.
    """
    verdicts: dict[int, bool] = {}
    names: dict[int, tuple[str, nn.Parameter]] = {}
    for module_name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            full = f"{module_name}.{pname}" if module_name else pname
            ok = low_rank_filter(full, module, p)
            verdicts[id(p)] = verdicts.get(id(p), True) and ok
            names.setdefault(id(p), (full, p))
    low = [names[k] for k in names if verdicts[k]]
    dense = [names[k] for k in names if not verdicts[k]]
    return low, dense


def low_rank_param_groups(model: nn.Module, rank: int, *, low_rank_filter: Callable | None = None, **low_rank_options: Any) -> list[dict[str, Any]]:
    """Param groups for LoRAPre: [{"params": matrices, "rank": rank, **options}, {"params": rest, "rank": None}]."""
    low, dense = split_low_rank_params(model, low_rank_filter or default_low_rank_filter)
    if not low:
        raise InvalidInputError("no parameter qualifies for a low-rank state (no nn.Linear weights besides the head)")
    check_rank(rank, low)
    groups = [{"params": [p for _, p in low], "rank": rank, **low_rank_options}]
    if dense:
        groups.append({"params": [p for _, p in dense], "rank": None})
    return groups


def check_rank(rank: int, named_params: list[tuple[str, nn.Parameter]]) -> None:
    """Raise a clear error if `rank` exceeds the smaller dimension of any of the matrices."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise InvalidInputError(f"rank must be a positive int, got {rank!r}")
    for name, p in named_params:
        if rank > min(p.shape):
            raise InvalidInputError(f"rank {rank} exceeds min{tuple(p.shape)} of {name}; choose rank <= {min(p.shape)}")
