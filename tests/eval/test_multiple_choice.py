"""Next-sentence multiple choice: deterministic items, fair scoring, padding independence."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.eval.multiple_choice import ChoiceItem, choice_accuracy, next_sentence_items, split_sentences

pytestmark = pytest.mark.method("care-mla")

TEXTS = [
    f"Topic {a} starts here with a first sentence of words. "
    + " ".join(f"Article {a} sentence {s} has several more words in it." for s in range(1, 5))
    for a in range(12)
]


class WordTokenizer:
    """Whitespace tokenizer with a growing vocabulary (ids from 1; 0 pads)."""

    pad_token_id = 0

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [self.vocab.setdefault(w, len(self.vocab) + 1) for w in text.split()]}


class PreferTokens(nn.Module):
    """Logits that favour a fixed set of token ids at every position, whatever the input."""

    def __init__(self, favoured: set[int], vocab: int) -> None:
        super().__init__()
        self.bias = torch.zeros(vocab)
        self.bias[list(favoured)] = 5.0

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(*input_ids.shape, -1).clone()


def test_split_sentences():
    assert split_sentences("One two. Three four! \"Five\" six? seven. Eight") == ["One two.", "Three four!", "\"Five\" six? seven.", "Eight"]


def test_items_are_deterministic_and_well_formed():
    items = next_sentence_items(TEXTS, 8, choices=4, min_words=5, seed=3)
    assert items == next_sentence_items(TEXTS, 8, choices=4, min_words=5, seed=3)
    assert items != next_sentence_items(TEXTS, 8, choices=4, min_words=5, seed=4)
    for it in items:
        article = it.context.split()[1]
        assert it.context in TEXTS[int(article)]
        truth = it.choices[it.answer]
        assert truth.startswith(f"Article {article} ") and TEXTS[int(article)].index(it.context) < TEXTS[int(article)].index(truth)
        others = [c for i, c in enumerate(it.choices) if i != it.answer]
        assert len(set(others)) == 3 and all(not c.startswith(f"Article {article} ") and not c.startswith("Topic") for c in others)
    assert len({it.answer for it in items}) > 1  # the answer position varies


def test_bad_input_raises():
    with pytest.raises(InvalidInputError):
        next_sentence_items(TEXTS, 0)
    with pytest.raises(InvalidInputError):
        next_sentence_items(TEXTS, 13, min_words=5)  # at most one item per article
    with pytest.raises(InvalidInputError):
        choice_accuracy(PreferTokens(set(), 4), WordTokenizer(), [])


def test_accuracy_follows_the_scores():
    tok = WordTokenizer()
    items = [ChoiceItem("ctx a", ("good good", "bad bad", "bad"), 0), ChoiceItem("ctx b", ("bad", "bad good", "good"), 2)]
    for it in items:
        for text in (it.context, *it.choices):
            tok(text)
    good = {tok.vocab["good"]}
    assert choice_accuracy(PreferTokens(good, 16), tok, items).accuracy == 1.0
    result = choice_accuracy(PreferTokens({tok.vocab["bad"]}, 16), tok, items)
    assert result.accuracy == 0.0 and result.chance == pytest.approx(1 / 3) and result.n_items == 2


def test_padding_and_batching_do_not_change_scores():
    from rankwise.models import load_smollm2_tokenizer, tiny_llama

    tokenizer = load_smollm2_tokenizer()
    model = tiny_llama(seed=0, num_layers=2)
    items = next_sentence_items(TEXTS, 6, choices=3, min_words=5, seed=0)
    one = choice_accuracy(model, tokenizer, items, context_tokens=8, choice_tokens=6, batch_size=1)
    many = choice_accuracy(model, tokenizer, items, context_tokens=8, choice_tokens=6, batch_size=7)
    assert one.correct == many.correct
