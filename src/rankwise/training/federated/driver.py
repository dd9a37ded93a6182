"""The federated runner of training procedures (`Procedure.runs_on == "federated"`, e.g. LA-LoRA): what
`rankwise finetune --procedure NAME` calls instead of the training loop.

`run_procedure` splits the task's training set across the procedure's clients, plans and runs the job on Flower
(`job.run_federated`), loads the global tensors into the module and returns a `TrainResult` as the loop would
(rounds as steps). The procedure says what the method decides: its `config` (clients, rounds, the privacy target,
the data split, the engine) and `local_config(batch_size, lr, weight_decay)` (each client's local round). Both come
from its settings alone: a federated procedure is built as `cls(config, seed)`, so `check_before_work` can build
and check the job it would run before any model is loaded.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankwise.core.io import write_json_atomic
from rankwise.core.progress import say
from rankwise.core.training import Procedure, TrainConfig, TrainResult
from rankwise.errors import InvalidInputError
from rankwise.training.federated.config import FederatedConfig
from rankwise.training.federated.job import run_federated
from rankwise.training.federated.models import classifier_model
from rankwise.training.federated.partition import dirichlet_partition, iid_partition


def job_config(procedure: Any, config: TrainConfig) -> FederatedConfig:
    """The federated job of `procedure` under the run's settings (batch size, lr, weight decay, seed)."""
    o = procedure.config
    local = procedure.local_config(config.batch_size, config.lr, config.weight_decay)
    epsilon = o.target_epsilon
    return FederatedConfig(rounds=o.rounds, clients_per_round=o.clients_per_round, local=local,
                           epsilon=None if epsilon is None else float(epsilon), delta=float(o.delta),
                           noise_multiplier=None if o.noise_multiplier is None else float(o.noise_multiplier),
                           seed=config.seed, engine=o.engine)


TASK_KINDS = ("text-classification",)  # what `run_procedure` can split across clients (token ids and labels)


def check_before_work(procedure_cls: type[Procedure], options: Any, config: TrainConfig, task_kind: str) -> None:
    """What `run_procedure` would refuse, checked before any model is loaded (`training.procedures.check_procedure_run`):
    a task it can split, and the job itself -- rounds, privacy target, clients per round and the clients' local
    settings -- built from the procedure `procedure_cls(options, seed)` as `run_procedure` builds it."""
    name = procedure_cls.name
    if task_kind not in TASK_KINDS:
        raise InvalidInputError(f"--procedure {name} runs a federated classification job: it needs a "
                                f"{' or '.join(TASK_KINDS)} task (e.g. --task wiki-topics), not a {task_kind} one")
    try:
        job = job_config(procedure_cls(options, config.seed), config)
        job.validate()
        clients, per_round = getattr(options, "clients", None), job.clients_per_round
        if per_round is not None and isinstance(clients, int) and not 1 <= per_round <= clients:
            raise InvalidInputError(f"clients_per_round must be between 1 and the {clients} clients, got {per_round!r}")
    except InvalidInputError as e:  # the job's own words, said of the flag that set it
        raise InvalidInputError(f"--procedure {name} (--procedure-option): {e}") from None


def run_procedure(procedure: Procedure, module: nn.Module, task: Any, config: TrainConfig, out_dir: str | Path | None,
                  run_config: Mapping[str, Any]) -> TrainResult:
    """Run a federated procedure's job on `task` and leave the global adapter (and head) in `module`."""
    model = classifier_model(module)  # a SequenceClassifier with LoRA A/B factors, checked before any work
    job = job_config(procedure, config)
    job.validate()
    data = task.batch(torch.arange(task.num_train))  # every example, padded to the longest
    data = {k: data[k] for k in ("input_ids", "attention_mask", "labels")}
    o = procedure.config
    if o.beta == 0:
        parts = iid_partition(task.num_train, o.clients, config.batch_size, config.seed)
    else:
        parts = dirichlet_partition(data["labels"], o.clients, float(o.beta), config.batch_size, config.seed)
    builder = client_builder(run_config, task) if job.engine == "processes" else None
    t0 = time.perf_counter()

    def report(r: int, record: dict[str, float]) -> None:
        say(f"{procedure.name} round {r}/{job.rounds}: clients' mean loss {record['loss']:.4f}")

    result = run_federated(model, data, parts, job, builder, on_round=report)
    model.set_tensors(result.parameters)
    module.eval()
    final = task.evaluate(module)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(out_dir) / "privacy.json", {"arm": o.arm, "delta": job.delta, "target_epsilon": job.epsilon,
                                                            "client_sizes": [len(p) for p in parts], "noise_source": noise_source(job.local),
                                                            **result.privacy()})
    history = [{"step": r["round"], "loss": r["loss"], "lr": config.lr, "grad_norm": float("nan"), "tokens": 0.0,
                "clipped_fraction": r["clipped_fraction"]} for r in result.rounds]
    # The clients' local SGD keeps no state across rounds (AdamW's is rebuilt each round): an empty optimizer over
    # the trained tensors stands for it in the run's record (state bytes 0).
    record = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=config.lr)
    return TrainResult(steps=job.rounds, final=final, history=history, evals=[{"step": job.rounds, **final}],
                       wall_s=time.perf_counter() - t0, optimizer=record)


def client_builder(run_config: Mapping[str, Any], task: Any) -> tuple[str, dict[str, Any]]:
    """How a client process rebuilds this module: the finetune command's model, rank, targets and options."""
    targets = run_config.get("targets_regex") or (
        [t.strip() for t in run_config["targets"].split(",") if t.strip()] if run_config.get("targets") else None)
    options = {k[len("option "):]: v for k, v in run_config.items() if k.startswith("option ")}
    adapter = {"rank": run_config["rank"], "targets": targets, "top_k_layers": run_config.get("top_k_layers"), "options": options}
    return ("rankwise.training.federated.models:adapted_classifier",
            {"base": {"embedded": run_config["model"]}, "num_labels": task.num_labels, "adapter": adapter})


def noise_source(local: Any) -> str:
    """Where the clients' batch draws and noise came from, for the run's record: only OS entropy is private."""
    if getattr(local, "deterministic_noise", False):
        return "deterministic from the seed: NOT PRIVATE (reproductions and tests only)"
    return "OS entropy, not recorded"
