"""PLoP (Hayou, Ghosh, Yu, ICLR 2026): choose which module *types* get LoRA from normalised feature norms (NFN).

For a linear module W [out, in] and its task inputs z (rows of Z [N, in]):
    NFN(W, Z) = mean_rows ||W_bar z_hat|| / mean_rows ||W_bar r_hat||
with W_bar = W / rms(W), z_hat = z / ||z|| and r_hat a row-normalised Gaussian draw of the same shape: 1 means "no
more aligned with W than a random direction", > 1 aligned, < 1 anti-aligned (the official `calculate_nfn_scores`;
the 1/sqrt(in) and rms factors cancel in the ratio, they are kept so the two parts are interpretable). Bias is
excluded (W z, not the layer output). Padding rows are masked out (the official code averages them in; the card
flags this as a pitfall). A module's NFN is the mean of its per-batch NFNs; a type's is the mean of its per-layer
NFNs (the official `individual=True`). PLoP adapts the k types with the *lowest* NFN (least aligned with the task,
most to gain); the k highest is the deliberately bad control PLoP^-1.

`target_modules(...)` turns chosen types into a list that both `rankwise.adapters` and `peft.LoraConfig` accept: the
last name component where it identifies the type (`q_proj`), otherwise the exact module names (BERT's FFN
`output.dense` is a suffix of `attention.output.dense`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.adapters.config import layer_index, module_type
from rankwise.core.calibration import module_input_rows, run_with_input_hooks
from rankwise.errors import InvalidInputError


@dataclass
class NFNScores:
    """NFN per module (`per_module`, mean over batches; `per_batch` keeps each batch's value) and per module type
    (`per_type`: mean over layers, keyed by the type pattern, e.g. `model.layers.*.self_attn.q_proj`)."""

    per_module: dict[str, float]
    per_batch: dict[str, list[float]]
    per_type: dict[str, float]
    type_members: dict[str, list[str]] = field(default_factory=dict)

    def ranking(self) -> list[str]:
        """Type patterns from lowest to highest NFN (ties by name, so the order is deterministic)."""
        return sorted(self.per_type, key=lambda t: (self.per_type[t], t))

    def lowest(self, k: int) -> list[str]:
        _check_k(k, len(self.per_type))
        return self.ranking()[:k]

    def highest(self, k: int) -> list[str]:
        _check_k(k, len(self.per_type))
        return self.ranking()[::-1][:k]

    def subset(self, batches: Sequence[int]) -> NFNScores:
        """Scores recomputed from only some batches (for stability checks), without another forward pass."""
        per_module = {n: sum(v[i] for i in batches) / len(batches) for n, v in self.per_batch.items()}
        return _aggregate(per_module, {n: [v[i] for i in batches] for n, v in self.per_batch.items()}, self.type_members)

    def for_layers(self, layers: Iterable[int]) -> NFNScores:
        """Scores of only the modules in `layers` (e.g. the adaptable top layers), type means over those layers."""
        wanted = set(layers)
        members = {t: [n for n in ms if layer_index(n) in wanted] for t, ms in self.type_members.items()}
        members = {t: ms for t, ms in members.items() if ms}
        if not members:
            raise InvalidInputError(f"no scored module lies in layers {sorted(wanted)}")
        keep = [n for ms in members.values() for n in ms]
        return _aggregate({n: self.per_module[n] for n in keep}, {n: self.per_batch[n] for n in keep}, members)


def _check_k(k: int, n: int) -> None:
    if not 1 <= k <= n:
        raise InvalidInputError(f"k must be between 1 and the number of module types ({n}), got {k}")


def nfn_parts(
    weight: torch.Tensor, z: torch.Tensor, generator: torch.Generator, wz: torch.Tensor | None = None, random_rows: int | None = None
) -> tuple[float, float]:
    """(actual, random) mean normalised feature norms of W [out, in] on input rows z [N, in] (zero rows ignored).

    `wz` [N, out] = z W^T if already computed (the layer's output without bias), saving a matmul. `random_rows`
    caps the Gaussian draws: E||W r_hat||^2 = ||W||_F^2 / in for every draw, so a few hundred rows estimate the
    random baseline to well under 1% at these widths, at a fraction of a forward pass's cost.
    """
    z = z.detach().float()
    keep = z.norm(dim=1) > 0
    if not keep.any():
        raise InvalidInputError("NFN needs at least one non-zero input row")
    w = weight.detach().float()
    rms = w.pow(2).mean().sqrt().clamp_min(1e-30)
    scale = z.size(1) ** 0.5
    wz = F.linear(z, w) if wz is None else wz.detach().float()
    actual = (wz[keep].norm(dim=1) / z[keep].norm(dim=1) / rms / scale).mean()
    n = int(keep.sum()) if random_rows is None else min(int(keep.sum()), random_rows)
    r_hat = F.normalize(torch.randn((n, z.size(1)), generator=generator), dim=1)
    random = (F.linear(r_hat, w).norm(dim=1) / rms / scale).mean()
    return float(actual), float(random)


def nfn(weight: torch.Tensor, z: torch.Tensor, seed: int = 0) -> float:
    """NFN of W [out, in] on input rows z [N, in], with the random baseline drawn from `seed`."""
    actual, random = nfn_parts(weight, z, torch.Generator().manual_seed(seed))
    return actual / random


def linear_modules(model: nn.Module, layers: Iterable[int] | None = None) -> list[str]:
    """The `nn.Linear` modules PLoP scores: those inside the layer stack (so no embeddings, norms, heads)."""
    wanted = None if layers is None else set(layers)
    names = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and "norm" not in name.lower():
            index = layer_index(name)
            if index is not None and (wanted is None or index in wanted):
                names.append(name)
    if not names:
        raise InvalidInputError("no nn.Linear module inside a layer stack (model.layers.<i>, encoder.layer.<i>, ...) to score")
    return names


def nfn_scores(
    model: nn.Module,
    batches: Sequence[torch.Tensor | dict[str, torch.Tensor]],
    seed: int = 0,
    layers: Iterable[int] | None = None,
    modules: Sequence[str] | None = None,
    random_rows: int | None = 256,
    desc: str = "NFN scores",
) -> NFNScores:
    """NFN scores with the random baseline drawn from `seed`; see `nfn_scores_for_seeds`."""
    return nfn_scores_for_seeds(model, batches, [seed], layers, modules, random_rows, desc)[seed]


@torch.no_grad()
def nfn_scores_for_seeds(
    model: nn.Module,
    batches: Sequence[torch.Tensor | dict[str, torch.Tensor]],
    seeds: Sequence[int],
    layers: Iterable[int] | None = None,
    modules: Sequence[str] | None = None,
    random_rows: int | None = 256,
    desc: str = "NFN scores",
) -> dict[int, NFNScores]:
    """NFN of every linear module in the layer stack (or `modules`), over `batches` of input ids [B, T] or dicts with
    `input_ids` and `attention_mask` (padding rows are excluded). One forward pass per batch (the backbone only, no
    LM head); hooks are removed after. `random_rows`: see `nfn_parts` (None: one Gaussian row per input row, as the
    official code).

    The random baseline of module m in batch b is drawn from a generator seeded by (seed, m, b), so the result does
    not depend on module order or on which other batches are scored. Several `seeds` share one forward pass (the
    actual part is the same; only the random baselines differ), for seed-stability checks.
    """
    seeds = list(dict.fromkeys(seeds))
    if not seeds:
        raise InvalidInputError("pass at least one seed")
    if not batches:
        raise InvalidInputError("NFN scoring needs at least one batch of task inputs")
    names = list(modules) if modules is not None else linear_modules(model, layers)
    table = dict(model.named_modules())
    missing = [n for n in names if not isinstance(table.get(n), nn.Linear)]
    if missing:
        raise InvalidInputError(f"not linear modules of this model: {missing[:3]}")
    per_batch: dict[int, dict[str, list[float]]] = {sd: {n: [] for n in names} for sd in seeds}
    masks = [batch.get("attention_mask") if isinstance(batch, dict) else None for batch in batches]

    def score(name: str, module: nn.Linear, x: torch.Tensor, output: torch.Tensor, index: int) -> None:
        z, wz = module_input_rows(x), module_input_rows(output)
        if module.bias is not None:
            wz = wz - module.bias  # NFN is about W z: the bias is not part of the feature
        if masks[index] is not None:
            rows = masks[index].reshape(-1).bool()
            z, wz = z[rows], wz[rows]
        for sd in seeds:
            gen = torch.Generator().manual_seed((sd * 1_000_003 + zlib.crc32(name.encode()) * 131 + index) % 2**63)
            actual, random = nfn_parts(module.weight, z, gen, wz=wz, random_rows=random_rows)
            per_batch[sd][name].append(actual / random)

    backbone = getattr(model, "base_model", model)  # transformers: skip the LM head, which PLoP does not score

    def forward(batch) -> None:
        ids, mask = (batch["input_ids"], batch.get("attention_mask")) if isinstance(batch, dict) else (batch, None)
        backbone(input_ids=ids, attention_mask=mask) if mask is not None else backbone(input_ids=ids)

    run_with_input_hooks(model, names, batches, score, forward=forward, desc=desc)
    members: dict[str, list[str]] = {}
    for n in names:
        members.setdefault(module_type(n), []).append(n)
    out = {}
    for sd, values in per_batch.items():
        out[sd] = _aggregate({n: sum(v) / len(v) for n, v in values.items()}, values, members)
    return out


def _aggregate(per_module: dict[str, float], per_batch: dict[str, list[float]], members: dict[str, list[str]]) -> NFNScores:
    per_type = {t: sum(per_module[n] for n in ms) / len(ms) for t, ms in members.items()}  # mean of per-layer ratios
    return NFNScores(per_module, per_batch, per_type, members)


def short_name(type_pattern: str, all_types: Iterable[str]) -> str | None:
    """The shortest name suffix that selects exactly this type's modules by PEFT's suffix rule, or None."""
    parts = type_pattern.split(".")
    others = [t for t in all_types if t != type_pattern]
    for k in range(1, len(parts) + 1):
        suffix = ".".join(parts[-k:])
        if "*" in suffix:
            return None
        if not any(o == suffix or o.endswith("." + suffix) for o in others):
            return suffix
    return None


def target_modules(scores: NFNScores, types: Sequence[str]) -> list[str]:
    """A `target_modules` list for the chosen type patterns that our adapters and `peft.LoraConfig` both accept."""
    out: list[str] = []
    for t in types:
        if t not in scores.type_members:
            raise InvalidInputError(f"unknown module type {t!r}; scored types are {sorted(scores.type_members)}")
        short = short_name(t, scores.type_members)
        out.extend([short] if short else scores.type_members[t])
    return out


def plop_targets(scores: NFNScores, k: int = 3, inverse: bool = False) -> list[str]:
    """PLoP's placement: the k lowest-NFN types (`inverse=True`: the k highest, the PLoP^-1 control)."""
    return target_modules(scores, scores.highest(k) if inverse else scores.lowest(k))


def type_label(type_pattern: str) -> str:
    """A short display name for a type pattern (`model.layers.*.self_attn.q_proj` -> `self_attn.q_proj`)."""
    return type_pattern.split("*.", 1)[-1]


def kendall_tau(a: Sequence[str], b: Sequence[str]) -> float:
    """Kendall rank correlation of two orderings of the same items (1: identical, -1: reversed)."""
    if sorted(a) != sorted(b) or len(a) < 2:
        raise InvalidInputError("kendall_tau needs two orderings of the same (at least 2) items")
    pos = {x: i for i, x in enumerate(b)}
    concordant = discordant = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            if pos[a[i]] < pos[a[j]]:
                concordant += 1
            else:
                discordant += 1
    return (concordant - discordant) / (concordant + discordant)


def lora_parameters_per_rank(model: nn.Module, targets: list[str] | str, layers: list[int] | None = None) -> int:
    """Trainable LoRA parameters per unit of rank, sum of (in + out) over the modules `targets` select."""
    from rankwise.adapters.config import AdapterConfig, find_targets

    table = dict(model.named_modules())
    chosen = find_targets(model, AdapterConfig(r=1, target_modules=targets, layers_to_transform=layers))
    return sum(table[n].in_features + table[n].out_features for n in chosen)


def rank_for_budget(model: nn.Module, targets: list[str] | str, budget: int, layers: list[int] | None = None) -> int:
    """The LoRA rank whose trainable-parameter count on `targets` is closest to `budget` (at least 1)."""
    per_rank = lora_parameters_per_rank(model, targets, layers)
    return max(1, round(budget / per_rank))
