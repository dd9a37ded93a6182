"""Fields of the JSON files rankwise reads back (configs, records, manifests, checkpoints), checked for the type the
reader needs: a hand-edited or crafted file gets a `CorruptFileError` naming the file and the field, instead of a
TypeError or KeyError deep inside the reader. Torch-free (`rankwise info` reads folders with it).

    q = json_object(read_json(path), path)                  # the file holds an object
    recipe = json_field(q, "recipe", dict, path, {})         # absent or null: the default
    layers = json_field(q, "layers", dict, path, required=True)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rankwise.errors import CorruptFileError

_NAMES = {dict: "a JSON object", list: "a list", str: "a string", int: "an integer", float: "a number", bool: "true or false"}
_MISSING = object()


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON true is no integer or number
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


def json_object(value: Any, where: str | os.PathLike) -> dict[str, Any]:
    """`value` (a parsed JSON file) if it is an object; else CorruptFileError naming the file `where`."""
    if not isinstance(value, dict):
        raise CorruptFileError(f"{where} holds {_kind(value)}, not a JSON object: it was edited or is not rankwise's file")
    return value


def json_field(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], where: str | os.PathLike,
               default: Any = None, required: bool = False) -> Any:
    """`data[key]` when it is one of `kinds` (a bool counts only as bool; an int counts as a float); `default` when it
    is absent or null, unless `required`. Anything else raises CorruptFileError naming the file `where` and the key."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    value = data.get(key, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise CorruptFileError(f"{where} lacks its field {key!r}: it was edited or is incomplete")
        return default
    if not _is(value, kinds):
        wanted = " or ".join(_NAMES.get(k, k.__name__) for k in kinds)
        shown = repr(value) if len(repr(value)) <= 60 else f"{repr(value)[:57]}..."
        raise CorruptFileError(f"{where}: field {key!r} must be {wanted}, got {_kind(value)} {shown}: the file was "
                               "edited or is not rankwise's")
    return value


def json_list_of(data: Mapping[str, Any], key: str, kind: type, where: str | os.PathLike,
                 default: Any = None, required: bool = False) -> Any:
    """`json_field(..., list)` whose every item is a `kind` (e.g. a list of module names)."""
    value = json_field(data, key, list, where, default, required)
    if value is not default and not all(_is(v, (kind,)) for v in value):
        raise CorruptFileError(f"{where}: field {key!r} must be a list of {_NAMES.get(kind, kind.__name__)}s: the file was "
                               "edited or is not rankwise's")
    return value
