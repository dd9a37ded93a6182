"""The CBM's options, one frozen dataclass: how tokens are pooled, what regularises them, how it trains."""

from __future__ import annotations

from dataclasses import dataclass

from rankwise.errors import InvalidInputError

POOLINGS = ("magnet", "cls")
REGULARISERS = ("none", "ivq", "explicit-vq", "spectral", "barlow")
HEADS = ("text", "linear")


@dataclass(frozen=True)
class CBMConfig:
    """pooling: "magnet" (K prototypes from the patch tokens) or "cls" (the CLS token);
    head: "text" (cosine to the text embeddings, IVQ-CBM's bridge) or "linear" (a linear concept layer, CLS only);
    regulariser: on the patch tokens Z_p -- "ivq" (the method), "explicit-vq" (Z_q forwarded), "spectral", "barlow",
    or "none"; reg_weight its weight (IVQ: 1, L = L_cls + L_concept + L_IVQ); beta the commitment weight;
    frozen_codebook: the released code's optimiser bug (codebook never trained); label_free: no concept loss (LF-CBM
    style); freeze_backbone: train the bridge and heads only. Training: AdamW, `lr` for the bridge and heads and
    lr * backbone_lr_ratio for the backbone (the authors' 0.1), warmup + cosine, `epochs` of `batch_size`."""

    pooling: str = "magnet"
    head: str = "text"
    regulariser: str = "ivq"
    reg_weight: float = 1.0
    beta: float = 1.0
    frozen_codebook: bool = False
    num_codes: int | None = None  # None: M = K (the paper's best)
    temperature: float = 1.0
    label_free: bool = False
    freeze_backbone: bool = False
    logit_scale: float = 10.0  # initial scale of the cosine scores (learned)
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    backbone_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    rank_probe: int = 128  # validation images whose patch-feature rank is read after every epoch (0: none)
    seed: int = 0

    def validate(self) -> None:
        for name, value, allowed in (("pooling", self.pooling, POOLINGS), ("head", self.head, HEADS),
                                     ("regulariser", self.regulariser, REGULARISERS)):
            if value not in allowed:
                raise InvalidInputError(f"{name} must be one of {allowed}, got {value!r}")
        if self.pooling == "magnet" and self.head != "text":
            raise InvalidInputError("Magnet prototypes are scored against their group's text embeddings: head='text'")
        if self.regulariser == "explicit-vq" and self.pooling != "magnet":
            raise InvalidInputError("explicit VQ forwards the quantised patches into Magnet attention: pooling='magnet'")
        if self.epochs < 1 or self.batch_size < 1:
            raise InvalidInputError(f"epochs and batch_size must be >= 1, got {self.epochs}, {self.batch_size}")
        for name in ("lr", "temperature", "logit_scale"):
            if not getattr(self, name) > 0:
                raise InvalidInputError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("reg_weight", "beta", "backbone_lr_ratio", "weight_decay", "warmup_ratio"):
            if not getattr(self, name) >= 0:
                raise InvalidInputError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.num_codes is not None and self.num_codes < 1:
            raise InvalidInputError(f"num_codes must be >= 1 (or None for M = K), got {self.num_codes}")
        if self.rank_probe < 0:
            raise InvalidInputError(f"rank_probe must be >= 0, got {self.rank_probe}")
