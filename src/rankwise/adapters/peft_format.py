"""Saving and loading adapters as PEFT folders.

A saved folder holds:
  adapter_config.json              PEFT's LoraConfig (peft_type LORA), the targets as exact module names
  adapter_model.safetensors        the deployed delta in LoRA form under PEFT's key names
                                   (`base_model.model.<module>.lora_A.weight` [r, in], `...lora_B.weight` [out, r])
  rankwise_adapter.json            our method and config (versioned), so our loader rebuilds the same adapter type
  rankwise_adapter.safetensors     every tensor of the adapter (trainable and frozen: PiCa's projectors, PiSSA's
                                   initial factors, ...), so our loader round-trips exactly
  rankwise-manifest.json           sizes and SHA-256s: a truncated or altered folder is detected before loading
`peft.PeftModel.from_pretrained(base, folder)` reads the first two and computes the same outputs.
`read_adapter_folder` reads ours, or a plain PEFT LoRA folder written by peft itself; `rankwise.adapters.model.
load_adapter` puts what it read onto a model. This module does not import `model.py` (which imports it to save):
the writer takes any object with the `AdaptedModel` methods it uses.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

import torch

from rankwise.adapters.base import Adapter
from rankwise.adapters.config import AdapterConfig
from rankwise.adapters.lora import LoraConfig
from rankwise.adapters.types import adapter_type
from rankwise.core.io import (
    MANIFEST_NAME,
    load_tensors,
    read_json,
    read_versioned_config,
    save_model_folder,
    save_tensors_atomic,
    verify_manifest,
    write_json_atomic,
    write_versioned_config,
)
from rankwise.errors import CorruptFileError, InvalidInputError

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
OUR_CONFIG = "rankwise_adapter.json"
OUR_WEIGHTS = "rankwise_adapter.safetensors"
CONFIG_KIND = "rankwise-adapter"
CONFIG_VERSION = 1
PEFT_PREFIX = "base_model.model."

# PEFT LoraConfig keys we understand or that cannot change a plain LoRA's outputs; any other key warns.
_PEFT_KEYS_IGNORED = {
    "task_type", "peft_type", "auto_mapping", "peft_version", "base_model_name_or_path", "revision", "inference_mode",
    "target_modules", "exclude_modules", "lora_dropout", "fan_in_fan_out", "bias", "modules_to_save",
    "init_lora_weights", "layers_to_transform", "layers_pattern", "megatron_config", "megatron_core",
    "trainable_token_indices", "loftq_config", "eva_config", "corda_config", "lora_ga_config", "use_dora",
    "velora_config", "alora_invocation_tokens", "use_qalora", "qalora_group_size", "monteclora_config",
    "layer_replication", "lora_bias", "target_parameters", "use_bdlora", "arrow_config", "kasa_config",
    "ensure_weight_tying", "r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern",
}


class AdapterHolder(Protocol):
    """What the writer needs of a model with adapters (an `AdaptedModel`)."""

    configs: dict[str, AdapterConfig]

    def adapters_of(self, name: str) -> dict[str, Adapter]: ...
    def adapter_state(self, name: str) -> dict[str, torch.Tensor]: ...


def save_adapter(model: AdapterHolder, folder: str | Path, adapter_name: str = "default", base_model_name_or_path: str | None = None) -> Path:
    """Write adapter `adapter_name` of `model` to `folder` (replaced atomically). Returns the folder."""
    config = model.configs.get(adapter_name)
    if config is None:
        raise InvalidInputError(f"no adapter named {adapter_name!r} to save; this model has {sorted(model.configs)}")
    adapters = model.adapters_of(adapter_name)
    factors = {name: a.lora_factors() for name, a in adapters.items()}

    def write(tmp: Path) -> None:  # PEFT's two files at the top level, as peft writes them; ours beside them
        if all(f is not None for f in factors.values()):
            write_json_atomic(tmp / PEFT_CONFIG, _peft_config(factors, base_model_name_or_path))
            tensors: dict[str, torch.Tensor] = {}
            for name, f in factors.items():
                tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = f.A.detach().float()
                tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = f.B.detach().float()
            save_tensors_atomic(tmp / PEFT_WEIGHTS, tensors, metadata={"format": "pt"})
        write_versioned_config(tmp / OUR_CONFIG, CONFIG_KIND, CONFIG_VERSION, {"config": config.to_dict(), "modules": list(adapters)})
        save_tensors_atomic(tmp / OUR_WEIGHTS, model.adapter_state(adapter_name), metadata={"format": "pt"})

    return save_model_folder(folder, write)


def _peft_config(factors: dict[str, Any], base_model_name_or_path: str | None) -> dict[str, Any]:
    """A PEFT LoraConfig whose per-module rank and scaling reproduce each delta exactly (rank_pattern, alpha_pattern)."""
    ranks = {n: f.rank for n, f in factors.items()}
    r = Counter(ranks.values()).most_common(1)[0][0]
    alphas = {n: f.scaling * f.rank for n, f in factors.items()}  # PEFT's scaling is lora_alpha / r
    alpha = Counter(alphas.values()).most_common(1)[0][0]
    return {
        "peft_type": "LORA",
        "task_type": None,
        "base_model_name_or_path": base_model_name_or_path,
        "r": r,
        "lora_alpha": alpha,
        "target_modules": sorted(factors),
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        # PEFT reads pattern keys as regexes matched against module-name suffixes: escape the exact names.
        "rank_pattern": {re.escape(n): k for n, k in ranks.items() if k != r},
        "alpha_pattern": {re.escape(n): a for n, a in alphas.items() if a != alpha},
    }


def read_adapter_folder(folder: str | Path) -> tuple[AdapterConfig, dict[str, torch.Tensor], list[str]]:
    """The adapter saved in `folder`: (its config, its tensors by `<module>.<tensor>` / `shared/<key>`, its modules).

    Reads our files when present (any known method), else a plain PEFT LoRA folder. Raises CorruptFileError for a
    damaged folder, InvalidInputError for one that is not an adapter folder.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidInputError(f"{folder} is not a folder with a saved adapter")
    if (folder / MANIFEST_NAME).is_file():
        verify_manifest(folder)
    if (folder / OUR_CONFIG).is_file():
        saved = read_versioned_config(folder / OUR_CONFIG, CONFIG_KIND, CONFIG_VERSION)
        unknown = sorted(set(saved) - {"kind", "version", "config", "modules"})
        if unknown:
            warnings.warn(f"{folder / OUR_CONFIG}: ignoring unknown key(s) {unknown}", stacklevel=3)
        fields = dict(saved.get("config") or {})
        cls = adapter_type(str(fields.pop("method", "")))
        return cls.config_class.from_dict(fields), load_tensors(folder / OUR_WEIGHTS), list(saved.get("modules") or [])
    if (folder / PEFT_CONFIG).is_file():
        return _from_peft_folder(folder)
    raise CorruptFileError(f"{folder} has neither {OUR_CONFIG} nor {PEFT_CONFIG}: not a saved adapter")


def _from_peft_folder(folder: Path) -> tuple[LoraConfig, dict[str, torch.Tensor], list[str]]:
    """Read a LoRA folder written by peft: per-module A/B under PEFT key names, scaling lora_alpha / r."""
    cfg = read_json(folder / PEFT_CONFIG)
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise InvalidInputError(f"{folder / PEFT_CONFIG} is not a LoRA adapter (peft_type={cfg.get('peft_type') if isinstance(cfg, dict) else None!r})")
    unknown = sorted(set(cfg) - _PEFT_KEYS_IGNORED)
    if unknown:
        warnings.warn(f"{folder / PEFT_CONFIG}: ignoring unknown key(s) {unknown}", stacklevel=4)
    if cfg.get("use_dora") or cfg.get("rank_pattern") or cfg.get("alpha_pattern") or cfg.get("lora_bias"):
        raise InvalidInputError(f"{folder}: DoRA, lora_bias and per-module rank/alpha patterns are not supported by this loader")
    tensors = load_tensors(folder / PEFT_WEIGHTS)
    state: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        if not key.startswith(PEFT_PREFIX) or not key.endswith((".lora_A.weight", ".lora_B.weight")):
            raise InvalidInputError(f"{folder / PEFT_WEIGHTS}: unsupported tensor {key!r} (only LoRA A/B of linear layers)")
        module, ab = key[len(PEFT_PREFIX) : -len(".weight")].rsplit(".", 1)
        state[f"{module}.{'A' if ab == 'lora_A' else 'B'}"] = t
    modules = sorted({k.rsplit(".", 1)[0] for k in state})
    config = LoraConfig(r=int(cfg["r"]), lora_alpha=float(cfg["lora_alpha"]), use_rslora=bool(cfg.get("use_rslora")), target_modules=modules)
    return config, state, modules
