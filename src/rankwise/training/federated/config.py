"""A differentially private federated job on Flower: FedAvg of the trained tensors over clients that each run a
private local round, with each client's (epsilon, delta) accounted per example.

    job = FederatedConfig(rounds=20, clients_per_round=4, local=LocalDPConfig(arm="la-lora", lr=0.5), epsilon=8.0)
    result = run_federated(model, data, partitions, job)   # job.run_federated; engine "inprocess" (default) or "processes"
    model.set_tensors(result.parameters)                            # the global adapter (and head)

`model` is a `FederatedModel` (a module, its vmap-safe logits and which tensors are A, B or other); `data` a dict of
tensors [N, ...] with the labels; `partitions` the clients' example indices (`partition.dirichlet_partition`).

Flower is the engine: the server is `flwr.server.Server` running the rounds with our strategy (`flower`:
client sampling as a pure function of (seed, round), the uniform FedAvg mean of A, B and the head); clients are
`flwr.client.NumPyClient`s running the method's local round. What a client does is the method's: `local` is its
round settings, an object with `local_steps`, `batch_size` and `clip` (what the privacy plan needs), `validate()`,
`local_round(loss, params, roles, data, noise_multiplier, round_index, seed) -> (tensors, stats)` and optionally
`check_roles(roles)` (e.g. LA-LoRA's `LocalDPConfig`). Engines:
- "inprocess": the same Server and clients in this process (Flower client proxies that call the client directly):
  no sockets, no ray; what the experiments and `rankwise finetune --procedure la-lora` use.
- "processes": `flwr.server.start_server` on a loopback gRPC port and one `flwr.client.start_client` process per
  client (`python -m rankwise.training.federated.worker`), each rebuilding the model from a builder target.

Everything is checked and planned before any work (`plan`): every client has data and at least one batch; the
sampling schedule; each client's number of noisy steps (K x rounds it takes part in: every local step releases a
gradient), its sampling rate q_i = b / n_i and its noise multiplier -- from a target epsilon via Opacus'
`get_noise_multiplier` (an unreachable target is refused), or given -- and the epsilon each client spends.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from rankwise.core.privacy import SampleLoss, check_budget, epsilon_spent, noise_for_epsilon
from rankwise.errors import InvalidInputError

ENGINES = ("inprocess", "processes")  # clients in this process, or one OS process each (Flower's gRPC)
Logits = Callable[[nn.Module, Mapping[str, torch.Tensor]], torch.Tensor]  # (module, batch) -> logits [B, C]


@dataclass(frozen=True)
class FederatedConfig:
    rounds: int = 10
    clients_per_round: int | None = None  # None: every client every round
    local: Any = None  # the clients' round settings (see the module docstring), e.g. la_lora.LocalDPConfig
    epsilon: float | None = 8.0  # target per client (example-level DP); None: give noise_multiplier instead
    delta: float = 1e-5
    noise_multiplier: float | None = None
    seed: int = 0
    engine: str = "inprocess"

    def validate(self) -> None:
        if self.local is None or not callable(getattr(self.local, "local_round", None)):
            raise InvalidInputError("a federated job needs local=: the clients' round settings, an object with "
                                    "local_round(...) (e.g. rankwise.adapters.la_lora.LocalDPConfig)")
        self.local.validate()
        if not isinstance(self.rounds, int) or self.rounds < 1:
            raise InvalidInputError(f"rounds must be a positive integer, got {self.rounds!r}")
        if self.engine not in ENGINES:
            raise InvalidInputError(f"engine must be one of {list(ENGINES)}, got {self.engine!r}")
        if (self.epsilon is None) == (self.noise_multiplier is None):
            raise InvalidInputError("give exactly one of epsilon (a target privacy budget) and noise_multiplier")
        if self.epsilon is not None:
            check_budget(self.epsilon, self.delta)
            if math.isinf(self.local.clip):
                raise InvalidInputError("a privacy budget needs a finite clipping norm (clip)")
        elif not (self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier)):
            raise InvalidInputError(f"noise_multiplier must be a finite number >= 0, got {self.noise_multiplier}")
        if not 0 < self.delta < 1:
            raise InvalidInputError(f"delta must lie in (0, 1), got {self.delta}")


@dataclass(frozen=True)
class ClientPlan:
    partition: int
    examples: int
    sample_rate: float
    rounds: int  # rounds this client takes part in
    steps: int  # noisy steps it releases (local_steps x rounds)
    noise_multiplier: float
    epsilon: float  # spent at the end (RDP accountant), at the job's delta


@dataclass(frozen=True)
class Plan:
    schedule: tuple[tuple[int, ...], ...]  # per round (1-based order), the partitions taking part
    clients: tuple[ClientPlan, ...]

    def client(self, partition: int) -> ClientPlan:
        return self.clients[partition]

    def to_dict(self) -> dict[str, Any]:
        return {"schedule": [list(s) for s in self.schedule], "clients": [asdict(c) for c in self.clients]}


def round_clients(num_clients: int, per_round: int, seed: int, round_index: int) -> tuple[int, ...]:
    """The partitions sampled in round `round_index` (1-based): a pure function of (seed, round), sorted."""
    if per_round >= num_clients:
        return tuple(range(num_clients))
    g = torch.Generator().manual_seed(seed * 7_919 + round_index)
    return tuple(sorted(torch.randperm(num_clients, generator=g)[:per_round].tolist()))


def plan(config: FederatedConfig, partition_sizes: Sequence[int]) -> Plan:
    """Check the job against the clients' data sizes and compute the schedule and privacy of every client."""
    config.validate()
    n_clients = len(partition_sizes)
    if n_clients < 1:
        raise InvalidInputError("a federated job needs at least one client")
    empty = [i for i, n in enumerate(partition_sizes) if n == 0]
    if empty:
        raise InvalidInputError(f"client(s) {empty} have no training examples; drop them or repartition the data")
    b = config.local.batch_size
    small = [(i, n) for i, n in enumerate(partition_sizes) if n < b]
    if small:
        raise InvalidInputError(f"client(s) {[i for i, _ in small]} have fewer examples ({[n for _, n in small]}) than the "
                                f"batch size {b}: lower the batch size or give them more data")
    per_round = n_clients if config.clients_per_round is None else config.clients_per_round
    if not isinstance(per_round, int) or not 1 <= per_round <= n_clients:
        raise InvalidInputError(f"clients_per_round must be between 1 and the {n_clients} clients, got {per_round!r}")
    too_big = [i for i, n in enumerate(partition_sizes) if config.delta >= 1 / n]
    if too_big:
        raise InvalidInputError(f"delta={config.delta:g} is not below 1/n for client(s) {too_big} (n = "
                                f"{[partition_sizes[i] for i in too_big]}): such a delta allows leaking an example outright; "
                                "use a smaller delta")
    schedule = tuple(round_clients(n_clients, per_round, config.seed, t) for t in range(1, config.rounds + 1))
    clients = []
    for i, n in enumerate(partition_sizes):
        taken = sum(i in s for s in schedule)
        steps, q = taken * config.local.local_steps, b / n
        if config.noise_multiplier is not None:
            sigma = float(config.noise_multiplier)
        else:
            sigma = noise_for_epsilon(config.epsilon, config.delta, q, steps) if steps else 0.0
        eps = epsilon_spent(sigma, q, steps, config.delta) if steps else 0.0
        clients.append(ClientPlan(i, int(n), q, taken, steps, sigma, eps))
    return Plan(schedule, tuple(clients))


def factor_roles(names: Sequence[str]) -> dict[str, str]:
    """Roles of the trained tensors by name: rankwise LoRA factors `...A` -> "A", `...B` -> "B", else "other"."""
    return {n: ("A" if n.endswith(".A") else "B" if n.endswith(".B") else "other") for n in names}


class FederatedModel:
    """A module trained federatedly: its trained tensors (requires_grad), their roles, and its per-example loss.

    `logits(module, batch)` must be vmap-safe (no data-dependent Python control flow): the per-sample gradients call
    it on one example at a time under `torch.func.vmap`. `label_key` names the labels in the data."""

    def __init__(self, module: nn.Module, logits: Logits, label_key: str = "labels") -> None:
        self.module, self.logits, self.label_key = module, logits, label_key
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        if not self.names:
            raise InvalidInputError("the module has no trainable tensors: add a LoRA adapter (and a head) first")
        self.roles = factor_roles(self.names)

    def tensors(self) -> dict[str, torch.Tensor]:
        named = dict(self.module.named_parameters())
        return {n: named[n].detach().clone() for n in self.names}

    @torch.no_grad()
    def set_tensors(self, values: Mapping[str, torch.Tensor]) -> None:
        named = dict(self.module.named_parameters())
        for n in self.names:
            named[n].copy_(values[n].to(named[n].dtype))

    def sample_loss(self) -> SampleLoss:
        """One example's cross-entropy as a function of the trained tensors (the rest of the module fixed)."""
        module, logits, key = self.module, self.logits, self.label_key
        fixed = {n: p.detach() for n, p in module.named_parameters() if n not in self.names}
        fixed.update(dict(module.named_buffers()))
        caller = _Call(module, logits)

        def loss(params: Mapping[str, torch.Tensor], sample: Mapping[str, torch.Tensor]) -> torch.Tensor:
            one = {k: v.unsqueeze(0) for k, v in sample.items() if k != key}
            state = {f"inner.{n}": t for n, t in {**fixed, **params}.items()}
            return F.cross_entropy(functional_call(caller, state, (one,)).reshape(1, -1), sample[key].reshape(1))

        return loss


class _Call(nn.Module):
    """`logits(inner, batch)` as a module's forward, so functional_call can swap `inner`'s tensors."""

    def __init__(self, inner: nn.Module, logits: Logits) -> None:
        super().__init__()
        self.inner = inner
        self._logits = logits

    def forward(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self._logits(self.inner, batch)


@dataclass
class FederatedResult:
    parameters: dict[str, torch.Tensor]  # the global trained tensors after the last round
    rounds: list[dict[str, float]]  # per round: clients' mean training loss, clipped fraction, ...
    plan: Plan
    wall_s: float
    engine: str

    def privacy(self) -> dict[str, Any]:
        eps = [c.epsilon for c in self.plan.clients if c.steps]
        return {"max_epsilon": max(eps) if eps else 0.0, **self.plan.to_dict()}


def check_data(data: Mapping[str, torch.Tensor], partitions: Sequence[torch.Tensor], label_key: str) -> int:
    """Validate the data dict and partitions; returns N."""
    if label_key not in data:
        raise InvalidInputError(f"the data has no {label_key!r} tensor (keys: {sorted(data)})")
    sizes = {t.size(0) for t in data.values()}
    if len(sizes) != 1:
        raise InvalidInputError(f"every data tensor needs the same first dimension, got {sorted(sizes)}")
    n = sizes.pop()
    for i, idx in enumerate(partitions):
        idx = torch.as_tensor(idx)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise InvalidInputError(f"client {i}'s indices fall outside the {n} examples")
    return n
