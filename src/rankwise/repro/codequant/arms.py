"""The CodeQuant experiments' shared machinery: build each arm from a shared rotated prefix, tune an arm's knob on
validation windows, and score an arm on held-out windows (NLL, router agreement, module output error).

A prefix is the FP model with its norms folded and its stream rotated (none, random, or learned at one AOS lr); it
is computed once per seed and copied for every arm that shares it, and it is the FP reference its arms' centroid
fine-tuning aims at.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics as st
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from rankwise.compress.codequant import AOSConfig, QuantSpec, finish_, rotate_stage_
from rankwise.compress.codequant.aos import aos_loss, learn_rotation, norm_outputs
from rankwise.compress.codequant.rotate import fold_norms_, random_orthogonal
from rankwise.compress.codequant.structure import decoder_of
from rankwise.compress.codequant.metrics import relative_output_errors, router_agreement
from rankwise.errors import NumericalError
from rankwise.eval import perplexity
from rankwise.quant import get_recipe, quantize_linears_


@dataclass(frozen=True)
class Arm:
    name: str
    spec: QuantSpec
    tuned: str | None = None  # which knob the validation grid picks ("smooth_alpha", "aos.lr", "finetune.lr", "damp")
    grid: tuple[float, ...] = ()
    peer: Callable[[nn.Module], nn.Module] | None = None  # a format outside the pipeline: quantizes an FP copy in place


MXFP4_BITS = 4 + 8 / 32  # E2M1 elements, one E8M0 scale per 32


def mxfp4_peer(model: nn.Module) -> nn.Module:
    """The microscaling peer at A4W4 on CodeQuant's scope: MXFP4 weights and inputs (blocks of 32 along the
    inputs) on q/k/v, the router and gate/up; o_proj, down_proj and lm_head stay fp32. No calibration."""
    recipe = get_recipe("mxfp4")
    quantize_linears_(model, recipe, activations=recipe, exclude=("lm_head", "o_proj", "down_proj"))
    return model


def weight_bits(spec: QuantSpec, in_features: int) -> float:
    """Stored bits per quantized weight: the 4-bit code plus its share of the fp32 centroids (k per row or group)
    or of the fp32 scale and zero point; 32 for FP weights."""
    if spec.weights == "fp":
        return 32.0
    group = in_features if spec.group is None else spec.group
    side = spec.k * 32 if spec.weights == "kmeans" else 2 * 32
    return spec.weight_bits + side / group


def with_knob(spec: QuantSpec, knob: str, value: float) -> QuantSpec:
    """`spec` with one (possibly nested, dotted) field replaced."""
    head, _, rest = knob.partition(".")
    if rest:
        return dataclasses.replace(spec, **{head: dataclasses.replace(getattr(spec, head), **{rest: value})})
    return dataclasses.replace(spec, **{head: value})


class Prefixes:
    """Rotated FP models of one seed's calibration, keyed by what determines them (rotation, AOS settings, seed)."""

    def __init__(self, model: nn.Module, calibration: torch.Tensor) -> None:
        self.model, self.calibration = model, calibration
        self._cache: dict[tuple, tuple[nn.Module, object]] = {}

    def get(self, spec: QuantSpec) -> tuple[nn.Module, object]:
        key = (spec.rotation, spec.aos if spec.rotation == "learned" else None, spec.aos_tokens, spec.seed)
        if key not in self._cache:
            m = copy.deepcopy(self.model)
            result = rotate_stage_(m, self.calibration, dataclasses.replace(spec, weights="fp", finetune=None,
                                                                          smooth_alpha=None))
            self._cache[key] = (m, result)
        return self._cache[key]

    def build(self, spec: QuantSpec, peer: Callable[[nn.Module], nn.Module] | None = None
              ) -> tuple[nn.Module, nn.Module, object]:
        """(quantized model, its FP rotated reference, the QuantResult); a peer format quantizes an FP copy."""
        if peer is not None:
            return peer(copy.deepcopy(self.model)), self.model, None
        fp, rot = self.get(spec)
        m = copy.deepcopy(fp)
        result = dataclasses.replace(rot, spec=spec)
        finish_(m, self.calibration, spec, result, fp_model=fp)
        return m, fp, result


def mean_nll(model: nn.Module, windows: torch.Tensor, batch_size: int = 8) -> float:
    return perplexity(model, windows, batch_size=batch_size, desc="nll").mean_nll


def tune(arm: Arm, prefixes: Prefixes, validation: torch.Tensor) -> tuple[QuantSpec, list[tuple[float, float]]]:
    """The arm's spec at the grid value with the lowest validation NLL, and every (value, NLL) tried."""
    if arm.tuned is None:
        return arm.spec, []
    tried = []
    for value in arm.grid:
        spec = with_knob(arm.spec, arm.tuned, value)
        try:
            m, _, _ = prefixes.build(spec)
            nll = mean_nll(m, validation)
        except NumericalError:  # a step size that diverges is a grid point that lost, not a failed experiment
            nll = float("inf")
        tried.append((value, nll if math.isfinite(nll) else float("inf")))
    best = min(tried, key=lambda t: t[1])[0]
    return with_knob(arm.spec, arm.tuned, best), tried


def tune_aos(model: nn.Module, calibration: torch.Tensor, validation: torch.Tensor, spec: QuantSpec,
             lrs: tuple[float, ...]) -> tuple[AOSConfig, list[tuple[float, float]]]:
    """The AOS lr with the lowest rotation objective on the validation windows' norm outputs (the stage's own
    criterion, far less noisy than a validation NLL whose differences between lrs are ~1e-3 nats), and every
    (lr, held-out objective) tried. Every lr starts from the same random rotation."""
    folded = copy.deepcopy(model)
    decoder = decoder_of(folded)
    fold_norms_(folded, decoder)
    train = norm_outputs(folded, decoder, calibration, spec.aos_tokens, seed=spec.seed)
    held_out = norm_outputs(folded, decoder, validation, spec.aos_tokens, seed=spec.seed + 1)
    start = random_orthogonal(decoder.hidden_size, spec.seed)
    tried = []
    for lr in lrs:
        config = dataclasses.replace(spec.aos, lr=lr)
        r = learn_rotation(train, start, config, seed=spec.seed).rotation
        with torch.no_grad():
            tried.append((lr, float(aos_loss(r, held_out, config.bits, config.group))))
    best = min(tried, key=lambda t: t[1])[0]
    return dataclasses.replace(spec.aos, lr=best), tried


def knob_value(spec: QuantSpec, knob: str) -> object:
    head, _, rest = knob.partition(".")
    value = getattr(spec, head)
    return getattr(value, rest) if rest else value


def tabulate_tuning(table, arm: str, knob: str, tried: list[tuple[float, float]], criterion: str = "validation NLL"
                    ) -> None:
    """One row per grid value tried: its criterion ("diverged" when the step blew up), which was chosen."""
    best = min(tried, key=lambda t: t[1])[0] if tried else None
    for value, v in tried:
        table.add(arm=arm, knob=knob, value=value, criterion=criterion,
                  score=v if math.isfinite(v) else "diverged", chosen=value == best, at_grid_edge=at_edge(tried))


TUNING_COLUMNS = ["arm", "knob", "value", "criterion", "score", "chosen", "at_grid_edge"]


def at_edge(tried: list[tuple[float, float]]) -> bool:
    """Whether the chosen value is the grid's first or last (the grid may not bracket the optimum)."""
    if len(tried) < 3:
        return False
    best = min(range(len(tried)), key=lambda i: tried[i][1])
    return best in (0, len(tried) - 1)


@dataclass
class Score:
    nll: float
    agreement: float | None  # router top-k agreement with the FP model (MoE only)
    output_error: float  # mean relative output error over q/k/v and MLP blocks


def score(model: nn.Module, fp_model: nn.Module, windows: torch.Tensor, probe: torch.Tensor,
          top_k: int | None) -> Score:
    agree = router_agreement(fp_model, model, probe, top_k) if top_k else None
    errors = relative_output_errors(fp_model, model, probe)
    return Score(mean_nll(model, windows), agree, st.fmean(errors.values()))


def mean_of(scores: list[Score], field: str) -> float:
    return st.fmean(getattr(s, field) for s in scores)


def run_arms(arms: list[Arm], specs: dict[str, QuantSpec], seeds: list[int], calibration_of: Callable[[int], torch.Tensor],
             model: nn.Module, windows: torch.Tensor, probe: torch.Tensor, top_k: int | None,
             on_arm: Callable[[str, int], None] | None = None) -> dict[str, list[Score]]:
    """Score every arm (at its tuned spec) on every seed; a seed changes the calibration draw, the random rotation
    and the k-means initialisation. All arms of a seed share its prefixes."""
    scores: dict[str, list[Score]] = {a.name: [] for a in arms}
    for seed in seeds:
        prefixes = Prefixes(model, calibration_of(seed))
        for a in arms:
            spec = dataclasses.replace(specs[a.name], seed=seed)
            m, fp, _ = prefixes.build(spec, a.peer)
            scores[a.name].append(score(m, fp, windows, probe, top_k))
            if on_arm is not None:
                on_arm(a.name, seed)
    return scores


@dataclass
class Tuned:
    arms: list[Arm]
    specs: dict[str, QuantSpec]  # each arm at its chosen knob
    best_baseline: str  # the baseline with the lowest validation NLL
    baseline_validation: dict[str, float]
    prefixes: Prefixes  # seed 0's, for measurements on the tuning draw


def tune_all(report, model: nn.Module, calibration: torch.Tensor, validation: torch.Tensor, aos_spec: QuantSpec,
             aos_lrs: tuple[float, ...], make_arms: Callable[[AOSConfig], list[Arm]], baselines: tuple[str, ...]) -> Tuned:
    """The tuning phase of both experiments, on one calibration draw: the AOS lr by its held-out objective, then
    each arm's knob by validation NLL, then the best baseline; every grid point goes into a report table."""
    prefixes = Prefixes(model, calibration)
    table = report.table("Tuning on validation windows (calibration split, seed 0)", TUNING_COLUMNS)
    aos, tried = tune_aos(model, calibration, validation, aos_spec, aos_lrs)
    tabulate_tuning(table, "every learned rotation", "aos.lr", tried, "held-out AOS objective")
    arms = make_arms(aos)
    specs = {}
    for a in arms:
        specs[a.name], tried = tune(a, prefixes, validation)
        tabulate_tuning(table, a.name, a.tuned, tried)
    base_val = {b: mean_nll(prefixes.build(specs[b])[0], validation) for b in baselines}
    return Tuned(arms, specs, min(base_val, key=base_val.get), base_val, prefixes)
