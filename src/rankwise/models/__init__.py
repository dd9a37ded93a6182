"""The model zoo: `load_model(name_or_path)` returns (model, tokenizer), fully offline.

Attributes are imported on first use (PEP 562), so `rankwise.models.folders` (what a folder is, from its JSON) can be
read without importing torch or transformers: the CLI checks a `--model` argument before any heavy import.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "load_model": "rankwise.models.loading",
    "EMBEDDED": "rankwise.models.loading",
    "load_smollm2_tokenizer": "rankwise.models.smollm2",
    "tiny_llama": "rankwise.models.tiny",
    "tiny_bert": "rankwise.models.tiny",
    "embed_sentences": "rankwise.models.minilm",
    "MoEConfig": "rankwise.models.moe",
    "TinyMoELM": "rankwise.models.moe",
    "byte_windows": "rankwise.models.moe",
    "pretrained_moe": "rankwise.models.moe_pretrain",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module 'rankwise.models' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = ["load_model", "load_smollm2_tokenizer", "tiny_llama", "tiny_bert", "embed_sentences", "EMBEDDED", "MoEConfig",
           "TinyMoELM", "byte_windows", "pretrained_moe"]
