"""LoRA-Pre under gradient accumulation and DDP (2 processes, gloo, CPU): same parameters as one big batch."""


import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from rankwise.optim import LoRAPre

STEPS = 3
BATCH = 8  # global batch; each of the 2 ranks takes half


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


def _ddp_worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model = nn.parallel.DistributedDataParallel(_model())
        opt = _optimizer(model)
        share = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        for step in range(STEPS):
            x, y = _batch(step)
            opt.zero_grad()
            nn.functional.mse_loss(model(x[share]), y[share]).backward()  # DDP averages gradients across ranks
            opt.step()
        if rank == 0:
            torch.save([p.detach() for p in model.module.parameters()], out_file)
        # Without this, rank 1 can tear gloo down while rank 0 is still saving, and a process aborts (SIGABRT).
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_ddp_two_processes_match_single_process(tmp_path):
    out = tmp_path / "rank0.pt"
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    ddp_params = torch.load(out, weights_only=True)
    for p, q in zip(ddp_params, _single_process()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
