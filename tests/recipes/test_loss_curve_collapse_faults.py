"""The reproduction's injected faults act where declared and nowhere else; the muP family's timescale rule."""

import pytest
import torch
from torch import nn

from rankwise.repro.loss_curve_collapse.faults import LRSpikeAdamW, StuckDataTask

pytestmark = pytest.mark.method("loss-curve-collapse")


def test_lr_spike_scales_only_its_window():
    p = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = LRSpikeAdamW.over(2, 4, 3.0)([p], lr=0.1, weight_decay=0.0)
    moves = []
    for _ in range(6):
        p.grad = torch.ones_like(p)
        before = p.detach().clone()
        opt.step()
        moves.append(float((before - p.detach())[0]))
        assert opt.param_groups[0]["lr"] == 0.1  # restored after every step
    # Adam with a constant gradient moves by ~lr per step: 3x inside steps 2 and 3 only
    assert moves[2] == pytest.approx(3 * moves[1], rel=1e-6) and moves[3] == pytest.approx(3 * moves[4], rel=1e-6)
    assert moves[0] == pytest.approx(moves[1], rel=1e-6) and moves[5] == pytest.approx(moves[4], rel=1e-6)


def test_stuck_loader_repeats_one_batch_inside_its_window():
    windows = torch.arange(40).view(10, 4)
    task = StuckDataTask(windows, windows[:2], start=1, stop=3)
    calls = [task.batch(torch.tensor([i]))["input_ids"][0, 0].item() for i in range(5)]
    assert calls == [0, 4, 4, 12, 16]  # calls 1 and 2 serve call 1's batch; the others their own
