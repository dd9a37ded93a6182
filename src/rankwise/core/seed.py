"""One call makes runs repeatable: the same seed gives the same numbers."""

from __future__ import annotations

import random

import numpy as np
import torch


def set_seed(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a torch generator seeded the same way for explicit use."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
