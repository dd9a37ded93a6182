"""PALC's calibration module: a bottleneck from the frozen model's last hidden state to an offset on every vocabulary
logit, l'_t = l_t + gamma * W_up f(W_down h_t).

The base model is only read (its last hidden state h_t [H] and logits l_t [V] at each position); nothing is written
back into it, and gamma = 0 gives the base model exactly. The map h -> W_up W_down h has rank <= B (the bottleneck);
the paper measures how much of that rank a trained module uses (`effective_dimension`).

Paper and authors' code differ (card): the paper has a ReLU in the bottleneck, the code is linear with dropout 0.1 on
h_t; both are options, the paper's is the default. Init as in the code: W_down Kaiming-uniform (torch's Linear
default), W_up N(0, 0.01^2), so the first offsets are small but not zero (a zero W_up would give W_down no gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rankwise.core.rank_measures import factored_singular_values, participation_ratio
from rankwise.errors import InvalidInputError

UP_INIT_STD = 0.01


@dataclass(frozen=True)
class PalcConfig:
    """bottleneck B; relu between the two maps (the paper) or not (the authors' code); dropout on h_t in training;
    scale gamma at run time (1 in training, the paper's best at inference)."""

    bottleneck: int = 256
    relu: bool = True
    dropout: float = 0.1
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.bottleneck, int) or self.bottleneck < 1:
            raise InvalidInputError(f"bottleneck must be a positive integer, got {self.bottleneck!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise InvalidInputError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.scale, (int, float)) or self.scale != self.scale or abs(self.scale) == float("inf"):
            raise InvalidInputError(f"scale must be a finite number, got {self.scale!r}")


class LogitCalibrator(nn.Module):
    """h [..., H] -> logit offsets [..., V] (before gamma). Position-wise: each position's offset depends on its
    own hidden state only."""

    def __init__(self, hidden_size: int, vocab_size: int, config: PalcConfig = PalcConfig(), seed: int | None = None) -> None:
        super().__init__()
        if hidden_size < 1 or vocab_size < 1:
            raise InvalidInputError(f"hidden_size and vocab_size must be positive, got {hidden_size}, {vocab_size}")
        self.config = config
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.down = nn.Linear(hidden_size, config.bottleneck, bias=False)
        self.up = nn.Linear(config.bottleneck, vocab_size, bias=False)
        with torch.no_grad():
            bound = 1.0 / hidden_size ** 0.5  # Kaiming-uniform with a = sqrt(5), torch's Linear default
            self.down.weight.copy_(torch.empty_like(self.down.weight).uniform_(-bound, bound, generator=generator))
            self.up.weight.copy_(torch.randn(self.up.weight.shape, generator=generator) * UP_INIT_STD)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self.down(self.dropout(hidden))
        return self.up(torch.relu(z) if self.config.relu else z)

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def singular_values(self) -> torch.Tensor:
        """Of W_up W_down [V, H] (float64, descending, length <= B), from the factors."""
        return factored_singular_values(self.up.weight, self.down.weight)

    def effective_dimension(self) -> float:
        """The paper's d_eff = (sum sigma)^2 / sum sigma^2 of W_up W_down (the ReLU, where used, is ignored, as the
        paper's SVD of the two matrices does)."""
        return participation_ratio(self.singular_values())


class SteeringOffset(nn.Module):
    """A static steering vector v [H] added to the last hidden state before the output layer: with a linear output
    layer that is one constant logit offset W_out v [V] at every position (CAA, or BiPO-like when v is trained with
    PALC's loss). The control that a position-independent correction is: PALC's claim is that position matters."""

    def __init__(self, output_weight: torch.Tensor, vector: torch.Tensor | None = None) -> None:
        super().__init__()
        if output_weight.dim() != 2:
            raise InvalidInputError(f"output_weight must be [V, H], got {tuple(output_weight.shape)}")
        self.register_buffer("output_weight", output_weight.detach().clone(), persistent=False)
        v = torch.zeros(output_weight.shape[1]) if vector is None else vector.detach().float().clone()
        if v.shape != (output_weight.shape[1],):
            raise InvalidInputError(f"vector must be [{output_weight.shape[1]}], got {tuple(v.shape)}")
        self.vector = nn.Parameter(v)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        offset = self.output_weight @ self.vector  # [V]
        return offset.expand(*hidden.shape[:-1], offset.shape[0])
