"""The entry point of a federated job: check everything, plan the privacy budget, then run the rounds on Flower.

Here rather than in `federated` (the job's types and checks), which `flower` imports: no import cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rankwise.errors import InvalidInputError
from rankwise.training.federated import flower
from rankwise.training.federated.config import FederatedConfig, FederatedModel, FederatedResult, check_data, plan


def run_federated(model: FederatedModel, data: Mapping[str, torch.Tensor], partitions: Sequence[torch.Tensor],
                  config: FederatedConfig, builder: tuple[str, dict[str, Any]] | None = None,
                  on_round: Callable[[int, dict[str, float]], None] | None = None) -> FederatedResult:
    """Train `model` federatedly over the clients `partitions` of `data`; returns the global tensors (and leaves
    `model` unchanged). `builder` = ("module:function", kwargs) rebuilds the model in each client process (engine
    "processes" only)."""
    check_data(data, partitions, model.label_key)
    job = plan(config, [int(torch.as_tensor(p).numel()) for p in partitions])  # every check before any work
    check_roles = getattr(config.local, "check_roles", None)
    if check_roles is not None:  # the method's own check of what is trained (e.g. LoRA A and B factors)
        check_roles(model.roles)
    if config.engine == "processes" and builder is None:
        raise InvalidInputError("engine 'processes' needs builder=('module:function', kwargs) to rebuild the model in each client process")
    t0 = time.perf_counter()
    if config.engine == "inprocess":
        params, rounds = flower.run_inprocess(model, data, partitions, config, job, on_round)
    else:
        params, rounds = flower.run_processes(model, data, partitions, config, job, builder, on_round)
    return FederatedResult(params, rounds, job, time.perf_counter() - t0, config.engine)
