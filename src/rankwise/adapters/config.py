"""Adapter configurations and target selection (which `nn.Linear` modules get an adapter).

Selection follows PEFT's `target_modules` semantics so a PEFT user's list means the same thing here:
- a list of names: a module is chosen when its full name equals an entry or ends with "." + entry;
- a string: a regular expression that must match the *whole* module name.
`layers_to_transform` then keeps only modules inside the given layer indices of the model's layer stack
(`model.layers.<i>.`, `encoder.layer.<i>.`, ...).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import nn

from rankwise.core.layer_names import DEFAULT_LAYER_PATTERNS, layer_index, module_type  # noqa: F401  (re-exported)
from rankwise.errors import InvalidInputError



@dataclass
class AdapterConfig:
    """Settings every adapter type shares. Subclasses add their own fields and set `method`."""

    method: ClassVar[str] = ""

    r: int = 8
    target_modules: list[str] | str = field(default_factory=lambda: ["q_proj", "v_proj"])
    layers_to_transform: list[int] | None = None
    layers_pattern: str | None = None  # None: try DEFAULT_LAYER_PATTERNS

    def validate(self) -> None:
        check_field_types(self)
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 1:
            raise InvalidInputError(f"{self.method} rank r must be a positive integer, got {self.r!r}")
        if isinstance(self.target_modules, str):
            try:
                re.compile(self.target_modules)
            except re.error as e:
                raise InvalidInputError(f"target_modules {self.target_modules!r} is not a valid regular expression ({e})") from e
        elif not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            raise InvalidInputError(f"target_modules must be a regex string or a non-empty list of module names, got {self.target_modules!r}")
        if self.layers_to_transform is not None and not all(isinstance(i, int) and i >= 0 for i in self.layers_to_transform):
            raise InvalidInputError(f"layers_to_transform must be non-negative layer indices, got {self.layers_to_transform!r}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["method"] = self.method
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdapterConfig:
        """Build from a dict; keys this version does not know are reported with a warning and ignored."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - {"method"})
        if unknown:
            warnings.warn(f"{cls.__name__}: ignoring unknown config key(s) {unknown} (written by a newer or different version?)", stacklevel=2)
        return cls(**{k: v for k, v in data.items() if k in known})


_SIMPLE_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "None": (type(None),)}


def check_field_types(config: AdapterConfig) -> None:
    """Each field of a scalar type (int, float, bool, str, unions of them with None) holds a value of that type.

    A config built from text (`--option lora_alpha=abc`) would otherwise fail deep in the forward pass with a
    TypeError; fields of other types (lists, dicts) are left to the subclasses' own checks.
    """
    for f in dataclasses.fields(config):
        alternatives = [a.strip() for a in str(f.type).split("|")]
        if not all(a in _SIMPLE_TYPES for a in alternatives):
            continue
        value = getattr(config, f.name)
        allowed = tuple(t for a in alternatives for t in _SIMPLE_TYPES[a])
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise InvalidInputError(
                f"{config.method or type(config).__name__} option {f.name} must be {' or '.join(alternatives)}, "
                f"got {value!r} ({type(value).__name__})"
            )


def name_matches(module_name: str, target_modules: list[str] | str) -> bool:
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, module_name) is not None
    return any(module_name == t or module_name.endswith("." + t) for t in target_modules)


def find_targets(model: nn.Module, config: AdapterConfig, skip: Iterable[str] = ()) -> list[str]:
    """Names of the `nn.Linear` modules `config` selects, in `named_modules` order.

    Raises InvalidInputError when nothing matches, listing some linear module names the user could have meant.
    """
    config.validate()
    skip = set(skip)
    linear_names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in skip]
    chosen = [n for n in linear_names if name_matches(n, config.target_modules)]
    if config.layers_to_transform is not None:
        wanted = set(config.layers_to_transform)
        chosen = [n for n in chosen if layer_index(n, config.layers_pattern) in wanted]
    if not chosen:
        examples = sorted({n.rsplit(".", 1)[-1] for n in linear_names})[:12]
        where = f" within layers {config.layers_to_transform}" if config.layers_to_transform is not None else ""
        raise InvalidInputError(
            f"no nn.Linear module matched target_modules={config.target_modules!r}{where}; "
            f"this model's linear modules end in {examples} (full names via model.named_modules())"
        )
    return chosen
