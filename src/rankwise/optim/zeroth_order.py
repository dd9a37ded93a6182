"""Zeroth-order (SPSA / MeZO) steps on a fixed, ordered set of tensors: two forwards, no backward, no stored noise.

One step with seed s (Malladi et al. 2023, "MeZO"; the ZO phase of LMAO):

    L+ = L(W + eps z),  L- = L(W - eps z),  g = (L+ - L-) / (2 eps)      z ~ N(0, I), regenerated from s
    W_i <- W_i - lr (g z_i + weight_decay W_i)                           weight decay on tensors of dim >= 2 only

`z` is never stored: tensor i's noise is drawn from a generator seeded by (s, i) whenever it is needed, so the
perturbation and the update see the same z whatever order the forward visits the tensors in, and the extra memory
is one tensor's worth at a time (the largest parameter), as in MeZO.

Two ways to evaluate L(W +- eps z) (`perturbation`):
- "exact" (default): W is never written during the two forwards. A forward pre-hook on each module that owns a
  tensor of the set swaps in `W_i + scale * eps * z_i` for the duration of that module's forward and puts the
  original back afterwards, so the weights after the two forwards are the originals bit for bit, in any dtype, and
  a step with lr = 0 changes nothing. It needs every tensor of the set to be used through its owning module's
  forward (true of transformers models and rankwise adapters; a tensor that no owner's forward used raises).
- "in-place": MeZO's reference scheme, W += eps z, W -= 2 eps z, W += eps z (restore). Works for any module code;
  the restore is exact only up to rounding (a few ulps per step: the known MeZO drift).

Randomness is a pure function of the seed the caller passes (`step_seed(seed, step)`): resuming a run at step t
repeats the noise of the uninterrupted run. The global RNG is never touched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.errors import InvalidInputError, NumericalError

PERTURBATIONS = ("exact", "in-place")
_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant (golden ratio): spreads (seed, step, index) over generator seeds
_MASK = (1 << 63) - 1


def step_seed(seed: int, step: int) -> int:
    """The noise seed of optimizer step `step` of a run seeded `seed`: a pure function of both."""
    return ((int(seed) * _MIX) ^ (int(step) * 1_000_003 + 0x5BD1E995)) & _MASK


@dataclass(frozen=True)
class ZOStep:
    """What one SPSA step saw: the two losses, the projected gradient g, and the noise seed."""

    loss_plus: float
    loss_minus: float
    projected_grad: float  # (L+ - L-) / (2 eps)
    seed: int


class SPSA:
    """Zeroth-order steps on `params` (ordered (name, tensor) pairs) of `module`; see the module docstring.

    `module` is the root whose forward the loss function runs (only used by the "exact" perturbation, to find the
    modules owning each tensor). The order of `params` fixes which generator seed each tensor gets.
    """

    def __init__(self, module: nn.Module, params: Sequence[tuple[str, torch.Tensor]], eps: float = 1e-3,
                 perturbation: str = "exact") -> None:
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
            raise InvalidInputError(f"the ZO perturbation scale eps must be a positive number, got {eps!r}")
        if perturbation not in PERTURBATIONS:
            raise InvalidInputError(f"perturbation must be one of {PERTURBATIONS}, got {perturbation!r}")
        params = list(params)
        if not params:
            raise InvalidInputError("a zeroth-order step needs at least one tensor to perturb; the selection is empty")
        seen: set[int] = set()
        for name, p in params:
            if not torch.is_tensor(p) or not p.is_floating_point():
                raise InvalidInputError(f"ZO tensor {name!r} must be a floating-point tensor, got {type(p).__name__}")
            if id(p) in seen:
                raise InvalidInputError(f"ZO tensor {name!r} is listed twice (a tied weight?): list each tensor once")
            seen.add(id(p))
        self.module, self.params, self.eps, self.perturbation = module, params, float(eps), perturbation
        self._index = {id(p): i for i, (_, p) in enumerate(params)}
        self._owners = _owners(module, self._index) if perturbation == "exact" else {}
        if perturbation == "exact":
            missing = [params[i][0] for i in range(len(params)) if i not in {j for v in self._owners.values() for _, j in v}]
            if missing:
                raise InvalidInputError(f"ZO tensors {missing[:3]} are not parameters of the module: the exact perturbation "
                                        "swaps module parameters; pass module parameters or perturbation='in-place'")
        self._generator = torch.Generator()

    @property
    def numel(self) -> int:
        return sum(p.numel() for _, p in self.params)

    def noise(self, index: int, seed: int) -> torch.Tensor:
        """z_index of the step seeded `seed`: N(0, 1) in the tensor's shape and dtype, the same on every call."""
        p = self.params[index][1]
        self._generator.manual_seed(((seed * 6364136223846793005) + index * 1442695040888963407 + 1) & _MASK)
        return torch.randn(p.shape, generator=self._generator, dtype=p.dtype, device="cpu").to(p.device)

    @torch.no_grad()
    def projected_gradient(self, loss_fn: Callable[[], torch.Tensor], seed: int) -> tuple[float, float, float]:
        """(L+, L-, g) at the current weights; the weights are left as they were (see `perturbation`)."""
        if self.perturbation == "exact":
            with self._swapped(+1.0, seed):
                plus = float(loss_fn())
            with self._swapped(-1.0, seed):
                minus = float(loss_fn())
        else:
            self._shift(+1.0, seed)
            try:
                plus = float(loss_fn())
                self._shift(-2.0, seed)
                minus = float(loss_fn())
            finally:
                self._shift(+1.0, seed)  # restore (exact up to rounding)
        return plus, minus, (plus - minus) / (2.0 * self.eps)

    @torch.no_grad()
    def update(self, projected_grad: float, seed: int, lr: float, weight_decay: float = 0.0) -> None:
        """W_i <- W_i - lr (g z_i + weight_decay W_i), z regenerated tensor by tensor in the fixed order."""
        if lr == 0.0:
            return  # nothing moves (and no -0.0 sign flips): an lr of 0 leaves the weights bit for bit
        for i, (_, p) in enumerate(self.params):
            if weight_decay and p.dim() >= 2:  # the reference code skips biases and LayerNorm weights (1-D)
                p.mul_(1.0 - lr * weight_decay)
            p.add_(self.noise(i, seed), alpha=-lr * projected_grad)

    def step(self, loss_fn: Callable[[], torch.Tensor], seed: int, lr: float, weight_decay: float = 0.0) -> ZOStep:
        """One SPSA step: two forwards of `loss_fn` (call it under inference mode / eval mode), then the update.

        A non-finite projected gradient raises NumericalError before anything is updated (the weights are intact).
        """
        _check_rate(lr, weight_decay)
        return self.step_from(*self.projected_gradient(loss_fn, seed), seed, lr, weight_decay)

    def step_from(self, plus: float, minus: float, g: float, seed: int, lr: float, weight_decay: float = 0.0) -> ZOStep:
        """The update half of `step`, from a `projected_gradient` computed by the caller (e.g. under inference mode)."""
        _check_rate(lr, weight_decay)
        if not math.isfinite(g):
            raise NumericalError(f"the zeroth-order loss difference is not finite (L+ = {plus}, L- = {minus}); the weights "
                                 "are unchanged. Lower the learning rates or eps.")
        self.update(g, seed, lr, weight_decay)
        return ZOStep(plus, minus, g, seed)

    # ---- the two perturbation schemes -------------------------------------------------------------------------
    def _shift(self, scale: float, seed: int) -> None:
        for i, (_, p) in enumerate(self.params):
            p.add_(self.noise(i, seed), alpha=scale * self.eps)

    @contextmanager
    def _swapped(self, scale: float, seed: int) -> Iterator[None]:
        """Owners see W_i + scale * eps * z_i during their own forward; W itself is never written."""
        used: set[int] = set()
        handles = []

        def before(module: nn.Module, _args) -> None:
            for attr, i in self._owners[id(module)]:
                # W + s eps z written into z's own buffer: one temporary of W's size, as MeZO's in-place z
                z = self.noise(i, seed)
                module._parameters[attr] = torch.add(self.params[i][1], z, alpha=scale * self.eps, out=z)
                used.add(i)

        def after(module: nn.Module, _args, _out) -> None:
            for attr, i in self._owners[id(module)]:
                module._parameters[attr] = self.params[i][1]

        modules = {id(m): m for m in self.module.modules()}
        try:
            for key in self._owners:
                handles.append(modules[key].register_forward_pre_hook(before))
                handles.append(modules[key].register_forward_hook(after))
            yield
        finally:
            for h in handles:
                h.remove()
            for key, entries in self._owners.items():  # also after an exception inside a forward
                for attr, i in entries:
                    modules[key]._parameters[attr] = self.params[i][1]
        unused = [self.params[i][0] for i in range(len(self.params)) if i not in used]
        if unused:
            raise InvalidInputError(f"ZO tensors {unused[:3]} were not used by their modules' forwards, so the exact "
                                    "perturbation cannot reach them: exclude them or use perturbation='in-place'")


def _owners(module: nn.Module, index: dict[int, int]) -> dict[int, list[tuple[str, int]]]:
    """id(owning module) -> [(attribute, tensor index)] for every module holding a tensor of the set (tied weights:
    several owners of one tensor)."""
    owners: dict[int, list[tuple[str, int]]] = {}
    for m in module.modules():
        for attr, p in m._parameters.items():
            if p is not None and id(p) in index:
                owners.setdefault(id(m), []).append((attr, index[id(p)]))
    return owners


def _check_rate(lr: float, weight_decay: float) -> None:
    for what, v in (("ZO learning rate", lr), ("ZO weight decay", weight_decay)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise InvalidInputError(f"the {what} must be a number >= 0, got {v!r}")


def mezo_step(module: nn.Module, params: Sequence[tuple[str, torch.Tensor]], loss_fn: Callable[[], torch.Tensor],
              seed: int, lr: float, eps: float = 1e-3, weight_decay: float = 0.0, perturbation: str = "exact") -> ZOStep:
    """One MeZO step on `params` of `module` (a convenience around `SPSA`; build an SPSA once for many steps)."""
    return SPSA(module, params, eps, perturbation).step(loss_fn, seed, lr, weight_decay)


def numerical_rank(delta: torch.Tensor, rtol: float = 1e-6) -> int:
    """Singular values of a 2-D `delta` [m, n] above rtol * the largest (float64 SVD): the card's full-rank check."""
    if delta.dim() != 2:
        raise InvalidInputError(f"numerical_rank takes a 2-D matrix, got shape {tuple(delta.shape)}")
    s = torch.linalg.svdvals(delta.detach().to(torch.float64))
    return int((s > rtol * s.max()).sum()) if s.numel() and float(s.max()) > 0 else 0
