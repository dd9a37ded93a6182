"""Compact vocabularies for small language models: bytes, or a small byte-level BPE trained on given texts.

A 49k-token vocabulary makes a d_model = 64 model almost all embedding; with 257 byte tokens (or a few hundred BPE
tokens) the parameters sit in the blocks, which is what scaling experiments on tiny models need. Both tokenizers
are `transformers.PreTrainedTokenizerFast` objects built with the `tokenizers` library, so they plug into
`rankwise.data.token_windows` and `LanguageModelingTask.from_wiki` like the real ones. Nothing is downloaded and
both are deterministic: the byte tokenizer is fixed, and BPE training on the same texts gives the same merges.

    tok = byte_tokenizer()                 # ids 0..255 are the UTF-8 bytes, 256 is <|endoftext|>
    tok("héllo")["input_ids"]              # [104, 195, 169, 108, 108, 111]
    tok = wiki_bpe_tokenizer(512)          # 512 tokens trained on the wiki corpus's train split
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rankwise.errors import InvalidInputError

EOS = "<|endoftext|>"
NUM_BYTES = 256
BYTE_VOCAB_SIZE = NUM_BYTES + 1  # the bytes and EOS


def byte_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable character map of byte-level BPE (GPT-2's convention).

    Printable Latin-1 bytes map to themselves; the other 68 bytes (controls, space, ...) map to the code points from
    256 upward, in byte order. The `tokenizers` ByteLevel pre-tokenizer applies this same map, so a vocabulary
    keyed by these characters sees every byte.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(NUM_BYTES):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(NUM_BYTES + extra)
            extra += 1
    return table


def _byte_level(tok: Tokenizer) -> Tokenizer:
    # use_regex=False: no word splitting, so the byte tokenizer is a pure byte map and BPE may merge across spaces
    # only where its training data makes it worth it (a space is just another byte).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _wrap(tok: Tokenizer, name: str) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.name_or_path = name  # token_windows caches streams by (name, vocabulary size, split)
    return fast


@lru_cache(maxsize=1)
def _byte_tokenizer() -> PreTrainedTokenizerFast:
    chars = byte_to_unicode()
    vocab = {chars[b]: b for b in range(NUM_BYTES)}
    vocab[EOS] = NUM_BYTES
    # A BPE model without merges is a lookup of single byte characters: id == byte value.
    tok = _byte_level(Tokenizer(models.BPE(vocab=vocab, merges=[])))
    tok.add_special_tokens([EOS])
    return _wrap(tok, "rankwise/bytes")


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A 257-token tokenizer: token id b is the UTF-8 byte b (0..255), id 256 is EOS (also used as padding)."""
    return _byte_tokenizer()


def train_bpe(texts: Sequence[str] | Iterable[str], vocab_size: int, min_frequency: int = 2,
              name: str | None = None) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of `vocab_size` tokens (the 256 bytes, EOS and vocab_size - 257 merges) trained on
    `texts`. Every byte stays in the vocabulary, so any text encodes and decodes back exactly.

    Deterministic: the same texts in the same order give the same vocabulary and merges. `name` (default: a hash of
    the texts and settings) is the tokenizer's `name_or_path`.
    """
    texts = list(texts)
    if not texts or not any(texts):
        raise InvalidInputError("train_bpe needs at least one non-empty text to learn merges from")
    if not isinstance(vocab_size, int) or vocab_size < BYTE_VOCAB_SIZE:
        raise InvalidInputError(f"vocab_size must be an int >= {BYTE_VOCAB_SIZE} (the 256 bytes and EOS), got {vocab_size!r}")
    if min_frequency < 1:
        raise InvalidInputError(f"min_frequency must be >= 1, got {min_frequency}")
    tok = _byte_level(Tokenizer(models.BPE()))
    chars = byte_to_unicode()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS],
                                  initial_alphabet=[chars[b] for b in range(NUM_BYTES)], show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    if name is None:
        digest = hashlib.sha256()
        for t in texts:
            digest.update(t.encode("utf-8") + b"\0")
        name = f"rankwise/bpe-{vocab_size}-{min_frequency}-{digest.hexdigest()[:12]}"
    return _wrap(tok, name)


@lru_cache(maxsize=4)
def wiki_bpe_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """`train_bpe` on the wiki corpus's train split (articles in title order); cached per vocabulary size."""
    from rankwise.data.wiki import articles

    return train_bpe([a.text for a in articles("train")], vocab_size, name=f"rankwise/wiki-bpe-{vocab_size}")
