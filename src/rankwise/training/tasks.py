"""Fine-tuning tasks: what a batch is, the loss, and the held-out evaluation.

- `LanguageModelingTask`: next-token prediction on given token windows (`from_wiki`: the wiki corpus); evaluation is
  the held-out mean NLL (`eval_loss`, nats per token) and perplexity.
- `ClassificationTask`: sequence classification with a pooled representation and a linear head (`SequenceClassifier`:
  mean pooling for encoders such as MiniLM, last-token pooling for causal LMs such as SmolLM2); evaluation is
  accuracy. `topic_classification` builds the 12-class wiki-topics task.

A task's `wrap(model)` returns the module that is trained (the model itself, or model + head); the training loop
only calls `batch`, `loss` and `evaluate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.core.progress import progress
from rankwise.data import token_windows, topic_task
from rankwise.errors import InvalidInputError
from rankwise.eval import perplexity
from rankwise.models.minilm import mean_pool


class LanguageModelingTask:
    """Causal LM on windows [W, T]; the loss is the model's own shifted cross-entropy."""

    name = "wiki-lm"
    metric = "perplexity"
    higher_is_better = False

    def __init__(self, train_windows: torch.Tensor, eval_windows: torch.Tensor, eval_batch_size: int = 8, name: str | None = None) -> None:
        for what, w in (("train", train_windows), ("eval", eval_windows)):
            if w.dim() != 2 or w.size(0) == 0 or w.size(1) < 2:
                raise InvalidInputError(f"{what} windows must be a non-empty [W, T] tensor with T >= 2, got {tuple(w.shape)}")
        self.train_windows, self.eval_windows, self.eval_batch_size = train_windows, eval_windows, eval_batch_size
        if name is not None:  # e.g. "pretrain" for windows of another corpus; checkpoints record it
            self.name = name

    @classmethod
    def from_wiki(cls, tokenizer, seq_len: int = 64, train_windows: int | None = None, eval_windows: int = 32) -> LanguageModelingTask:
        return cls(token_windows(tokenizer, "train", seq_len, train_windows), token_windows(tokenizer, "eval", seq_len, eval_windows))

    @property
    def num_train(self) -> int:
        return self.train_windows.size(0)

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"input_ids": self.train_windows[indices]}

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        return module(input_ids=ids, labels=ids).loss

    def evaluate(self, module: nn.Module) -> dict[str, float]:
        result = perplexity(module, self.eval_windows, batch_size=self.eval_batch_size, desc="eval ppl")
        return {"eval_loss": result.mean_nll, "perplexity": result.perplexity}


class SequenceClassifier(nn.Module):
    """model (optionally adapted) -> pooled hidden state [B, D] -> linear head -> logits [B, num_labels]."""

    def __init__(self, model: nn.Module, num_labels: int, pooling: str = "auto") -> None:
        super().__init__()
        self.model = model
        hf = model  # a transformers model, or an AdaptedModel (whose attributes fall through to the one it wraps)
        backbone = getattr(hf, "base_model", hf)  # transformers: the encoder/decoder stack without the LM head
        # Not registered: it is a submodule of `model` already (registering it twice would duplicate its state).
        object.__setattr__(self, "_backbone", backbone)
        causal = hasattr(hf, "lm_head")
        self.pooling = ("last" if causal else "mean") if pooling == "auto" else pooling
        if self.pooling not in ("mean", "last"):
            raise InvalidInputError(f"pooling must be 'mean', 'last' or 'auto', got {pooling!r}")
        self.head = nn.Linear(hf.config.hidden_size, num_labels)

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self._backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "mean":
            return mean_pool(hidden, attention_mask)
        last = attention_mask.long().sum(1).clamp_min(1) - 1  # right padding: the last real token
        return hidden[torch.arange(hidden.size(0)), last]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.pooled(input_ids, attention_mask))


class ClassificationTask:
    """Texts -> token ids (truncated to `max_length`, right-padded per batch) -> labels in [0, num_labels)."""

    name = "classification"
    metric = "accuracy"
    higher_is_better = True

    def __init__(
        self,
        tokenizer,
        texts: Sequence[str],
        labels: Sequence[int],
        eval_texts: Sequence[str],
        eval_labels: Sequence[int],
        num_labels: int,
        max_length: int = 32,
        pooling: str = "auto",
        eval_batch_size: int = 64,
    ) -> None:
        if not texts or not eval_texts:
            raise InvalidInputError("a classification task needs at least one training and one evaluation example")
        if max_length < 2:
            raise InvalidInputError(f"max_length must be at least 2, got {max_length}")
        for what, ys in (("train", labels), ("eval", eval_labels)):
            bad = [y for y in ys if not 0 <= int(y) < num_labels]
            if bad:
                raise InvalidInputError(f"{what} labels must lie in [0, {num_labels}), found {bad[:3]}")
        self.num_labels, self.max_length, self.pooling, self.eval_batch_size = num_labels, max_length, pooling, eval_batch_size
        self.pad_id = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
        self.train_ids = self._encode(tokenizer, texts)
        self.eval_ids = self._encode(tokenizer, eval_texts)
        self.train_labels = torch.tensor([int(y) for y in labels])
        self.eval_labels = torch.tensor([int(y) for y in eval_labels])

    def _encode(self, tokenizer, texts: Sequence[str]) -> list[list[int]]:
        return tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]

    @property
    def num_train(self) -> int:
        return len(self.train_ids)

    def wrap(self, model: nn.Module) -> SequenceClassifier:
        return SequenceClassifier(model, self.num_labels, self.pooling)

    def _pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        return ids, mask

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        ids, mask = self._pad([self.train_ids[i] for i in indices.tolist()])
        return {"input_ids": ids, "attention_mask": mask, "labels": self.train_labels[indices]}

    def loss(self, module: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(module(batch["input_ids"], batch["attention_mask"]), batch["labels"])

    @torch.no_grad()
    def evaluate(self, module: nn.Module) -> dict[str, float]:
        was_training = module.training
        module.eval()
        correct, total_loss = 0, 0.0
        try:
            for start in progress(range(0, len(self.eval_ids), self.eval_batch_size), desc="eval accuracy"):
                ids, mask = self._pad(self.eval_ids[start : start + self.eval_batch_size])
                labels = self.eval_labels[start : start + ids.size(0)]
                logits = module(ids, mask)
                total_loss += float(F.cross_entropy(logits, labels, reduction="sum"))
                correct += int((logits.argmax(-1) == labels).sum())
        finally:
            module.train(was_training)
        n = len(self.eval_ids)
        return {"eval_loss": total_loss / n, "accuracy": correct / n}


def topic_classification(tokenizer, max_length: int = 32, train_examples: int | None = None, eval_examples: int | None = None) -> ClassificationTask:
    """The 12-class wiki-topics task (train and eval splits are disjoint by article)."""
    train, test = topic_task("train", train_examples), topic_task("eval", eval_examples)
    task = ClassificationTask(tokenizer, train.texts, train.labels, test.texts, test.labels, len(train.label_names), max_length)
    task.name = "wiki-topics"
    return task


@dataclass(frozen=True)
class TaskRequest:
    """What `finetune` knows when it builds a task from its record: each builder reads what it needs (a text task
    the tokenizer and sequence length, an image task the model's image size)."""

    tokenizer: Any = None
    seq_len: int = 64
    image_size: int | None = None
    train_examples: int | None = None
    eval_examples: int | None = None
    seed: int = 0


def wiki_topics(request: TaskRequest) -> ClassificationTask:
    """The `wiki-topics` record: `topic_classification` at the request's sequence length."""
    return topic_classification(request.tokenizer, request.seq_len, request.train_examples, request.eval_examples)


def wiki_lm(request: TaskRequest) -> LanguageModelingTask:
    """The `wiki-lm` record: next-token prediction on `seq_len`-token windows of the corpus."""
    return LanguageModelingTask.from_wiki(request.tokenizer, request.seq_len, request.train_examples, request.eval_examples)


def fashion_mnist_5to9_task(request: TaskRequest):
    """The `fashion-mnist-5to9` record (`training.image_tasks`)."""
    from rankwise.training.image_tasks import fashion_mnist_5to9

    return fashion_mnist_5to9(request.image_size or 28, request.train_examples, request.eval_examples, request.seed)
