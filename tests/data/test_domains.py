"""Text domains (wiki, python-docs), their document splits, and the default calibration mix."""

import pytest
import torch

from rankwise.data import token_windows
from rankwise.data.domains import (DOMAINS, MIX, calibration_mix_windows, cut_windows, domain_texts, domain_windows,
                                   mix_windows, text_stream)
from rankwise.errors import InvalidInputError, UnknownNameError

pytestmark = pytest.mark.method("care-mla")


def test_python_docs_splits_are_disjoint_nonempty_and_prose():
    cal, ev = domain_texts("python-docs", "calibration"), domain_texts("python-docs", "eval")
    assert len(cal) > 20 and len(ev) > 20 and not set(cal) & set(ev)
    assert domain_texts("python-docs", "eval") == ev  # fixed order and split
    words = " ".join(ev).split()
    assert sum(w.lower() in {"the", "is", "of", "a"} for w in words) / len(words) > 0.05  # English prose, not code


def test_domain_windows_match_token_windows_for_wiki_and_are_prefixes(tokenizer):
    assert torch.equal(domain_windows(tokenizer, "wiki", "eval", 64, 5), token_windows(tokenizer, "eval", 64, 5))
    w8, w3 = domain_windows(tokenizer, "python-docs", "eval", 32, 8), domain_windows(tokenizer, "python-docs", "eval", 32, 3)
    assert w8.shape == (8, 32) and torch.equal(w8[:3], w3)


def test_mix_takes_each_domains_windows_from_its_own_calibration_split(tokenizer):
    mix = calibration_mix_windows(tokenizer, 20, 16, seed=1)
    assert mix.shape == (20, 16) and [share for _, share in MIX] == [0.5, 0.5]
    pools = {d: {tuple(r) for r in domain_windows(tokenizer, d, "calibration", 16).tolist()} for d in DOMAINS}
    rows = [tuple(r) for r in mix.tolist()]
    assert all(r in pools["wiki"] for r in rows[:10]) and all(r in pools["python-docs"] for r in rows[10:])
    assert len(set(rows)) == 20  # drawn without replacement
    assert torch.equal(mix, calibration_mix_windows(tokenizer, 20, 16, seed=1))
    assert not torch.equal(mix, calibration_mix_windows(tokenizer, 20, 16, seed=2))


def test_stream_joins_documents_with_eos(tokenizer):
    stream = text_stream(tokenizer, ["one two", "three"])
    assert (stream == tokenizer.eos_token_id).sum() == 2 and stream[-1] == tokenizer.eos_token_id
    assert cut_windows(torch.arange(10), 3).tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_bad_input_is_refused(tokenizer):
    with pytest.raises(UnknownNameError):
        domain_texts("novels", "eval")
    with pytest.raises(UnknownNameError):
        domain_texts("python-docs", "train")
    with pytest.raises(InvalidInputError):
        mix_windows(tokenizer, {"wiki": 0}, 16)
    with pytest.raises(InvalidInputError):
        mix_windows(tokenizer, {"python-docs": 10**6}, 16)
    with pytest.raises(InvalidInputError):
        text_stream(tokenizer, ["  "])
    with pytest.raises(InvalidInputError):
        cut_windows(torch.arange(3), 4)
