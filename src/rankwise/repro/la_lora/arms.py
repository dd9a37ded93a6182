"""The arms of the la-lora reproduction, the federated job of each, and the runner that trains and scores every
run once.

Paper arms (the same DP machinery, the same frozen pre-trained head, LoRA on the tail's attention): LA-LoRA, DP-LoRA,
FFA-LoRA, RoLoRA (`rankwise.adapters.la_lora.ARMS`). Controls, run through the same Flower federation:

- head-only DP: LoRA off, only the head trained with DP-SGD from the same pre-trained head, on the tail's fixed
  pooled features (the adapter-off model: what the LoRA arms must beat for the adapter to add anything under DP);
- non-private LoRA: DP-LoRA's update (A and B together) without clipping or noise, the head frozen: the
  no-privacy reference, which shows whether the testbed leaves the adapter anything to do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rankwise.adapters.la_lora import ARMS, LocalDPConfig
from rankwise.core.progress import say
from rankwise.errors import InvalidInputError
from rankwise.repro.la_lora.features import PooledHead, TopTail, accuracy, head_logits, tail_logits
from rankwise.training.federated import FederatedConfig, FederatedModel, FederatedResult
from rankwise.training.federated.job import run_federated

HEAD_ONLY = "head-only-dp"
NON_PRIVATE = "non-private-lora"
NAMES = {"la-lora": "LA-LoRA", "dp-lora": "DP-LoRA", "ffa-lora": "FFA-LoRA", "rolora": "RoLoRA",
         HEAD_ONLY: "head-only DP", NON_PRIVATE: "non-private LoRA"}
PRIVATE_ARMS = (*ARMS, HEAD_ONLY)  # the arms run at each target epsilon
ALL_ARMS = (*PRIVATE_ARMS, NON_PRIVATE)


@dataclass(frozen=True)
class HeadOnlyDPConfig(LocalDPConfig):
    """LA-LoRA's local DP-SGD round on a model with no LoRA factor: every trained tensor is "other" (the head), so
    each step clips, noises and updates the head alone (the arm's factor schedule has nothing to act on)."""

    def check_roles(self, roles: Mapping[str, str]) -> None:
        factors = sorted(n for n, role in roles.items() if role in ("A", "B"))
        if factors:
            raise InvalidInputError(f"the head-only control trains no LoRA factor, but the model trains {factors[:3]}")


@dataclass(frozen=True)
class RunSpec:
    """The federation and local round every arm shares (matched budgets)."""

    rounds: int
    clients_per_round: int
    local_steps: int
    batch: int
    clip: float
    delta: float


def job(arm: str, eps: float | None, lr: float, seed: int, spec: RunSpec) -> FederatedConfig:
    """The federated job of `arm` at target `eps` (None: the non-private arm, which has no budget) and rate `lr`.

    The batches and the noise are drawn from the seed (`deterministic_noise`): a reproduction reruns, so these runs
    are not private in deployment; the accounting is the same."""
    if arm not in ALL_ARMS:
        raise InvalidInputError(f"unknown la-lora reproduction arm {arm!r}; known: {list(ALL_ARMS)}")
    if (arm == NON_PRIVATE) != (eps is None):
        raise InvalidInputError(f"arm {arm!r}: only the non-private arm runs without a target epsilon")
    common = dict(local_steps=spec.local_steps, batch_size=spec.batch, lr=lr, deterministic_noise=True)
    if arm == NON_PRIVATE:
        local: LocalDPConfig = LocalDPConfig(arm="dp-lora", clip=math.inf, **common)
        privacy = dict(epsilon=None, noise_multiplier=0.0)
    else:
        local = (HeadOnlyDPConfig(arm="dp-lora", clip=spec.clip, **common) if arm == HEAD_ONLY
                 else LocalDPConfig(arm=arm, clip=spec.clip, **common))
        privacy = dict(epsilon=eps)
    return FederatedConfig(rounds=spec.rounds, clients_per_round=spec.clients_per_round, delta=spec.delta, seed=seed,
                           local=local, **privacy)


def train(model: FederatedModel, data: Mapping[str, torch.Tensor], parts: Sequence[torch.Tensor],
          config: FederatedConfig) -> FederatedResult:
    """Run the job and load the global tensors into `model` (its module is then the trained global model)."""
    result = run_federated(model, data, parts, config)
    model.set_tensors(result.parameters)
    return result


class Runner:
    """Every federated run of the reproduction, trained once per (arm, epsilon, lr, seed) and scored lazily: a
    tuning run is scored on validation, a run at the chosen rate on test, and nothing else is evaluated.

    `feats[split]` = {h [N, T, D], mask [N, T], labels [N]} (the cached prefix), `pooled[split]` [N, D] (the
    adapter-off features, for the head-only control); `layers` the top encoder layers the tail copies; `head` the
    pre-trained head every arm starts from."""

    def __init__(self, layers: Sequence[torch.nn.Module], head: torch.nn.Linear, rank: int, targets: Sequence[str],
                 feats: Mapping[str, Mapping[str, torch.Tensor]], pooled: Mapping[str, torch.Tensor],
                 parts: Sequence[torch.Tensor], spec: RunSpec) -> None:
        self.layers, self.head, self.rank, self.targets = list(layers), head, rank, tuple(targets)
        self.feats, self.pooled, self.parts, self.spec = feats, pooled, parts, spec
        self.runs: dict[tuple[str, float | None, float, int], dict] = {}
        self._eval = {kind: self._model(kind, 0) for kind in ("lora", HEAD_ONLY)}

    def _model(self, arm: str, seed: int) -> FederatedModel:
        """A fresh model of `arm` (the LoRA's A drawn from `seed`), starting from the pre-trained head."""
        torch.manual_seed(seed)
        if arm == HEAD_ONLY:
            return FederatedModel(PooledHead(self.head), head_logits)
        return FederatedModel(TopTail(self.layers, self.head, self.rank, float(self.rank), self.targets), tail_logits)

    def data(self, arm: str, split: str) -> dict[str, torch.Tensor]:
        if arm == HEAD_ONLY:
            return {"pooled": self.pooled[split], "labels": self.feats[split]["labels"]}
        return dict(self.feats[split])

    def run(self, arm: str, eps: float | None, lr: float, seed: int) -> dict:
        """Train (once) and return {params, eps, wall, sigma, trainable, scores}."""
        key = (arm, eps, lr, seed)
        if key not in self.runs:
            model = self._model(arm, seed)
            result = train(model, self.data(arm, "train"), self.parts, job(arm, eps, lr, seed, self.spec))
            self.runs[key] = {"params": result.parameters, "eps": result.privacy()["max_epsilon"], "wall": result.wall_s,
                              "sigma": [c.noise_multiplier for c in result.plan.clients],
                              "trainable": sum(t.numel() for t in result.parameters.values()), "scores": {}}
            say(f"la-lora repro: {NAMES[arm]} eps={'-' if eps is None else f'{eps:g}'} lr={lr:g} seed={seed}: trained "
                f"in {result.wall_s:.1f} s")
        return self.runs[key]

    def score(self, arm: str, eps: float | None, lr: float, seed: int, split: str) -> float:
        """Accuracy on `split` ("val" or "test") of the run's global model."""
        run = self.run(arm, eps, lr, seed)
        if split not in run["scores"]:
            model = self._eval[HEAD_ONLY if arm == HEAD_ONLY else "lora"]
            model.set_tensors(run["params"])
            run["scores"][split] = accuracy(model.module, model.logits, self.data(arm, split))
        return run["scores"][split]
