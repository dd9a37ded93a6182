"""The options a training procedure declares (`--procedure-option KEY=VALUE`), checked before any model is loaded.

A procedure's builder `(module, task, seed, **options)` needs the module, so it runs only after the model is loaded
and adapted; an unknown key, a value of the wrong type or a missing required option would then cost that load.
Each registration in `training.procedure_table` therefore declares its options as a table of `ProcedureOption`s,
and `check_options` checks what needs no module: names, types (of the parsed value: `finetune.parse_options`
reads `1e-4` as a float and `kl` as the string 'kl'), allowed values, required options, and a procedure-wide
`check` for value ranges. The builder still checks everything that depends on the module (layer indices, the
adapter's choices, the previous stage's adapter) and repeats the rest, so calling it directly is as safe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rankwise.errors import InvalidInputError

NUMBER = (int, float)  # bool is an int to Python but never a number here (see `_is_a`)
_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool", list: "list", tuple: "tuple", type(None): "None"}


@dataclass(frozen=True)
class ProcedureOption:
    """One `--procedure-option KEY=VALUE`: the parsed value's accepted types, the values it may take (`choices`;
    None: any of those types), and whether it is required (then the error shows KEY=`metavar` and `help`)."""

    types: tuple[type, ...]
    required: bool = False
    metavar: str = "VALUE"
    choices: tuple[Any, ...] | None = None
    help: str = ""


@dataclass(frozen=True)
class ProcedureOptions:
    """A procedure's declared options, plus `check(options)`: what its builder checks without the module (value
    ranges, combinations), raising InvalidInputError."""

    options: Mapping[str, ProcedureOption]
    check: Callable[[Mapping[str, Any]], None] | None = None


def _is_a(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    return isinstance(value, types)


def check_options(procedure: str, declared: ProcedureOptions, given: Mapping[str, Any]) -> None:
    """InvalidInputError for an unknown option, a value of a type or outside the choices its declaration allows, a
    missing required option, or what `declared.check` refuses. `given`: the parsed --procedure-option values."""
    names = list(declared.options)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise InvalidInputError(f"--procedure {procedure} has no option(s) {unknown}; its options are {names}")
    for key, spec in declared.options.items():
        if key not in given:
            if spec.required:
                why = f" ({spec.help})" if spec.help else ""
                raise InvalidInputError(f"--procedure {procedure} needs --procedure-option {key}={spec.metavar}{why}")
            continue
        value = given[key]
        if not _is_a(value, spec.types):
            kinds = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in spec.types)
            raise InvalidInputError(f"--procedure {procedure}: option {key} must be {kinds}, got {value!r}")
        if spec.choices is not None and value not in spec.choices:
            raise InvalidInputError(f"--procedure {procedure}: option {key} must be one of {list(spec.choices)}, got {value!r}")
    if declared.check is not None:
        declared.check(given)
