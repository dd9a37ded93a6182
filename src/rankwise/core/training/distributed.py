"""Data parallelism for the training harness: the same `train(...)` call on one process or under `torchrun`.

When `torch.distributed` is initialised, or the process was launched by torchrun (RANK, WORLD_SIZE, LOCAL_RANK and
MASTER_ADDR set), `train` joins the process group (gloo, which runs on the CPU, unless one is already set up),
wraps the module in DistributedDataParallel and gives each rank a disjoint, equal slice of every global batch. DDP
averages the gradients, so with equal slices the update is the single-process one up to float reassociation.

The helpers here are what a command needs around `train`: who writes files (`is_main_process`), waiting for the
writer (`barrier`), letting rank 0 build shared caches first (`main_process_first`), and closing the group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
import torch.distributed as dist

from rankwise.errors import InvalidInputError

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in TORCHRUN_ENV)


def init_distributed(backend: str = "gloo") -> bool:
    """Join the process group if this process is one of several (torchrun's variables, or an initialised group).

    Returns True when a group is initialised (by the caller or here). A group that already exists is used as is.
    """
    if not dist.is_available():
        if launched_by_torchrun():
            raise InvalidInputError("this process was launched by torchrun but torch.distributed is not available in this torch build")
        return False
    if dist.is_initialized():
        return True
    if not launched_by_torchrun():
        return False
    try:
        dist.init_process_group(backend)  # env:// : RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    except (ValueError, RuntimeError) as e:
        raise InvalidInputError(
            f"cannot join the {backend} process group from the torchrun environment ({e}); launch with "
            "`torchrun --nproc_per_node N ...`, which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
        ) from e
    return True


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def is_main_process() -> bool:
    """True on rank 0, and in a single process: the one that writes checkpoints, models and metrics."""
    return rank() == 0


def barrier() -> None:
    if is_initialized():
        dist.barrier()


@contextmanager
def main_process_first() -> Iterator[None]:
    """Rank 0 runs the block first (building caches, downloading nothing); the others run it once it is done."""
    if not is_main_process():
        barrier()
    try:
        yield
    finally:
        if is_main_process():
            barrier()


def shutdown() -> None:
    """Wait for every rank (so none tears gloo down while another still writes), then close the group."""
    if is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum over ranks (float64 so counts and sums stay exact); the input itself in one process."""
    if world_size() == 1:
        return values
    out = values.detach().to(torch.float64).clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def average_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Each metric averaged over ranks (every rank must report the same keys)."""
    if world_size() == 1 or not metrics:
        return dict(metrics)
    keys = sorted(metrics)
    names: list[list[str] | None] = [None] * world_size()
    dist.all_gather_object(names, keys)
    if any(n != keys for n in names):
        raise InvalidInputError(f"ranks reported different evaluation metrics: {names}")
    total = all_reduce_sum(torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64))
    return {k: float(v) / world_size() for k, v in zip(keys, total)}


def check_same_across_ranks(tensors: list[torch.Tensor], what: str) -> None:
    """Raise if `tensors` (e.g. the frozen base weights DDP does not synchronise) differ between ranks."""
    if world_size() == 1:
        return
    # A fingerprint per tensor: its float64 sum and sum of squares; differences in any weight change it.
    local = torch.stack([torch.stack([t.detach().double().sum(), t.detach().double().square().sum()]) for t in tensors]) if tensors \
        else torch.zeros(0, 2, dtype=torch.float64)
    reference = local.clone()
    dist.broadcast(reference, src=0)
    differs = torch.tensor([0.0 if torch.equal(local, reference) else 1.0], dtype=torch.float64)
    if float(all_reduce_sum(differs)) > 0:
        raise InvalidInputError(
            f"the {what} differ between ranks: build or load the model the same way (same seed, same folder) on every "
            "rank before training"
        )
