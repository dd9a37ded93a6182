"""Task inputs as model batches: token windows or right-padded texts with an attention mask (e.g. for NFN scoring)."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from rankwise.core.padding import pad_batch
from rankwise.data.topics import topic_task
from rankwise.data.windows import token_windows
from rankwise.errors import InvalidInputError

TASKS = ("wiki-lm", "wiki-topics")


def task_batches(
    tokenizer: PreTrainedTokenizerBase, task: str, examples: int = 64, seq_len: int = 64, batch_size: int = 16
) -> list[dict[str, torch.Tensor]]:
    """Inputs of a task's training split: `wiki-lm` windows of `seq_len` tokens, or `wiki-topics` texts (truncated
    to `seq_len` tokens, right-padded per batch with an attention mask). -> batches of input_ids / attention_mask [B, T]."""
    if task not in TASKS:
        raise InvalidInputError(f"unknown task {task!r}; choose one of {TASKS}")
    if examples < 1 or batch_size < 1 or seq_len < 2:
        raise InvalidInputError("examples and batch_size must be >= 1 and seq_len >= 2")
    if task == "wiki-lm":
        windows = token_windows(tokenizer, "train", seq_len, examples)
        return [{"input_ids": w, "attention_mask": torch.ones_like(w)} for w in windows.split(batch_size)]
    texts = topic_task("train", examples).texts
    pad = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
    out = []
    for start in range(0, len(texts), batch_size):
        encoded = tokenizer(texts[start : start + batch_size], truncation=True, max_length=seq_len)["input_ids"]
        ids = [torch.tensor(s, dtype=torch.long) for s in encoded]
        out.append({"input_ids": pad_batch(ids, pad), "attention_mask": pad_batch([torch.ones_like(s) for s in ids], 0)})
    return out
