"""The built-in training procedures, registered under their CLI names (`rankwise finetune --procedure NAME`) with
the options each declares (`training.procedure_options`), `check_procedure_options`, which finetune calls before
it loads a model, and `build_procedure`, which it calls once the module exists.

Each method registers one entry here: `_register("lmao", lmao_procedure, ProcedureOptions({...}, check))`, its
builder living beside the method's code. (Here rather than in `procedures`, which every procedure module imports: no
import cycle.) `tests/training/test_procedure_options.py` checks that each declaration names exactly the options its
builder takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from rankwise.errors import InvalidInputError, UnknownNameError
from rankwise.training.procedure_options import NUMBER, ProcedureOption, ProcedureOptions, check_options
from rankwise.training.procedures import PROCEDURES, Procedure, ProcedureBuilder, register_procedure

# CLI name -> the options its builder takes (filled by `_register` below, beside PROCEDURES)
PROCEDURE_OPTIONS: dict[str, ProcedureOptions] = {}


def _register(name: str, builder: ProcedureBuilder, options: ProcedureOptions) -> None:
    register_procedure(name, builder)
    PROCEDURE_OPTIONS[name] = options


def check_procedure_options(name: str, options: Mapping[str, Any]) -> None:
    """What can be checked of `--procedure NAME --procedure-option ...` without a model: a RankwiseError for an
    unknown procedure or option, a value of the wrong type or out of range, or a missing required option."""
    if name not in PROCEDURES:
        raise UnknownNameError(f"unknown training procedure {name!r}; known: {sorted(PROCEDURES)}")
    check_options(name, PROCEDURE_OPTIONS[name], options)


def build_procedure(name: str, module: nn.Module, task: Any, seed: int, **options: Any) -> Procedure:
    """The procedure `name` for this module and task; options are the builder's keyword arguments."""
    check_procedure_options(name, options)
    return PROCEDURES[name](module, task, seed, **options)


# -- lmao ---------------------------------------------------------------------------------------------------------
from rankwise.optim.lmao import BASE_PARAMS, PERTURBATIONS, LmaoConfig  # noqa: E402
from rankwise.training.lmao import lmao_procedure  # noqa: E402

_register("lmao", lmao_procedure, ProcedureOptions({
    "base_lr": ProcedureOption(NUMBER), "eps": ProcedureOption(NUMBER), "weight_decay": ProcedureOption(NUMBER),
    "params": ProcedureOption((str,), choices=BASE_PARAMS), "top_k_layers": ProcedureOption((int, type(None))),
    "perturbation": ProcedureOption((str,), choices=PERTURBATIONS),
}, check=lambda options: LmaoConfig(**options).validate()))

# -- peso ---------------------------------------------------------------------------------------------------------
from rankwise.adapters.peso import DEFAULT_EPS, PROXIMAL_KINDS, check_proximal  # noqa: E402
from rankwise.training.peso import peso_procedure  # noqa: E402


def _check_peso(options: Mapping[str, Any]) -> None:
    # the values given; an option not given takes the builder's default, so a valid stand-in is checked for it
    check_proximal(options.get("lam", 0.0), options.get("proximal", PROXIMAL_KINDS[0]), options.get("eps", DEFAULT_EPS))
    folder = Path(str(options["previous"]))
    if not folder.is_dir():
        raise InvalidInputError(f"--procedure peso: previous={folder} is not a folder (pass the previous run's OUT/adapter)")


_register("peso", peso_procedure, ProcedureOptions({
    # an int too: literal_eval reads a folder named 2024 as a number (the builder takes str(previous))
    "previous": ProcedureOption((str, int), required=True, metavar="PREV_OUT/adapter",
                                help="the previous stage's adapter; the first stage is plain --method lora"),
    "lam": ProcedureOption(NUMBER), "proximal": ProcedureOption((str,), choices=PROXIMAL_KINDS),
    "eps": ProcedureOption(NUMBER), "adapter": ProcedureOption((str,)),
}, check=_check_peso))

# -- car-lora -----------------------------------------------------------------------------------------------------
from rankwise.quant.compression_ops import parse_operators  # noqa: E402
from rankwise.training.car_lora import car_lora_procedure  # noqa: E402


def _check_car_lora(options: Mapping[str, Any]) -> None:
    if "operators" in options:
        parse_operators(options["operators"])  # unknown or repeated operator names


_BLOCKS = (int, str, list, tuple)  # 28, "27,28" or (27, 28): block indices, checked against the model by the builder
_register("car-lora", car_lora_procedure, ProcedureOptions({
    "operators": ProcedureOption((str, list, tuple)), "layers": ProcedureOption(_BLOCKS), "skip_layers": ProcedureOption(_BLOCKS),
}, check=_check_car_lora))

# -- coa-lora -----------------------------------------------------------------------------------------------------
from rankwise.training.coa_lora import MODES  # noqa: E402
from rankwise.training.coa_lora import check_options as check_coa_lora  # noqa: E402
from rankwise.training.coa_lora import coa_lora_procedure  # noqa: E402

_KNOB = (int, str, list, tuple)  # one value or a list of values of one quantization knob
_register("coa-lora", coa_lora_procedure, ProcedureOptions({
    "bits": ProcedureOption(_KNOB), "scale_bits": ProcedureOption(_KNOB), "scale_dtypes": ProcedureOption(_KNOB),
    "blocks": ProcedureOption(_KNOB), "scale_blocks": ProcedureOption(_KNOB),
    "search": ProcedureOption((str,), choices=MODES),
    "fixed": ProcedureOption((list, tuple, type(None))),  # one option (b0, b1, b2, B0, B1), or one per layer
    "search_every": ProcedureOption((int,)), "n_starts": ProcedureOption((int,)),
    "max_climb": ProcedureOption((int, type(None))),
    "budgets": ProcedureOption((list, tuple)), "bins": ProcedureOption((list, tuple)),  # (low, high, step) each
    "deploy_bits": ProcedureOption(NUMBER), "max_bank_gib": ProcedureOption(NUMBER),
}, check=check_coa_lora))

# -- la-lora ------------------------------------------------------------------------------------------------------
from rankwise.adapters.la_lora import ARMS, OPTIMIZERS  # noqa: E402
from rankwise.training.federated import ENGINES  # noqa: E402
from rankwise.training.la_lora_procedure import OPTIONS as LA_LORA_OPTIONS  # noqa: E402
from rankwise.training.la_lora_procedure import check_option_values as check_la_lora  # noqa: E402
from rankwise.training.la_lora_procedure import la_lora_procedure  # noqa: E402

_LA_LORA_CHOICES = {"arm": ARMS, "optimizer": OPTIMIZERS, "engine": ENGINES}
_register("la-lora", la_lora_procedure, ProcedureOptions(
    {name: ProcedureOption(types, choices=_LA_LORA_CHOICES.get(name)) for name, (types, _) in LA_LORA_OPTIONS.items()},
    check=check_la_lora))
