"""`rankwise finetune --method lora --procedure la-lora --procedure-option clients=4 --procedure-option epsilon=8`

LA-LoRA as a training procedure: a differentially private federated job, which the harness's federated engine
(`rankwise.training.federated`, on Flower) runs whole instead of the training loop (`runs_on = "federated"`). It
splits the task's training set across `clients` (Dirichlet label skew, or IID), runs the rounds, and loads the global
adapter and head into the module, which finetune then saves as a PEFT folder. `--batch-size` is each client's
expected Poisson batch, `--lr` the local SGD rate, `--seed` the job's seed; `--steps` is unused (rounds x local steps
are the budget). Writes `privacy.json` (each client's noise multiplier, steps and epsilon spent, and where the noise
came from) beside the adapter. The batch draws and the noise come from OS entropy, unrecorded, unless
`deterministic_noise=True` (not private: a rerun repeats them; for reproductions and tests).

This module holds what the method decides (the options, the client's local-round settings); the engine holds how a
federated job runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn

from rankwise.adapters.la_lora import ARMS, OPTIMIZERS, LocalDPConfig
from rankwise.core.options import config_or_options, option
from rankwise.core.training import Procedure
from rankwise.errors import InvalidInputError
from rankwise.targets import literal

# The federated engine's modes, read from its source (no import: the engine is in the harness, above this package).
ENGINES = literal("rankwise.training.federated.config:ENGINES")
DEFAULT_EPSILON = 8.0  # the target epsilon when neither epsilon nor noise_multiplier is given


@dataclass(frozen=True)
class LaLoraConfig:
    """The federated job: the arm, clients and rounds, the privacy target, clipping, the data split and the engine."""

    arm: str = field(default="la-lora", metadata=option(choices=ARMS))  # la-lora | dp-lora | ffa-lora | rolora
    clients: int = 4
    clients_per_round: int | None = None  # None: every client every round
    rounds: int = 10
    local_steps: int = 10
    epsilon: float | None = None  # the (epsilon, delta) target; None: DEFAULT_EPSILON unless noise_multiplier is given
    noise_multiplier: float | None = None  # a fixed noise multiplier instead of an epsilon target
    delta: float = 1e-5
    clip: float = 1.0
    beta: float = 0.5  # Dirichlet concentration of the label skew; 0: IID
    smoothing: bool | None = None  # None: the arm's default
    optimizer: str = field(default="sgd", metadata=option(choices=OPTIMIZERS))
    start_with: str = "B"  # the factor trained in the first local step (alternating arms)
    b_lr_scale: float = 1.0
    engine: str = field(default="inprocess", metadata=option(choices=ENGINES))
    deterministic_noise: bool = field(default=False, metadata=option(
        help="NOT PRIVATE: draw the batches and the noise from --seed so that a rerun repeats them (whoever knows the "
             "seed can regenerate the noise and subtract it); for reproductions and tests only"))

    def validate(self) -> None:
        """The checks that need neither the module nor the task (finetune runs them before the model loads)."""
        if self.epsilon is not None and self.noise_multiplier is not None:
            raise InvalidInputError("give epsilon (a target) or noise_multiplier, not both")
        if self.clients < 1:
            raise InvalidInputError(f"procedure la-lora option clients must be at least 1, got {self.clients}")
        if self.beta < 0:
            raise InvalidInputError(f"procedure la-lora option beta must be > 0 (Dirichlet) or 0 (IID), got {self.beta}")

    @property
    def target_epsilon(self) -> float | None:
        if self.noise_multiplier is not None:
            return None
        return DEFAULT_EPSILON if self.epsilon is None else self.epsilon


class LaLoraProcedure(Procedure):
    """The settings of one LA-LoRA job; `rankwise.training.federated.run_procedure` runs it."""

    name: ClassVar[str] = "la-lora"
    resumable: ClassVar[bool] = False  # a federated job is run whole (no checkpoints)
    runs_on: ClassVar[str] = "federated"

    def __init__(self, config: LaLoraConfig, seed: int) -> None:
        self.config, self.seed = config, seed

    def describe(self) -> dict[str, Any]:
        return {"procedure": self.name, **{f"la-lora {k}": v for k, v in sorted(dataclasses.asdict(self.config).items())}}

    def local_config(self, batch_size: int, lr: float, weight_decay: float) -> LocalDPConfig:
        """Each client's local round: the arm, its steps, Poisson batch, rate and clipping."""
        c = self.config
        return LocalDPConfig(arm=c.arm, local_steps=c.local_steps, batch_size=batch_size, lr=lr, clip=float(c.clip),
                             smoothing=c.smoothing, start_with=c.start_with, b_lr_scale=float(c.b_lr_scale),
                             optimizer=c.optimizer, weight_decay=weight_decay, deterministic_noise=c.deterministic_noise)


def la_lora_procedure(module: nn.Module, task: Any, seed: int, config: LaLoraConfig | None = None, **options: Any) -> LaLoraProcedure:
    """The builder `rankwise finetune --procedure la-lora --procedure-option KEY=VALUE` calls (options: LaLoraConfig)."""
    config = config_or_options(LaLoraConfig, config, options, "procedure la-lora")
    if not hasattr(task, "train_labels"):
        raise InvalidInputError("procedure la-lora trains a classifier: use --task wiki-topics")
    if config.clients > task.num_train:
        raise InvalidInputError(f"{config.clients} clients need at least as many training examples, the task has {task.num_train}")
    return LaLoraProcedure(config, seed)
