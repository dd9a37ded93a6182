"""The two injected faults of the detection experiment, both expressed through the training harness's own hooks
(an optimizer class, a task): a learning-rate spike and a data-order bug (a stuck data loader)."""

from __future__ import annotations

import torch

from rankwise.training import LanguageModelingTask


class LRSpikeAdamW(torch.optim.AdamW):
    """AdamW whose steps number [start, stop) (0-based) run at `factor` x the scheduled learning rate."""

    start: int = 0
    stop: int = 0
    factor: float = 1.0

    @classmethod
    def over(cls, start: int, stop: int, factor: float) -> type[LRSpikeAdamW]:
        """A subclass with the spike window fixed (the harness's factory takes a class)."""
        return type("LRSpikeAdamW", (cls,), {"start": start, "stop": stop, "factor": factor})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._count = 0

    @torch.no_grad()
    def step(self, closure=None):
        scheduled = [g["lr"] for g in self.param_groups]  # the loop has just set them from the schedule
        if self.start <= self._count < self.stop:  # scale them for this step only
            for g in self.param_groups:
                g["lr"] *= self.factor
        try:
            return super().step(closure)
        finally:
            for g, lr in zip(self.param_groups, scheduled):
                g["lr"] = lr
            self._count += 1


class StuckDataTask(LanguageModelingTask):
    """A loader bug: from batch call `start` to `stop` (one call per step) the same batch is served again and again
    (the one drawn at `start`); before and after, the harness's normal order."""

    def __init__(self, train_windows, eval_windows, start: int, stop: int, eval_batch_size: int = 8) -> None:
        super().__init__(train_windows, eval_windows, eval_batch_size=eval_batch_size)
        self.start, self.stop, self._calls, self._stuck = start, stop, 0, None

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        k, self._calls = self._calls, self._calls + 1
        if self.start <= k < self.stop:
            if self._stuck is None:
                self._stuck = indices.clone()
            indices = self._stuck
        return super().batch(indices)
