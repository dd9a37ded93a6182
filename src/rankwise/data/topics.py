"""The 12-class topic classification task over the Wikipedia summaries (train and eval splits by article)."""

from __future__ import annotations

from dataclasses import dataclass

from rankwise.data.wiki import articles, load_articles
from rankwise.errors import UnknownNameError


@dataclass(frozen=True)
class TopicTask:
    texts: list[str]
    labels: list[int]
    label_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.texts)


def topic_labels() -> tuple[str, ...]:
    """The 12 topic names, sorted; a label's index is its class id."""
    return tuple(sorted({a.topic for a in load_articles()}))


def topic_task(split: str, max_examples: int | None = None) -> TopicTask:
    """Texts and integer labels of the 'train' or 'eval' split (calibration articles are held out of both)."""
    if split not in ("train", "eval"):
        raise UnknownNameError(f"the topic task has splits 'train' and 'eval', not {split!r}")
    names = topic_labels()
    index = {n: i for i, n in enumerate(names)}
    items = articles(split)
    if max_examples is not None:
        # An even stride, not a prefix: title order would otherwise bias the classes of a small sample.
        stride = max(1, len(items) // max_examples)
        items = items[::stride][:max_examples]
    return TopicTask([a.text for a in items], [index[a.topic] for a in items], names)
