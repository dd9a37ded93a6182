"""The shape of a Lorsa layer: how many QK and OV heads, their widths, RoPE, the scale and the sparsity K."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from rankwise.errors import InvalidInputError
from rankwise.nn.lorsa.rope import Rope

SELECTIONS = ("abs", "relu")


@dataclass(frozen=True)
class LorsaConfig:
    """Lorsa: `n_ov` rank-1 OV heads in `n_qk` groups, each group sharing one QK head of width `d_qk`.

    OV head i reads the pattern of QK head i // G, G = n_ov / n_qk (consecutive OV heads share a QK head).
    `k` heads stay active per token (k = n_ov: no sparsity). `selection` ranks heads by |z| * ||w_o|| ("abs", the
    authors' default) or ReLU(z) * ||w_o|| ("relu"). `attn_scale` multiplies the QK scores (None: 1 / sqrt(d_qk)).
    `qk_bias`: learnable b_Q, b_K. Without RoPE, b_K shifts every score of a query equally, which softmax ignores:
    it then gets no gradient.
    """

    d_model: int
    n_qk: int
    n_ov: int
    d_qk: int
    k: int
    rope: Rope = field(default_factory=Rope)
    attn_scale: float | None = None
    selection: str = "abs"
    qk_bias: bool = True

    def __post_init__(self) -> None:
        for name in ("d_model", "n_qk", "n_ov", "d_qk", "k"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidInputError(f"LorsaConfig.{name} must be a positive integer, got {v!r}")
        if self.n_ov % self.n_qk:
            raise InvalidInputError(f"n_ov ({self.n_ov}) must be a multiple of n_qk ({self.n_qk}): each QK head "
                                    "serves the same number G = n_ov / n_qk of OV heads")
        if self.k > self.n_ov:
            raise InvalidInputError(f"k = {self.k} active heads per token, but there are only n_ov = {self.n_ov} heads")
        if self.selection not in SELECTIONS:
            raise InvalidInputError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.attn_scale is not None and not (math.isfinite(self.attn_scale) and self.attn_scale > 0):
            raise InvalidInputError(f"attn_scale must be a positive finite number or None, got {self.attn_scale}")
        if not isinstance(self.rope, Rope):
            raise InvalidInputError(f"rope must be a Rope, got {type(self.rope).__name__}")
        self.rope.check_fits(self.d_qk)

    @property
    def group_size(self) -> int:
        """G: OV heads per QK head."""
        return self.n_ov // self.n_qk

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.d_qk)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rope"] = self.rope.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> LorsaConfig:
        try:
            return cls(**{**d, "rope": Rope(**d.get("rope", {}))})
        except TypeError as e:
            raise InvalidInputError(f"not a Lorsa config ({e}): {sorted(d)}") from None
