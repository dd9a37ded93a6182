"""LA-LoRA (Liu et al., ICLR 2026): local alternating LoRA updates with DP-SGD for private federated learning.

One client's local round, K steps on its own data (`local_round`); the federation around it (FedAvg of A and B over
the sampled clients, Flower) is `rankwise.training.federated`. Each local step k:

1. draws a Poisson batch (each example with probability q = b / n_i),
2. picks the factor(s) it updates (`active_factors`): LA-LoRA alternates per *local step*, B on odd k (B = 0 at
   init makes the first A-gradient exactly zero, so starting with A would spend a step on pure noise), A on even k;
   the baselines: DP-LoRA updates A and B together, FFA-LoRA only B (A frozen), RoLoRA alternates per *round*,
3. takes the DP gradient of the active factor(s) and of the other trained tensors (the task head, new for the task:
   it must be private too) -- per-sample gradients, one joint clipping to C, Gaussian noise (`core.privacy`),
4. smooths the noisy A/B gradients with the 5-tap binomial kernel [1, 4, 6, 4, 1] / 16 along the *feature* axis
   (each row of dA [r, in], each column of dB [out, r]; never across the rank axis) -- post-processing, so free in
   privacy (`binomial_smooth`),
5. descends: B <- B - lr_B g~_B or A <- A - lr_A g~_A (SGD, or AdamW with a fresh state each round).

The inactive factor is never touched (bit-identical). Every local step releases a noisy gradient, so the privacy
accountant counts every one of them (alternation does not halve epsilon).

Options from the authors' code (`DP_lora.py`) that keep the DP guarantee are exposed: `start_with="A"` (the code
alternates by batch parity starting with A), `b_lr_scale=2` (the code gives B twice A's rate). Its data-dependent
clipping threshold and its double update per step are not reproduced: they void the guarantee (see the docs).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from rankwise.core.privacy import SampleLoss, Tensors, clip_per_sample, noisy_mean, per_sample_gradients
from rankwise.errors import InvalidInputError

# arm -> how A and B are scheduled (the paper's method and its three baselines, all with the same DP machinery)
ARMS = ("la-lora", "dp-lora", "ffa-lora", "rolora")
ROLES = ("A", "B", "other")  # a trained tensor is a LoRA A, a LoRA B, or anything else (the head: always updated)
OPTIMIZERS = ("sgd", "adamw")
BINOMIAL_KERNEL = (1 / 16, 4 / 16, 6 / 16, 4 / 16, 1 / 16)


@dataclass(frozen=True)
class LocalDPConfig:
    """One client's local training: the arm, K steps of DP-SGD with expected batch b, clipping C."""

    arm: str = "la-lora"
    local_steps: int = 10  # K
    batch_size: int = 16  # expected Poisson batch b (the sampling rate is b / n_i)
    lr: float = 0.05
    clip: float = 1.0  # C (math.inf: no clipping, only without noise)
    smoothing: bool | None = None  # None: on for la-lora, off for the baselines (the paper's set-up)
    start_with: str = "B"  # the first factor of an alternation
    b_lr_scale: float = 1.0  # B's rate relative to A's (the authors' code uses 2)
    head_lr_scale: float = 1.0  # the other trained tensors' rate relative to A's
    optimizer: str = "sgd"
    weight_decay: float = 0.0  # AdamW only
    chunk_size: int | None = None  # per-sample gradients in chunks of this many samples (memory), None: all at once
    # The batch draws and the noise: False (private) from OS entropy, never recorded; True from (seed, round, step),
    # so a rerun repeats them -- NOT PRIVATE (whoever knows the seed regenerates the noise and subtracts it): for
    # reproductions and tests only.
    deterministic_noise: bool = False

    # -- the client protocol of the federated engine (`rankwise.training.federated`) --------------------------------
    def check_roles(self, roles: Mapping[str, str]) -> None:
        """Before any work: the trained tensors hold LoRA A and B factors (the arms alternate or freeze them)."""
        for role in ("A", "B"):
            if role not in roles.values():
                raise InvalidInputError(f"no trainable LoRA {role} factor found (names ending in '.{role}'): LA-LoRA and its "
                                        "baselines train rankwise LoRA adapters (--method lora)")

    def local_round(self, loss: SampleLoss, params: Mapping[str, torch.Tensor], roles: Mapping[str, str],
                    data: Mapping[str, torch.Tensor], noise_multiplier: float, round_index: int, seed: int):
        """One client's round under these settings: `local_round` (below)."""
        return local_round(loss, params, roles, data, self, noise_multiplier, round_index, seed)

    def validate(self) -> None:
        if self.arm not in ARMS:
            raise InvalidInputError(f"unknown LA-LoRA arm {self.arm!r}; known: {list(ARMS)}")
        if self.optimizer not in OPTIMIZERS:
            raise InvalidInputError(f"local optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.start_with not in ("A", "B"):
            raise InvalidInputError(f"start_with must be 'A' or 'B', got {self.start_with!r}")
        for name in ("local_steps", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {v!r}")
        for name in ("lr", "b_lr_scale", "head_lr_scale"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise InvalidInputError(f"{name} must be a positive finite number, got {v!r}")
        if not (isinstance(self.clip, (int, float)) and self.clip > 0):
            raise InvalidInputError(f"the clipping norm clip must be positive (inf: none), got {self.clip!r}")
        if self.weight_decay < 0:
            raise InvalidInputError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise InvalidInputError(f"chunk_size must be a positive integer or None, got {self.chunk_size}")

    @property
    def smooths(self) -> bool:
        return self.arm == "la-lora" if self.smoothing is None else bool(self.smoothing)


def active_factors(arm: str, step: int, round_index: int, start_with: str = "B") -> frozenset[str]:
    """The LoRA factors updated at local step `step` (1-based) of communication round `round_index` (1-based)."""
    other = "A" if start_with == "B" else "B"
    if arm == "la-lora":
        return frozenset({start_with if step % 2 == 1 else other})
    if arm == "rolora":
        return frozenset({start_with if round_index % 2 == 1 else other})
    if arm == "ffa-lora":
        return frozenset({"B"})
    if arm == "dp-lora":
        return frozenset({"A", "B"})
    raise InvalidInputError(f"unknown LA-LoRA arm {arm!r}; known: {list(ARMS)}")


def binomial_smooth(g: torch.Tensor, dim: int) -> torch.Tensor:
    """g convolved along `dim` with [1, 4, 6, 4, 1] / 16, symmetric (edge-repeating) padding; same shape as g.

    The kernel sums to 1, so a gradient constant along `dim` is unchanged; i.i.d. noise of variance v becomes, in
    the interior, variance v * sum(w^2) = v * 70 / 256."""
    n = g.size(dim)
    idx = torch.tensor([_symmetric(p, n) for p in range(-2, n + 2)], device=g.device)
    windows = g.index_select(dim, idx).unfold(dim, 5, 1)  # [..., n, ..., 5]
    kernel = torch.tensor(BINOMIAL_KERNEL, dtype=g.dtype, device=g.device)
    return windows @ kernel


def _symmetric(p: int, n: int) -> int:
    """Index of position p (may lie outside [0, n)) under symmetric padding: ... x1 x0 | x0 x1 ... x_{n-1} | x_{n-1} ..."""
    while not 0 <= p < n:
        p = -p - 1 if p < 0 else 2 * n - p - 1
    return p


def smooth_factor_gradient(g: torch.Tensor, role: str) -> torch.Tensor:
    """Filter a LoRA gradient along its feature axis: dA [r, in] along `in` (dim 1), dB [out, r] along `out` (dim 0)."""
    if role == "A":
        return binomial_smooth(g, 1)
    if role == "B":
        return binomial_smooth(g, 0)
    return g


@dataclass
class RoundStats:
    """What one local round did: steps per factor, samples drawn, the fraction of per-sample gradients clipped."""

    steps: int = 0
    factor_steps: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})
    samples: int = 0
    clipped: int = 0
    loss_sum: float = 0.0  # sum of per-sample losses (before the step), for a training curve

    @property
    def clipped_fraction(self) -> float:
        return self.clipped / self.samples if self.samples else 0.0

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / self.samples if self.samples else float("nan")


def step_generator(seed: int, round_index: int, step: int, deterministic: bool = False) -> torch.Generator:
    """The randomness (Poisson batch and Gaussian noise) of one local step.

    Private (the default): seeded from 63 bits of OS entropy (`secrets`), drawn afresh each step and never recorded,
    so nobody can regenerate the noise to subtract it, nor the batch draws that the privacy amplification by
    sampling assumes hidden. torch's generator is a Mersenne Twister, not a cryptographic one; Opacus's secure mode
    needs torchcsprng, archived and not built for current torch. `deterministic`: a pure function of (seed, round,
    step), so a rerun repeats it -- not private; for reproductions and tests."""
    if not deterministic:
        return torch.Generator().manual_seed(secrets.randbits(63))
    return torch.Generator().manual_seed((seed * 1_000_003 + round_index) * 10_007 + step)


def local_round(loss: SampleLoss, params: Mapping[str, torch.Tensor], roles: Mapping[str, str],
                data: Mapping[str, torch.Tensor], config: LocalDPConfig, noise_multiplier: float, round_index: int,
                seed: int) -> tuple[Tensors, RoundStats]:
    """K local DP steps from `params` on `data` (tensors [n, ...], this client's examples). Returns new tensors.

    `loss(params, sample)` is one example's loss; `roles[name]` is "A", "B" or "other" for every tensor of `params`
    (all of them trained; FFA-LoRA's A is simply never active). `seed` should differ per client and per job; it
    draws the batches and the noise only under `config.deterministic_noise` (see `step_generator`)."""
    config.validate()
    bad = sorted(n for n in params if roles.get(n) not in ROLES)
    if bad:
        raise InvalidInputError(f"every trained tensor needs a role in {ROLES}; missing or unknown for {bad[:3]}")
    n = {t.size(0) for t in data.values()}
    if len(n) != 1 or 0 in n:
        raise InvalidInputError(f"client data must be non-empty tensors with one first dimension, got sizes {sorted(n)}")
    n_i = n.pop()
    if config.batch_size > n_i:
        raise InvalidInputError(f"batch size {config.batch_size} exceeds this client's {n_i} examples (sampling rate > 1)")
    q = config.batch_size / n_i
    state = {k: v.detach().clone() for k, v in params.items()}
    rates = {k: config.lr * {"A": 1.0, "B": config.b_lr_scale, "other": config.head_lr_scale}[roles[k]] for k in state}
    adam = _Adam(state, config.weight_decay) if config.optimizer == "adamw" else None
    stats = RoundStats()
    for k in range(1, config.local_steps + 1):
        factors = active_factors(config.arm, k, round_index, config.start_with)
        names = [m for m in state if roles[m] == "other" or roles[m] in factors]
        g = step_generator(seed, round_index, k, config.deterministic_noise)
        chosen = (torch.rand(n_i, generator=g) < q).nonzero().squeeze(1)
        batch = {key: t[chosen] for key, t in data.items()}
        fixed = {m: t for m, t in state.items() if m not in names}

        def one(active: Mapping[str, torch.Tensor], sample: Mapping[str, torch.Tensor]) -> torch.Tensor:
            return loss({**fixed, **active}, sample)

        per_sample, losses = per_sample_gradients(one, {m: state[m] for m in names}, batch, config.chunk_size)
        clipped, norms = clip_per_sample(per_sample, config.clip)
        noisy = noisy_mean(clipped, config.clip, noise_multiplier, config.batch_size, g)
        if config.smooths:
            noisy = {m: smooth_factor_gradient(v, roles[m]) for m, v in noisy.items()}
        for m, v in noisy.items():
            if adam is None:
                state[m] = state[m] - rates[m] * v
            else:
                state[m] = adam.step(m, state[m], v, rates[m])
        stats.steps += 1
        for f in factors:
            stats.factor_steps[f] += int(any(roles[m] == f for m in names))
        stats.samples += int(chosen.numel())
        stats.clipped += int((norms > config.clip).sum())
        stats.loss_sum += float(losses.sum())
    return state, stats


class _Adam:
    """AdamW moments per tensor for one local round; a tensor's step counter advances only when it is updated."""

    def __init__(self, state: Mapping[str, torch.Tensor], weight_decay: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.m = {k: torch.zeros_like(v) for k, v in state.items()}
        self.v = {k: torch.zeros_like(v) for k, v in state.items()}
        self.t = dict.fromkeys(state, 0)
        self.wd, self.betas, self.eps = weight_decay, betas, eps

    def step(self, name: str, p: torch.Tensor, g: torch.Tensor, lr: float) -> torch.Tensor:
        b1, b2 = self.betas
        self.t[name] += 1
        t = self.t[name]
        self.m[name] = b1 * self.m[name] + (1 - b1) * g
        self.v[name] = b2 * self.v[name] + (1 - b2) * g * g
        m_hat = self.m[name] / (1 - b1**t)
        v_hat = self.v[name] / (1 - b2**t)
        return p * (1 - lr * self.wd) - lr * m_hat / (v_hat.sqrt() + self.eps)


def lora_roles(named: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Roles of trained tensors by name: `...A` -> "A", `...B` -> "B" (rankwise LoRA adapters), else "other"."""
    return {n: ("A" if n.endswith(".A") else "B" if n.endswith(".B") else "other") for n in named}


def cross_entropy_loss(logits: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """One example's cross-entropy: logits [1, C] (or [C]), label [] or [1]."""
    return F.cross_entropy(logits.reshape(1, -1), label.reshape(1))
