"""CodeQuant end to end, and the baselines it is compared with, as one composable recipe.

    fold norms -> rotate (none | random: QuaRot-like | learned: AOS) -> [SmoothQuant] -> weights (fp | rtn | gptq |
    kmeans) -> [centroid fine-tuning] -> the quantized linears swapped in (scope: q/k/v, router, expert gate/up)

CodeQuant itself is `QuantSpec(rotation="learned", weights="kmeans", finetune=ACCFConfig())`; SpinQuant-like is
learned + rtn, QuaRot-like random + rtn (or + gptq). Each stage is a public function so that an experiment can run
the shared prefix once and branch (`copy.deepcopy`) for the arms.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from rankwise.compress.codequant.accf import ACCFConfig, ACCFResult, finetune_centroids_
from rankwise.compress.codequant.act_quant import check_bits
from rankwise.compress.codequant.aos import AOSConfig, AOSResult, learn_rotation, norm_outputs
from rankwise.compress.codequant.layers import ClusteredLinear, RoundedLinear, check_group
from rankwise.compress.codequant.rotate import fold_norms_, fuse_rotation_, random_orthogonal
from rankwise.compress.codequant.scope import reader_groups, replace_module_
from rankwise.compress.codequant.stats import collect_input_stats
from rankwise.compress.codequant.structure import decoder_of, require_moe
from rankwise.compress.codequant.uniform import gptq, rtn
from rankwise.errors import InvalidInputError

ROTATIONS = ("none", "random", "learned")
WEIGHTS = ("fp", "rtn", "gptq", "kmeans")


@dataclass(frozen=True)
class QuantSpec:
    rotation: str = "learned"
    weights: str = "kmeans"
    finetune: ACCFConfig | None = None  # centroid fine-tuning (kmeans only)
    smooth_alpha: float | None = None  # SmoothQuant's migration strength (rotation "none" only)
    weight_bits: int = 4  # 2^bits centroids, or a 2^bits-level grid
    act_bits: int | None = 4  # per-token inputs of the quantized linears; None: weight-only
    group: int | None = None  # weight group along the inputs (None: whole rows, the paper's embedding-wise)
    aos: AOSConfig = AOSConfig()
    aos_tokens: int = 2048  # calibration token positions per hook for AOS
    kmeans_iters: int = 300
    damp: float = 0.01  # GPTQ's dampening, a fraction of the Hessian's mean diagonal
    seed: int = 0  # random rotation, AOS batches, k-means++ (42 + seed)

    def __post_init__(self) -> None:
        if self.rotation not in ROTATIONS:
            raise InvalidInputError(f"unknown rotation {self.rotation!r}; choose one of {ROTATIONS}")
        if self.weights not in WEIGHTS:
            raise InvalidInputError(f"unknown weight quantizer {self.weights!r}; choose one of {WEIGHTS}")
        if self.finetune is not None and self.weights != "kmeans":
            raise InvalidInputError("centroid fine-tuning needs weights='kmeans' (there are no centroids otherwise)")
        if self.smooth_alpha is not None and (self.rotation != "none" or not 0 < self.smooth_alpha < 1):
            raise InvalidInputError("SmoothQuant takes an alpha in (0, 1) and no rotation")
        if isinstance(self.weight_bits, bool) or not isinstance(self.weight_bits, int) or not 2 <= self.weight_bits <= 8:
            raise InvalidInputError(f"weight bits must be an integer in [2, 8] (a codebook of 2^bits centroids), got "
                                    f"{self.weight_bits!r}")
        if self.act_bits is not None:
            check_bits(self.act_bits)
        if not self.damp > 0:
            raise InvalidInputError(f"GPTQ's damp must be positive, got {self.damp!r}")

    @property
    def k(self) -> int:
        return 2**self.weight_bits


def codequant_spec(**overrides) -> QuantSpec:
    """The paper's recipe: learned rotation, 16 centroids per row, centroid fine-tuning with the router KL."""
    return QuantSpec(**{"rotation": "learned", "weights": "kmeans", "finetune": ACCFConfig(), **overrides})


@dataclass
class QuantResult:
    spec: QuantSpec
    rotation: torch.Tensor | None = None
    aos: AOSResult | None = None
    accf: ACCFResult | None = None
    quantized: list[str] = field(default_factory=list)  # qualified names of the swapped linears


def check_calibration(windows: torch.Tensor) -> None:
    if not isinstance(windows, torch.Tensor) or windows.dim() != 2 or windows.numel() == 0 or windows.dtype != torch.long:
        raise InvalidInputError("calibration must be a non-empty [W, T] int64 tensor of token ids")


def rotate_stage_(model: nn.Module, calibration: torch.Tensor, spec: QuantSpec) -> QuantResult:
    """Fold the norms and rotate the stream (in place); returns the rotation used and the AOS history."""
    check_calibration(calibration)
    decoder = decoder_of(model)
    for g in reader_groups(model, decoder):  # group sizes checked before any work
        for _, lin in g.linears:
            check_group(lin.in_features, spec.group)
    fold_norms_(model, decoder)
    result = QuantResult(spec)
    if spec.rotation == "none":
        return result
    r = random_orthogonal(decoder.hidden_size, spec.seed)
    if spec.rotation == "learned":
        acts = norm_outputs(model, decoder, calibration, spec.aos_tokens, seed=spec.seed)
        result.aos = learn_rotation(acts, r, spec.aos, seed=spec.seed)
        r = result.aos.rotation
    fuse_rotation_(decoder, r)
    result.rotation = r
    return result


@torch.no_grad()
def smooth_stage_(model: nn.Module, calibration: torch.Tensor, alpha: float) -> None:
    """SmoothQuant: per channel j of each norm's output, s_j = max|x_j|^α / max|W_:j|^(1-α) over its readers;
    the norm gain is divided by s and the readers' columns multiplied by it (the function is unchanged)."""
    decoder = decoder_of(model)
    groups = reader_groups(model, decoder)
    first = {g.name: g.linears[0] for g in groups}  # the router or q/gate_proj: it sees every token
    stats = collect_input_stats(model, {n: m for n, m in first.values()}, calibration)
    for g in groups:
        x_max = stats[first[g.name][0]].absmax.clamp_min(1e-5)
        w_max = torch.stack([lin.weight.detach().abs().amax(0).double() for _, lin in g.linears]).amax(0).clamp_min(1e-5)
        s = (x_max**alpha / w_max ** (1 - alpha)).clamp_min(1e-5)
        g.norm.weight.div_(s.to(g.norm.weight.dtype))
        for _, lin in g.linears:
            lin.weight.mul_(s.to(lin.weight.dtype))


def weight_stage_(model: nn.Module, calibration: torch.Tensor, spec: QuantSpec, keep_source: bool = False) -> list[str]:
    """Quantize the scoped linears' weights and swap them for RoundedLinear / ClusteredLinear (in place)."""
    decoder = decoder_of(model)
    linears = {n: m for g in reader_groups(model, decoder) for n, m in g.linears}
    stats = collect_input_stats(model, linears, calibration) if spec.weights == "gptq" else {}
    for i, (name, lin) in enumerate(linears.items()):
        w, b = lin.weight.detach(), lin.bias
        if spec.weights == "kmeans":
            new: nn.Module = ClusteredLinear.from_weight(w, b, spec.k, spec.group, spec.act_bits, spec.kmeans_iters,
                                                         seed=42 + spec.seed + i, keep_source=keep_source)
        elif spec.weights == "rtn":
            new = RoundedLinear(rtn(w, spec.weight_bits, spec.group), b, spec.act_bits)
        elif spec.weights == "gptq":
            new = RoundedLinear(gptq(w, stats[name].hessian(), spec.weight_bits, spec.group, spec.damp), b, spec.act_bits)
        else:
            new = RoundedLinear(w, b, spec.act_bits)
        replace_module_(model, name, new)
    return list(linears)


def finish_(model: nn.Module, calibration: torch.Tensor, spec: QuantSpec, result: QuantResult | None = None,
            fp_model: nn.Module | None = None) -> QuantResult:
    """Everything after the rotation, on a model `rotate_stage_` already folded and rotated (in place): SmoothQuant,
    the weights, the centroid fine-tuning. `fp_model`: the unquantized rotated model for the fine-tuning targets
    (default: a copy of `model` taken here)."""
    result = result if result is not None else QuantResult(spec)
    if spec.smooth_alpha is not None:
        smooth_stage_(model, calibration, spec.smooth_alpha)
    if spec.finetune is not None and fp_model is None:
        fp_model = copy.deepcopy(model)
    result.quantized = weight_stage_(model, calibration, spec, keep_source=spec.finetune is not None)
    if spec.finetune is not None:
        result.accf = finetune_centroids_(model, decoder_of(model), fp_model, decoder_of(fp_model), calibration,
                                          spec.finetune, seed=spec.seed)
        for m in model.modules():
            if isinstance(m, ClusteredLinear):
                m.drop_source()
    return result


def quantize_(model: nn.Module, calibration: torch.Tensor, spec: QuantSpec) -> QuantResult:
    """Run the whole recipe on `model` in place. `calibration [W, T]`: token ids (disjoint from evaluation text)."""
    if spec.finetune is not None and spec.finetune.kl_weight:  # refused before any work, not after the clustering
        require_moe(decoder_of(model), f"the router KL term (kl_weight={spec.finetune.kl_weight})")
    return finish_(model, calibration, spec, rotate_stage_(model, calibration, spec))
