"""The adapter types, by method name: one explicit table (the CLI's `--method`, saved configs, the loader read it).

A new method adds its `Adapter` subclass here; its `method` attribute (and its config's) must equal the key, which
`tests/adapters/test_adapters.py` checks.
"""

from __future__ import annotations

from rankwise.adapters.base import Adapter
from rankwise.adapters.coa_lora import CoaLoraAdapter
from rankwise.adapters.guardspace import GuardSpaceAdapter
from rankwise.adapters.lora import LoraAdapter
from rankwise.adapters.pica import PicaAdapter
from rankwise.adapters.svft import SvftAdapter
from rankwise.errors import UnknownNameError

ADAPTER_TYPES: dict[str, type[Adapter]] = {
    "lora": LoraAdapter,  # also PiSSA: LoraConfig(init="pissa")
    "pica": PicaAdapter,
    "guardspace": GuardSpaceAdapter,
    "svft": SvftAdapter,
    "coa-lora": CoaLoraAdapter,
}


def adapter_type(method: str) -> type[Adapter]:
    """The `Adapter` subclass of `method`; raises UnknownNameError listing the known ones."""
    if method not in ADAPTER_TYPES:
        raise UnknownNameError(f"unknown adapter method {method!r}; known: {sorted(ADAPTER_TYPES)}")
    return ADAPTER_TYPES[method]
