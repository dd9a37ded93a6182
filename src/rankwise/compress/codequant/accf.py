"""Stage 3's second half: centroid fine-tuning (ACCF), the paper's alternating loop.

Per calibration batch:
  1. the FP model (same rotation, no quantization) runs without gradient; the outputs of its q/k/v projections, of
     every MLP block and of every router are recorded as targets;
  2. the clustered model runs with each quantized module's input detached (no cross-layer gradient), giving
       attention q/k/v:  MSE(X̃ W_cᵀ, X Wᵀ)                              (X̃: the input in the clustered model)
       an MLP block:     MSE(Y_clustered, Y_fp) + λ KL(Π_fp ‖ Π_clustered)  (the router term only for an MoE)
     and one backward of their sum gives every clustered layer the gradient of its own module's loss;
     with `relative=True` (the default) each MSE is divided by its FP target's mean square: since a module's
     centroids see only their own loss, this rescales each module's step size and nothing else, so that one lr
     serves models whose module outputs differ by orders of magnitude (SmolLM2's massive activations: the plain
     MSE's step that suits the toy MoE blows up there); λ then weighs the KL against a relative error.
     `relative=False` is the paper's plain MSE;
  3. each centroid moves by SGD (no momentum) along the MEAN gradient of the weights assigned to it (autograd's
     gather gives the sum; it is divided by the cluster size);
  4. the FP weights are re-assigned to their nearest updated centroid (the released code's rule: its two
     diagonal statistics D1, D2 are the same tensor, so the paper's weighted rule reduces to nearest-centroid).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.compress.codequant.layers import ClusteredLinear
from rankwise.compress.codequant.structure import Decoder, require_moe
from rankwise.errors import InvalidInputError, NumericalError


@dataclass(frozen=True)
class ACCFConfig:
    steps: int = 64  # calibration batches (the paper: 64 iterations)
    lr: float = 1e-4
    kl_weight: float | None = None  # λ; None: 1.0 on an MoE (the paper), no term on a dense model; 0: the ablation
    batch_size: int = 8  # windows per batch
    relative: bool = True  # each module's MSE over its target's mean square (see the module docstring)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"ACCF {name} must be a positive integer, got {v!r}")
        if not self.lr > 0 or not (self.kl_weight is None or self.kl_weight >= 0):
            raise InvalidInputError(f"ACCF lr must be positive and kl_weight non-negative, got {self.lr!r}, "
                                    f"{self.kl_weight!r}")


@dataclass
class ACCFResult:
    losses: list[float] = field(default_factory=list)  # summed module losses per step
    kl: list[float] = field(default_factory=list)  # summed router KL per step (0 for a dense model)
    reassigned: list[float] = field(default_factory=list)  # share of codes that changed per step


def _backbone(model: nn.Module) -> nn.Module:
    """The decoder without its lm_head (`model.model`): the losses never read the logits, and SmolLM2's 49k-token
    head is a fifth of its forward."""
    return getattr(model, "model", model)


def _targets(fp_model: nn.Module, fp_decoder: Decoder, batch: torch.Tensor) -> dict[str, torch.Tensor]:
    modules = _watched(fp_decoder)
    out: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(lambda _m, _a, y, k=k: out.__setitem__(k, y.detach()))
               for k, m in modules.items()]
    try:
        with torch.no_grad():
            _backbone(fp_model)(batch)
    finally:
        for h in handles:
            h.remove()
    return out


def _watched(decoder: Decoder) -> dict[str, nn.Module]:
    """The modules whose outputs are compared: q/k/v, each MLP block, each router; keyed by position."""
    watched: dict[str, nn.Module] = {}
    for b in decoder.blocks:
        for tag, m in zip(("q", "k", "v"), b.attention_readers):
            watched[f"{b.index}.{tag}"] = m
        watched[f"{b.index}.mlp"] = b.mlp
        if b.router is not None:
            watched[f"{b.index}.router"] = b.router
    return watched


def finetune_centroids_(model: nn.Module, decoder: Decoder, fp_model: nn.Module, fp_decoder: Decoder,
                        windows: torch.Tensor, config: ACCFConfig, seed: int = 0) -> ACCFResult:
    """Fine-tune the centroids of `model`'s ClusteredLinear layers (which must keep their FP source) in place.

    `decoder` must describe `model` after the swap (its q/k/v, routers and MLPs as they are now); `fp_model` is the
    same network, rotated the same way, unquantized. `windows [W, T]`: calibration token ids.
    """
    clustered = [m for m in model.modules() if isinstance(m, ClusteredLinear)]
    if not clustered:
        raise InvalidInputError("the model has no clustered layer to fine-tune")
    if any(m.source is None for m in clustered):
        raise InvalidInputError("fine-tuning needs the clustered layers' FP source weights (keep_source=True)")
    if windows.dim() != 2 or windows.shape[0] < 1:
        raise InvalidInputError(f"calibration windows must be a non-empty [W, T] tensor, got {tuple(windows.shape)}")
    if config.kl_weight:  # an explicit router term: only a mixture of experts has routers
        require_moe(decoder, f"the router KL term (kl_weight={config.kl_weight})")
    kl_weight = 1.0 if config.kl_weight is None else config.kl_weight
    params = [p for p in model.parameters()]
    frozen = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    for m in clustered:
        m.centroids.requires_grad_(True)
    watched = _watched(decoder)
    detach_handles = [m.register_forward_pre_hook(lambda _m, args: (args[0].detach(), *args[1:]))
                      for k, m in watched.items() if not k.endswith(".router")]
    outputs: dict[str, torch.Tensor] = {}
    out_handles = [m.register_forward_hook(lambda _m, _a, y, k=k: outputs.__setitem__(k, y)) for k, m in watched.items()]
    g = torch.Generator().manual_seed(seed)
    result = ACCFResult()
    was_training = model.training
    model.eval()
    try:
        for _ in range(config.steps):
            batch = windows[torch.randint(0, windows.shape[0], (min(config.batch_size, windows.shape[0]),), generator=g)]
            targets = _targets(fp_model, fp_decoder, batch)
            outputs.clear()
            _backbone(model)(batch)
            loss, kl_total = torch.zeros(()), torch.zeros(())
            for k, y in outputs.items():
                if k.endswith(".router"):
                    kl = F.kl_div(F.log_softmax(y.float(), -1).flatten(0, -2), F.log_softmax(targets[k].float(), -1)
                                  .flatten(0, -2), log_target=True, reduction="batchmean")  # KL(P_fp ‖ P_clustered)
                    kl_total = kl_total + kl
                    loss = loss + kl_weight * kl
                else:
                    t = targets[k]
                    mse = F.mse_loss(y, t)
                    loss = loss + (mse / t.pow(2).mean().clamp_min(1e-12) if config.relative else mse)
            if not torch.isfinite(loss):
                raise NumericalError("the centroid fine-tuning loss became non-finite: lower the lr")
            for m in clustered:
                m.centroids.grad = None
            loss.backward()
            changed = total = 0
            with torch.no_grad():
                for m in clustered:
                    if m.centroids.grad is not None:
                        m.centroids -= config.lr * m.centroids.grad / m.cluster_sizes().clamp_min(1)
                    before = m.codes.clone()
                    m.reassign_()
                    changed += int((before != m.codes).sum())
                    total += before.numel()
            result.losses.append(float(loss.detach()))
            result.kl.append(float(kl_total.detach()))
            result.reassigned.append(changed / total)
    finally:
        for h in detach_handles + out_handles:
            h.remove()
        for p, f in zip(params, frozen):
            p.requires_grad_(f)
        model.train(was_training)
    return result
