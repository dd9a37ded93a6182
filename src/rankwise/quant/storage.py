"""Real packed storage of a block-quantized model: two FP4 codes per byte, one scale byte per block, one fp32 global
scale per tensor, in safetensors; everything else (embeddings, norms, biases) in fp32 beside it.

Folder layout (written atomically, with a manifest of sizes and SHA-256s):
  config.json              the model's transformers config plus "rankwise_format": "microscaling"
  quantization.json        versioned: the recipe and, per quantized Linear, its shape
  quantized.safetensors    <name>.codes uint8 [out, Kp/2] (or [out, Kp] for 8-bit elements), <name>.scales,
                           <name>.global_scale fp32 [1]
  dense.safetensors        the remaining parameters (tied duplicates stored once)
  tokenizer files

`load_model(folder)` reloads it (the microscaling-ue5m3 record in `rankwise.registry` names its loader), dequantizing into fp32 weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from rankwise.core.io import (load_tensors, read_versioned_config, save_model_folder, save_tensors_atomic,
                              verify_manifest, write_versioned_config)
from rankwise.core.json_fields import json_field
from rankwise.core.model_files import dense_remainder, write_config_and_tokenizer
from rankwise.errors import CorruptFileError, InvalidInputError
from rankwise.quant.block import BlockRecipe, QuantizedTensor, quantize
from rankwise.quant.fake_quant import quantizable_linears
from rankwise.quant.formats import get_format
from rankwise.core.packing import pack_nibbles, unpack_nibbles

FORMAT_NAME = "microscaling"
CONFIG_KIND = "rankwise-microscaling"
CONFIG_VERSION = 1
QUANTIZED_FILE = "quantized.safetensors"
DENSE_FILE = "dense.safetensors"


@dataclass(frozen=True)
class StorageSummary:
    folder: Path
    quantized_weights: int  # number of weights stored block-quantized
    payload_bytes: int  # bytes of their codes, scales and global scales (tensor data only)
    file_bytes: int  # size of quantized.safetensors on disk (header included)
    folder_bytes: int  # the whole folder

    @property
    def bytes_per_weight(self) -> float:
        """Measured payload bytes per quantized weight (FP4, block 16, 8-bit scales: 0.5 + 1/16 = 0.5625)."""
        return self.payload_bytes / self.quantized_weights

    @property
    def file_bytes_per_weight(self) -> float:
        return self.file_bytes / self.quantized_weights


def recipe_to_dict(recipe: BlockRecipe) -> dict:
    return {"name": recipe.name, "element": recipe.element.name, "scale": recipe.scale.name if recipe.scale else None,
            "block_size": recipe.block_size, "global_scale": recipe.global_scale, "scale_rule": recipe.scale_rule,
            "clamp_scale_to_min_normal": recipe.clamp_scale_to_min_normal}


def recipe_from_dict(d: dict) -> BlockRecipe:
    try:
        if not isinstance(d, dict) or type(d["block_size"]) is not int:  # int("big") or int(2.5) would pass or raise late
            raise TypeError(f"block_size must be an integer, got {d.get('block_size') if isinstance(d, dict) else d!r}")
        return BlockRecipe(d["name"], get_format(d["element"]), get_format(d["scale"]) if d["scale"] else None,
                           d["block_size"], bool(d["global_scale"]), d["scale_rule"], bool(d["clamp_scale_to_min_normal"]))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CorruptFileError(f"quantization recipe is incomplete or malformed ({e!r})") from e


def _pack(q: QuantizedTensor) -> torch.Tensor:
    return pack_nibbles(q.codes) if q.recipe.element.bits == 4 else q.codes


@torch.no_grad()
def save_quantized(model: PreTrainedModel, tokenizer, recipe: BlockRecipe, folder: str | Path,
                   exclude: tuple[str, ...] = ("lm_head",), overwrite: bool = False) -> StorageSummary:
    """Block-quantize every nn.Linear weight of `model` (not modified) and write the packed folder.

    `overwrite`: replace a folder rankwise did not write (the CLI's --overwrite); see `core.io.save_model_folder`."""
    folder = Path(folder)
    layers = quantizable_linears(model, exclude)
    if not layers:
        raise InvalidInputError(f"{type(model).__name__} has no nn.Linear to quantize")
    quantized, shapes = {}, {}
    for name, linear in layers:
        q = quantize(linear.weight, recipe, pad=True)
        quantized[f"{name}.codes"] = _pack(q)
        quantized[f"{name}.scales"] = q.scales.contiguous()
        quantized[f"{name}.global_scale"] = q.global_scale.reshape(1).float()
        shapes[name] = list(q.shape)
    skip = {f"{name}.weight" for name, _ in layers}
    dense = dense_remainder(model, skip.__contains__)

    def write(tmp: Path) -> None:
        write_config_and_tokenizer(tmp, model, tokenizer, FORMAT_NAME)
        write_versioned_config(tmp / "quantization.json", CONFIG_KIND, CONFIG_VERSION,
                               {"recipe": recipe_to_dict(recipe), "layers": shapes, "exclude": list(exclude),
                                "model_class": type(model).__name__})
        save_tensors_atomic(tmp / QUANTIZED_FILE, quantized)
        save_tensors_atomic(tmp / DENSE_FILE, dense)

    save_model_folder(folder, write, format_name=FORMAT_NAME, overwrite=overwrite)
    payload = sum(t.numel() * t.element_size() for t in quantized.values())
    n = sum(int(torch.tensor(s).prod()) for s in shapes.values())
    total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return StorageSummary(folder, n, payload, (folder / QUANTIZED_FILE).stat().st_size, total)


def load_quantized(folder: str | Path) -> tuple[PreTrainedModel, object]:
    """Rebuild the model of a `save_quantized` folder with dequantized fp32 weights; (model in eval mode, tokenizer).
    Checks the manifest first, so a truncated or altered file raises `CorruptFileError` instead of loading."""
    folder = Path(folder)
    verify_manifest(folder)
    meta = read_versioned_config(folder / "quantization.json", CONFIG_KIND, CONFIG_VERSION)
    layers = _stored_layers(meta, folder / "quantization.json")
    try:
        recipe = recipe_from_dict(meta.get("recipe", {}))
    except CorruptFileError as e:
        raise CorruptFileError(f"{folder / 'quantization.json'}: {e}") from None
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    cls = _model_class(meta.get("model_class"), config)
    model = (cls.from_config(config) if hasattr(cls, "from_config") else cls(config)).float()
    dense = load_tensors(folder / DENSE_FILE)
    missing, unexpected = model.load_state_dict(dense, strict=False)
    if unexpected:
        raise CorruptFileError(f"{folder / DENSE_FILE} holds parameters this model does not have: {unexpected[:5]}")
    tensors = load_tensors(folder / QUANTIZED_FILE)
    filled = set()
    for name, shape in layers.items():
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise CorruptFileError(f"{folder / 'quantization.json'} lists a layer {name!r} that the model has no module "
                                   "of: the file was edited, or belongs to another model") from None
        if not isinstance(module, nn.Linear) or list(module.weight.shape) != shape:
            raise CorruptFileError(f"{folder}: layer {name} with shape {shape} does not match the model's {module}")
        with torch.no_grad():
            module.weight.copy_(_dequantize_stored(tensors, name, shape, recipe))
        filled.add(f"{name}.weight")
    if model.config.tie_word_embeddings if hasattr(model.config, "tie_word_embeddings") else False:
        model.tie_weights()
    left = [k for k in missing if k not in filled and not _is_tied(model, k)]
    if left:
        raise CorruptFileError(f"{folder}: parameters missing from the files: {left[:5]}")
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False) if (folder / "tokenizer_config.json").is_file() else None
    return model.eval(), tokenizer


def _stored_layers(meta: dict, where: Path) -> dict[str, list[int]]:
    """quantization.json's `layers`, {module name: [out, in]}, checked before any weight is read."""
    layers = json_field(meta, "layers", dict, where, required=True)
    for name, shape in layers.items():
        if not (isinstance(shape, list) and len(shape) == 2 and all(type(d) is int and d > 0 for d in shape)):
            raise CorruptFileError(f"{where}: layer {name!r} has shape {shape!r}, not [out, in] (two positive integers): "
                                   "the file was edited or is not rankwise's")
    return layers


def _model_class(name: str | None, config):
    """The transformers class the folder was saved from (a plain class name, looked up in transformers only)."""
    cls = getattr(transformers, name, None) if isinstance(name, str) and name.isidentifier() else None
    if isinstance(cls, type) and issubclass(cls, PreTrainedModel):
        return cls
    causal = any(a.endswith("ForCausalLM") for a in (config.architectures or []))
    return AutoModelForCausalLM if causal else AutoModel


def _dequantize_stored(tensors: dict, name: str, shape: list[int], recipe: BlockRecipe) -> torch.Tensor:
    try:
        codes, scales, gs = tensors[f"{name}.codes"], tensors[f"{name}.scales"], tensors[f"{name}.global_scale"]
    except KeyError as e:
        raise CorruptFileError(f"{QUANTIZED_FILE} lacks {e.args[0]}") from e
    k = recipe.block_size
    padded = -(-shape[-1] // k) * k
    codes = unpack_nibbles(codes) if recipe.element.bits == 4 else codes
    expected_scales = (shape[0], padded // k)
    if tuple(codes.shape) != (shape[0], padded) or tuple(scales.shape) != expected_scales or gs.numel() != 1:
        raise CorruptFileError(f"{name}: stored shapes {tuple(codes.shape)}, {tuple(scales.shape)} do not fit {shape} "
                               f"at block {k}")
    if not torch.isfinite(gs).all() or gs.item() <= 0:
        raise CorruptFileError(f"{name}: global scale {gs.item()} is not a positive finite number")
    q = QuantizedTensor(codes, scales, gs.reshape(()), tuple(shape), recipe)
    w = q.dequantize()
    if not torch.isfinite(w).all():
        raise CorruptFileError(f"{name}: stored codes decode to NaN/Inf (a NaN scale code?)")
    return w


def _is_tied(model: nn.Module, key: str) -> bool:
    """True when parameter `key` shares storage with another, loaded, parameter (tied embeddings)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    p = params.get(key)
    return p is not None and any(q is p for k, q in params.items() if k != key)
