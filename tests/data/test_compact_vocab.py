"""Compact vocabularies: the byte tokenizer is an exact byte map, BPE training is deterministic and lossless."""

import pytest

from rankwise.data import token_windows
from rankwise.data.compact_vocab import BYTE_VOCAB_SIZE, EOS, byte_to_unicode, byte_tokenizer, train_bpe
from rankwise.errors import InvalidInputError

pytestmark = pytest.mark.method("loss-curve-collapse")

TEXTS = ["The cat sat on the mat.", "The dog sat on the log.", "Ünïcödé — ☃ and tabs\tand\nnewlines", "the the the"]


def test_byte_map_is_a_bijection_onto_printable_characters():
    table = byte_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert all(ch.isprintable() and not ch.isspace() for ch in table.values())


def test_byte_tokenizer_ids_are_the_utf8_bytes():
    tok = byte_tokenizer()
    assert len(tok) == BYTE_VOCAB_SIZE
    assert tok.eos_token == EOS and tok.eos_token_id == 256
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == list(text.encode("utf-8"))
        assert tok.decode(ids) == text


def test_bpe_is_deterministic_lossless_and_of_the_asked_size():
    a = train_bpe(TEXTS * 5, 300, min_frequency=1)
    b = train_bpe(TEXTS * 5, 300, min_frequency=1)
    assert a.get_vocab() == b.get_vocab()
    assert a.name_or_path == b.name_or_path
    assert BYTE_VOCAB_SIZE < len(a) <= 300
    for text in TEXTS + ["bytes it never saw: ½ ∑ 🙂"]:
        ids = a(text, add_special_tokens=False)["input_ids"]
        assert a.decode(ids) == text
    # merges compress the training text relative to bytes
    assert len(a(TEXTS[0])["input_ids"]) < len(TEXTS[0].encode("utf-8"))
    # different texts: a different name, so cached token streams never mix
    assert train_bpe(TEXTS[:2] * 5, 300, min_frequency=1).name_or_path != a.name_or_path


def test_byte_tokenizer_feeds_token_windows():
    windows = token_windows(byte_tokenizer(), "eval", 16, 4)
    assert windows.shape == (4, 16)
    assert int(windows.max()) < BYTE_VOCAB_SIZE


@pytest.mark.parametrize("kwargs", [dict(texts=[], vocab_size=300), dict(texts=[""], vocab_size=300),
                                    dict(texts=TEXTS, vocab_size=100), dict(texts=TEXTS, vocab_size=300, min_frequency=0)])
def test_bpe_refuses_bad_input(kwargs):
    with pytest.raises(InvalidInputError):
        train_bpe(**kwargs)
