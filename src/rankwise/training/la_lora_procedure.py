"""`rankwise finetune --method lora --procedure la-lora --procedure-option clients=4 --procedure-option epsilon=8`

A procedure that owns its loop: `run` splits the task's training set across `clients` (Dirichlet label skew, or
IID), runs the differentially private federated job on Flower (`training.federated`) and loads the global adapter
and head into the module, which finetune then saves as a PEFT folder. `--batch-size` is each client's expected
Poisson batch, `--lr` the local SGD rate, `--seed` the job's seed; `--steps` is unused (rounds x local steps are the
budget). Writes `privacy.json` (each client's noise multiplier, steps and epsilon spent) beside the adapter.

Options (`--procedure-option KEY=VALUE`): arm (la-lora | dp-lora | ffa-lora | rolora), clients, clients_per_round,
rounds, local_steps, epsilon | noise_multiplier, delta, clip, beta (Dirichlet concentration; 0 = IID), smoothing,
optimizer (sgd | adamw), start_with (B | A), b_lr_scale, engine (inprocess | processes).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from rankwise.adapters.la_lora import ARMS, OPTIMIZERS, LocalDPConfig
from rankwise.core.io import write_json_atomic
from rankwise.core.progress import say
from rankwise.errors import InvalidInputError
from rankwise.training.federated import ENGINES, FederatedConfig
from rankwise.training.federated_job import run_federated
from rankwise.training.federated_models import classifier_model
from rankwise.training.loop import TrainConfig, TrainResult
from rankwise.training.partition import dirichlet_partition, iid_partition
from rankwise.training.procedures import Procedure

# option -> (accepted types, default)
OPTIONS: dict[str, tuple[tuple[type, ...], Any]] = {
    "arm": ((str,), "la-lora"), "clients": ((int,), 4), "clients_per_round": ((int, type(None)), None),
    "rounds": ((int,), 10), "local_steps": ((int,), 10), "epsilon": ((int, float, type(None)), 8.0),
    "noise_multiplier": ((int, float, type(None)), None), "delta": ((float,), 1e-5), "clip": ((int, float), 1.0),
    "beta": ((int, float), 0.5), "smoothing": ((bool, type(None)), None), "optimizer": ((str,), "sgd"),
    "start_with": ((str,), "B"), "b_lr_scale": ((int, float), 1.0), "engine": ((str,), "inprocess"),
}


class LaLoraProcedure(Procedure):
    name: ClassVar[str] = "la-lora"
    resumable: ClassVar[bool] = False  # a federated job is run whole (no checkpoints)
    owns_loop: ClassVar[bool] = True

    def __init__(self, module: nn.Module, options: Mapping[str, Any], seed: int) -> None:
        self.options = dict(options)
        self.seed = seed
        self.model = classifier_model(module)  # a SequenceClassifier with LoRA A/B factors, checked now

    def describe(self) -> dict[str, Any]:
        return {"procedure": self.name, **{f"la-lora {k}": v for k, v in sorted(self.options.items())}}

    def job_config(self, config: TrainConfig) -> FederatedConfig:
        o = self.options
        epsilon = o["epsilon"] if o["noise_multiplier"] is None else None
        local = LocalDPConfig(arm=o["arm"], local_steps=o["local_steps"], batch_size=config.batch_size, lr=config.lr,
                              clip=float(o["clip"]), smoothing=o["smoothing"], start_with=o["start_with"],
                              b_lr_scale=float(o["b_lr_scale"]), optimizer=o["optimizer"], weight_decay=config.weight_decay)
        return FederatedConfig(rounds=o["rounds"], clients_per_round=o["clients_per_round"], local=local,
                               epsilon=None if epsilon is None else float(epsilon), delta=float(o["delta"]),
                               noise_multiplier=None if o["noise_multiplier"] is None else float(o["noise_multiplier"]),
                               seed=config.seed, engine=o["engine"])

    def run(self, module: nn.Module, task: Any, config: TrainConfig, out_dir: Any, run_config: Mapping[str, Any]) -> TrainResult:
        job = self.job_config(config)
        job.validate()
        data = task.batch(torch.arange(task.num_train))  # every example, padded to the longest
        data = {k: data[k] for k in ("input_ids", "attention_mask", "labels")}
        o = self.options
        if o["beta"] == 0:
            parts = iid_partition(task.num_train, o["clients"], config.batch_size, config.seed)
        else:
            parts = dirichlet_partition(data["labels"], o["clients"], float(o["beta"]), config.batch_size, config.seed)
        builder = _builder(run_config, task) if job.engine == "processes" else None
        t0 = time.perf_counter()

        def report(r: int, record: dict[str, float]) -> None:
            say(f"la-lora round {r}/{job.rounds}: clients' mean loss {record['loss']:.4f}")

        result = run_federated(self.model, data, parts, job, builder, on_round=report)
        self.model.set_tensors(result.parameters)
        module.eval()
        final = task.evaluate(module)
        if out_dir is not None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            write_json_atomic(Path(out_dir) / "privacy.json", {"arm": o["arm"], "delta": job.delta, "target_epsilon": job.epsilon,
                                                                "client_sizes": [len(p) for p in parts], **result.privacy()})
        history = [{"step": r["round"], "loss": r["loss"], "lr": config.lr, "grad_norm": float("nan"), "tokens": 0.0,
                    "clipped_fraction": r["clipped_fraction"]} for r in result.rounds]
        # The clients' local SGD keeps no state across rounds (AdamW's is rebuilt each round): an empty optimizer over
        # the trained tensors stands for it in the run's record (state bytes 0).
        record = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=config.lr)
        return TrainResult(steps=job.rounds, final=final, history=history, evals=[{"step": job.rounds, **final}],
                           wall_s=time.perf_counter() - t0, optimizer=record)


def _builder(run_config: Mapping[str, Any], task: Any) -> tuple[str, dict[str, Any]]:
    """How a client process rebuilds this module: the finetune command's model, rank, targets and options."""
    targets = run_config.get("targets_regex") or (
        [t.strip() for t in run_config["targets"].split(",") if t.strip()] if run_config.get("targets") else None)
    options = {k[len("option "):]: v for k, v in run_config.items() if k.startswith("option ")}
    adapter = {"rank": run_config["rank"], "targets": targets, "top_k_layers": run_config.get("top_k_layers"), "options": options}
    return ("rankwise.training.federated_models:adapted_classifier",
            {"base": {"embedded": run_config["model"]}, "num_labels": task.num_labels, "adapter": adapter})


def check_option_values(options: Mapping[str, Any]) -> None:
    """The checks of the given options that need neither the module nor the task (run by `finetune` before the
    model loads, through the procedure table, and again by the builder); their types are checked already."""
    if "noise_multiplier" in options and "epsilon" in options:
        raise InvalidInputError("give epsilon (a target) or noise_multiplier, not both")
    if options.get("clients", OPTIONS["clients"][1]) < 1:
        raise InvalidInputError(f"procedure la-lora option clients must be at least 1, got {options['clients']}")
    if options.get("beta", OPTIONS["beta"][1]) < 0:
        raise InvalidInputError(f"procedure la-lora option beta must be > 0 (Dirichlet) or 0 (IID), got {options['beta']}")


def la_lora_procedure(module: nn.Module, task: Any, seed: int, **options: Any) -> LaLoraProcedure:
    """The builder `rankwise finetune --procedure la-lora --procedure-option KEY=VALUE` calls (options: see OPTIONS)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidInputError(f"procedure la-lora has no option(s) {unknown}; its options are {list(OPTIONS)}")
    values = {k: options.get(k, default) for k, (_, default) in OPTIONS.items()}
    for k, v in options.items():
        types = OPTIONS[k][0]
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise InvalidInputError(f"procedure la-lora option {k} must be {' or '.join(t.__name__ for t in types)}, got {v!r}")
    if values["arm"] not in ARMS:
        raise InvalidInputError(f"procedure la-lora option arm must be one of {list(ARMS)}, got {values['arm']!r}")
    if values["optimizer"] not in OPTIMIZERS:
        raise InvalidInputError(f"procedure la-lora option optimizer must be one of {list(OPTIMIZERS)}, got {values['optimizer']!r}")
    if values["engine"] not in ENGINES:
        raise InvalidInputError(f"procedure la-lora option engine must be one of {list(ENGINES)}, got {values['engine']!r}")
    check_option_values(options)
    if not hasattr(task, "train_labels"):
        raise InvalidInputError("procedure la-lora trains a classifier: use --task wiki-topics")
    if values["clients"] * 1 > task.num_train:
        raise InvalidInputError(f"{values['clients']} clients need at least as many training examples, the task has {task.num_train}")
    return LaLoraProcedure(module, values, seed)
