"""PftConfig: the options of both PFT stages (defaults: the card's, lambda_expr = lambda_style = 1, Adam)."""

from __future__ import annotations

from dataclasses import dataclass

from rankwise.apps.vision.pft.losses import EMOTION_LOSSES
from rankwise.errors import InvalidInputError

STYLES = ("gram", "meanstd")


@dataclass(frozen=True)
class PftConfig:
    lr: float = 1e-3  # stage 2 (Adam)
    steps: int = 60  # stage 2 optimizer steps
    batch_size: int = 32
    pretrain_lr: float = 1e-3  # stage 1 (Adam)
    pretrain_steps: int = 400
    lambda_expr: float = 1.0
    lambda_style: float = 1.0
    lambda_moment: float = 0.0  # stage 1 only; the code's `moment_loss`
    emotion: str = "ce"  # L_expr: ce | mse | kl
    style: str = "gram"  # L_style: gram (bug-fixed Gram MSE) | meanstd (the code's `style_loss`)
    hidden: int | None = None  # T's hidden width (None: the feature dim)
    image_shape: tuple[int, ...] | None = None  # (C, H, W) the model reads; None: probed on one frame
    seed: int = 0

    def validate(self) -> None:
        if self.emotion not in EMOTION_LOSSES:
            raise InvalidInputError(f"emotion must be one of {EMOTION_LOSSES}, got {self.emotion!r}")
        if self.style not in STYLES:
            raise InvalidInputError(f"style must be one of {STYLES}, got {self.style!r}")
        for name in ("lr", "pretrain_lr"):
            if not getattr(self, name) > 0:
                raise InvalidInputError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("steps", "pretrain_steps", "batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidInputError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        for name in ("lambda_expr", "lambda_style", "lambda_moment"):
            if not getattr(self, name) >= 0:
                raise InvalidInputError(f"{name} must be >= 0, got {getattr(self, name)}")


__all__ = ["PftConfig", "STYLES"]
