"""The CoA-LoRA training procedure: every micro-batch on a quantized base drawn from the configuration set.

    rankwise finetune --model minilm-l6 --task wiki-topics --method coa-lora --rank 8 --procedure coa-lora \
        --procedure-option bits=2,3,4,8 --checkpoint-every 0 --grad-accum 2 --out DIR

Per optimizer step with `grad_accum=2` (the authors' recipe): before each micro-batch a configuration is drawn (a
pure function of seed, step, micro) from the current set C, the base is quantized to it by lookup in the
precomputed bank and the adapters are told it; the two losses' gradients accumulate, the loop clips at 1.0 and
steps once. Every `search_every` steps the Pareto search (`rankwise.recipes.coa_lora.search`) refines C using the
loss of the step's last batch. At the end the deployed configuration (lowest archived loss within `deploy_bits`
average bits; the ILP allocation at that budget when nothing was searched) is applied, so the final evaluation and
the adapter folder finetune writes are that configuration's: its PEFT files are the adjusted LoRA (A, B (I + U)),
to be loaded onto that configuration's quantized base, which finetune writes as DIR/model (`changes_base`); the
configuration itself is recorded in the adapter's `knobs`.

Modes (`search=`): `pareto` (the method), `frozen` (the initial ILP pool, never searched), `random` (every knob of
every layer uniform per micro-batch: the no-search ablation and Shared-LoRA's sampler), `fixed` (one configuration,
`fixed=(b0, b1, b2, B0, B1)` on every layer, or a list of one option per layer: a QLoRA-style per-configuration adapter). Works with `--method lora`
too (then only the base changes: Shared-LoRA / QLoRA-style baselines).

Not resumable: the archive and the GP search live in the procedure, not in the checkpoint (pass
`--checkpoint-every 0`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from rankwise.adapters.coa_lora import CoaLoraAdapter
from rankwise.core.options import config_from_options, config_or_options, option
from rankwise.core.progress import say
from rankwise.core.training import Procedure
from rankwise.errors import InvalidInputError
from rankwise.recipes.coa_lora.bank import DEFAULT_MAX_BANK_GIB, QuantizedBank, adapted_layers, space_for
from rankwise.recipes.coa_lora.search import ConfigurationSearch, ilp_pool, stream_seed
from rankwise.recipes.coa_lora.space import Configuration

MODES = ("pareto", "frozen", "random", "fixed")
MAX_GRID_POINTS = 1_000  # budgets / bins: the paper's grids have ~100 (2.5..7.3 by 0.05)
_KNOB_OPTIONS = ("bits", "scale_bits", "scale_dtypes", "blocks", "scale_blocks")
Knob = int | str | tuple[Any, ...]  # one value or a list of values of one quantization knob


@dataclass(frozen=True)
class CoaLoraProcedureConfig:
    """The configuration space (each knob's values), the search and the deployment budget; see the module docstring."""

    bits: Knob = (2, 3, 4, 8)
    scale_bits: Knob = (8,)
    scale_dtypes: Knob = ("fp32",)
    blocks: Knob = (16, 32, 64)
    scale_blocks: Knob = (256,)
    search: str = field(default="pareto", metadata=option(choices=MODES))
    fixed: tuple[Any, ...] | None = None  # one option (b0, b1, b2, B0, B1), or one per layer
    search_every: int = 50
    n_starts: int = 5
    max_climb: int | None = None
    budgets: tuple[float, ...] = (2.5, 7.3, 0.05)  # (low, high, step) of the ILP pool's bit budgets
    bins: tuple[float, ...] = (2.25, 6.5, 0.25)  # (low, high, step) of the search's bit bins
    deploy_bits: float = 4.25
    max_bank_gib: float = DEFAULT_MAX_BANK_GIB

    def validate(self) -> None:
        self.options()

    def options(self) -> dict[str, Any]:
        """The options as the procedure uses them (every knob a tuple); InvalidInputError for a bad value."""
        return _checked(dataclasses.asdict(self))


DEFAULTS: dict[str, Any] = dataclasses.asdict(CoaLoraProcedureConfig())


def _as_tuple(value: Any, name: str) -> tuple:
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (list, tuple)) and value:
        return tuple(value)
    raise InvalidInputError(f"coa-lora procedure option {name} must be a value or a list of values, got {value!r}")


def _number(value: Any, name: str, low: float, integer: bool = False) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or value < low:
        kind = "an integer" if integer else "a number"
        raise InvalidInputError(f"coa-lora procedure option {name} must be {kind} >= {low}, got {value!r}")
    return value


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The procedure's options with defaults filled in; InvalidInputError for an unknown or bad one."""
    return config_from_options(CoaLoraProcedureConfig, options, "coa-lora procedure").options()


def _checked(o: dict[str, Any]) -> dict[str, Any]:
    for name in _KNOB_OPTIONS:
        o[name] = _as_tuple(o[name], name)
    if o["search"] not in MODES:
        raise InvalidInputError(f"coa-lora procedure option search must be one of {MODES}, got {o['search']!r}")
    if (o["search"] == "fixed") != (o["fixed"] is not None):
        raise InvalidInputError("coa-lora: search=fixed needs fixed=(b0, b1, b2, B0, B1), and fixed is only for search=fixed")
    _number(o["search_every"], "search_every", 1, integer=True)
    _number(o["n_starts"], "n_starts", 1, integer=True)
    if o["max_climb"] is not None:
        _number(o["max_climb"], "max_climb", 0, integer=True)
    _number(o["deploy_bits"], "deploy_bits", 0)
    _number(o["max_bank_gib"], "max_bank_gib", 0)
    for name in ("budgets", "bins"):
        v = o[name]
        if not (isinstance(v, (list, tuple)) and len(v) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
                and v[0] < v[1] and v[2] > 0):
            raise InvalidInputError(f"coa-lora procedure option {name} is (low, high, step) with low < high and step > 0, got {v!r}")
        count = math.floor((v[1] - v[0]) / v[2]) + 1
        if count > MAX_GRID_POINTS:  # each budget is an ILP solve and each bin a Pareto segment: bound them first
            raise InvalidInputError(f"coa-lora procedure option {name}={tuple(v)} has {count:,} points; at most "
                                    f"{MAX_GRID_POINTS:,} are allowed (a larger step)")
    return o


class CoaLoraProcedure(Procedure):
    """See the module docstring. Built by `coa_lora_procedure`."""

    name: ClassVar[str] = "coa-lora"
    resumable: ClassVar[bool] = False
    # finetune then writes the deployed configuration's quantized base as DIR/model (the adapter's base model), so
    # the PEFT folder in DIR/adapter loads onto exactly the base it was deployed on.
    changes_base: ClassVar[bool] = True

    def __init__(self, module: nn.Module, seed: int, options: Mapping[str, Any], reuse: CoaLoraProcedure | None = None) -> None:
        """`reuse`: a procedure built for another module with the same base weights and options (an experiment's
        arms), whose quantized bank and initial pool are shared instead of recomputed."""
        self.options = dict(options)
        self.seed = seed
        choices = tuple(self.options[k] for k in _KNOB_OPTIONS)
        layers = adapted_layers(module)
        for name, layer in layers.items():  # every knob value must be one the adapter's network embeds
            for adapter in layer.adapters.values():
                if isinstance(adapter, CoaLoraAdapter):
                    for knob, mine, theirs in zip(_KNOB_OPTIONS, choices, adapter.config.choices()):
                        extra = [v for v in mine if v not in theirs]
                        if extra:
                            raise InvalidInputError(f"coa-lora procedure {knob}={list(mine)}: {extra} not in the adapter's "
                                                    f"choices {list(theirs)} (set them with --option {knob}=...)")
        self.space = space_for(module, choices)
        self.fixed: Configuration | None = None
        fixed = self.options["fixed"]
        if fixed is not None:  # one option for every layer, or one per layer
            nested = isinstance(fixed, (list, tuple)) and fixed and isinstance(fixed[0], (list, tuple))
            self.fixed = self.space.check(fixed) if nested else self.space.uniform(fixed)
        self.bank = QuantizedBank(module, self.space, self.options["max_bank_gib"], reuse.bank if reuse else None)
        low, high, step = self.options["budgets"]
        self.pool = reuse.pool if reuse else ilp_pool(self.space, self.bank.errors, np.arange(low, high + step / 2, step))
        self.search = ConfigurationSearch(self.space, self.pool, seed, self.options["n_starts"], tuple(self.options["bins"]),
                                          self.options["max_climb"])
        self.drawn: list[Configuration] = []  # every micro-batch's configuration, in order (for the record)

    # ---- hooks ---------------------------------------------------------------------------------------------------
    def draw(self, step: int, micro: int) -> Configuration:
        """The configuration of micro-batch `micro` of step `step` (a pure function of seed, step, micro and C)."""
        mode = self.options["search"]
        if mode == "fixed":
            return self.fixed
        rng = np.random.default_rng(stream_seed(self.seed, "draw", step, micro))
        if mode == "random":
            return self.space.random(rng)
        pool = self.search.training_set
        return pool[int(rng.integers(len(pool)))]

    def before_micro_batch(self, step: int, micro: int) -> None:
        config = self.draw(step, micro)
        if config != self.bank.current:
            self.bank.apply(config)
        self.drawn.append(config)

    def after_step(self, step: int, module: nn.Module, task: Any, batch: Mapping[str, torch.Tensor]) -> None:
        if self.options["search"] != "pareto" or (step + 1) % self.options["search_every"]:
            return
        record = self.search.update(lambda c: self.batch_loss(module, task, batch, c), step)
        say(f"coa-lora search at step {step + 1}: archive {record['archive']}, {record['new']} new, "
            f"training set {record['training_set']} configurations over {record['bits_range']} bits")

    @torch.no_grad()
    def batch_loss(self, module: nn.Module, task: Any, batch: Mapping[str, torch.Tensor], config: Sequence) -> float:
        """Task loss of `batch` on configuration `config` with the current adapter (eval mode: no dropout)."""
        was = module.training
        self.bank.apply(config)
        module.eval()
        try:
            return float(task.loss(module, batch))
        finally:
            module.train(was)

    def deployed_configuration(self) -> Configuration:
        if self.fixed is not None:
            return self.fixed
        budget = float(self.options["deploy_bits"])
        best = self.search.best_within(budget) if self.options["search"] == "pareto" else None
        if best is not None:
            return best
        within = [c for c in self.pool if self.space.average_bits(c) <= budget + 1e-12]
        if not within:
            raise InvalidInputError(f"coa-lora: no configuration within deploy_bits={budget}; the cheapest pool member has "
                                    f"{min(self.space.average_bits(c) for c in self.pool):.3f} bits")
        return max(within, key=self.space.average_bits)  # the ILP allocation closest to the budget

    def end_of_training(self, module: nn.Module) -> None:
        config = self.bank.apply(self.deployed_configuration())
        say(f"coa-lora: deployed configuration at {self.space.average_bits(config):.3f} bits per weight")

    def describe(self) -> dict[str, Any]:
        return {"procedure": self.name, **{f"coa-lora {k}": v for k, v in sorted(self.options.items())}}


def coa_lora_procedure(module: nn.Module, task: Any, seed: int, config: CoaLoraProcedureConfig | None = None, **options: Any) -> CoaLoraProcedure:
    """Builder for `rankwise finetune --procedure coa-lora --procedure-option KEY=VALUE` (see the module docstring)."""
    config = config_or_options(CoaLoraProcedureConfig, config, options, "coa-lora procedure")
    return CoaLoraProcedure(module, seed, config.options())
