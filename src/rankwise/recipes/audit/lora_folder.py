"""Reading any PEFT LoRA folder for inspection: each adapted module's factors and scaling, as peft computes them.

Stricter than nothing and looser than a loader: `rankwise.adapters.peft_format` loads a folder onto a model and
refuses what it cannot reproduce; an audit must read what people actually download, so this reader also takes
per-module `rank_pattern` / `alpha_pattern` (matched as peft matches them: a regex against the end of the module
name), rsLoRA's alpha / sqrt(r) scaling and DoRA folders (whose magnitude vectors are listed; the delta analysed is
the low-rank direction update B A). It never unpickles: an `adapter_model.bin` folder is refused with the command
that converts it, and the tensor file is checked as safetensors before it is read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rankwise.core.io import load_tensors, read_json
from rankwise.errors import CorruptFileError, InvalidInputError

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
PICKLED_WEIGHTS = "adapter_model.bin"
PREFIX = "base_model.model."
_FACTOR = re.compile(r"^(?P<module>.+)\.(?P<which>lora_A|lora_B)(?:\.[^.]+)?\.weight$")
_MAGNITUDE = re.compile(r"^(?P<module>.+)\.lora_magnitude_vector(?:\.[^.]+)?(?:\.weight)?$")


@dataclass
class LoraModule:
    """One adapted linear layer: the delta is `scaling * B @ A`, B [out, r], A [r, in] (float32 as stored)."""

    name: str
    A: torch.Tensor
    B: torch.Tensor
    scaling: float
    magnitude: torch.Tensor | None = None  # DoRA's per-output magnitude [out], when the folder has one

    @property
    def rank(self) -> int:
        return int(self.A.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.B.shape[0]), int(self.A.shape[1])


@dataclass
class LoraFolder:
    """What a PEFT LoRA folder holds: its config, its modules in name order, and what it also saves whole."""

    path: Path
    config: dict[str, Any]
    modules: list[LoraModule]
    saved_whole: dict[str, tuple[int, ...]] = field(default_factory=dict)  # modules_to_save tensors: name -> shape

    @property
    def base_model(self) -> str | None:
        value = self.config.get("base_model_name_or_path")
        return value if isinstance(value, str) and value else None


def pattern_value(patterns: dict[str, Any], module: str, default: float) -> float:
    """peft's per-module override: the first pattern key matching the end of the module name (peft's rule)."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _number(cfg: dict[str, Any], key: str, where: Path) -> float:
    value = cfg.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise CorruptFileError(f"{where}: {key!r} must be a finite number, got {value!r}")
    return float(value)


def _patterns(cfg: dict[str, Any], key: str, where: Path) -> dict[str, float]:
    value = cfg.get(key) or {}
    if not isinstance(value, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
        raise CorruptFileError(f"{where}: {key!r} must map module patterns to numbers, got {value!r}")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as e:
            raise CorruptFileError(f"{where}: {key!r} has an invalid pattern {pattern!r} ({e})") from e
    return value


def check_lora_folder(path: str | Path) -> Path:
    """Refuse, before any tensor is read, what is not a readable PEFT LoRA folder. Returns the folder."""
    folder = Path(path)
    if not folder.is_dir():
        raise InvalidInputError(f"{folder} is not a folder: give the adapter's folder (with {PEFT_CONFIG})")
    if not (folder / PEFT_CONFIG).is_file():
        raise InvalidInputError(f"{folder} has no {PEFT_CONFIG}: not a PEFT adapter folder (a rankwise method whose "
                                "adapter has no LoRA form cannot be audited as one)")
    if not (folder / PEFT_WEIGHTS).is_file():
        if (folder / PICKLED_WEIGHTS).is_file():
            raise InvalidInputError(
                f"{folder} holds {PICKLED_WEIGHTS}, a pickle, which is not loaded from an untrusted source; convert it "
                "where you trust it: PeftModel.from_pretrained(base, folder).save_pretrained(out, safe_serialization=True)")
        raise InvalidInputError(f"{folder} has no {PEFT_WEIGHTS}")
    cfg = read_json(folder / PEFT_CONFIG)
    if not isinstance(cfg, dict):
        raise CorruptFileError(f"{folder / PEFT_CONFIG} is not a JSON object")
    if cfg.get("peft_type") != "LORA":
        raise InvalidInputError(f"{folder / PEFT_CONFIG}: peft_type {cfg.get('peft_type')!r}; only LoRA adapters are audited")
    return folder


def read_lora_folder(path: str | Path) -> LoraFolder:
    """Every adapted module's A, B and scaling (lora_alpha / r, or / sqrt(r) with rsLoRA, after the patterns)."""
    folder = check_lora_folder(path)
    where = folder / PEFT_CONFIG
    cfg = read_json(where)
    r_default, alpha_default = _number(cfg, "r", where), _number(cfg, "lora_alpha", where)
    rank_pattern, alpha_pattern = _patterns(cfg, "rank_pattern", where), _patterns(cfg, "alpha_pattern", where)
    rslora = bool(cfg.get("use_rslora"))
    tensors = load_tensors(folder / PEFT_WEIGHTS)
    factors: dict[str, dict[str, torch.Tensor]] = {}
    magnitudes: dict[str, torch.Tensor] = {}
    saved_whole: dict[str, tuple[int, ...]] = {}
    for key, t in tensors.items():
        name = key[len(PREFIX):] if key.startswith(PREFIX) else key
        if m := _FACTOR.match(name):
            factors.setdefault(m["module"], {})[m["which"]] = t
        elif m := _MAGNITUDE.match(name):
            magnitudes[m["module"]] = t
        else:
            saved_whole[name] = tuple(t.shape)
    modules = []
    for name in sorted(factors):
        pair = factors[name]
        if set(pair) != {"lora_A", "lora_B"}:
            raise CorruptFileError(f"{folder / PEFT_WEIGHTS}: module {name!r} has {sorted(pair)} but needs lora_A and lora_B")
        A, B = pair["lora_A"].float(), pair["lora_B"].float()
        if A.dim() != 2 or B.dim() != 2 or A.shape[0] != B.shape[1] or A.shape[0] == 0:
            raise CorruptFileError(f"{folder / PEFT_WEIGHTS}: module {name!r} has lora_A {tuple(A.shape)} and lora_B "
                                   f"{tuple(B.shape)}; a LoRA pair is A [r, in], B [out, r] (an embedding or conv LoRA is not audited)")
        r = pattern_value(rank_pattern, name, r_default)
        if int(r) != A.shape[0]:
            raise CorruptFileError(f"{where}: module {name!r} is stored with rank {A.shape[0]} but the config gives {r:g}")
        alpha = pattern_value(alpha_pattern, name, alpha_default)
        scaling = alpha / (math.sqrt(r) if rslora else r)
        modules.append(LoraModule(name, A, B, scaling, magnitudes.get(name)))
    if not modules:
        raise InvalidInputError(f"{folder / PEFT_WEIGHTS} holds no LoRA factors (lora_A / lora_B weights)")
    return LoraFolder(folder, cfg, modules, saved_whole)
