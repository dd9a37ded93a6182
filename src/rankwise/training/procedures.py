"""The training procedures, by name, from the registry records: what `rankwise finetune --procedure NAME
--procedure-option KEY=VALUE` offers, checks before any model is loaded, builds and runs.

Each record names its procedure's builder `(module, task, seed, config)` and config dataclass as strings, so this
table imports a method's code only for the procedure asked for. The options are the config's fields, parsed by the
one `KEY=VALUE` parser (`core.options`), so nothing is declared twice.

    config = check_procedure_options("lmao", {"base_lr": 1e-6})      # before the model loads
    procedure = build_procedure("lmao", module, task, seed, base_lr=1e-6)
    result = run_procedure(procedure, module, task, TrainConfig(...), out_dir)   # the loop, or the procedure's engine
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from rankwise.core.options import config_from_options
from rankwise.core.training import Procedure, TrainConfig, TrainResult, train
from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.registry import ProcedureEntry, resolve
from rankwise.registry.tables import procedure_entries

# Runners other than the loop, by `Procedure.runs_on`: engines of the harness that run a procedure whole.
RUNNERS = {"federated": "rankwise.training.federated.driver:run_procedure"}
# ... and what each checks before any model is loaded: (procedure class, config, TrainConfig, task kind) -> None.
RUNNER_CHECKS = {"federated": "rankwise.training.federated.driver:check_before_work"}


def procedure_entry(name: str) -> ProcedureEntry:
    entries = procedure_entries()
    if name not in entries:
        raise UnknownNameError(f"unknown training procedure {name!r}; known: {sorted(entries)}")
    return entries[name]


def check_procedure_options(name: str, options: Mapping[str, Any]) -> Any:
    """The procedure's config built from `--procedure-option` values: a RankwiseError, before any model is loaded,
    for an unknown procedure or option, a value of the wrong type or out of range, or a missing required option."""
    entry = procedure_entry(name)
    return config_from_options(resolve(entry.config), options, f"--procedure {name}", "--procedure-option")


def procedure_class(name: str) -> type[Procedure] | None:
    """The `Procedure` subclass that the builder of `name` returns, read from its return annotation (every registered
    builder has one; tests/training/test_procedures.py checks it), so that its `runs_on` and `resumable` are known
    before any model is loaded. None when the annotation names no Procedure subclass."""
    builder = resolve(procedure_entry(name).builder)
    try:
        cls = typing.get_type_hints(builder).get("return")
    except (NameError, TypeError, AttributeError):  # an annotation that does not resolve
        return None
    return cls if isinstance(cls, type) and issubclass(cls, Procedure) else None


def check_procedure_run(name: str, config: Any, train: TrainConfig, task_kind: str) -> None:
    """Before any model is loaded, what the procedure's class says about this run: a loop procedure that keeps state
    a checkpoint cannot store refuses checkpoints (finetune's default `--checkpoint-every 50` included), and one run
    by another engine has that engine check the job it would run (`RUNNER_CHECKS`: e.g. the federated one checks the
    task, the rounds, the privacy target and the clients' local settings). `config`: from `check_procedure_options`;
    `task_kind`: the task's registry kind ("text-classification", ...)."""
    cls = procedure_class(name)
    if cls is None:
        return  # nothing known up front: the loop or the engine still refuses, later
    if cls.runs_on == "loop":
        if not cls.resumable and train.checkpoint_every:
            raise InvalidInputError(f"--procedure {name} keeps state a checkpoint cannot store, so its runs cannot be "
                                    "resumed: pass --checkpoint-every 0 (no checkpoints)")
        return
    if cls.runs_on in RUNNER_CHECKS:
        resolve(RUNNER_CHECKS[cls.runs_on])(cls, config, train, task_kind)


def build_procedure(name: str, module: nn.Module, task: Any, seed: int, **options: Any) -> Procedure:
    """The procedure `name` for this module and task; `options` are its config's fields."""
    config = check_procedure_options(name, options)
    return resolve(procedure_entry(name).builder)(module, task, seed, config)


def check_trains(name: str, full: bool, method: str | None = None) -> None:
    """Refuse a procedure that trains an adapter with `--method full`, one that trains the base with an adapter, or
    an adapter `method` the procedure's record does not list among those it can train."""
    entry = procedure_entry(name)
    trains = entry.trains
    if full and trains == "adapter":
        raise InvalidInputError(f"--procedure {name} trains an adapter: it needs an adapter --method, not full")
    if not full and trains == "base":
        raise InvalidInputError(f"--procedure {name} trains the model's own weights: it needs --method full")
    if not full and method is not None and entry.adapters and method not in entry.adapters:
        raise InvalidInputError(f"--procedure {name} trains {' or '.join(entry.adapters)} adapters, not --method "
                                f"{method}: use --method {entry.adapters[0]}")


def run_procedure(procedure: Procedure | None, module: nn.Module, task: Any, config: TrainConfig,
                  out_dir: str | Path | None = None, run_config: Mapping[str, Any] | None = None,
                  **train_options: Any) -> TrainResult:
    """Train `module` on `task` with `procedure`: the loop (`train`, given `train_options` such as resume and
    optimizer) for a loop procedure or none, else the engine its `runs_on` names (which runs it whole)."""
    if procedure is None or procedure.runs_on == "loop":
        return train(module, task, config, out_dir=out_dir, run_config=run_config, procedure=procedure, **train_options)
    if procedure.runs_on not in RUNNERS:
        raise UnknownNameError(f"procedure {procedure.name!r} runs on {procedure.runs_on!r}; known runners: "
                               f"['loop', {', '.join(repr(r) for r in RUNNERS)}]")
    return resolve(RUNNERS[procedure.runs_on])(procedure, module, task, config, out_dir, dict(run_config or {}))
