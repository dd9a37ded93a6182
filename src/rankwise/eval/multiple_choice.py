"""Multiple-choice next-sentence selection: an accuracy-type measure beside perplexity, built from held-out articles.

    items = next_sentence_items([a.text for a in articles("eval")], n_items=96, choices=4)
    result = choice_accuracy(model, tokenizer, items)          # result.accuracy in [0, 1]; chance is 1 / choices

Each item is one article's context sentence, its true next sentence, and `choices - 1` distractor sentences drawn
from *other* articles (never an article's first sentence, whose "X is a ..." form would give it away). The model
picks the candidate with the highest mean log-likelihood per token given the context, so candidates of different
length compete fairly; each candidate is cut to its first `choice_tokens` tokens and the context to its last
`context_tokens`, which bounds the cost (one forward of at most context_tokens + choice_tokens per candidate).
Items are deterministic: the same texts and seed give the same items on every machine.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.core.progress import progress
from rankwise.errors import InvalidInputError, NumericalError

__all__ = ["ChoiceItem", "ChoiceResult", "split_sentences", "next_sentence_items", "choice_accuracy"]

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


@dataclass(frozen=True)
class ChoiceItem:
    context: str
    choices: tuple[str, ...]
    answer: int  # index of the true continuation in `choices`


@dataclass(frozen=True)
class ChoiceResult:
    accuracy: float  # fraction of items whose true continuation scores highest
    correct: tuple[bool, ...]  # per item
    chance: float  # 1 / number of choices

    @property
    def n_items(self) -> int:
        return len(self.correct)


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, split after . ! ? followed by whitespace and a capital or an opening quote/bracket."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def next_sentence_items(texts: Sequence[str], n_items: int, choices: int = 4, min_words: int = 8, seed: int = 0) -> list[ChoiceItem]:
    """`n_items` next-sentence items from article texts (one item per article at most, articles in a seeded order).

    An article qualifies if it has two consecutive sentences of >= `min_words` words; distractors are sentences of
    >= `min_words` words from other articles, not first sentences. Raises if fewer than `n_items` articles qualify.
    """
    if isinstance(n_items, bool) or not isinstance(n_items, int) or n_items < 1:
        raise InvalidInputError(f"n_items must be a positive integer, got {n_items!r}")
    if isinstance(choices, bool) or not isinstance(choices, int) or choices < 2:
        raise InvalidInputError(f"choices must be an integer >= 2, got {choices!r}")
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise InvalidInputError("texts must be a sequence of article strings")
    sentences = [split_sentences(t) for t in texts]
    long = [[len(s.split()) >= min_words for s in doc] for doc in sentences]
    pool = [(a, s) for a, doc in enumerate(sentences) for s in range(1, len(doc)) if long[a][s]]
    rng = random.Random(seed)
    order = list(range(len(texts)))
    rng.shuffle(order)
    items: list[ChoiceItem] = []
    for a in order:
        starts = [i for i in range(len(sentences[a]) - 1) if long[a][i] and long[a][i + 1]]
        if not starts:
            continue
        i = rng.choice(starts)
        distractors: list[str] = []
        while len(distractors) < choices - 1:
            b, s = pool[rng.randrange(len(pool))]
            if b != a and sentences[b][s] not in distractors:
                distractors.append(sentences[b][s])
        answer = rng.randrange(choices)
        options = distractors[:answer] + [sentences[a][i + 1]] + distractors[answer:]
        items.append(ChoiceItem(sentences[a][i], tuple(options), answer))
        if len(items) == n_items:
            return items
    raise InvalidInputError(f"only {len(items)} of {len(texts)} articles give a next-sentence item with sentences of >= {min_words} words; "
                            f"{n_items} were asked for")


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def choice_accuracy(
    model: nn.Module, tokenizer, items: Sequence[ChoiceItem], context_tokens: int = 32, choice_tokens: int = 16,
    batch_size: int = 16, desc: str = "multiple choice",
) -> ChoiceResult:
    """Accuracy of picking each item's true continuation by mean log p(candidate token | context, earlier tokens).

    Sequences are [context (last `context_tokens` tokens)] + [" " + candidate (first `choice_tokens` tokens)],
    right-padded to a batch [B, <= context_tokens + choice_tokens]; with causal attention the padding never reaches
    a scored position, so no attention mask is needed. Log-probabilities are summed in float64.
    """
    if not items:
        raise InvalidInputError("choice_accuracy needs at least one item")
    if context_tokens < 1 or choice_tokens < 1:
        raise InvalidInputError(f"context_tokens and choice_tokens must be positive, got {context_tokens}, {choice_tokens}")
    width = len(items[0].choices)
    if any(len(it.choices) != width or not 0 <= it.answer < width for it in items):
        raise InvalidInputError("every item needs the same number of choices and an answer index among them")
    seqs: list[tuple[list[int], int]] = []  # (token ids, number of context tokens)
    for it in items:
        ctx = _encode(tokenizer, it.context)[-context_tokens:]
        if not ctx:
            raise InvalidInputError(f"an item's context encodes to no tokens: {it.context!r}")
        for choice in it.choices:
            cand = _encode(tokenizer, " " + choice)[:choice_tokens]
            if not cand:
                raise InvalidInputError(f"a candidate encodes to no tokens: {choice!r}")
            seqs.append((ctx + cand, len(ctx)))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    scores = torch.empty(len(seqs), dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for start in progress(range(0, len(seqs), batch_size), desc=desc):
            chunk = seqs[start : start + batch_size]
            length = max(len(ids) for ids, _ in chunk)
            batch = torch.full((len(chunk), length), pad, dtype=torch.long)
            for row, (ids, _) in enumerate(chunk):
                batch[row, : len(ids)] = torch.tensor(ids)
            out = model(input_ids=batch)
            logp = torch.log_softmax((out.logits if hasattr(out, "logits") else out).double(), dim=-1)
            for row, (ids, n_ctx) in enumerate(chunk):
                positions = torch.arange(n_ctx - 1, len(ids) - 1)  # the logits that predict candidate tokens
                targets = torch.tensor(ids[n_ctx:])
                scores[start + row] = logp[row, positions, targets].mean()
    finally:
        model.train(was_training)
    if not torch.isfinite(scores).all():
        raise NumericalError("the model produced non-finite log-probabilities on a multiple-choice candidate")
    picked = scores.view(len(items), width).argmax(dim=1)
    correct = tuple(bool(p == it.answer) for p, it in zip(picked.tolist(), items))
    return ChoiceResult(accuracy=sum(correct) / len(correct), correct=correct, chance=1.0 / width)
