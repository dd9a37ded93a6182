"""Corpora and tasks with deterministic splits."""

from rankwise.data.batches import TASKS, task_batches
from rankwise.data.topics import TopicTask, topic_labels, topic_task
from rankwise.data.wiki import SPLITS, Article, articles, load_articles, split_of
from rankwise.data.windows import split_tokens, token_windows

__all__ = [
    "SPLITS", "Article", "articles", "load_articles", "split_of", "split_tokens", "token_windows",
    "TopicTask", "topic_labels", "topic_task", "TASKS", "task_batches",
]
