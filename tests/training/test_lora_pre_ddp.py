"""LoRA-Pre under gradient accumulation: same parameters as one big batch.

LoRA-Pre under DDP (2 processes, gloo, CPU) is tested through the training harness, with the other optimizers and an
adapter, in tests/training/test_training_ddp.py.
"""


import pytest
import torch
from torch import nn

from rankwise.optim import LoRAPre

pytestmark = pytest.mark.method("lora-pre")

STEPS = 3
BATCH = 8


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 6))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 12, generator=gen), torch.randn(BATCH, 6, generator=gen)


def _optimizer(model: nn.Module) -> LoRAPre:
    return LoRAPre(model.parameters(), lr=1e-2, rank=3, weight_decay=0.01, seed=5)


def _single_process() -> list[torch.Tensor]:
    model = _model()
    opt = _optimizer(model)
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def test_gradient_accumulation_equals_one_big_batch():
    model = _model()
    opt = _optimizer(model)
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        for half in (slice(0, BATCH // 2), slice(BATCH // 2, BATCH)):
            (nn.functional.mse_loss(model(x[half]), y[half]) / 2).backward()
        opt.step()
    for p, q in zip(model.parameters(), _single_process()):
        torch.testing.assert_close(p.detach(), q, rtol=1e-5, atol=1e-6)
