"""PESO (Yoo et al., ICLR 2026): one evolving LoRA adapter over chronological data blocks, each stage anchored softly
to a frozen snapshot of the previous stage's adapter by a proximal term.

    anchor = Snapshot.of(adapted)                               # frozen copies of every module's (A, B)
    proximal = ProximalRegularizer(anchor, lam=2.0, kind="kl")  # "kl" (PESO) or "l2" (H = I)
    loss = task_loss + proximal(lora_factors_of(adapted))       # at the stage's first step: exactly 0, zero gradient

The PESO term (what the official code trains, `lora_kldiv_latest`):

    lam * (1/G) * sum_g [ KL(softmax(vec A_g) || softmax(vec A_g^prev)) + KL(softmax(vec B_g) || softmax(vec B_g^prev)) ]

over the G adapted modules; each factor is flattened and softmaxed over all its entries, `eps` is added to both
distributions which are then renormalised, each KL is clamped at >= 0, and the previous factors are constants. The
L2 proximal (the general objective with H = I) is `lam * (1/G) * sum_g 1/2 (||A - A^prev||^2 + ||B - B^prev||^2)`:
averaged over modules like the KL, so that the two share a calibration of lam (our choice; the paper's general form
writes lam/2 * sum_g, i.e. G times ours).

Only the latest snapshot enters the loss (`reanchor` replaces it); snapshots are plain tensors without gradients,
and only the adapter's LoRA factors are regularised — fully trained modules (embeddings, heads) are not.
The softmax-KL is computed in float64 with an analytic gradient (`SoftmaxKL`): at v = v_prev the log-ratio is
exactly 0, so the term and its gradient are exactly 0 rather than rounding noise.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from rankwise.adapters.lora import LoraAdapter, LoraConfig
from rankwise.adapters.model import AdaptedModel
from rankwise.adapters.peft_format import SavedAdapter, read_adapter_sources
from rankwise.errors import InvalidInputError

PROXIMAL_KINDS = ("kl", "l2")
DEFAULT_EPS = 1e-8  # the official code's smoothing of both distributions

Factors = Mapping[str, tuple[torch.Tensor, torch.Tensor]]  # module name -> (A [r, in], B [out, r])


class SoftmaxKL(torch.autograd.Function):
    """KL(p' || q') with p' = renorm(softmax(vec a) + eps), q' = renorm(softmax(vec b) + eps), clamped at >= 0.

    a: any shape (the trainable factor); b: the same shape (a constant). Returns a 0-d tensor in a's dtype. Forward
    and backward run in float64. Backward (b gets no gradient): with d = log p' - log q', Z = sum(softmax(a) + eps),
    dKL/du = (d - <p', d>) / Z for u = softmax(a) + eps, then through the softmax: g_a = p * (g_u - <p, g_u>).
    """

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:  # type: ignore[override]
        p = torch.softmax(a.detach().reshape(-1).double(), 0)
        q = torch.softmax(b.detach().reshape(-1).double(), 0)
        u, w = p + eps, q + eps
        z = u.sum()
        p_s, q_s = u / z, w / w.sum()
        d = p_s.log() - q_s.log()
        kl = (p_s * d).sum()
        clamped = bool(kl < 0)  # only rounding makes it negative; the clamp stops its gradient, as in the paper's code
        ctx.save_for_backward(p, p_s, d, z)
        ctx.clamped, ctx.shape, ctx.dtype = clamped, a.shape, a.dtype
        return (kl.clamp_min(0.0)).to(a.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        p, p_s, d, z = ctx.saved_tensors
        if ctx.clamped:
            return torch.zeros(ctx.shape, dtype=ctx.dtype), None, None
        g_u = (d - (p_s * d).sum()) / z
        g_a = p * (g_u - (p * g_u).sum())
        return (grad.double() * g_a).reshape(ctx.shape).to(ctx.dtype), None, None


def softmax_kl(current: torch.Tensor, previous: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """KL(softmax(vec current) || softmax(vec previous)) with the paper's smoothing; differentiable in `current`."""
    if current.shape != previous.shape:
        raise InvalidInputError(f"softmax_kl: shapes differ, {tuple(current.shape)} vs {tuple(previous.shape)}")
    return SoftmaxKL.apply(current, previous, float(eps))


def softmax_kl_quadratic(previous: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """The local form 1/2 delta^T (diag p - p p^T) delta = 1/2 Var_p(delta), p = softmax(vec previous) (float64)."""
    p = torch.softmax(previous.reshape(-1).double(), 0)
    x = delta.reshape(-1).double()
    mean = (p * x).sum()
    return 0.5 * (p * (x - mean) ** 2).sum()


def lora_factors_of(adapted: AdaptedModel, adapter_name: str = "default") -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """module name -> (A, B) parameters of LoRA adapter `adapter_name` (the live tensors, with gradients)."""
    layers = adapted.adapters_of(adapter_name)
    out = {}
    for name, adapter in layers.items():
        if not isinstance(adapter, LoraAdapter) or adapter.pissa:
            raise InvalidInputError(f"PESO regularises plain LoRA factors; {name} holds a {adapter.method} adapter"
                                    f"{' with init=pissa' if getattr(adapter, 'pissa', False) else ''}")
        out[name] = (adapter.A, adapter.B)
    if not out:
        raise InvalidInputError(f"adapter {adapter_name!r} adapts no module")
    return out


@dataclass(frozen=True)
class Snapshot:
    """Frozen copies of every module's LoRA factors at the end of a stage (`requires_grad=False`, own storage)."""

    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def of(cls, factors: Factors | AdaptedModel, adapter_name: str = "default") -> Snapshot:
        live = lora_factors_of(factors, adapter_name) if isinstance(factors, AdaptedModel) else factors
        return cls({n: (a.detach().clone(), b.detach().clone()) for n, (a, b) in live.items()})

    @property
    def modules(self) -> list[str]:
        return list(self.factors)


class ProximalRegularizer:
    """`lam * (1/G) * sum_g term_g(current_g, anchor_g)`: the PESO softmax-KL (`kind="kl"`) or the L2 proximal."""

    def __init__(self, anchor: Snapshot, lam: float, kind: str = "kl", eps: float = DEFAULT_EPS) -> None:
        check_proximal(lam, kind, eps)
        self.anchor, self.lam, self.kind, self.eps = anchor, float(lam), kind, float(eps)

    def per_module(self, current: Factors) -> dict[str, torch.Tensor]:
        """module -> its (unweighted) term: KL(A) + KL(B), or 1/2 (||dA||^2 + ||dB||^2)."""
        if set(current) != set(self.anchor.factors):
            extra, missing = sorted(set(current) - set(self.anchor.factors)), sorted(set(self.anchor.factors) - set(current))
            raise InvalidInputError(f"the adapter's modules differ from the anchor's: new {extra[:3]}, missing {missing[:3]}")
        out = {}
        for name, (a, b) in current.items():
            a0, b0 = self.anchor.factors[name]
            if a.shape != a0.shape or b.shape != b0.shape:
                raise InvalidInputError(f"{name}: factors {tuple(a.shape)}, {tuple(b.shape)} but the anchor has "
                                        f"{tuple(a0.shape)}, {tuple(b0.shape)} (another rank?)")
            if self.kind == "kl":
                out[name] = softmax_kl(a, a0, self.eps) + softmax_kl(b, b0, self.eps)
            else:
                out[name] = 0.5 * ((a - a0).pow(2).sum() + (b - b0).pow(2).sum())
        return out

    def __call__(self, current: Factors) -> torch.Tensor:
        terms = list(self.per_module(current).values())
        return self.lam * torch.stack(terms).mean()

    def reanchor(self, current: Factors) -> None:
        """Make the end of this stage the anchor of the next: the older snapshot is dropped, never consulted again."""
        self.anchor = Snapshot.of(current)


def check_proximal(lam: float, kind: str, eps: float = DEFAULT_EPS) -> None:
    if kind not in PROXIMAL_KINDS:
        raise InvalidInputError(f"proximal must be one of {PROXIMAL_KINDS}, got {kind!r}")
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not (0 <= lam < float("inf")):
        raise InvalidInputError(f"lam must be a finite number >= 0, got {lam!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0 <= eps < 1):
        raise InvalidInputError(f"eps must be a number in [0, 1), got {eps!r}")


def read_saved_adapter(folder: str | Path) -> SavedAdapter:
    """A saved adapter folder's contents, read as `load_adapter` would (our files if the manifest vouches for them)."""
    ours, peft_side, verified = read_adapter_sources(folder)
    chosen = ours if ours is not None and (verified or peft_side is None) else peft_side
    assert chosen is not None
    return chosen


def inherit(adapted: AdaptedModel, previous: str | Path | SavedAdapter, adapter_name: str = "default",
            prefix: str = "") -> Snapshot:
    """Continue from the previous stage: copy its LoRA factors into adapter `adapter_name`; return them as the anchor.

    `prefix`: where `adapted` sits in the module the previous adapter was saved from ("model." for a classifier,
    whose saved module names are relative to the classifier, as PEFT reads them). Refuses (InvalidInputError, before
    changing anything) a previous adapter of another method, rank, scaling, initialisation or set of modules: its
    factors would mean something else here.
    """
    saved = previous if isinstance(previous, SavedAdapter) else read_saved_adapter(previous)
    if prefix and saved.modules and all(m.startswith(prefix) for m in saved.modules):
        saved = dataclasses.replace(saved, modules=[m[len(prefix):] for m in saved.modules],
                                    state={k[len(prefix):] if k.startswith(prefix) else k: v for k, v in saved.state.items()})
    where = "the previous adapter" if isinstance(previous, SavedAdapter) else str(previous)
    config = adapted.configs.get(adapter_name)
    if not isinstance(config, LoraConfig):
        raise InvalidInputError(f"PESO continues a LoRA adapter; adapter {adapter_name!r} is "
                                f"{config.method if config else 'missing'}")
    old = saved.config
    if not isinstance(old, LoraConfig):
        raise InvalidInputError(f"{where}: the previous adapter is {old.method}, not LoRA: PESO cannot continue it")
    mismatch = [(k, getattr(old, k), getattr(config, k)) for k in ("r", "init", "use_rslora") if getattr(old, k) != getattr(config, k)]
    if abs(old.scaling - config.scaling) > 1e-12 * abs(config.scaling):
        mismatch.append(("scaling (lora_alpha / r)", old.scaling, config.scaling))
    current = lora_factors_of(adapted, adapter_name)
    if sorted(saved.modules) != sorted(current):
        gone, new = sorted(set(saved.modules) - set(current)), sorted(set(current) - set(saved.modules))
        mismatch.append(("modules", f"{len(saved.modules)} (only there: {gone[:3]})", f"{len(current)} (only here: {new[:3]})"))
    if mismatch:
        told = "; ".join(f"{k}: previous {a}, here {b}" for k, a, b in mismatch)
        raise InvalidInputError(f"{where}: the previous stage's adapter does not match this one ({told}); "
                                "use the same --rank, --targets, LoRA options and kind of task (language model or "
                                "classifier) in every stage")
    values = {}
    for name, (a, b) in current.items():
        a0, b0 = saved.state.get(f"{name}.A"), saved.state.get(f"{name}.B")
        if a0 is None or b0 is None or a0.shape != a.shape or b0.shape != b.shape:
            raise InvalidInputError(f"{where}: {name}'s saved factors are missing or have other shapes than here")
        values[name] = (a0, b0)
    with torch.no_grad():
        for name, (a, b) in current.items():
            a.copy_(values[name][0].to(a.dtype))
            b.copy_(values[name][1].to(b.dtype))
    return Snapshot.of(current)
