"""Reproduction `wasi`: MiniLM (all-MiniLM-L6-v2, the real pretrained transformer: the analogue of the paper's
TinyLlama run) fine-tuned on the 12-class wiki-topics task with WASI on the MLP linears of its last layer
(intermediate.dense 384 -> 1536, output.dense 1536 -> 384), against vanilla fine-tuning of the same layers, LoRA,
WSI only, ASI only, SVD truncation + LoRA (for SVD-LLM) and a frozen-backbone control (`protocol`).

Only the last layer's MLP is trained (plus a new head), so everything below its first linear -- the embeddings,
layers 1-5 and the last layer's attention -- is a fixed function of the text: its output (the MLP's input,
[N, T, 384]) is computed once per example and cached (`training.prefix_cache.module_inputs`), and a training step
runs the MLP, its residual LayerNorm, mean pooling and the head. Texts are padded to `max_length` tokens so every
batch has the same [B, T, D] shape (ASI warm-starts each mode's factor). The training and validation articles are
drawn from the wiki train split by `seed`; the test articles are the eval split's.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from rankwise.core.report import Report
from rankwise.data import topic_task
from rankwise.models.minilm import mean_pool
from rankwise.repro.setup import BySize, experiment_model
from rankwise.repro.wasi.protocol import Settings, declare, run_protocol
from rankwise.training.cached_classification import CachedClassificationTask, CachedInputs
from rankwise.training.prefix_cache import batches, eval_mode, module_inputs

TARGETS = ("intermediate.dense", "output.dense")


@dataclass(frozen=True)
class TextSettings:
    train: int
    val: int
    test: int
    max_length: int
    protocol: Settings


SIZES = BySize(
    smoke=TextSettings(train=48, val=24, test=24, max_length=8,
                       protocol=Settings(steps=2, batch=8, lr_grid=(0.1,), seeds=1, max_extend=0)),
    full=TextSettings(train=2000, val=400, test=800, max_length=32,
                      protocol=Settings(steps=72, batch=32, lr_grid=(0.3, 1.0, 3.0), seeds=5)),
)


class MlpTail(nn.Module):
    """The last BERT layer's MLP on cached inputs h [B, T, 384] (mask [B, T]): intermediate (dense + GELU), output
    (dense, dropout, LayerNorm(h + .)), mean pooling, a new linear `head` -> logits [B, C]."""

    def __init__(self, layer: nn.Module, num_labels: int) -> None:
        super().__init__()
        self.intermediate = copy.deepcopy(layer.intermediate)
        self.output = copy.deepcopy(layer.output)
        self.head = nn.Linear(self.output.dense.out_features, num_labels)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(mean_pool(self.output(self.intermediate(h), h), mask))


@torch.no_grad()
def cache_mlp_inputs(model: nn.Module, tokenizer, texts: list[str], labels: list[int], max_length: int) -> CachedInputs:
    """The input of the last layer's intermediate.dense for each text (padded to `max_length`), with its mask."""
    enc = tokenizer(texts, truncation=True, max_length=max_length, padding="max_length", return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    target = model.encoder.layer[-1].intermediate
    with eval_mode(model):
        hs = [module_inputs(target, partial(model, input_ids=ids[p], attention_mask=mask[p])).first()
              for p in batches(len(texts), 64)]
    return CachedInputs(torch.cat(hs), mask.float(), torch.tensor(labels))


def run(size: str = "smoke", seed: int = 0) -> Report:
    t = SIZES[size]
    s = t.protocol
    report = Report("wasi", "WASI on MiniLM's last MLP (wiki-topics, cached prefix) vs vanilla, LoRA, WSI, ASI and "
                    "SVD truncation + LoRA", size, seed)
    testbed = f"minilm-l6 last-layer MLP, wiki-topics {t.train}/{t.val}/{t.test}, {t.max_length} tokens, batch {s.batch}"
    declare(report, s.eps_low, s.eps_high, testbed)
    model, tokenizer = experiment_model("minilm-l6", size, seed)
    pool = topic_task("train")
    picked = random.Random(seed).sample(range(len(pool.texts)), t.train + t.val)
    held = topic_task("eval", t.test)
    cache = lambda idx: cache_mlp_inputs(model, tokenizer, [pool.texts[i] for i in idx],  # noqa: E731
                                         [pool.labels[i] for i in idx], t.max_length)
    train_set, val_set = cache(picked[: t.train]), cache(picked[t.train :])
    test_set = cache_mlp_inputs(model, tokenizer, held.texts, held.labels, t.max_length)
    base = MlpTail(model.encoder.layer[-1], len(pool.label_names)).eval()  # dropout off: the function is deterministic
    task = CachedClassificationTask(train_set, val_set, "wiki-topics (cached MLP inputs)")
    test = CachedClassificationTask(train_set, test_set, "wiki-topics test")
    run_protocol(report, s, base, TARGETS, task, test, seed)
    _notes(report, t)
    return report.finish()


def _notes(report: Report, t: TextSettings) -> None:
    s = t.protocol
    report.note(f"Testbed: all-MiniLM-L6-v2; only its last layer's MLP linears (intermediate.dense, output.dense) and "
                f"a new 12-way head are trained, on inputs cached below them; {t.train} training / {t.val} validation "
                f"articles from the wiki train split (drawn by the seed), {t.test} test articles from the eval split, "
                f"{t.max_length} tokens each.")
    report.note(f"Training: the loop with SGD (momentum 0, weight decay {s.weight_decay}, clip {s.max_grad_norm}, the "
                f"paper's), cosine decay, {s.steps} steps of batch {s.batch}; every arm's lr chosen on validation "
                f"accuracy from {list(s.lr_grid)} (extended off an edge) on the first seed, then {s.seeds} seeds "
                "(head initialisation and batch order). LoRA rank "
                f"{s.lora_rank} (alpha {2 * s.lora_rank}); SVD + LoRA truncates each target at WASI's rank K "
                f"(eps {s.eps_high}) then adds the same LoRA. WASI uses one threshold for weights and activations "
                "(the card's simplest faithful reading; the knapsack search is `budget_mb`).")
    report.note("Memory: one training step on the loop's first batch, the target layers only (the paper's convention); "
                "measured = bytes autograd saves during each target's forward (parameters excluded) + the bytes of the "
                "parameters and buffers the layer holds (the paper variant holds its dense master W besides L, R).")


__all__ = ["run", "SIZES", "MlpTail", "cache_mlp_inputs"]
