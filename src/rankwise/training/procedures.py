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


def build_procedure(name: str, module: nn.Module, task: Any, seed: int, **options: Any) -> Procedure:
    """The procedure `name` for this module and task; `options` are its config's fields."""
    config = check_procedure_options(name, options)
    return resolve(procedure_entry(name).builder)(module, task, seed, config)


def check_trains(name: str, full: bool) -> None:
    """Refuse a procedure that trains an adapter with `--method full`, or one that trains the base with an adapter."""
    trains = procedure_entry(name).trains
    if full and trains == "adapter":
        raise InvalidInputError(f"--procedure {name} trains an adapter: it needs an adapter --method, not full")
    if not full and trains == "base":
        raise InvalidInputError(f"--procedure {name} trains the model's own weights: it needs --method full")


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
