"""Two pieces every rankwise folder of a re-encoded transformers model writes (microscaling, CodeQuant): the config
stamped with its format, with the tokenizer beside it, and the parameters left unencoded, tied ones stored once."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from rankwise.core.io import read_json, write_json_atomic


def dense_remainder(model: nn.Module, skip: Callable[[str], bool]) -> dict[str, torch.Tensor]:
    """fp32 copies of the state dict's tensors that `skip(key)` leaves (tied weights, such as lm_head =
    embed_tokens, are stored once: the first key of a storage)."""
    dense, seen = {}, set()
    for key, t in model.state_dict().items():
        ptr = t.untyped_storage().data_ptr()
        if skip(key) or ptr in seen:
            continue
        seen.add(ptr)
        dense[key] = t.detach().float().contiguous()
    return dense


def write_config_and_tokenizer(folder: Path, model: nn.Module, tokenizer, format_name: str) -> None:
    """config.json (the model's transformers config plus "rankwise_format") and the tokenizer's files, if any."""
    model.config.save_pretrained(folder)
    config = read_json(folder / "config.json")
    config["rankwise_format"] = format_name
    write_json_atomic(folder / "config.json", config)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
