"""The model zoo: `load_model(name_or_path)` returns (model, tokenizer), fully offline."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rankwise.core.io import MANIFEST_NAME, verify_manifest
from rankwise.errors import CorruptFileError, UnknownNameError
from rankwise.models.minilm import embed_sentences, load_minilm
from rankwise.models.smollm2 import load_smollm2, load_smollm2_tokenizer
from rankwise.models.tiny import tiny_bert, tiny_llama

EMBEDDED = {"smollm2-135m": load_smollm2, "minilm-l6": load_minilm}



def load_model(name_or_path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """An embedded model by name (`smollm2-135m`, `minilm-l6`) or a saved `transformers` folder. fp32, eval mode."""
    key = str(name_or_path)
    if key in EMBEDDED:
        return EMBEDDED[key]()
    path = Path(key)
    if not (path / "config.json").is_file():
        raise UnknownNameError(
            f"{key!r} is neither an embedded model ({', '.join(EMBEDDED)}) nor a folder with a config.json"
        )
    return _load_folder(path)


def _load_folder(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    try:
        config = json.loads((path / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"{path / 'config.json'} is not valid JSON ({e})") from e
    fmt = config.get("rankwise_format")
    if fmt:
        # Folders written by rankwise name their format in config.json; the method that writes a format names its
        # loader in its registry record (a string resolved here, so this layer imports no method package).
        from rankwise.registry import folder_loader

        try:
            loader = folder_loader(fmt)
        except UnknownNameError as e:
            raise UnknownNameError(f"{path}: {e}") from None
        return loader(path)
    if (path / MANIFEST_NAME).is_file():  # written by rankwise (e.g. `finetune --method full`): check it first
        verify_manifest(path)
    architectures = config.get("architectures") or []
    auto = AutoModelForCausalLM if any(a.endswith("ForCausalLM") for a in architectures) else AutoModel
    model = auto.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer


__all__ = ["load_model", "load_smollm2_tokenizer", "tiny_llama", "tiny_bert", "embed_sentences", "EMBEDDED"]
