"""One way to turn `KEY=VALUE` items into a typed config: every procedure, optimizer and adapter config is a
dataclass, and `config_from_options` builds one from the parsed items with the same messages everywhere.

    items = parse_key_values(["base_lr=1e-6", "params=all"], "--procedure-option")   # {"base_lr": 1e-06, "params": "all"}
    config = config_from_options(LmaoConfig, items, "--procedure lmao")              # checked, then config.validate()

Values are read as Python literals (`1e-4` is a float, `(3, 2, 1)` a tuple, `None` None) and otherwise kept as
strings (`init=pissa`). A field's annotation says what it accepts: int, float (an int too), bool, str, None,
`tuple[...]`/`list[...]` (a list or a tuple; kept as given), `Literal[...]` (those values), `Any`, or a union of
them; a bool is never accepted as a number. Field metadata (`option(...)`) adds allowed values and, for a required
field (one without a default), the metavar and help the error shows.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union

from rankwise.errors import InvalidInputError

_NAMES = {int: "int", float: "float", str: "str", bool: "bool", list: "list", tuple: "tuple", dict: "dict", type(None): "None"}


def option(choices: Sequence[Any] | None = None, metavar: str = "VALUE", help: str = "") -> dict[str, Any]:
    """Field metadata: `field(default=..., metadata=option(choices=("a", "b")))`."""
    return {"choices": None if choices is None else tuple(choices), "metavar": metavar, "help": help}


_SHELL_BOOLS = {"true": True, "false": False}


def parse_key_values(items: Sequence[str], flag: str = "--option") -> dict[str, Any]:
    """["KEY=VALUE", ...] -> {KEY: value}, each value a Python literal if it reads as one, else the string."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInputError(f"{flag} takes KEY=VALUE, got {item!r}")
        if value.lower() in _SHELL_BOOLS:  # true / false as people type them on a command line, not only True / False
            options[key] = _SHELL_BOOLS[value.lower()]
            continue
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value  # a plain string such as init=pissa
        if not _finite(options[key]):  # 1e999 reads as inf: refused here, not as a NaN loss at step 1
            raise InvalidInputError(f"{flag} {key}={value}: the number overflows or is not finite; give a finite value")
    return options


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, complex):
        return math.isfinite(value.real) and math.isfinite(value.imag)
    if isinstance(value, (list, tuple, set)):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _accepted(annotation: Any) -> tuple[tuple[type, ...], tuple[Any, ...] | None] | None:
    """(accepted types, allowed literal values or None) of an annotation; None: anything goes (Any, unknown)."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return None
    if origin in (Union, types.UnionType):
        kinds: list[type] = []
        values: list[Any] = []
        only_literals = True  # the allowed values are listed only when every arm but None is a Literal
        for arm in typing.get_args(annotation):
            got = _accepted(arm)
            if got is None:
                return None
            kinds.extend(k for k in got[0] if k not in kinds)
            if got[1] is not None:
                values.extend(got[1])
            elif got[0] != (type(None),):
                only_literals = False
        return tuple(kinds), tuple(values) if values and only_literals else None
    if origin is Literal:
        values = typing.get_args(annotation)
        return tuple(dict.fromkeys(type(v) for v in values)), values
    if origin in (tuple, list, Sequence) or annotation in (tuple, list):
        return (list, tuple), None
    if origin in (dict, Mapping) or annotation is dict:
        return (dict,), None
    if annotation is float:
        return (int, float), None
    if annotation is None or annotation is type(None):
        return (type(None),), None
    if isinstance(annotation, type):
        return (annotation,), None
    return None


def _is_a(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


def check_value(what: str, name: str, value: Any, annotation: Any, choices: Sequence[Any] | None = None) -> None:
    """InvalidInputError unless `value` fits `annotation` (and `choices`); `what` names the config in the message."""
    accepted = _accepted(annotation)
    if accepted is not None:
        kinds, literal = accepted
        if not _is_a(value, kinds):
            names = " or ".join(dict.fromkeys(_NAMES.get(k, k.__name__) for k in kinds))
            number = " (a number)" if float in kinds else ""
            raise InvalidInputError(f"{what}: option {name} must be {names}, got {value!r}{number}")
        choices = choices if choices is not None else literal
    if choices is not None and value not in choices and not (value is None and _accepts_none(annotation)):
        raise InvalidInputError(f"{what}: option {name} must be one of {list(choices)}, got {value!r}")


def _wants_float(annotation: Any) -> bool:
    """float or float | None (not int | float, where an int stays an int)."""
    arms = typing.get_args(annotation) if typing.get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    return float in arms and int not in arms


def _accepts_none(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def describe_options(cls: type) -> list[str]:
    """One line per option of config class `cls`: `name: type = default  (choices; help)`, for listings."""
    hints = typing.get_type_hints(cls)
    lines = []
    for name, f in config_fields(cls).items():
        meta = f.metadata or {}
        kind = getattr(hints.get(name), "__name__", None) or str(hints.get(name, "Any")).replace("typing.", "")
        default = ("(required)" if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                   else f"= {f.default!r}" if f.default is not dataclasses.MISSING else "= (computed)")
        notes = [f"one of {', '.join(map(str, meta['choices']))}"] if meta.get("choices") else []
        notes += [meta["help"]] if meta.get("help") else []
        lines.append(f"{name}: {kind} {default}" + (f"  ({'; '.join(notes)})" if notes else ""))
    return lines


def config_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def config_from_options(cls: type, options: Mapping[str, Any], what: str, flag: str = "--option") -> Any:
    """`cls(**options)` after checking every name, type and allowed value against `cls`'s fields, and that every
    required field is given; then `validate()` if the config has one. Messages name `what` (e.g. "--procedure
    lmao") and `flag` (for a missing required field: "needs --procedure-option previous=PREV_OUT/adapter")."""
    fields = config_fields(cls)
    unknown = [k for k in options if k not in fields]
    if unknown:
        raise InvalidInputError(f"{what} has no option(s) {sorted(unknown)}; its options are {list(fields)}")
    hints = typing.get_type_hints(cls)
    for name, f in fields.items():
        meta = f.metadata or {}
        if name not in options:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                why = f" ({meta['help']})" if meta.get("help") else ""
                raise InvalidInputError(f"{what} needs {flag} {name}={meta.get('metavar', 'VALUE')}{why}")
            continue
        check_value(what, name, options[name], hints.get(name, Any), meta.get("choices"))
    # A float field given an int (`lr=1`) holds the float: the same run as `lr=1.0`, and recorded alike.
    values = {k: float(v) if type(v) is int and _wants_float(hints.get(k, Any)) else v for k, v in options.items()}
    config = cls(**values)
    validate = getattr(config, "validate", None)
    if callable(validate):
        validate()
    return config


def check_field_types(config: Any, what: str) -> None:
    """Each field of a built config holds a value its annotation accepts (a config built in Python, not parsed)."""
    hints = typing.get_type_hints(type(config))
    for name, f in config_fields(type(config)).items():
        check_value(what, name, getattr(config, name), hints.get(name, Any), (f.metadata or {}).get("choices"))


def config_or_options(cls: type, config: Any, options: Mapping[str, Any], what: str) -> Any:
    """A builder's config: the one given (validated), or one built from keyword options by `config_from_options`
    (so `builder(module, task, seed, lr=1e-3)` and `builder(module, task, seed, Config(lr=1e-3))` are the same)."""
    if config is not None:
        if options:
            raise InvalidInputError(f"{what}: give a {cls.__name__} or keyword options, not both")
        if not isinstance(config, cls):
            raise InvalidInputError(f"{what} takes a {cls.__name__}, got {type(config).__name__}")
        check_field_types(config, what)
        validate = getattr(config, "validate", None)
        if callable(validate):
            validate()
        return config
    return config_from_options(cls, options, what)
