"""PESO as a training procedure: one stage of continual training is one `rankwise finetune` run.

    rankwise finetune --model M --task T --method lora --rank 8 --out stage1            # the first stage: plain LoRA
    rankwise finetune --model M --task T --method lora --rank 8 --out stage2 \\
        --procedure peso --procedure-option previous=stage1/adapter --procedure-option lam=2

The builder loads the previous stage's adapter into the new one (inheritance; a mismatched rank, scaling or module
set is refused before training) and freezes a copy of it as the anchor; every micro-batch's loss then gets the
proximal term of `rankwise.adapters.peso` (`proximal=kl`, PESO's softmax-KL, or `proximal=l2`). The anchor is rebuilt
from the same folder on a resume, so the procedure is resumable; `describe()` records the folder and the adapter
files' SHA-256, so resuming against a changed previous stage is refused. What finetune saves afterwards is the
complete adapter (a plain LoRA PEFT folder): the next stage's `previous`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from rankwise.adapters import AdaptedModel
from rankwise.adapters.peso import DEFAULT_EPS, PROXIMAL_KINDS, ProximalRegularizer, check_proximal, inherit, lora_factors_of
from rankwise.core.io import sha256_of
from rankwise.core.options import config_or_options, option
from rankwise.core.training import Procedure
from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class PesoConfig:
    """One PESO stage: the previous stage's adapter folder (required), the proximal term's weight and kind."""

    # an int too: literal_eval reads a folder named 2024 as a number (the builder takes str(previous))
    previous: str | int = field(metadata=option(metavar="PREV_OUT/adapter",
                                                help="the previous stage's adapter; the first stage is plain --method lora"))
    lam: float = 2.0  # >= 0
    proximal: str = field(default="kl", metadata=option(choices=PROXIMAL_KINDS))  # PESO's softmax-KL, or l2
    eps: float = DEFAULT_EPS
    adapter: str = "default"  # the adapter name inside the model

    def validate(self) -> None:
        """What needs no model: the proximal settings, and that `previous` is a folder."""
        check_proximal(self.lam, self.proximal, self.eps)
        folder = Path(str(self.previous))
        if not folder.is_dir():
            raise InvalidInputError(f"--procedure peso: previous={folder} is not a folder (pass the previous run's OUT/adapter)")


class PesoProcedure(Procedure):
    """Adds `regularizer(current LoRA factors)` to every micro-batch's loss."""

    name: ClassVar[str] = "peso"

    def __init__(self, adapted: AdaptedModel, regularizer: ProximalRegularizer, adapter_name: str = "default",
                 previous: str | None = None, previous_sha256: str | None = None) -> None:
        self.adapted, self.regularizer, self.adapter_name = adapted, regularizer, adapter_name
        self.previous, self.previous_sha256 = previous, previous_sha256
        self.factors = lora_factors_of(adapted, adapter_name)
        self.last_value: float | None = None  # the proximal term of the latest micro-batch (for logging and tests)

    def extra_loss(self, module: nn.Module) -> torch.Tensor:
        term = self.regularizer(self.factors)
        self.last_value = float(term.detach())
        return term

    def describe(self) -> dict[str, Any]:
        return {"procedure": self.name, "peso_previous": self.previous, "peso_previous_sha256": self.previous_sha256,
                "peso_lam": self.regularizer.lam, "peso_proximal": self.regularizer.kind, "peso_eps": self.regularizer.eps}


def find_adapted(module: nn.Module) -> tuple[str, AdaptedModel]:
    """The AdaptedModel inside a task's module (the module itself, or e.g. a classifier's wrapped model), and its
    module path there as a prefix ("" or "model.", the prefix `finetune` saves a classifier's adapter with)."""
    for name, m in module.named_modules():
        if isinstance(m, AdaptedModel):
            return (f"{name}." if name else ""), m
    raise InvalidInputError("--procedure peso trains an adapter: the module holds no AdaptedModel (use --method lora)")


def peso_procedure(module: nn.Module, task: Any, seed: int, config: PesoConfig | None = None, **options: Any) -> PesoProcedure:
    """The builder behind `--procedure peso`: inherit the previous stage's adapter and anchor the proximal term to it."""
    config = config_or_options(PesoConfig, config, options, "--procedure peso")
    folder = Path(str(config.previous))
    prefix, adapted = find_adapted(module)
    anchor = inherit(adapted, folder, config.adapter, prefix)
    weights = sorted(folder.glob("*.safetensors"))
    digest = ",".join(f"{p.name}:{sha256_of(p)[:16]}" for p in weights)
    return PesoProcedure(adapted, ProximalRegularizer(anchor, config.lam, config.proximal, config.eps), config.adapter,
                         str(folder), digest)
