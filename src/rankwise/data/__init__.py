"""Corpora and tasks with deterministic splits.

The text corpus and its tasks are exported here. The domain loaders are imported by module, so that importing
`rankwise.data` pulls in none of their dependencies (RDKit, MuJoCo, ...): `data.vision` (Fashion-MNIST, digits,
scikit-image), `data.tabular` (COMPAS, Adult), `data.graphs` (CSBM pairs, fly connectomes), `data.molecules`
(Hallem-Carlson odorants, PubChem SMILES, RDKit features), `data.control` (gymnasium, Meta-World experts),
`data.pdes` (spectral solvers at several resolutions), `data.ratings` (MovieLens); `data.splits` is their shared
stratified split."""

from rankwise.data.batches import TASKS, task_batches
from rankwise.data.topics import TopicTask, topic_labels, topic_task
from rankwise.data.wiki import SPLITS, Article, articles, load_articles, split_of
from rankwise.data.windows import split_tokens, token_windows

__all__ = [
    "SPLITS", "Article", "articles", "load_articles", "split_of", "split_tokens", "token_windows",
    "TopicTask", "topic_labels", "topic_task", "TASKS", "task_batches",
]
