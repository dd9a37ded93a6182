"""Text domains for calibration and evaluation, and the default calibration mix.

Two offline domains, each split by document into a calibration and an eval half:

- ``"wiki"``: the Wikipedia lead summaries (`rankwise.data.wiki`; its "calibration" and "eval" splits).
- ``"python-docs"``: the Python Language Reference as it ships inside CPython (`pydoc_data.topics`, the text behind
  `help("if")`): about 80 sections, ~110k SmolLM2 tokens of technical English prose with some grammar snippets. It
  needs no package beyond the interpreter; its exact text follows the Python minor version (3.11 here), so token
  counts can shift slightly on another Python. A section's split is fixed by a hash of its text, and sections
  filed under two names (e.g. "if" and "elif") are kept once, so no text is in both splits.

`calibration_mix_windows` is the documented default calibration set of `rankwise convert mla`: half the windows
from each domain's calibration split (wiki, then python-docs), seeded. Calibrating on one domain alone makes a
whitened conversion fit that domain (docs/methods/care-mla.md, "Calibration domain"); a mix of two unlike domains is
a cheap hedge, and a user's own text (`--calibration-text`) beats both on that user's domain.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import torch
from transformers import PreTrainedTokenizerBase

from rankwise.data.wiki import articles
from rankwise.data.windows import cut_windows
from rankwise.errors import InvalidInputError, UnknownNameError

DOMAINS = ("wiki", "python-docs")
DOMAIN_SPLITS = ("calibration", "eval")
MIX = (("wiki", 0.5), ("python-docs", 0.5))  # the default calibration mix: domain, share of the windows

_stream_cache: dict[tuple[str, int, str, str], torch.Tensor] = {}


def _pydocs_split(text: str) -> str:
    # SHA-256 of the section's text: the same split on every machine and run, independent of dict order, and the
    # same for a text filed under two names.
    return "calibration" if int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16) % 2 == 0 else "eval"


@lru_cache(maxsize=1)
def _pydocs_sections() -> tuple[str, ...]:
    """The distinct non-empty sections of the Python Language Reference, sorted by text."""
    from pydoc_data.topics import topics  # CPython's own reference text; part of every standard install

    return tuple(sorted({text.strip() for text in topics.values() if text.strip()}))


def domain_texts(domain: str, split: str) -> list[str]:
    """The documents of one domain's split, in a fixed order (wiki: by title; python-docs: by text)."""
    if domain not in DOMAINS:
        raise UnknownNameError(f"unknown text domain {domain!r}; choose one of {DOMAINS}")
    if split not in DOMAIN_SPLITS:
        raise UnknownNameError(f"unknown split {split!r} for a text domain; choose one of {DOMAIN_SPLITS}")
    if domain == "wiki":
        return [a.text for a in articles(split)]
    return [text for text in _pydocs_sections() if _pydocs_split(text) == split]


def text_stream(tokenizer: PreTrainedTokenizerBase, texts: str | list[str]) -> torch.Tensor:
    """Documents as one token stream, each followed by the EOS token. -> [N] int64"""
    if isinstance(texts, str):
        texts = [texts]
    if not texts or not all(isinstance(t, str) for t in texts) or not any(t.strip() for t in texts):
        raise InvalidInputError("text_stream needs at least one non-empty string")
    ids = tokenizer([t for t in texts if t.strip()], add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    return torch.tensor([t for seq in ids for t in (*seq, eos)], dtype=torch.long)


def domain_windows(
    tokenizer: PreTrainedTokenizerBase, domain: str, split: str, seq_len: int, max_windows: int | None = None
) -> torch.Tensor:
    """Windows of one domain's split, as `token_windows` cuts the wiki splits (a smaller set is a prefix). -> [W, T]"""
    key = (tokenizer.name_or_path, len(tokenizer), domain, split)
    if key not in _stream_cache:
        _stream_cache[key] = text_stream(tokenizer, domain_texts(domain, split))
    return cut_windows(_stream_cache[key], seq_len, max_windows)


def mix_windows(
    tokenizer: PreTrainedTokenizerBase, parts: dict[str, int], seq_len: int, seed: int = 0, split: str = "calibration"
) -> torch.Tensor:
    """`parts[domain]` windows drawn (seeded, without replacement) from each domain's split, domains in DOMAINS order.

    -> [sum(parts), seq_len]
    """
    unknown = [d for d in parts if d not in DOMAINS]
    if unknown or not parts or any(n < 0 for n in parts.values()) or sum(parts.values()) == 0:
        raise InvalidInputError(f"mix parts must map domains of {DOMAINS} to window counts >= 0, not all 0; got {parts}")
    chunks = []
    for i, domain in enumerate(d for d in DOMAINS if parts.get(d, 0) > 0):
        pool = domain_windows(tokenizer, domain, split, seq_len)
        n = parts[domain]
        if pool.size(0) < n:
            raise InvalidInputError(f"{domain} {split} has only {pool.size(0)} windows of {seq_len} tokens, fewer than {n}")
        order = torch.randperm(pool.size(0), generator=torch.Generator().manual_seed(seed * 1009 + i))[:n]
        chunks.append(pool[order.sort().values])
    return torch.cat(chunks)


def calibration_mix_windows(tokenizer: PreTrainedTokenizerBase, samples: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """The default calibration set: `samples` windows split between the domains by MIX's shares. -> [samples, seq_len]"""
    if samples < len(MIX):
        raise InvalidInputError(f"the calibration mix needs at least {len(MIX)} windows, got {samples}")
    counts = [int(samples * share) for _, share in MIX]
    counts[0] += samples - sum(counts)  # rounding goes to the first domain
    return mix_windows(tokenizer, {d: n for (d, _), n in zip(MIX, counts)}, seq_len, seed)
