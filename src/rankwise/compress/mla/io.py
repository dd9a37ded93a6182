"""Save and reload converted models as `transformers` folders.

A converted folder is what `save_pretrained` writes (config.json + safetensors weights, holding
`...k_proj.down.weight` / `...k_proj.up.weight` instead of `...k_proj.weight`) plus the tokenizer and a manifest
of sizes and SHA-256s. config.json declares its own model_type (`rankwise-mla-oneshot`, the original's kept in the
record), so stock transformers refuses it rather than loading random K/V projections; it carries
`"rankwise_format": "mla-oneshot"` and the per-layer ranks, so
`rankwise.models.load_model(folder)` finds `load_mla` through care-mla's registry record (`folder_formats`) and rebuilds the exact modules.
The folder is written atomically: on any failure nothing is left at the destination.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.initialization import no_init_weights

from rankwise.compress.mla.layout import CONFIG_KEY, FORMAT, decoder_layers, kv_layout, mla_info
from rankwise.compress.mla.modules import LowRankLinear
from rankwise.core.io import load_tensors, read_json, save_model_folder, verify_manifest, write_json_atomic
from rankwise.errors import CorruptFileError, InvalidInputError

# The folder's own identity in config.json: a name stock transformers does not know, so it refuses the folder instead
# of loading it as a Llama with random K/V projections.
MODEL_TYPE = "rankwise-mla-oneshot"
ARCHITECTURE = "RankwiseMLAOneShotForCausalLM"
WEIGHTS_PREFIX = "mla-"  # weight files as mla-model.safetensors: no stock loader looks for that name


def save_mla(model: PreTrainedModel, folder: str | Path, tokenizer: PreTrainedTokenizerBase | None = None,
             overwrite: bool = False) -> Path:
    """Write a converted model (and its tokenizer) to `folder` as a transformers folder with a manifest.

    `overwrite`: replace a folder rankwise did not write (the CLI's --overwrite); see `core.io.save_model_folder`."""
    if mla_info(model) is None:
        raise InvalidInputError("this model is not an MLA conversion (no rankwise_mla record in its config); use convert_to_mla first")

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        _declare_own_architecture(tmp / "config.json")
        _hide_weights_from_stock_loaders(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    return save_model_folder(folder, write, format_name=FORMAT, overwrite=overwrite)


def _declare_own_architecture(path: Path) -> None:
    """Give the folder its own model_type and architecture, keeping the originals in the conversion record.

    Declared as a plain Llama, stock transformers would load it with k_proj/v_proj freshly initialized (the saved
    weights are `k_proj.down/up`) and only a warning; under a model_type it does not know, it refuses the folder,
    and `rankwise.models.load_model` (which reads `rankwise_format`) is the one way to load it.
    """
    config = read_json(path)
    record = dict(config.get(CONFIG_KEY) or {})
    record.setdefault("base_model_type", config.get("model_type"))
    record.setdefault("base_architectures", config.get("architectures"))
    config[CONFIG_KEY] = record
    config["model_type"] = MODEL_TYPE
    config["architectures"] = [ARCHITECTURE]
    write_json_atomic(path, config)


def _hide_weights_from_stock_loaders(folder: Path) -> None:
    """Rename the weight files (and a shard index) with a `WEIGHTS_PREFIX`, so that a stock class called directly
    (`LlamaForCausalLM.from_pretrained(DIR)`, which only warns about the model_type) finds no weights and refuses,
    instead of loading the model with k_proj/v_proj freshly initialised. `load_mla` reads every *.safetensors."""
    for path in sorted(folder.glob("*.safetensors*")):
        path.rename(folder / f"{WEIGHTS_PREFIX}{path.name}")


def _base_config(folder: Path) -> PretrainedConfig:
    """The original architecture's config of a converted folder (its own model_type swapped back)."""
    data = read_json(folder / "config.json")
    if not isinstance(data, dict):
        raise CorruptFileError(f"{folder / 'config.json'} is not a JSON object")
    record = data.get(CONFIG_KEY)
    if data.get("rankwise_format") != FORMAT or not isinstance(record, dict):
        raise CorruptFileError(f"{folder / 'config.json'} is not a {FORMAT!r} folder")
    base_type = record.get("base_model_type") or data.get("model_type")  # folders written before: a plain llama
    if base_type not in CONFIG_MAPPING:
        raise CorruptFileError(f"{folder / 'config.json'}: the converted model's architecture {base_type!r} is unknown to transformers")
    data["model_type"] = base_type
    data["architectures"] = record.get("base_architectures") or data.get("architectures")
    return CONFIG_MAPPING[base_type].from_dict(data)


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CorruptFileError(f"{folder} holds no .safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_tensors(f))
    return tensors


def load_mla(folder: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Rebuild a converted model from `folder` (fp32, eval mode) and its tokenizer (None if none was saved).

    Verifies the manifest first; raises CorruptFileError on a truncated, altered or inconsistent folder.
    """
    folder = Path(folder)
    verify_manifest(folder)
    config = _base_config(folder)
    info = getattr(config, CONFIG_KEY, None)
    if getattr(config, "rankwise_format", None) != FORMAT or not isinstance(info, dict):
        raise CorruptFileError(f"{folder / 'config.json'} is not a {FORMAT!r} folder")
    with no_init_weights():  # every parameter is overwritten below; random init would only cost time
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    layout = kv_layout(model)
    k_ranks, v_ranks = info.get("k_ranks"), info.get("v_ranks")
    if not (isinstance(k_ranks, list) and isinstance(v_ranks, list) and len(k_ranks) == len(v_ranks) == layout.num_layers):
        raise CorruptFileError(f"{folder / 'config.json'}: {CONFIG_KEY} needs k_ranks and v_ranks for all {layout.num_layers} layers")
    for layer, rk, rv in zip(decoder_layers(model), k_ranks, v_ranks):
        attn = layer.self_attn
        attn.k_proj = LowRankLinear(layout.hidden_size, int(rk), layout.kv_width, bias=attn.k_proj.bias is not None)
        attn.v_proj = LowRankLinear(layout.hidden_size, int(rv), layout.kv_width, bias=attn.v_proj.bias is not None)
    weights = _read_weights(folder)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise CorruptFileError(f"{folder}: weights do not match the recorded ranks (missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()
    model.float().eval()
    # The base architecture's config, given: reading config.json itself, AutoTokenizer would warn that our model_type
    # is not the one it instantiates.
    tokenizer = (AutoTokenizer.from_pretrained(folder, config=config, trust_remote_code=False)
                 if (folder / "tokenizer_config.json").is_file() else None)
    return model, tokenizer


def read_mla_record(folder: str | Path) -> dict:
    """The conversion record (method, per-layer ranks, ...) from a converted folder's config.json, without loading."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CorruptFileError(f"{path} is missing or not valid JSON ({e})") from e
    if config.get("rankwise_format") != FORMAT:
        raise CorruptFileError(f"{path} is not a {FORMAT!r} folder")
    return config[CONFIG_KEY]
