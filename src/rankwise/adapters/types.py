"""The adapter types, by method name, from the registry records (`AdapterEntry`: the CLI's `--method`, saved
configs and the loader read this table). A new adapter method names its `Adapter` subclass in its record; its
`method` attribute (and its config's) must equal the name, which `tests/adapters/test_adapters.py` checks.
"""

from __future__ import annotations

from rankwise.adapters.base import Adapter
from rankwise.errors import UnknownNameError
from rankwise.registry import resolve
from rankwise.registry.tables import adapter_entries


ADAPTER_TYPES: dict[str, type[Adapter]] = {name: resolve(entry.target) for name, entry in adapter_entries().items()}


def adapter_type(method: str) -> type[Adapter]:
    """The `Adapter` subclass of `method`; raises UnknownNameError listing the known ones."""
    if method not in ADAPTER_TYPES:
        raise UnknownNameError(f"unknown adapter method {method!r}; known: {sorted(ADAPTER_TYPES)}")
    return ADAPTER_TYPES[method]
