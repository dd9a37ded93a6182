"""Stage 1 of TraDy: the a-priori layer ranking by reweighted gradient norm (RGN) on a proxy task.

Channel score RGN_c = ‖(dL/dW_i)[:, c]‖₂ / Θ_space,c (gradient norm per unit of memory). Layer score: Σ_c RGN_c
(the paper note's "sum of channel RGNs", the default) or, with `squared=True`, Prop. 3.1's
(1 / Θ_space,i) Σ_c ‖(dL/dW_i)[:, c]‖₂² with Θ_space,i the layer's whole cost. Scores are averaged over the
iterations of a short full-backprop fine-tuning of the backbone on a task that is *not* the target; the layers kept
are the top ones whose cumulative share of the total score reaches `keep` (0.97 in the paper).

    ranking = rank_layers(proxy_module, proxy_task, TrainConfig(steps=40, batch_size=64, lr=0.05))
    ranking.save("ranking.json")             # finetune --procedure trady --procedure-option ranking=ranking.json
    ranking.select(0.97)                     # the layer names TraDy samples channels from
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankwise.core.io import read_json, write_json_atomic
from rankwise.core.training import Procedure, TrainConfig, train
from rankwise.errors import CorruptFileError, InvalidInputError
from rankwise.recipes.trady.costs import LayerGeometry, find_layers, in_head, measure_geometry
from rankwise.recipes.trady.norms import batch_norms, freeze_statistics
from rankwise.recipes.trady.optimizer import sgd

RANKING_KIND = "trady-layer-ranking"


def channel_norms(grad_w: torch.Tensor) -> torch.Tensor:
    """‖dW[:, c]‖₂ per input channel, float64 [C], of a weight gradient [C', C, ...]."""
    g = grad_w.detach().double().transpose(0, 1)
    return g.reshape(g.size(0), -1).norm(dim=1)


def channel_rgn(norms: torch.Tensor, geometry: LayerGeometry) -> torch.Tensor:
    """RGN_c = ‖dW[:, c]‖ / (C^W_c + C^A_c), float64 [C]."""
    return norms.double() / geometry.channel_cost()


def layer_score(norms: torch.Tensor, geometry: LayerGeometry, squared: bool = False) -> float:
    """Σ_c RGN_c, or (1 / Θ_space,i) Σ_c ‖dW[:, c]‖² with `squared`."""
    if squared:
        return float(norms.double().square().sum() / geometry.full_cost())
    return float(channel_rgn(norms, geometry).sum())


@dataclass
class LayerRanking:
    """Layer scores (mean over iterations) and mean channel RGNs of a proxy fine-tuning, per layer name."""

    scores: dict[str, float]
    channel_rgn: dict[str, torch.Tensor] = field(repr=False)
    squared: bool = False
    steps: int = 0
    task: str = ""

    def order(self) -> list[str]:
        """Layer names by descending score (ties by name)."""
        return sorted(self.scores, key=lambda n: (-self.scores[n], n))

    def select(self, keep: float = 0.97) -> list[str]:
        """The top layers whose cumulative share of the total score first reaches `keep` (in (0, 1])."""
        if not 0.0 < keep <= 1.0:
            raise InvalidInputError(f"keep is a share of the total layer score in (0, 1], got {keep}")
        order = self.order()
        total = sum(self.scores[n] for n in order)
        if not total > 0:
            raise InvalidInputError(f"the ranking of {self.task or 'the proxy task'} has no positive layer score: "
                                    "its gradients were all zero; rank on a task the backbone is not already perfect on")
        kept, share = [], 0.0
        for n in order:
            kept.append(n)
            share += self.scores[n] / total
            if share >= keep - 1e-12:
                break
        return kept

    def to_json(self) -> dict[str, Any]:
        return {"kind": RANKING_KIND, "squared": self.squared, "steps": self.steps, "task": self.task,
                "scores": dict(self.scores), "channel_rgn": {n: v.tolist() for n, v in self.channel_rgn.items()}}

    def save(self, path: str | Path) -> None:
        write_json_atomic(Path(path), self.to_json())


def load_ranking(path: str | Path) -> LayerRanking:
    """A ranking `LayerRanking.save` wrote."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"ranking {path} is not a file: write one with rankwise.recipes.trady.rank_layers(...)"
                                ".save(path)")
    data = read_json(path)
    try:
        if data.get("kind") != RANKING_KIND:
            raise KeyError("kind")
        scores = {str(n): float(v) for n, v in data["scores"].items()}
        channels = {str(n): torch.tensor(v, dtype=torch.float64) for n, v in data.get("channel_rgn", {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CorruptFileError(f"{path} is not a TraDy layer ranking ({e!r}); write one with LayerRanking.save") from e
    if not scores or not all(math.isfinite(v) and v >= 0 for v in scores.values()):
        raise CorruptFileError(f"{path}: layer scores must be finite and non-negative, one per layer")
    return LayerRanking(scores, channels, bool(data.get("squared", False)), int(data.get("steps", 0)), str(data.get("task", "")))


class _FrozenNorms(Procedure):
    """Keeps batch-norm statistics frozen during the proxy fine-tuning, as during TraDy's own training."""

    name = "trady-rank"

    def __init__(self, module: nn.Module) -> None:
        self.norms = batch_norms(module)

    def before_micro_batch(self, step: int, micro: int) -> None:
        freeze_statistics(self.norms)


def rank_layers(module: nn.Module, task: Any, config: TrainConfig, head: str = "head", squared: bool = False,
                layers: Sequence[str] | None = None, optimizer: Any = None) -> LayerRanking:
    """Fine-tune `module` (the proxy task's wrapped backbone; it is trained in place) on `task` with full backprop on
    every eligible conv/linear weight and the head (everything else frozen, batch-norm statistics frozen, SGD without
    momentum unless `optimizer` is given) and score its layers by RGN at every step (`config.grad_accum` must be 1:
    a score is per iteration). Returns the ranking of `layers` (default: every eligible layer outside `head`)."""
    if config.grad_accum != 1:
        raise InvalidInputError("rank_layers scores each iteration's gradient: use grad_accum=1")
    names = list(layers) if layers is not None else find_layers(module, head)
    geometries = measure_geometry(module, names, lambda: task.loss(module, task.batch(torch.arange(min(2, task.num_train)))),
                                  used_by_loss=True)
    if not geometries:
        raise InvalidInputError(f"{type(module).__name__} has no conv or linear layer outside {head!r} that the task's "
                                "loss depends on: nothing to rank")
    modules = dict(module.named_modules())
    flags = {p: p.requires_grad for p in module.parameters()}
    module.requires_grad_(False)
    for n, m in module.named_modules():
        if in_head(n, head):
            m.requires_grad_(True)
    sums = {n: torch.zeros(g.in_channels, dtype=torch.float64) for n, g in geometries.items()}
    layer_sums = dict.fromkeys(geometries, 0.0)
    counts = dict.fromkeys(geometries, 0)
    hooks = []
    for n, g in geometries.items():
        weight = modules[n].weight
        weight.requires_grad_(True)

        def record(p: torch.Tensor, n: str = n, g: LayerGeometry = g) -> None:
            norms = channel_norms(p.grad)
            sums[n] += channel_rgn(norms, g)
            layer_sums[n] += layer_score(norms, g, squared)
            counts[n] += 1
        hooks.append(weight.register_post_accumulate_grad_hook(record))
    try:
        train(module, task, config, procedure=_FrozenNorms(module), optimizer=optimizer or sgd())
    finally:
        for h in hooks:
            h.remove()
        for p, flag in flags.items():
            p.requires_grad_(flag)
    scores = {n: layer_sums[n] / max(1, counts[n]) for n in geometries}
    channels = {n: sums[n] / max(1, counts[n]) for n in geometries}
    return LayerRanking(scores, channels, squared, config.steps, getattr(task, "name", ""))


def spearman(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Spearman's rank correlation of two score maps over their common keys (average ranks for ties)."""
    from scipy.stats import spearmanr

    keys = sorted(set(a) & set(b))
    if len(keys) < 3:
        raise InvalidInputError(f"a rank correlation needs at least 3 common layers, got {len(keys)}")
    return float(spearmanr([a[k] for k in keys], [b[k] for k in keys]).statistic)
