"""Reproduction B's scores from a causal LM: per-token NLL of real texts and of the LM's own sampled continuations,
computed once and cached as JSON under the rankwise cache dir (the generator is frozen, so its samples can be).

h(text) = mean negative log-likelihood per token of tokens 2..L+1 given the preceding ones, under the same model
that generates, clipped to [0, 15] nats so that h is bounded (Theorem 6 needs |h| <= H).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import read_json, write_json_atomic
from rankwise.core.progress import say
from rankwise.errors import CorruptFileError

NLL_CLIP = (0.0, 15.0)
CACHE_VERSION = 1
NAMESPACE = "martingale-posterior-uq"


@dataclass(frozen=True)
class LMScores:
    generated: list[float]  # h of each sampled continuation: the generator's score pool
    real: list[float]  # h of each real text: F*
    generated_texts: list[str]
    clipped: int  # scores moved by the clip to NLL_CLIP
    path: Path


def _clip(values: torch.Tensor) -> tuple[list[float], int]:
    lo, hi = NLL_CLIP
    clipped = int(((values < lo) | (values > hi)).sum())
    return values.clamp(lo, hi).tolist(), clipped


@torch.no_grad()
def _real_nll(model: Any, ids: torch.Tensor, batch: int) -> torch.Tensor:
    """ids [N, L+1] -> [N] mean NLL of tokens 1..L."""
    out = []
    for i in range(0, ids.shape[0], batch):
        x = ids[i:i + batch]
        logits = model(input_ids=x).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        out.append(nll.mean(1))
    return torch.cat(out)


@torch.no_grad()
def _generated_nll(model: Any, prompt_id: int, count: int, new_tokens: int, top_p: float, batch: int,
                   seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample `count` continuations of the one-token prompt (top-p, temperature 1, exactly `new_tokens` tokens: EOS
    is suppressed so every sample has the same length) -> (token ids [count, new_tokens], mean NLL [count]) where the
    NLL is under the model's raw (untruncated) distribution."""
    torch.manual_seed(seed)
    ids, nll = [], []
    for i in range(0, count, batch):
        b = min(batch, count - i)
        say(f"generating samples {i + 1}..{i + b} of {count}")
        prompt = torch.full((b, 1), prompt_id, dtype=torch.long)
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, top_p=top_p,
                             temperature=1.0, top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        new = out.sequences[:, 1:]
        logits = torch.stack(out.logits, 1).float()  # [b, new_tokens, vocab]
        nll.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), new, reduction="none").mean(1))
        ids.append(new)
    return torch.cat(ids), torch.cat(nll)


def lm_scores(model: Any, tokenizer: Any, texts: list[str], *, model_tag: str, count: int, real_count: int,
              new_tokens: int, top_p: float = 0.95, prompt: str = "The", batch: int = 25, seed: int = 0) -> LMScores:
    """The cached scores of `count` generated continuations and of the first `real_count` real `texts` that have
    new_tokens + 1 tokens (cut to that; shorter texts are skipped). Computed on first use, then read from the cache."""
    key = cache_key(v=CACHE_VERSION, model=model_tag, count=count, real_count=real_count, new_tokens=new_tokens,
                    top_p=top_p, prompt=prompt, seed=seed, texts=cache_key(texts=texts))
    name = f"lm-scores-{key}.json"
    entry = cached_entry(NAMESPACE, key)  # a manifest-checked cache entry (a corrupted one is discarded)
    if entry is not None:
        path = entry / name
        try:
            d = read_json(path)
            if len(d["generated"]) == count and d["key"] == key:
                return LMScores(d["generated"], d["real"], d["generated_texts"], d["clipped"], path)
        except (CorruptFileError, KeyError, TypeError):
            pass
        say(f"rankwise: {path} unusable; recomputing the LM scores")
    prompt_ids = tokenizer(prompt).input_ids
    if len(prompt_ids) != 1:
        raise CorruptFileError(f"the prompt {prompt!r} must be one token, got {len(prompt_ids)}")
    model.eval()
    gen_ids, gen_nll = _generated_nll(model, prompt_ids[0], count, new_tokens, top_p, batch, seed)
    encoded = [tokenizer(t).input_ids[:new_tokens + 1] for t in texts]
    real_ids = torch.tensor([e for e in encoded if len(e) == new_tokens + 1][:real_count], dtype=torch.long)
    say(f"scoring {real_ids.shape[0]} real texts")
    real_nll = _real_nll(model, real_ids, batch)
    generated, c1 = _clip(gen_nll)
    real, c2 = _clip(real_nll)
    texts_out = tokenizer.batch_decode(gen_ids, skip_special_tokens=True)
    record = {"key": key, "generated": generated, "real": real, "generated_texts": texts_out, "clipped": c1 + c2}
    folder = store_entry(NAMESPACE, key, lambda tmp: write_json_atomic(tmp / name, record))
    return LMScores(generated, real, texts_out, c1 + c2, folder / name)
