"""`EmacConfig`: every option of one pass of (active) test-time adaptation over a stream, EMAC's and its baselines'.

`loss` says how the model adapts, `selector` which samples the oracle labels (at most round(budget * N) over the
stream); the arms of the reproduction are combinations:
    source            loss="none"                      (no update: BN in eval mode, the source model)
    TENT              loss="tent"                      (entropy minimisation, batch statistics)
    SHOT-IM           loss="shot-im"                   (entropy minimisation + prediction diversity)
    open-set TENT     loss="open-tent"                 (MME on the energy-posterior split, no labels)
    SimATTA-like      loss="simatta", selector="simatta"
    active baselines  loss="emac", selector in random / entropy / coreset / badge
    EMAC              loss="emac", selector="emac"      (restrict_to_mix=False: the ablation)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rankwise.core.options import option
from rankwise.errors import InvalidInputError

LOSSES = ("none", "tent", "shot-im", "open-tent", "simatta", "emac")
SELECTORS = ("none", "emac", "random", "entropy", "coreset", "badge", "simatta")
PARAMS = ("bn", "features", "all")


@dataclass(frozen=True)
class EmacConfig:
    budget: float = field(default=0.03, metadata=option(help="share of the stream the oracle may label, 0..1 (0: unsupervised)"))
    lr: float = 1e-3  # Adam's learning rate on the adapted parameters
    loss: str = field(default="emac", metadata=option(choices=LOSSES))
    selector: str = field(default="emac", metadata=option(choices=SELECTORS))
    restrict_to_mix: bool = True  # EMAC selects only inside X_mix (False: the ablation, the whole batch)
    params: str = field(default="bn", metadata=option(choices=PARAMS))  # BN affine (TENT's), the feature extractor, or all
    tau: float = 0.1  # contrastive temperature (the card's proposal; the note gives none)
    contrastive_weight: float = 1.0
    confidence: float = 0.9  # max-softmax floor of a pseudo-labelled X_old anchor (F_p)
    window: int = 256  # energies the mixture is refitted on
    ema: float = 0.3  # weight of a new mixture fit
    reward_alpha: float = 0.5  # weight of the newest reward
    store_size: int = 16  # most recent annotated samples replayed in every later step
    batch_size: int = 32
    seed: int = 0

    def validate(self) -> None:
        if not 0.0 <= self.budget <= 1.0:
            raise InvalidInputError(f"budget is a share of the stream in [0, 1] (0: no labels), got {self.budget}")
        if not self.lr > 0 or not self.tau > 0 or self.contrastive_weight < 0:
            raise InvalidInputError(f"lr and tau must be positive and contrastive_weight >= 0, got lr={self.lr}, "
                                    f"tau={self.tau}, contrastive_weight={self.contrastive_weight}")
        if self.loss not in LOSSES or self.selector not in SELECTORS or self.params not in PARAMS:
            raise InvalidInputError(f"loss in {LOSSES}, selector in {SELECTORS}, params in {PARAMS}; got "
                                    f"{self.loss!r}, {self.selector!r}, {self.params!r}")
        if not 0.0 < self.confidence < 1.0 or not 0.0 < self.reward_alpha <= 1.0:
            raise InvalidInputError(f"confidence in (0, 1) and reward_alpha in (0, 1], got {self.confidence}, {self.reward_alpha}")
        if self.batch_size < 2 or self.store_size < 0 or self.window < 2 or not 0.0 < self.ema <= 1.0:
            raise InvalidInputError(f"batch_size >= 2, store_size >= 0, window >= 2, 0 < ema <= 1; got {self.batch_size}, "
                                    f"{self.store_size}, {self.window}, {self.ema}")
        if self.selector != "none" and self.loss in ("none", "tent", "shot-im", "open-tent"):
            raise InvalidInputError(f"loss {self.loss!r} uses no labels: pair it with selector='none' (or use loss='emac' "
                                    "or 'simatta' for an active arm)")

    @property
    def active(self) -> bool:
        return self.selector != "none" and self.budget > 0
