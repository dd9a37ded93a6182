"""Losses l(p, y), p in [0, 1] the learner's value, y in [0, 1] the label, written as a quadratic in p:
l(p, y) = a(y) p^2 + b(y) p + c(y). This is the card's "practical collapse": the O(t^2) triples of the empirical
objective aggregate into two per-point coefficients, updated in O(t) per round.

- absolute |p - y| with binary labels: = y + p (1 - 2y) (linear in p; exact on [0, 1] only for y in {0, 1}); L = 1.
- squared (p - y)^2 = p^2 - 2 y p + y^2; L = 2 on [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class Loss:
    name: str
    lipschitz: float

    def coefficients(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a, b, c) [n] each, l(p, y) = a p^2 + b p + c."""
        y = self.check_labels(y)
        if self.name == "absolute":
            return np.zeros_like(y), 1.0 - 2.0 * y, y.copy()
        return np.ones_like(y), -2.0 * y, y * y

    def value(self, p: np.ndarray, y: np.ndarray) -> np.ndarray:
        """l(p, y) elementwise, [n]."""
        p = np.asarray(p, dtype=np.float64)
        y = self.check_labels(y)
        return np.abs(p - y) if self.name == "absolute" else (p - y) ** 2

    def check_labels(self, y) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        if not np.all(np.isfinite(y)) or np.any(y < 0) or np.any(y > 1):
            raise InvalidInputError("labels must be finite and in [0, 1]")
        if self.name == "absolute" and np.any((y != 0) & (y != 1)):
            raise InvalidInputError("the absolute loss is linear in p only for binary labels: the label class must "
                                    "be {0, 1}-valued (use the squared loss for [0, 1] labels)")
        return y


ABSOLUTE = Loss("absolute", 1.0)
SQUARED = Loss("squared", 2.0)
LOSSES = {"absolute": ABSOLUTE, "squared": SQUARED}


def get_loss(loss: str | Loss) -> Loss:
    if isinstance(loss, Loss):
        return loss
    if loss not in LOSSES:
        raise InvalidInputError(f"loss must be one of {sorted(LOSSES)}, got {loss!r}")
    return LOSSES[loss]
