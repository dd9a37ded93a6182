"""Distillation from a teacher language model: the loss and a harness task that uses it.

Loss: L = CE(student, next token) + beta * tau^2 * KL(softmax(z_T / tau) || softmax(z_S / tau)), means over tokens
(the tau^2 keeps the KL term's gradient scale independent of the temperature). Used to heal converted models (CARE's
deployable MLA) against the model they were converted from.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.eval import perplexity


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor, beta: float, tau: float) -> torch.Tensor:
    """CE + beta tau^2 KL(teacher || student) at temperature tau, means over tokens. logits [B, T, V], targets [B, T]."""
    vocab = student_logits.size(-1)
    s, t = student_logits.reshape(-1, vocab).float(), teacher_logits.reshape(-1, vocab).float()
    ce = F.cross_entropy(s, targets.reshape(-1))
    kl = F.kl_div(F.log_softmax(s / tau, -1), F.log_softmax(t / tau, -1), log_target=True, reduction="batchmean")
    return ce + beta * tau**2 * kl


class DistillationTask:
    """Next-token prediction on token windows [N, T], distilled from `teacher` (frozen, evaluated without grad).

    Evaluation is the student's perplexity on `eval_windows` [M, T'] when given, else nothing.
    """

    name = "distillation"
    metric = "perplexity"
    higher_is_better = False

    def __init__(self, teacher: nn.Module, train_windows: torch.Tensor, eval_windows: torch.Tensor | None = None,
                 beta: float = 1.0, tau: float = 2.0) -> None:
        if train_windows.dim() != 2 or train_windows.size(0) < 1 or train_windows.size(1) < 2:
            raise InvalidInputError(f"distillation needs token windows [N, T] with T >= 2, got shape {tuple(train_windows.shape)}")
        if tau <= 0 or beta < 0:
            raise InvalidInputError(f"distillation needs tau > 0 and beta >= 0, got tau {tau}, beta {beta}")
        self.teacher, self.train_windows, self.eval_windows, self.beta, self.tau = teacher.eval(), train_windows, eval_windows, beta, tau

    @property
    def num_train(self) -> int:
        return self.train_windows.size(0)

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"input_ids": self.train_windows[indices]}

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        with torch.no_grad():
            teacher_logits = self.teacher(input_ids=ids).logits[:, :-1]
        return distillation_loss(module(input_ids=ids).logits[:, :-1], teacher_logits, ids[:, 1:], self.beta, self.tau)

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        if self.eval_windows is None:
            return {}
        result = perplexity(module, self.eval_windows, desc="eval ppl")
        return {"eval_loss": result.mean_nll, "perplexity": result.perplexity}
