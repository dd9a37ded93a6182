"""Where a module sits in a model's stack of repeated blocks, read from its name (`model.layers.3.mlp.up_proj` is in
block 3). Adapters select targets by it (PEFT's `layers_to_transform`), procedures restrict themselves to the top
blocks by it (LMAO's top_k_layers, CAR-LoRA's compressed blocks)."""

from __future__ import annotations

import re

# Names of the repeated-block containers in common architectures (PEFT's defaults): Llama "layers", BERT "layer".
DEFAULT_LAYER_PATTERNS = ("layers", "layer", "h", "block", "blocks")


def layer_index(module_name: str, layers_pattern: str | None = None) -> int | None:
    """The layer-stack index in a module name (`model.layers.3.mlp.up_proj` -> 3), or None outside a stack."""
    patterns = (layers_pattern,) if layers_pattern else DEFAULT_LAYER_PATTERNS
    for p in patterns:
        m = re.search(rf"(?:^|\.){re.escape(p)}\.(\d+)(?:\.|$)", module_name)
        if m:
            return int(m.group(1))
    return None


def module_type(module_name: str, layers_pattern: str | None = None) -> str:
    """The name with its layer index replaced by '*': all layers' modules of one kind share this key.

    `model.layers.3.self_attn.q_proj` -> `model.layers.*.self_attn.q_proj`. Grouping by the full name pattern (not
    by the last component) keeps BERT's `attention.output.dense` apart from the FFN's `output.dense`.
    """
    patterns = (layers_pattern,) if layers_pattern else DEFAULT_LAYER_PATTERNS
    for p in patterns:
        new, n = re.subn(rf"((?:^|\.){re.escape(p)}\.)\d+(?=\.|$)", r"\1*", module_name, count=1)
        if n:
            return new
    return module_name
