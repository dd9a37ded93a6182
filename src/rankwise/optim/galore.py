"""GaLore baseline: the authors' `galore-torch` package (GaLoreAdamW), set up on the same matrices as LoRA-Pre.

GaLore projects each matrix gradient onto its top-r singular subspace (refreshed by an SVD every
`update_proj_gap` steps), runs Adam in that r-dimensional space, projects the update back and scales it by `scale`.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn

from rankwise.errors import MissingPackageError
from rankwise.optim.param_groups import check_rank, split_low_rank_params


def galore_adamw(
    model: nn.Module,
    lr: float,
    rank: int,
    *,
    update_proj_gap: int = 200,
    scale: float = 0.25,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.optim.Optimizer:
    """galore_torch.GaLoreAdamW with rank-`rank` projection on the block matrices, plain AdamW on the rest.

    eps defaults to 1e-8 (as torch AdamW and LoRAPre) rather than the package's 1e-6, so only the moment handling
    differs between the optimizers compared.
    """
    try:
        # galore-torch imports bitsandbytes, which logs about GPU kernels it cannot load on a CPU; quiet it.
        bnb_logger = logging.getLogger("bitsandbytes")
        level = bnb_logger.level
        bnb_logger.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from galore_torch import GaLoreAdamW
        finally:
            bnb_logger.setLevel(level)
    except ImportError as e:
        raise MissingPackageError("GaLore needs the galore-torch package: pip install galore-torch==1.0 bitsandbytes==0.50.2") from e
    low, dense = split_low_rank_params(model)
    check_rank(rank, low)
    groups = [
        {"params": [p for _, p in low], "rank": rank, "update_proj_gap": update_proj_gap, "scale": scale, "proj_type": "std"},
        {"params": [p for _, p in dense]},
    ]
    return GaLoreAdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, no_deprecation_warning=True)
