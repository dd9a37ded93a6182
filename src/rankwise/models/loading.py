"""`load_model(name_or_path)`: an embedded model by name, or a folder, as (model, tokenizer), fully offline.

What the folder is comes from `models.folders` (JSON only); a folder of a rankwise format goes to the loader its
method's registry record names, a plain transformers folder to `transformers`. A folder that is not a model (an
adapter, a finetune run, a checkpoint) or a broken one raises a `RankwiseError` that says what to pass instead.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rankwise.core.io import MANIFEST_NAME, verify_manifest
from rankwise.errors import CorruptFileError, InvalidInputError, UnknownNameError
from rankwise.models import folders
from rankwise.models.embedded import EMBEDDED_MODELS
from rankwise.targets import resolve

EMBEDDED = EMBEDDED_MODELS  # by name (`rankwise.models.embedded`)


def load_model(name_or_path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """An embedded model by name (`smollm2-135m`, `minilm-l6`) or a saved model folder. fp32, eval mode."""
    key = str(name_or_path)
    if key in EMBEDDED_MODELS:
        return resolve(EMBEDDED_MODELS[key].loader)()
    info = folders.identify(key)
    if info.kind in (folders.ADAPTER, folders.FINETUNE_RUN, folders.CHECKPOINT):
        raise InvalidInputError(f"{key} is a {info.kind} folder, not a model ({info.summary}); load it with: {'; '.join(info.load)}")
    return _load_folder(Path(key))


def _load_folder(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    config = folders.read_model_config(path)
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
    folders.check_transformers_folder(path)
    auto = AutoModelForCausalLM if folders._is_causal(config) else AutoModel
    try:
        model = auto.from_pretrained(path, dtype=torch.float32, trust_remote_code=False, use_safetensors=True)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as e:  # transformers' own account of an unreadable folder
        raise CorruptFileError(f"{path} could not be loaded by transformers: {e}") from e
    return model.eval(), tokenizer
