"""The CodeQuant folder: a quantized causal LM that `load_model` and `rankwise info` read back.

Layout (written atomically through `core.io.save_model_folder`, with a manifest of sizes and SHA-256s):
  config.json           the transformers config (lm_head untied) plus "rankwise_format": "codequant"
  codequant.json        versioned: the recipe, the model class, per clustered linear its [out, in], group, k, act bits
  clustered.safetensors <name>.codes uint8 [out, in / 2] (two 4-bit codes per byte, low nibble first),
                        <name>.centroids fp32 [out, in / group, k], <name>.bias when present
  dense.safetensors     everything else, already rotated and folded (embeddings, lm_head, o/down projections, norms)
  tokenizer files

Reloading rebuilds the transformers model from its config, loads the dense part and swaps a ClusteredLinear in at
every listed name: the reloaded model computes exactly what the saved one did (activation quantization included).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rankwise.compress.codequant.layers import ClusteredLinear
from rankwise.compress.codequant.lut import pack_codes, unpack_codes
from rankwise.compress.codequant.scope import replace_module_
from rankwise.core.io import (load_tensors, read_versioned_config, save_model_folder, save_tensors_atomic,
                              verify_manifest, write_versioned_config)
from rankwise.core.json_fields import json_field
from rankwise.core.model_files import dense_remainder, write_config_and_tokenizer
from rankwise.errors import CorruptFileError, InvalidInputError

FORMAT_NAME = "codequant"
CONFIG_KIND = "rankwise-codequant"
CONFIG_VERSION = 1
CLUSTERED_FILE = "clustered.safetensors"
DENSE_FILE = "dense.safetensors"


@dataclass(frozen=True)
class CodeQuantSummary:
    folder: Path
    clustered_weights: int  # weights stored as codes
    payload_bytes: int  # their codes + centroids (tensor data)
    fp32_bytes: int  # the same weights in fp32

    @property
    def bytes_per_weight(self) -> float:
        return self.payload_bytes / self.clustered_weights

    @property
    def compression(self) -> float:
        return self.fp32_bytes / self.payload_bytes


def _spec_dict(spec: object) -> dict:
    return dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else {}


@torch.no_grad()
def save_codequant(model: PreTrainedModel, tokenizer, folder: str | Path, spec: object = None,
                   overwrite: bool = False) -> CodeQuantSummary:
    """Write a model whose scoped linears are ClusteredLinear (after `quantize_`) as a CodeQuant folder."""
    folder = Path(folder)
    if not hasattr(model, "config") or not hasattr(model.config, "save_pretrained"):
        raise InvalidInputError(f"{type(model).__name__} is not a transformers model: only those are saved as folders")
    clustered = {n: m for n, m in model.named_modules() if isinstance(m, ClusteredLinear)}
    if not clustered:
        raise InvalidInputError("the model has no clustered linear: run CodeQuant (weights='kmeans') first")
    tensors, layers = {}, {}
    for name, m in clustered.items():
        if m.in_features % 2 or m.k > 16:
            raise InvalidInputError(f"{name}: only 4-bit codes (k <= 16) on an even input size are stored packed")
        tensors[f"{name}.codes"] = pack_codes(m.codes)
        tensors[f"{name}.centroids"] = m.centroids.detach().float().contiguous()
        if m.bias is not None:
            tensors[f"{name}.bias"] = m.bias.detach().float().contiguous()
        layers[name] = {"shape": [m.out_features, m.in_features], "group": m.group_size, "k": m.k,
                        "act_bits": m.act_bits}
    skip = tuple(f"{n}." for n in clustered)
    dense = dense_remainder(model, lambda key: key.startswith(skip))

    def write(tmp: Path) -> None:
        write_config_and_tokenizer(tmp, model, tokenizer, FORMAT_NAME)
        write_versioned_config(tmp / "codequant.json", CONFIG_KIND, CONFIG_VERSION,
                               {"recipe": _spec_dict(spec), "model_class": type(model).__name__, "layers": layers})
        save_tensors_atomic(tmp / CLUSTERED_FILE, tensors)
        save_tensors_atomic(tmp / DENSE_FILE, dense)

    save_model_folder(folder, write, format_name=FORMAT_NAME, overwrite=overwrite)
    n = sum(m.out_features * m.in_features for m in clustered.values())
    payload = sum(t.numel() * t.element_size() for k, t in tensors.items() if not k.endswith(".bias"))
    return CodeQuantSummary(folder, n, payload, 4 * n)


def _layers(meta: dict, where: Path) -> dict[str, dict]:
    layers = json_field(meta, "layers", dict, where, required=True)
    for name, d in layers.items():
        shape = d.get("shape") if isinstance(d, dict) else None
        ok = (isinstance(shape, list) and len(shape) == 2 and all(type(x) is int and x > 0 for x in shape)
              and type(d.get("group")) is int and d["group"] > 0 and shape[1] % d["group"] == 0
              and type(d.get("k")) is int and 2 <= d["k"] <= 16 and (d.get("act_bits") is None or type(d["act_bits"]) is int))
        if not ok:
            raise CorruptFileError(f"{where}: layer {name!r} is malformed ({d!r}): the file was edited or is not rankwise's")
    return layers


def load_codequant(folder: str | Path) -> tuple[PreTrainedModel, object]:
    """(model in eval mode with its ClusteredLinear layers, tokenizer or None). The manifest is checked first."""
    folder = Path(folder)
    verify_manifest(folder)
    where = folder / "codequant.json"
    meta = read_versioned_config(where, CONFIG_KIND, CONFIG_VERSION)
    layers = _layers(meta, where)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    name = meta.get("model_class")
    cls = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
    cls = cls if isinstance(cls, type) and issubclass(cls, PreTrainedModel) else AutoModelForCausalLM
    model = (cls.from_config(config) if hasattr(cls, "from_config") else cls(config)).float()
    tensors = load_tensors(folder / CLUSTERED_FILE)
    for lname, d in layers.items():
        try:
            old = model.get_submodule(lname)
        except AttributeError:
            raise CorruptFileError(f"{where} lists {lname!r}, which the model has no module of") from None
        out, inp = d["shape"]
        if not isinstance(old, nn.Linear) or (old.out_features, old.in_features) != (out, inp):
            raise CorruptFileError(f"{folder}: layer {lname} [{out}, {inp}] does not match the model's {old}")
        try:
            codes, centroids = unpack_codes(tensors[f"{lname}.codes"]), tensors[f"{lname}.centroids"]
        except KeyError as e:
            raise CorruptFileError(f"{CLUSTERED_FILE} lacks {e.args[0]}") from None
        if tuple(codes.shape) != (out, inp) or tuple(centroids.shape) != (out, inp // d["group"], d["k"]):
            raise CorruptFileError(f"{lname}: stored shapes {tuple(codes.shape)}, {tuple(centroids.shape)} do not fit "
                                   f"[{out}, {inp}] at group {d['group']}, k {d['k']}")
        if int(codes.max()) >= d["k"] or not torch.isfinite(centroids).all():
            raise CorruptFileError(f"{lname}: codes beyond k or non-finite centroids")
        replace_module_(model, lname, ClusteredLinear(codes, centroids, tensors.get(f"{lname}.bias"), d["act_bits"]))
    dense = load_tensors(folder / DENSE_FILE)
    missing, unexpected = model.load_state_dict(dense, strict=False)
    if unexpected:
        raise CorruptFileError(f"{folder / DENSE_FILE} holds parameters this model does not have: {unexpected[:5]}")
    clustered_keys = {f"{n}.{p}" for n in layers for p in ("codes", "centroids", "bias", "source")}
    left = [k for k in missing if k not in clustered_keys]
    if left:
        raise CorruptFileError(f"{folder}: parameters missing from the files: {left[:5]}")
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False) if (folder / "tokenizer_config.json").is_file() else None
    return model.eval(), tokenizer
