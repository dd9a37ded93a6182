"""One seed of the reproduction: theta_0 pretrained on the proxy label, then FFT, LoRA, task addition of the six
race-group vectors, the scaled-FFT-vector ablation, and single-group injection into FFT, all scored on the seed's
validation (selection) and test (claims) splits. Learning rates come in chosen (tuned at the first seed by
main.py); lambda is selected on this seed's validation split, as the method prescribes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from rankwise.core.arms import Selection, select_with_extension
from rankwise.recipes.task_arithmetic import (FairnessMetrics, TaskVector, constrained_score, inject, lora_task_vector,
                                              scale_sum, subgroup_task_vectors, task_vector)
from rankwise.recipes.task_arithmetic.vectors import as_state
from rankwise.repro.task_arithmetic_fairness.arms import (Part, Protocol, Split, full_finetune, fit, lora_finetune, predict,
                                                          score)


@dataclass
class Knobs:
    """What a seed run needs from the settings (a view of main.Settings)."""

    protocol: Protocol
    lora_rank: int
    lam_grid: tuple[float, ...]
    lam_step: float
    lam_extend: int
    inject_grid: tuple[float, ...]
    margin: float  # accuracy margin (fraction) below FFT's validation accuracy that lambda selection accepts


@dataclass
class SeedResult:
    seed: int
    val: dict[str, FairnessMetrics] = field(default_factory=dict)
    test: dict[str, FairnessMetrics] = field(default_factory=dict)
    predictions: dict[str, torch.Tensor] = field(default_factory=dict)  # test predictions per arm
    lam: dict[str, Selection] = field(default_factory=dict)  # per lambda-selected arm
    seen: dict[str, int] = field(default_factory=dict)
    sweep_test: dict[float, FairnessMetrics] = field(default_factory=dict)  # task addition on the base lambda grid
    norms: list[float] = field(default_factory=list)  # ||tau_g|| per group
    inject_dpd: list[list[float]] = field(default_factory=list)  # [group][inject lambda], test DPD
    random_dpd: list[list[float]] = field(default_factory=list)  # the same for norm-matched random directions
    worst: int = -1
    worst_curve: list[FairnessMetrics] = field(default_factory=list)
    invariants: dict[str, float] = field(default_factory=dict)
    proxy_accuracy: float = float("nan")
    lora_params: int = 0
    test_part: Part | None = None


def step_neighbour(step: float) -> Callable[[float, bool], float]:
    return lambda value, up: round(value + (step if up else -step), 10)


def select_lambda(module, base_state, vectors: list[TaskVector], split: Split, floor: float, k: Knobs,
                  ) -> tuple[Selection, dict[float, FairnessMetrics]]:
    """lambda on the validation split: the fairest point at or above `floor` (sweep.constrained_score), the grid
    extended by `lam_step` off an edge."""
    seen: dict[float, FairnessMetrics] = {}

    def val_score(lam: float) -> float:
        seen[lam] = score(module, scale_sum(base_state, vectors, lam), split.val, split.num_groups)
        return constrained_score(seen[lam].accuracy, seen[lam].gap, floor)

    sel = select_with_extension(k.lam_grid, val_score, True, "lambda", k.lam_extend, step_neighbour(k.lam_step))
    return sel, seen


def subgroup_vectors(base, split: Split, lr: float, k: Knobs, seed: int) -> tuple[list[TaskVector], int]:
    seen, calls = [0], [0]

    def finetune(model, rows):
        calls[0] += 1  # groups are trained in order 0..G-1: a batch-order seed of its own for each
        seen[0] += fit(model, split.train.x[rows], split.train.y[rows], lr, k.protocol, seed + 1000 * calls[0],
                       split.val)

    vectors = subgroup_task_vectors(base, split.train.g, finetune, num_groups=split.num_groups)
    return [vectors[g] for g in range(split.num_groups)], seen[0]


def random_like(vector: TaskVector, seed: int) -> TaskVector:
    """A Gaussian direction with the same norm per tensor as `vector` (the injection's negative control)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, d in vector.deltas.items():
        r = torch.randn(d.shape, generator=gen, dtype=torch.float64)
        out[name] = r * (d.norm() / r.norm().clamp_min(1e-300))
    return TaskVector(out)


def slope(xs, ys) -> float:
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


def run_seed(base, proxy_accuracy: float, split: Split, lrs: dict[str, float], k: Knobs, seed: int,
             other_names: tuple[str, ...] = ("Other",)) -> SeedResult:
    """Every arm of one seed at the given learning rates ("fft", "lora", "ta")."""
    r = SeedResult(seed, proxy_accuracy=proxy_accuracy, test_part=split.test)
    G = split.num_groups
    theta0 = as_state(base)
    fft, r.seen["FFT"] = full_finetune(base, split, lrs["fft"], k.protocol, seed)
    lora, r.seen["LoRA"], r.lora_params = lora_finetune(base, split, lrs["lora"], k.lora_rank, k.protocol, seed)
    tau_fft, tau_lora = task_vector(theta0, fft), lora_task_vector(lora)
    states = {"FFT": as_state(fft), "LoRA": scale_sum(theta0, [tau_lora], 1.0)}
    for arm in ("FFT", "LoRA"):
        r.val[arm] = score(base, states[arm], split.val, G)
    floor = r.val["FFT"].accuracy - k.margin
    vectors, r.seen["task addition"] = subgroup_vectors(base, split, lrs["ta"], k, seed)
    r.seen["scaled FFT vector"] = r.seen["FFT"]
    for arm, vecs in (("task addition", vectors), ("scaled FFT vector", [tau_fft])):
        r.lam[arm], seen = select_lambda(base, theta0, vecs, split, floor, k)
        lam = float(r.lam[arm].chosen)
        r.val[arm], states[arm] = seen[lam], scale_sum(theta0, vecs, lam)
    for arm, state in states.items():
        r.predictions[arm] = predict(base, state, split.test.x)
        r.test[arm] = score(base, state, split.test, G)
    r.sweep_test = {lam: score(base, scale_sum(theta0, vectors, lam), split.test, G) for lam in k.lam_grid}
    r.norms = [v.norm() for v in vectors]
    # Single-group injection into FFT: theta_FFT + lam tau_g, and the same with a random direction of tau_g's norms.
    fft_state = states["FFT"]
    for g, v in enumerate(vectors):
        rand = random_like(v, 90_000 + 31 * seed + g)
        r.inject_dpd.append([score(base, inject(fft_state, v, lam), split.test, G).dpd for lam in k.inject_grid])
        r.random_dpd.append([score(base, inject(fft_state, rand, lam), split.test, G).dpd for lam in k.inject_grid])
    candidates = [g for g in range(G) if split.group_names[g] not in other_names]
    fft_val = r.val["FFT"]
    r.worst = max(candidates, key=lambda g: float(fft_val.dpd_vs_rest[g] + fft_val.eod_vs_rest[g]))
    r.worst_curve = [score(base, inject(fft_state, vectors[r.worst], lam), split.test, G) for lam in k.inject_grid]
    r.invariants = _invariants(theta0, vectors, tau_fft, fft_state, lora)
    return r


def _invariants(theta0, vectors, tau_fft, fft_state, lora) -> dict[str, float]:
    """The card's exact identities on this run's real vectors, and LoRA's delta against peft's own merge."""
    import copy

    zero = scale_sum(theta0, vectors, 0.0)
    one = scale_sum(theta0, [tau_fft], 1.0)
    merged = copy.deepcopy(lora).merge_and_unload().state_dict()
    ours = scale_sum(theta0, [lora_task_vector(lora)], 1.0)
    scale = max(float(v.abs().max()) for v in merged.values())
    return {"lambda0": max(float((zero[n] - theta0[n]).abs().max()) for n in theta0),
            "lambda1": max(float((one[n] - fft_state[n]).abs().max()) for n in theta0),
            "lora_merge": max(float((ours[n] - merged[n]).abs().max()) for n in merged) / scale}
