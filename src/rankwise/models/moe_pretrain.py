"""The small MoE byte-level LM (rankwise.models.moe.TinyMoELM) pretrained here on the wiki corpus, cached.

No fp32 MoE weights ship offline (SmolLM2's sit on a 4-bit grid), so MoE compression methods (CodeQuant) start
from this one, pretrained once, deterministically, and cached:

    moe = pretrained_moe("tiny-moe-wiki")     # ~3.5 min at 1 thread the first time, then loaded from the cache
    moe.module(input_ids)                     # int64 [B, T] bytes -> logits [B, T, 256]
    moe.held_out_loss, moe.unigram_loss       # nats per byte on articles("eval") vs a unigram byte model
    moe.expert_share                          # [layer][expert]: share of the held-out routing assignments

Recipe "tiny-moe-wiki": the card's toy MoE (d 128, 2 layers, 4 heads, 8 SwiGLU experts of 256, top-2) on
non-overlapping 256-byte windows of `rankwise.data.articles("train")` (rankwise.models.moe.byte_windows: each
article's UTF-8 bytes, then a 0 byte), 540 AdamW steps of 16 windows (2.2M bytes, about half an epoch) at lr
3e-3 with warmup + cosine, next-byte cross-entropy + 0.01 x the Switch load-balancing loss, through the project's
one loop (`core.training.train`: fixed batch order from the seed, clipping at 1). Held-out: the first 512 windows
of articles("eval"). The "smoke" recipe (a 1-layer d-32 model, 40 steps, a few seconds) is for tests.

What this stand-in changes from a real MoE LLM (Qwen3-30B-A3B, Mixtral): 1.8M parameters instead of billions, a
256-byte vocabulary instead of ~150k BPE tokens, minutes of pretraining on 4 MB of text; it is far from fluent, but
its weights are fp32 and continuous, its router is trained, and its experts all get traffic.

Cached (`core.cache`, namespace "moe-lm") under a key of the whole recipe, a SHA-256 of the train and held-out
windows and CACHE_VERSION; a corrupt entry (or one of another layout) pretrains again. The same recipe on the same
data gives the same weights on one machine; on another CPU rounding may differ, and the cache keeps the first run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from rankwise.core.cache import cache_key, cached_entry, store_entry
from rankwise.core.io import load_tensors, read_json, save_tensors_atomic, write_json_atomic
from rankwise.core.progress import say
from rankwise.core.training import TrainConfig, train
from rankwise.errors import CorruptFileError, UnknownNameError
from rankwise.models.moe import MoEConfig, TinyMoELM, byte_windows

CACHE_NAMESPACE = "moe-lm"
CACHE_VERSION = 1


@dataclass(frozen=True)
class MoERecipe:
    """Everything a pretraining depends on besides the corpus text (which the cache key hashes)."""

    name: str
    model: MoEConfig
    steps: int
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    aux_coef: float = 0.01  # weight of the load-balancing loss (Switch / Mixtral's router_aux_loss_coef)
    max_train_windows: int | None = None  # None: every window of the train articles
    eval_windows: int = 512  # the first windows of the eval articles that score the model
    eval_batch_size: int = 32
    seed: int = 0

    def build(self) -> TinyMoELM:
        """A freshly initialised model, seeded by `seed` (the caller's global RNG is left as it was)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return TinyMoELM(self.model)


RECIPES: dict[str, MoERecipe] = {
    "tiny-moe-wiki": MoERecipe("tiny-moe-wiki", MoEConfig(), steps=540),
    "smoke": MoERecipe("smoke", MoEConfig(hidden_size=32, num_layers=1, num_heads=2, num_experts=4, expert_hidden_size=64,
                                          max_seq_len=64),
                       steps=40, batch_size=8, seq_len=64, max_train_windows=400, eval_windows=64, warmup_ratio=0.1),
}


@dataclass(frozen=True)
class PretrainedMoE:
    """A pretrained TinyMoELM (in eval mode) with its recipe and what its pretraining measured: the held-out
    next-byte loss (nats per byte) and perplexity, a unigram byte model's loss on the same bytes (the floor to
    beat), the wall time of the pretraining (when it was first run), and per layer the share of the held-out
    routing assignments each expert received (each row sums to 1)."""

    name: str
    module: TinyMoELM
    recipe: MoERecipe
    held_out_loss: float
    held_out_perplexity: float
    unigram_loss: float
    pretrain_seconds: float
    expert_share: tuple[tuple[float, ...], ...]
    from_cache: bool = False
    history: list[dict[str, float]] = field(default_factory=list, repr=False)  # per-step losses (CE + aux term)


class _ByteLMTask:
    """Next-byte prediction on windows [W, T] for the one loop; loss = CE + aux_coef * the router balance loss."""

    metric, higher_is_better = "eval_loss", False

    def __init__(self, name: str, train_windows: torch.Tensor, eval_windows: torch.Tensor, aux_coef: float,
                 eval_batch_size: int) -> None:
        self.name, self.train_windows, self.eval_windows = name, train_windows, eval_windows
        self.aux_coef, self.eval_batch_size = aux_coef, eval_batch_size
        self.last_share: tuple[tuple[float, ...], ...] = ()  # the expert shares of the last evaluation

    @property
    def num_train(self) -> int:
        return self.train_windows.size(0)

    def batch(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"input_ids": self.train_windows[indices]}

    def loss(self, module: TinyMoELM, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        logits = module(ids)
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
        return ce + self.aux_coef * module.aux_loss()

    def evaluate(self, module: TinyMoELM) -> dict[str, float]:
        loss, self.last_share = held_out(module, self.eval_windows, self.eval_batch_size)
        return {"eval_loss": loss, "eval_perplexity": math.exp(loss)}


@torch.no_grad()
def held_out(module: TinyMoELM, windows: torch.Tensor, batch_size: int = 32) -> tuple[float, tuple[tuple[float, ...], ...]]:
    """(mean next-byte NLL in nats over windows int64 [W, T] (each predicts T - 1 bytes; summed in float64),
    per layer the share of routing assignments per expert)."""
    was_training = module.training
    module.eval()
    total, count = 0.0, 0
    layers = module.moe_layers()
    assignments = torch.zeros(len(layers), module.moe_config.num_experts, dtype=torch.float64)
    try:
        for start in range(0, windows.size(0), batch_size):
            ids = windows[start : start + batch_size]
            logits = module(ids)[:, :-1]
            total += float(F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="sum").double())
            count += ids[:, 1:].numel()
            assignments += torch.stack([moe.last_counts for moe in layers]).double()
    finally:
        module.train(was_training)
    share = assignments / assignments.sum(dim=1, keepdim=True)
    return total / count, tuple(tuple(float(s) for s in row) for row in share)


def unigram_loss(train_windows: torch.Tensor, eval_windows: torch.Tensor, vocab_size: int = 256) -> float:
    """Nats per byte of a unigram byte model (train byte frequencies, add-one smoothed) on the bytes that
    `held_out` scores (every eval window's bytes after its first)."""
    counts = torch.bincount(train_windows.reshape(-1), minlength=vocab_size).double() + 1.0
    log_p = (counts / counts.sum()).log()
    return float(-log_p[eval_windows[:, 1:].reshape(-1)].mean())


def pretrained_moe(name: str | MoERecipe = "tiny-moe-wiki", use_cache: bool = True) -> PretrainedMoE:
    """The TinyMoELM of recipe `name` (a key of RECIPES, or a MoERecipe) pretrained on the wiki corpus's train
    articles and scored on its eval articles: trained on the first call, loaded from the cache afterwards."""
    recipe = _recipe(name)
    from rankwise.data import articles  # the corpus loads only when a pretraining is asked for

    train_windows = byte_windows([a.text for a in articles("train")], recipe.seq_len, recipe.max_train_windows)
    eval_windows = byte_windows([a.text for a in articles("eval")], recipe.seq_len, recipe.eval_windows)
    baseline = unigram_loss(train_windows, eval_windows, recipe.model.vocab_size)
    key = cache_key(recipe=dataclasses.asdict(recipe), data=_fingerprint(train_windows, eval_windows), version=CACHE_VERSION)
    entry = cached_entry(CACHE_NAMESPACE, key) if use_cache else None
    if entry is not None:
        try:
            return _load(entry, recipe)
        except (CorruptFileError, KeyError, RuntimeError, TypeError, ValueError):
            pass  # another version's layout (or a state dict that no longer fits): pretrain again
    say(f"pretraining {recipe.name} on {train_windows.size(0)} windows of {recipe.seq_len} bytes ({recipe.steps} steps; "
        "cached afterwards)")
    module = recipe.build()
    task = _ByteLMTask(f"pretrain-{recipe.name}", train_windows, eval_windows, recipe.aux_coef, recipe.eval_batch_size)
    config = TrainConfig(steps=recipe.steps, batch_size=recipe.batch_size, lr=recipe.lr, weight_decay=recipe.weight_decay,
                         warmup_ratio=recipe.warmup_ratio, seed=recipe.seed)
    t0 = time.perf_counter()
    result = train(module, task, config)
    seconds = time.perf_counter() - t0
    module.eval()
    loss, share = float(result.final["eval_loss"]), task.last_share  # the loop's final evaluation of the trained model
    meta = {"recipe": dataclasses.asdict(recipe), "held_out_loss": loss, "unigram_loss": baseline,
            "pretrain_seconds": seconds, "expert_share": share, "history": result.history}
    if use_cache:
        store_entry(CACHE_NAMESPACE, key, lambda tmp: _save(tmp, module, meta))
    return _result(module, recipe, meta, from_cache=False)


def _recipe(name: str | MoERecipe) -> MoERecipe:
    if isinstance(name, MoERecipe):
        return name
    if name not in RECIPES:
        raise UnknownNameError(f"unknown pretrained MoE {name!r}; the recipes are {list(RECIPES)}")
    return RECIPES[name]


def _fingerprint(*tensors: torch.Tensor) -> str:
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(str((t.dtype, tuple(t.shape))).encode())
        digest.update(t.to(torch.uint8).contiguous().numpy().tobytes())  # bytes: the values are 0..255
    return digest.hexdigest()


def _save(folder: Path, module: TinyMoELM, meta: dict[str, Any]) -> None:
    save_tensors_atomic(folder / "weights.safetensors", module.state_dict())
    write_json_atomic(folder / "moe.json", meta)


def _load(folder: Path, recipe: MoERecipe) -> PretrainedMoE:
    meta = read_json(folder / "moe.json")
    if json.loads(json.dumps(dataclasses.asdict(recipe))) != meta["recipe"]:
        raise KeyError("recipe")  # a key collision or a hand-edited entry: pretrain again
    module = recipe.build()
    module.load_state_dict(load_tensors(folder / "weights.safetensors"), strict=True)
    return _result(module.eval(), recipe, meta, from_cache=True)


def _result(module: TinyMoELM, recipe: MoERecipe, meta: dict[str, Any], from_cache: bool) -> PretrainedMoE:
    loss = float(meta["held_out_loss"])
    share = tuple(tuple(float(s) for s in row) for row in meta["expert_share"])
    if len(share) != recipe.model.num_layers or any(len(row) != recipe.model.num_experts for row in share):
        raise CorruptFileError(f"the expert_share of cached {recipe.name} does not fit its model")
    return PretrainedMoE(recipe.name, module, recipe, loss, math.exp(loss), float(meta["unigram_loss"]),
                         float(meta["pretrain_seconds"]), share, from_cache, list(meta.get("history", [])))
