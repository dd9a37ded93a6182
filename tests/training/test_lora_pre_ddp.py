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


# float64: accumulating two half-batch gradients and one big batch sum in different orders, and the preconditioned
# step can amplify that; in float32 the two runs differ by ~1.6e-6 after 3 steps, in float64 by ~1e-15
def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 6)).double()


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return (torch.randn(BATCH, 12, generator=gen, dtype=torch.float64),
            torch.randn(BATCH, 6, generator=gen, dtype=torch.float64))


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
    # 1e-10 at |params| < 1: ~5e5 eps64, room for the step's normalisation; a wrong accumulation moves them by ~lr
    for p, q in zip(model.parameters(), _single_process()):
        torch.testing.assert_close(p.detach(), q, rtol=0, atol=1e-10)
