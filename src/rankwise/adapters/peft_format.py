"""Saving and loading adapters as PEFT folders.

A saved folder holds:
  adapter_config.json              PEFT's LoraConfig (peft_type LORA), the targets as exact module names
  adapter_model.safetensors        the deployed delta in LoRA form under PEFT's key names
                                   (`base_model.model.<module>.lora_A.weight` [r, in], `...lora_B.weight` [out, r])
  rankwise_adapter.json            our method and config (versioned), so our loader rebuilds the same adapter type
  rankwise_adapter.safetensors     every tensor of the adapter (trainable and frozen: PiCa's projectors, PiSSA's
                                   initial factors, ...), so our loader round-trips exactly
  rankwise-manifest.json           sizes and SHA-256s: a truncated or altered folder is detected before loading
`peft.PeftModel.from_pretrained(base, folder)` reads the first two and computes the same outputs. A classification
head is saved the PEFT way (`modules_to_save`): its tensors sit in adapter_model.safetensors under
`base_model.model.head.*`, so peft restores it on `SequenceClassifier(base, n)` (see `save_adapter`).
The PEFT files are the source of truth: when the manifest is missing or no longer matches (an edited
adapter_config.json), our files are used only where they agree with them exactly, so rankwise and peft always load
the same model. `read_adapter_sources` reads both, or a plain PEFT LoRA folder written by peft itself;
`rankwise.adapters.model.load_adapter` puts what it read onto a model. This module does not import `model.py` (which imports it to save):
the writer takes any object with the `AdaptedModel` methods it uses.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from rankwise.adapters.base import Adapter
from rankwise.adapters.config import AdapterConfig, module_type
from rankwise.adapters.lora import LoraConfig
from rankwise.adapters.types import adapter_type
from rankwise.core.io import (
    MANIFEST_NAME,
    load_tensors,
    read_json,
    read_versioned_config,
    save_model_folder,
    save_tensors_atomic,
    sha256_of,
    verify_manifest,
    write_json_atomic,
    write_versioned_config,
)
from rankwise.core.json_fields import json_field, json_list_of
from rankwise.errors import CorruptFileError, InvalidInputError

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
OUR_CONFIG = "rankwise_adapter.json"
OUR_WEIGHTS = "rankwise_adapter.safetensors"
CONFIG_KIND = "rankwise-adapter"
CONFIG_VERSION = 1
PEFT_PREFIX = "base_model.model."
TO_SAVE = "modules_to_save/"  # in our weights: the tensors of the modules saved whole (PEFT's modules_to_save)
FOLDER_KIND = "adapter"  # the manifest kind: only an adapter folder replaces an adapter folder

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


@dataclass
class SavedAdapter:
    """One reading of an adapter folder; names are relative to the module the folder is loaded onto (PEFT's view).

    `state`: `<module>.<tensor>` per adapted module and `shared/<key>`; `extra`: the full tensors of the
    `modules_to_save` (e.g. a classification head), by parameter name (`head.weight`).
    """

    config: AdapterConfig
    state: dict[str, torch.Tensor]
    modules: list[str]
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    source: str = "rankwise"  # or "peft"


def save_adapter(
    model: AdapterHolder,
    folder: str | Path,
    adapter_name: str = "default",
    base_model_name_or_path: str | None = None,
    modules_to_save: Mapping[str, nn.Module] | None = None,
    prefix: str = "",
    overwrite: bool = False,
    base_sha256: str | None = None,
) -> Path:
    """Write adapter `adapter_name` of `model` to `folder` (replaced atomically). Returns the folder.

    `modules_to_save` maps names to whole modules saved beside the adapter the PEFT way (PEFT's `modules_to_save`,
    e.g. `{"head": classifier.head}`), and `prefix` is where the adapted model sits inside the module PEFT will wrap
    (`"model."` for `SequenceClassifier(base)`): then `PeftModel.from_pretrained(SequenceClassifier(base, n), folder)`
    and `load_adapter(SequenceClassifier(base, n), folder)` rebuild the adapter and the head. `base_sha256` (the base
    folder's `core.io.folder_digest`) is recorded so that loading onto a changed base can be refused.
    """
    config = model.configs.get(adapter_name)
    if config is None:
        raise InvalidInputError(f"no adapter named {adapter_name!r} to save; this model has {sorted(model.configs)}")
    if prefix and not prefix.endswith("."):
        raise InvalidInputError(f"prefix must be a module path ending in '.', got {prefix!r}")
    adapters = model.adapters_of(adapter_name)
    extra = {f"{name}.{k}": v.detach() for name, m in (modules_to_save or {}).items() for k, v in m.state_dict().items()}
    peft_files = peft_form(adapters, base_model_name_or_path, prefix, sorted(modules_to_save or {}), extra)

    def write(tmp: Path) -> None:  # PEFT's two files at the top level, as peft writes them; ours beside them
        if peft_files is not None:
            write_json_atomic(tmp / PEFT_CONFIG, peft_files[0])
            save_tensors_atomic(tmp / PEFT_WEIGHTS, peft_files[1], metadata={"format": "pt"})
        fields = {"config": config.to_dict(), "modules": list(adapters), "prefix": prefix, "modules_to_save": sorted(modules_to_save or {})}
        if base_sha256 is not None:
            fields["base_sha256"] = base_sha256
        write_versioned_config(tmp / OUR_CONFIG, CONFIG_KIND, CONFIG_VERSION, fields)
        state = {**model.adapter_state(adapter_name), **{f"{TO_SAVE}{k}": v for k, v in extra.items()}}
        save_tensors_atomic(tmp / OUR_WEIGHTS, state, metadata={"format": "pt"})

    return save_model_folder(folder, write, kind=FOLDER_KIND, overwrite=overwrite)


def peft_form(
    adapters: Mapping[str, Adapter],
    base_model_name_or_path: str | None,
    prefix: str = "",
    modules_to_save: list[str] | None = None,
    extra: Mapping[str, torch.Tensor] | None = None,
) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    """The PEFT config and tensors these adapters deploy as (None when one has no LoRA form)."""
    factors = {f"{prefix}{name}": a.lora_factors() for name, a in adapters.items()}
    if not all(f is not None for f in factors.values()):
        return None
    tensors: dict[str, torch.Tensor] = {}
    for name, f in factors.items():
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = f.A.detach().float()
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = f.B.detach().float()
    for key, t in (extra or {}).items():  # PEFT stores a module to save under its own name, without a wrapper
        tensors[f"{PEFT_PREFIX}{key}"] = t
    return _peft_config(factors, base_model_name_or_path, modules_to_save or None), tensors


def _peft_config(factors: dict[str, Any], base_model_name_or_path: str | None, modules_to_save: list[str] | None = None) -> dict[str, Any]:
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
        "modules_to_save": modules_to_save,
        # PEFT reads pattern keys as regexes matched against module-name suffixes: escape the exact names.
        "rank_pattern": {re.escape(n): k for n, k in ranks.items() if k != r},
        "alpha_pattern": {re.escape(n): a for n, a in alphas.items() if a != alpha},
    }


# The PEFT config keys that change what a folder computes: ours agrees with the PEFT files only if these do.
_OUTPUT_KEYS = ("r", "lora_alpha", "target_modules", "use_rslora", "modules_to_save", "rank_pattern", "alpha_pattern",
                "use_dora", "lora_bias", "bias", "fan_in_fan_out")
_DEFAULTS = {"use_rslora": False, "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}, "use_dora": False,
             "lora_bias": False, "bias": "none", "fan_in_fan_out": False}


def agrees_with_peft_files(expected: tuple[dict[str, Any], dict[str, torch.Tensor]] | None, folder: str | Path) -> bool:
    """Whether the PEFT files in `folder` are exactly `expected` (config keys that matter, every tensor bit for bit)."""
    if expected is None:
        return False
    folder = Path(folder)
    on_disk = read_json(folder / PEFT_CONFIG)
    if not isinstance(on_disk, dict):
        return False
    config, tensors = expected
    norm = lambda c, k: c.get(k, _DEFAULTS.get(k)) or _DEFAULTS.get(k)  # noqa: E731 (None and {} alike)
    if any(norm(config, k) != norm(on_disk, k) for k in _OUTPUT_KEYS):
        return False
    saved = load_tensors(folder / PEFT_WEIGHTS)
    return set(saved) == set(tensors) and all(
        saved[k].dtype == t.dtype and saved[k].shape == t.shape and torch.equal(saved[k], t) for k, t in tensors.items()
    )


def read_adapter_sources(folder: str | Path) -> tuple[SavedAdapter | None, SavedAdapter | None, bool]:
    """(our reading, the PEFT files' reading, whether the manifest vouches that they agree) of an adapter folder.

    With an intact manifest the folder is exactly as rankwise wrote it, so both readings compute the same model.
    Without one (or with a manifest that no longer matches, e.g. after `adapter_config.json` was edited), the PEFT
    files are the source of truth — they are what `peft` loads — and our files count only where they agree with
    them (`rankwise.adapters.model.load_adapter` checks). A manifest that disagrees only about the JSON configs warns
    (an edit); altered or missing tensor files, or any disagreement in a folder without PEFT files, raise
    CorruptFileError (damage: nothing trustworthy to load).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise InvalidInputError(f"{folder} is not a folder with a saved adapter")
    has_ours, has_peft = (folder / OUR_CONFIG).is_file(), (folder / PEFT_CONFIG).is_file()
    if not has_ours and not has_peft:
        raise CorruptFileError(f"{folder} has neither {OUR_CONFIG} nor {PEFT_CONFIG}: not a saved adapter")
    verified = False
    if (folder / MANIFEST_NAME).is_file():
        try:
            verify_manifest(folder)
            verified = True
        except CorruptFileError as e:
            edited = _edited_files(folder)
            # An edited config is a user's change (peft users edit adapter_config.json); altered tensor bytes are
            # damage, which no reading can repair.
            if not has_peft or any(not name.endswith(".json") for name in edited):
                raise
            warnings.warn(f"{folder}: {e}; loading what the PEFT files ({PEFT_CONFIG}, {PEFT_WEIGHTS}) describe, as peft does",
                          stacklevel=3)
    peft_side = _from_peft_folder(folder) if has_peft and not verified else None
    ours = None
    if has_ours:
        try:
            ours = _from_our_files(folder)
        except CorruptFileError:
            if peft_side is None:
                raise
            ours = None  # damaged, but the PEFT files say what the adapter is
    return ours, peft_side, verified


def _edited_files(folder: Path) -> list[str]:
    """The files the manifest lists that are missing or differ from it."""
    manifest = read_json(folder / MANIFEST_NAME)
    files = manifest.get("files") if isinstance(manifest, dict) else None
    files = files if isinstance(files, dict) else {}  # a crafted manifest: every file counts as edited
    edited = []
    for name, expected in files.items():
        p = folder / name
        expected = expected if isinstance(expected, dict) else {}
        try:
            same = p.is_file() and p.stat().st_size == expected.get("bytes") and sha256_of(p) == expected.get("sha256")
        except OSError:  # unreadable: it cannot be vouched for (verify_manifest's error says why)
            same = False
        if not same:
            edited.append(name)
    return edited or ["(manifest)"]


def read_adapter_folder(folder: str | Path) -> tuple[AdapterConfig, dict[str, torch.Tensor], list[str]]:
    """The adapter saved in `folder`: (its config, its tensors by `<module>.<tensor>` / `shared/<key>`, its modules).

    Our files when the manifest vouches for them (or when there are no PEFT files), else the PEFT files (the source
    of truth, see `read_adapter_sources`). Raises CorruptFileError for a damaged folder, InvalidInputError for one
    that is not an adapter folder.
    """
    ours, peft_side, verified = read_adapter_sources(folder)
    chosen = ours if (verified or peft_side is None) and ours is not None else peft_side
    assert chosen is not None
    return chosen.config, chosen.state, chosen.modules


def _from_our_files(folder: Path) -> SavedAdapter:
    saved = read_versioned_config(folder / OUR_CONFIG, CONFIG_KIND, CONFIG_VERSION)
    unknown = sorted(set(saved) - {"kind", "version", "config", "modules", "prefix", "modules_to_save", "base_sha256"})
    if unknown:
        warnings.warn(f"{folder / OUR_CONFIG}: ignoring unknown key(s) {unknown}", stacklevel=4)
    where = folder / OUR_CONFIG
    fields = dict(json_field(saved, "config", dict, where, {}))
    cls = adapter_type(str(fields.pop("method", "")))
    prefix = json_field(saved, "prefix", str, where, "")
    config = cls.config_class.from_dict(fields)
    tensors = load_tensors(folder / OUR_WEIGHTS)
    saved_modules = list(json_list_of(saved, "modules", str, where, []))
    # Shared parameters are keyed by module type ("M:encoder.layer.*.attention.self.query" for PiCa), which moves
    # with the prefix like the module names do.
    types = sorted({(module_type(m, config.layers_pattern), module_type(prefix + m, config.layers_pattern)) for m in saved_modules},
                   key=lambda pair: -len(pair[0])) if prefix else []
    state, extra = {}, {}
    for key, t in tensors.items():
        if key.startswith(TO_SAVE):
            extra[key[len(TO_SAVE) :]] = t
        elif key.startswith("shared/"):
            state[next((key[: -len(old)] + new for old, new in types if key.endswith(old) and key[-len(old) - 1] in ":/"), key)] = t
        else:
            state[f"{prefix}{key}"] = t
    return SavedAdapter(config, state, [f"{prefix}{m}" for m in saved_modules], extra, "rankwise")


def _from_peft_folder(folder: Path) -> SavedAdapter:
    """Read a LoRA folder written by peft: per-module A/B under PEFT key names, scaling lora_alpha / r, and the
    whole tensors of its `modules_to_save`."""
    cfg = read_json(folder / PEFT_CONFIG)
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise InvalidInputError(f"{folder / PEFT_CONFIG} is not a LoRA adapter (peft_type={cfg.get('peft_type') if isinstance(cfg, dict) else None!r})")
    unknown = sorted(set(cfg) - _PEFT_KEYS_IGNORED)
    if unknown:
        warnings.warn(f"{folder / PEFT_CONFIG}: ignoring unknown key(s) {unknown}", stacklevel=4)
    if cfg.get("use_dora") or cfg.get("rank_pattern") or cfg.get("alpha_pattern") or cfg.get("lora_bias"):
        raise InvalidInputError(f"{folder}: DoRA, lora_bias and per-module rank/alpha patterns are not supported by this loader")
    where = folder / PEFT_CONFIG
    to_save = list(json_list_of(cfg, "modules_to_save", str, where, []))
    # The scaling lora_alpha / r comes from these two alone: a missing or mistyped one is named, not a KeyError.
    r = json_field(cfg, "r", int, where, required=True)
    alpha = json_field(cfg, "lora_alpha", float, where, required=True)
    if r < 1 or not math.isfinite(alpha):
        raise CorruptFileError(f"{where}: r must be a positive integer and lora_alpha a finite number, got r={r!r}, "
                               f"lora_alpha={alpha!r}")
    tensors = load_tensors(folder / PEFT_WEIGHTS)
    state: dict[str, torch.Tensor] = {}
    extra: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        name = key[len(PEFT_PREFIX) :] if key.startswith(PEFT_PREFIX) else None
        if name is not None and key.endswith((".lora_A.weight", ".lora_B.weight")):
            module, ab = name[: -len(".weight")].rsplit(".", 1)
            state[f"{module}.{'A' if ab == 'lora_A' else 'B'}"] = t
        elif name is not None and any(name.startswith(f"{m}.") or f".{m}." in f".{name}" for m in to_save):
            extra[name] = t  # a module to save (PEFT matches its names as module-name suffixes)
        else:
            raise InvalidInputError(f"{folder / PEFT_WEIGHTS}: unsupported tensor {key!r} (only LoRA A/B of linear layers and modules_to_save)")
    modules = sorted({k.rsplit(".", 1)[0] for k in state})
    config = LoraConfig(r=r, lora_alpha=float(alpha), use_rslora=bool(cfg.get("use_rslora")), target_modules=modules)
    return SavedAdapter(config, state, modules, extra, "peft")
