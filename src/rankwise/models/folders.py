"""What a folder is, read from its JSON files alone (no torch, no transformers): the identity every command checks.

rankwise writes six kinds of folder; a user may also pass any `transformers` model folder. `identify(name_or_path)`
names the kind, says how it was made and how to load it, and `check_transformers_folder` finds a broken plain folder
(a `{}` config, a config without weights, weights without a tokenizer) before anything heavy is imported, so
commands can accept or refuse a `--model` up front (`rankwise.commands.common.require_model`) and `rankwise info`
can describe it in milliseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwise.core.json_fields import json_field, json_list_of, json_object
from rankwise.core.path_limits import check_path_limits, shown
from rankwise.core.safetensors_header import check_safetensors_file
from rankwise.models.embedded import EMBEDDED_MODELS
from rankwise.errors import CorruptFileError, InvalidInputError, UnknownNameError

MANIFEST = "rankwise-manifest.json"  # = core.io.MANIFEST_NAME (core.io imports torch; this module must not)

# The kinds of folder (and embedded model) rankwise knows.
MODEL = "model"  # a plain transformers model folder (e.g. `finetune --method full`'s DIR/model, or anyone's)
EMBEDDED = "embedded"  # a model shipped with rankwise, by name
MLA_ONESHOT = "mla-oneshot"  # `convert mla --out`: low-rank K/V projections, reloaded by rankwise only
MLA_DEPLOY = "mla-deploy"  # `convert mla --deploy --out`: a stock DeepSeek-V3 checkpoint with a latent-only cache
QUANTIZED = "quantized"  # `quantize --out`: packed block-quantized weights, reloaded by rankwise only
ADAPTER = "adapter"  # `finetune`'s DIR/adapter: a PEFT folder plus rankwise's exact state
FINETUNE_RUN = "finetune-run"  # `finetune --out DIR`: adapter/ or model/, metrics.json, checkpoint/
CHECKPOINT = "checkpoint"  # a training checkpoint (DIR/checkpoint)
KINDS = (MODEL, EMBEDDED, MLA_ONESHOT, MLA_DEPLOY, QUANTIZED, ADAPTER, FINETUNE_RUN, CHECKPOINT)

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")


@dataclass(frozen=True)
class FolderInfo:
    """What `identify` found: the kind, one line saying what it is, how it was made and how to load it."""

    kind: str
    name: str  # the argument as given (a path or an embedded model's name)
    summary: str
    made: dict[str, Any] = field(default_factory=dict)  # how it was made: method, ranks, recipe, base model, ...
    load: tuple[str, ...] = ()  # how to load it, one way per line
    causal: bool | None = None  # a causal LM (None: unknown, e.g. an adapter before its base is looked at)
    model_type: str | None = None
    base: str | None = None  # an adapter's base model, as recorded
    base_sha256: str | None = None  # the recorded base folder's `core.io.folder_digest` when it was trained (None: not recorded)

    @property
    def path(self) -> Path | None:
        return None if self.kind == EMBEDDED else Path(self.name)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptFileError(f"{path} is not valid JSON ({e})") from e
    except OSError as e:
        raise CorruptFileError(f"{path} cannot be read ({e})") from e


def _manifest(path: Path) -> dict[str, Any]:
    m = path / MANIFEST
    if not m.is_file():
        return {}
    data = _read_json(m)
    return data if isinstance(data, dict) else {}


def _is_causal(config: dict[str, Any]) -> bool:
    return any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])


def _causal(config: dict[str, Any], model_class: str | None = None) -> bool | None:
    """Whether the folder holds a causal LM: from its architectures (or the class it was saved from); None: unknown."""
    names = [*(config.get("architectures") or []), *([model_class] if model_class else [])]
    return any(str(a).endswith("ForCausalLM") for a in names) if names else None


# Files whose `auto_map` makes transformers offer to import Python code shipped inside the folder.
CODE_MAPS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json")


def refuse_folder_code(path: Path) -> None:
    """A folder that asks transformers to run code of its own (an `auto_map`, or Python files beside the weights) is
    refused, naming the file: rankwise never runs code from a model folder (and passes trust_remote_code=False)."""
    for name in CODE_MAPS:
        f = path / name
        if f.is_file():
            data = _read_json(f)
            if isinstance(data, dict) and data.get("auto_map"):
                raise InvalidInputError(
                    f"{f} has an auto_map ({data['auto_map']!r}): it asks to run Python code shipped in the folder, which "
                    "rankwise never does; use a model whose architecture transformers itself provides")


def read_model_config(path: Path) -> dict[str, Any]:
    """config.json as a dict, refusing what no loader can use (not an object, no model_type) and what would run
    code from the folder (`refuse_folder_code`)."""
    config = _read_json(path / "config.json")
    if not isinstance(config, dict):
        raise CorruptFileError(f"{path / 'config.json'} holds {type(config).__name__}, not a model config (a JSON object)")
    refuse_folder_code(path)
    if not isinstance(config.get("model_type"), str) or not config["model_type"]:
        raise CorruptFileError(
            f"{path / 'config.json'} has no model_type, so no loader knows which architecture it describes: it is not "
            "a transformers model config (save the model with model.save_pretrained(DIR))"
        )
    # The fields rankwise itself reads, so an edited one is named here rather than failing inside a reader.
    where = path / "config.json"
    json_list_of(config, "architectures", str, where)
    json_field(config, "rankwise_format", str, where)
    json_field(config, "rankwise_mla", dict, where)
    json_field(config, "rankwise_inputs", str, where)
    return config


def check_transformers_folder(path: Path, need_tokenizer: bool = True) -> None:
    """A plain transformers folder has weights and (for `load_model`) a tokenizer; say which part is missing."""
    if not any(any(path.glob(p)) for p in WEIGHT_PATTERNS):
        raise CorruptFileError(
            f"{path} has a config.json but no weights (no model.safetensors or pytorch_model.bin): save the model with "
            "model.save_pretrained(DIR), or pass the folder that holds the weights"
        )
    if not any(path.glob("*.safetensors")) and not (path / "model.safetensors.index.json").is_file():
        raise InvalidInputError(
            f"{path} holds only pickled weights (pytorch_model*.bin), which rankwise does not unpickle (a pickle can run "
            "code): convert them to safetensors where you trust them, e.g. model.save_pretrained(DIR, "
            "safe_serialization=True), and pass that folder")
    if need_tokenizer and not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise CorruptFileError(
            f"{path} has weights but no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): save the tokenizer "
            "beside the model with tokenizer.save_pretrained(DIR)"
        )
    # A plain folder has no manifest to catch a truncated file; the headers do (transformers' own account of such a
    # file is a raw SafetensorError, and `info` would call the folder loadable).
    for weights in sorted(path.glob("*.safetensors")):
        check_safetensors_file(weights)


def model_inputs(info: FolderInfo) -> str:
    """What a model reads: "text" (token ids, with a tokenizer) or "images", from its record or its config.json."""
    if info.kind == EMBEDDED:
        return EMBEDDED_MODELS[info.name].inputs
    if info.kind == MODEL and info.path is not None and (info.path / "config.json").is_file():
        config = _read_json(info.path / "config.json")
        return str(config.get("rankwise_inputs", "text")) if isinstance(config, dict) else "text"
    return "text"


def context_length(info: FolderInfo) -> int | None:
    """The longest token sequence a text model takes: its record's, or config.json's max_position_embeddings (an
    adapter: its recorded base's); None when unknown."""
    if info.kind == EMBEDDED:
        return EMBEDDED_MODELS[info.name].context
    if info.kind == ADAPTER:
        return context_length(identify(info.base)) if info.base else None
    if info.path is not None and (info.path / "config.json").is_file():
        config = _read_json(info.path / "config.json")
        value = config.get("max_position_embeddings") if isinstance(config, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    return None


# The sizes of a model's config that bound ranks and layer indices before it loads.
DIM_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers")


def model_dims(info: FolderInfo) -> dict[str, int]:
    """The sizes of `info`'s model that are known without loading it: its record's (embedded) or its config.json's
    (a plain or quantized folder), only those that are positive integers; `head_dim` and `num_key_value_heads`
    filled in the way transformers does when the config leaves them out. {} when nothing is known."""
    if info.kind == EMBEDDED:
        dims = dict(EMBEDDED_MODELS[info.name].dims)
    elif info.kind in (MODEL, QUANTIZED) and info.path is not None and (info.path / "config.json").is_file():
        config = _read_json(info.path / "config.json")
        config = config if isinstance(config, dict) else {}
        dims = {k: config[k] for k in DIM_KEYS if _positive_int(config.get(k))}
    else:
        return {}
    if "head_dim" not in dims and "hidden_size" in dims and "num_attention_heads" in dims:
        dims["head_dim"] = dims["hidden_size"] // dims["num_attention_heads"]
    if "num_key_value_heads" not in dims and "num_attention_heads" in dims:
        dims["num_key_value_heads"] = dims["num_attention_heads"]
    return dims


def smallest_matrix_side(dims: dict[str, int]) -> int | None:
    """The smaller side of the smallest weight matrix of a Llama- or BERT-layout transformer with these sizes (the
    attention projections are hidden x heads * head_dim and hidden x kv_heads * head_dim, the MLP hidden x
    intermediate): the largest rank a low-rank factorization of every one of them allows. None when unknown."""
    sides = [dims.get("hidden_size"), dims.get("intermediate_size")]
    if "head_dim" in dims:
        sides += [dims.get("num_attention_heads", 0) * dims["head_dim"] or None,
                  dims.get("num_key_value_heads", 0) * dims["head_dim"] or None]
    known = [s for s in sides if s]
    return min(known) if known else None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_sequence_length(info: FolderInfo, seq_len: int, flag: str = "--seq-len") -> None:
    """Refuse a sequence longer than the model's context, before any work (it would run for minutes, then fail or
    extrapolate positions the model never saw)."""
    context = context_length(info)
    if context is not None and seq_len > context:
        raise InvalidInputError(f"{flag} {seq_len} exceeds {info.name}'s context of {context} tokens: use at most {context}")


def identify(name_or_path: str | Path) -> FolderInfo:
    """The kind of an embedded model name or a folder, from its files' JSON. Raises for a missing or broken one."""
    key = str(name_or_path)
    if key in EMBEDDED_MODELS:
        record = EMBEDDED_MODELS[key]
        return FolderInfo(EMBEDDED, key, f"embedded model: {record.summary}", {"source": "shipped with rankwise (offline)"},
                          (f"rankwise.models.load_model({key!r})",), record.causal, record.model_type)
    path = Path(key)
    check_path_limits(path, shown(key), output=False)  # a name over the system's limit cannot even be looked up
    if not path.exists():
        raise UnknownNameError(f"{key!r} is neither an embedded model ({', '.join(EMBEDDED_MODELS)}) nor an existing folder")
    if not path.is_dir():
        raise InvalidInputError(f"{key} is a file; a model is an embedded name ({', '.join(EMBEDDED_MODELS)}) or a folder")
    if (path / "config.json").is_file():
        return _identify_model_folder(path, key)
    if (path / "rankwise_adapter.json").is_file() or (path / "adapter_config.json").is_file():
        return _identify_adapter(path, key)
    if (path / "trainer.json").is_file():
        trainer = json_object(_read_json(path / "trainer.json"), path / "trainer.json")
        step = json_field(trainer, "step", int, path / "trainer.json")
        return FolderInfo(CHECKPOINT, key, f"training checkpoint at step {step}",
                          {"run": json_field(trainer, "run", dict, path / "trainer.json", {})},
                          ("resumed by rerunning the command that wrote it (same settings, same --out)",))
    if any((path / name).exists() for name in ("rankwise-run.json", "metrics.json", "adapter", "model")):
        return _identify_run(path, key)  # rankwise-run.json: commands.common.RUN_MARKER (a run not finished yet)
    raise InvalidInputError(
        f"{key} is not a model folder: it has no config.json (a transformers model), adapter_config.json (an adapter) "
        "or metrics.json (a finetune run)"
    )


def _identify_model_folder(path: Path, key: str) -> FolderInfo:
    config = read_model_config(path)
    manifest = _manifest(path)
    fmt = config.get("rankwise_format") or json_field(manifest, "rankwise_format", str, path / MANIFEST)
    causal, model_type = _causal(config), config["model_type"]
    if fmt == MLA_ONESHOT:
        record = dict(config.get("rankwise_mla") or {})
        base_type = record.get("base_model_type", model_type)
        return FolderInfo(MLA_ONESHOT, key, f"one-shot MLA conversion of a {base_type} model (low-rank K/V projections)",
                          record, (f"rankwise.models.load_model({key!r})  (stock transformers refuses it: its K/V "
                                   "projections are low-rank factor pairs only rankwise rebuilds)",), True, base_type)
    if fmt == MLA_DEPLOY or (model_type == "deepseek_v3" and manifest):
        made = dict(json_field(manifest, "mla_deploy", dict, path / MANIFEST, {}))
        made.setdefault("kv_lora_rank", config.get("kv_lora_rank"))
        made.setdefault("qk_rope_head_dim", config.get("qk_rope_head_dim"))
        return FolderInfo(MLA_DEPLOY, key, "deployable MLA model: a stock DeepSeek-V3 checkpoint with a latent-only KV cache",
                          made, (f"transformers.AutoModelForCausalLM.from_pretrained({key!r})",
                                 f"rankwise.models.load_model({key!r})"), True, model_type)
    if fmt == "microscaling":
        where = path / "quantization.json"
        q = json_object(_read_json(where), where) if where.is_file() else {}
        recipe = json_field(q, "recipe", dict, where, {})
        causal = _causal(config, json_field(q, "model_class", str, where))
        name = json_field(recipe, "name", str, where, "unknown recipe")
        return FolderInfo(QUANTIZED, key, f"block-quantized {model_type} model ({name})",
                          {"recipe": recipe, "quantized_layers": len(json_field(q, "layers", dict, where, {})) if q else None},
                          (f"rankwise.models.load_model({key!r})  (dequantizes to fp32; stock transformers cannot read "
                           "the packed weights)",), causal, model_type)
    if fmt == "codequant":
        where = path / "codequant.json"
        q = json_object(_read_json(where), where) if where.is_file() else {}
        layers = json_field(q, "layers", dict, where, {})
        recipe = json_field(q, "recipe", dict, where, {})
        return FolderInfo(QUANTIZED, key, f"CodeQuant-quantized {model_type} model (rotated stream, 16-centroid codebooks "
                          "per row, 4-bit inputs)",
                          {"recipe": {k: recipe.get(k) for k in ("rotation", "weights", "weight_bits", "act_bits", "group")
                                      if k in recipe},
                           "clustered_layers": len(layers),
                           "clustered_weights": sum(d["shape"][0] * d["shape"][1] for d in layers.values()
                                                    if isinstance(d, dict) and isinstance(d.get("shape"), list)
                                                    and len(d["shape"]) == 2)},
                          (f"rankwise.models.load_model({key!r})  (its clustered layers quantize their inputs; stock "
                           "transformers cannot read the codes)",), True, model_type)
    if fmt:
        # A format of a method this version does not list: load_model will name it (registry.folder_loader).
        return FolderInfo(MODEL, key, f"rankwise folder of format {fmt!r}", {"rankwise_format": fmt},
                          (f"rankwise.models.load_model({key!r})",), causal, model_type)
    check_transformers_folder(path)
    made = {"architectures": config.get("architectures"), "written_by": "rankwise" if manifest else "not rankwise (no manifest)"}
    what = {True: "causal language model", False: "model (no causal LM head)", None: "model"}[causal]
    return FolderInfo(MODEL, key, f"transformers {what}, model_type {model_type}", made,
                      (f"transformers.AutoModel{'ForCausalLM' if causal else ''}.from_pretrained({key!r})",
                       f"rankwise.models.load_model({key!r})"), causal, model_type)


def _identify_adapter(path: Path, key: str) -> FolderInfo:
    peft, ours = _adapter_json(path / "adapter_config.json"), _adapter_json(path / "rankwise_adapter.json")
    config = json_field(ours, "config", dict, path / "rankwise_adapter.json", {})
    base = json_field(peft, "base_model_name_or_path", str, path / "adapter_config.json") or _run_model(path.parent)
    # Both files' fields are checked (the PEFT one is what peft and, without a manifest, rankwise load).
    peft_type, peft_rank = (json_field(peft, "peft_type", str, path / "adapter_config.json", ""),
                            json_field(peft, "r", int, path / "adapter_config.json"))
    method = json_field(config, "method", str, path / "rankwise_adapter.json") or peft_type.lower() or "unknown"
    rank = json_field(config, "r", int, path / "rankwise_adapter.json", peft_rank)
    made = {"method": method, "rank": rank, "base_model": base,
            "modules": len(json_field(ours, "modules", list, path / "rankwise_adapter.json", [])) if ours else None}
    load = [f"rankwise.adapters.load_adapter(base, {key!r})  (base = load_model({base!r})[0])" if base else
            f"rankwise.adapters.load_adapter(base, {key!r})"]
    if peft:
        load.append(f"peft.PeftModel.from_pretrained(base, {key!r})")
    load.append(f"rankwise eval ppl --model {key}" + ("" if base else " --base BASE"))
    digest = ours.get("base_sha256") if isinstance(ours, dict) else None
    return FolderInfo(ADAPTER, key, f"{method} adapter" + (f" for {base}" if base else " (base model not recorded)"),
                      made, tuple(load), None, None, base, digest if isinstance(digest, str) else None)


def _adapter_json(path: Path) -> dict[str, Any]:
    """An adapter folder's JSON file as an object ({} when absent); an edited one that is not an object is named."""
    return json_object(_read_json(path), path) if path.is_file() else {}


@dataclass(frozen=True)
class BaseIdentity:
    """Which model a run trains on, so that a later load or resume can tell it is the same one."""

    name: str  # an embedded model's name, or the folder's absolute path (a relative one would change with the cwd)
    sha256: str | None  # the folder's `core.io.folder_digest`; None for an embedded model (its package fixes it)


def base_identity(key: str) -> BaseIdentity:
    """The identity of `--model KEY` (an embedded name or an existing folder), read before it loads."""
    if key in EMBEDDED_MODELS:
        return BaseIdentity(key, None)
    from rankwise.core.io import folder_digest

    path = Path(key).resolve()
    try:
        return BaseIdentity(str(path), folder_digest(path))
    except OSError as e:
        raise CorruptFileError(f"{key}: a file of the model folder cannot be read ({e})") from e


def check_adapter_base(adapter: FolderInfo, base: str, explicit: bool) -> None:
    """Refuse to apply `adapter` on `base` when the base it was trained on is known and `base` is not it.

    A recorded base folder that is gone is named as such; one whose content changed since training (replaced at the
    same path, or a relative path read from another working directory) is refused, since the adapter's deltas mean
    nothing on other weights. `explicit`: the user named `base` (--base), so it may differ by name; its content must
    still be the recorded one when a digest was recorded."""
    recorded = adapter.base
    if recorded is None:
        return
    if not explicit and recorded not in EMBEDDED_MODELS and not Path(recorded).exists():
        raise InvalidInputError(f"{adapter.name}: its recorded base model {recorded} does not exist (moved or deleted?); "
                                "name the base with --base")
    if adapter.base_sha256 is None or base in EMBEDDED_MODELS:
        if base in EMBEDDED_MODELS and recorded in EMBEDDED_MODELS and base != recorded:
            raise InvalidInputError(f"{adapter.name} was trained on {recorded}, not {base}")
        return
    found = base_identity(base).sha256
    if found != adapter.base_sha256:
        raise InvalidInputError(
            f"{adapter.name} was trained on a base whose content differs from {base} (recorded folder {recorded}, "
            f"sha256 {adapter.base_sha256[:12]}..., found {str(found)[:12]}...): the folder was replaced or is another "
            "model; give the base it was trained on with --base")


def _run_model(folder: Path) -> str | None:
    """The --model a finetune run was given, from its metrics.json (None when absent)."""
    metrics = folder / "metrics.json"
    if not metrics.is_file():
        return None
    try:
        data = json.loads(metrics.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("model") if isinstance(data, dict) else None


def _identify_run(path: Path, key: str) -> FolderInfo:
    metrics = json_object(_read_json(path / "metrics.json"), path / "metrics.json") if (path / "metrics.json").is_file() else {}
    json_field(metrics, "model", str, path / "metrics.json")  # read as a model's name (the adapter's base)
    made = {k: metrics.get(k) for k in ("model", "task", "method", "rank", "optimizer", "steps") if k in metrics}
    inner = [p for p in ("adapter", "model") if (path / p).is_dir()]
    load = [f"{path / p}: " + ("rankwise eval ppl --model " + str(path / p)) for p in inner]
    if (path / "checkpoint").is_dir():
        load.append(f"{path / 'checkpoint'}: the last checkpoint; rerunning the same finetune command resumes from it")
    return FolderInfo(FINETUNE_RUN, key, f"finetune run ({', '.join(inner) or 'no saved model yet'})", made, tuple(load),
                      None, None, metrics.get("model"))
