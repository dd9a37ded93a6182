"""`WasiLinear`: an nn.Linear trained in WASI's subspaces, in one of the method's forms.

    layer = WasiLinear.from_linear(linear, weights="factored", activations="tucker", epsilon=0.9)
    y = layer(x)              # x [B, N, I] (or [B, I]); training: saves only the Tucker factors and L, R
    layer.refresh()           # after each optimizer step: one WSI step (the procedure's after_step calls it)
    linear = layer.to_linear()  # back to a dense nn.Linear with W = L R (what the compressed model computes)

Weight forms (`weights`):
- "factored" (the low-memory variant): Parameters L [O, K], R [K, I] (and the bias); the dense W is gone.
- "master" (the paper's, as evaluated): the dense W stays the Parameter; L, R are buffers refreshed from it.
- "dense": W as it is (ASI alone).
Activation forms (`activations`): "tucker" (ASI: the input stored as its HOSVD factors) or "exact" (the input).

K is the explained-variance rank of W at `epsilon` when the layer is built (t = 0) and never changes. The Tucker
ranks come from `activation_epsilon` on the first training batch, or are given (`activation_ranks`, e.g. from the
knapsack search). Without a graph to build (no grad mode, or nothing requires a gradient) the layer computes the
same function without compressing anything: evaluation runs the compressed model (L R), as the authors' code does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from rankwise.errors import InvalidInputError
from rankwise.recipes.wasi.functions import EXACT, TUCKER, DenseLinear, FactoredLinear, MasterLinear
from rankwise.recipes.wasi.spectrum import check_epsilon
from rankwise.recipes.wasi.subspace import factored_step, initial_factors, subspace_step
from rankwise.recipes.wasi.tucker import ActivationSubspace, as_3d

WEIGHT_FORMS = ("factored", "master", "dense")
ACTIVATION_FORMS = (TUCKER, EXACT)


class WasiLinear(nn.Module):
    """A linear layer [in_features -> out_features] in WASI form; build it with `from_linear`."""

    def __init__(self, in_features: int, out_features: int, weights: str, activations: str,
                 activation: ActivationSubspace | None) -> None:
        super().__init__()
        if weights not in WEIGHT_FORMS:
            raise InvalidInputError(f"weights must be one of {WEIGHT_FORMS}, got {weights!r}")
        if activations not in ACTIVATION_FORMS:
            raise InvalidInputError(f"activations must be one of {ACTIVATION_FORMS}, got {activations!r}")
        if weights == "dense" and activations == EXACT:
            raise InvalidInputError("a WASI layer compresses its weights, its activations or both: "
                                    "weights='dense' with activations='exact' is a plain nn.Linear")
        self.in_features, self.out_features = in_features, out_features
        self.weights, self.activations = weights, activations
        self.activation = activation  # the ASI state (None for exact activations)
        self.epsilon: float | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, weights: str = "factored", activations: str = TUCKER, epsilon: float = 0.9,
                    activation_epsilon: float | None = None,
                    activation_ranks: Sequence[int] | None = None) -> WasiLinear:
        """The WASI form of `linear` (whose bias Parameter, and weight Parameter for the "master" and "dense" forms,
        are reused, not copied; trainability is kept). `activation_epsilon` defaults to `epsilon`."""
        if not isinstance(linear, nn.Linear):
            raise InvalidInputError(f"WASI replaces nn.Linear layers, got a {type(linear).__name__}")
        epsilon = check_epsilon(epsilon)
        subspace = None
        if activations == TUCKER:
            a_eps = epsilon if activation_epsilon is None else check_epsilon(activation_epsilon, "activation_epsilon")
            subspace = ActivationSubspace(None if activation_ranks is not None else a_eps, activation_ranks)
        layer = cls(linear.in_features, linear.out_features, weights, activations, subspace)
        weight, trainable = linear.weight, linear.weight.requires_grad
        if weights == "factored":
            l, r = initial_factors(weight, epsilon)
            layer.L = nn.Parameter(l, requires_grad=trainable)
            layer.R = nn.Parameter(r, requires_grad=trainable)
        else:
            layer.weight = weight
            if weights == "master":
                l, r = initial_factors(weight, epsilon)
                layer.register_buffer("L", l, persistent=False)
                layer.register_buffer("R", r, persistent=False)
        layer.epsilon = epsilon if weights != "dense" else None
        if linear.bias is None:
            layer.register_parameter("bias", None)
        else:
            layer.bias = linear.bias
        return layer

    # ---- what it holds ------------------------------------------------------------------------------------------
    @property
    def rank(self) -> int | None:
        """K, the weight rank (None for the dense form)."""
        return None if self.weights == "dense" else int(self.L.shape[1])

    @property
    def activation_ranks(self) -> tuple[int, int, int] | None:
        """(r_batch, r_token, r_feature) once fixed (None for exact activations, or before the first batch)."""
        return None if self.activation is None else self.activation.ranks

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, weights={self.weights}, "
                f"activations={self.activations}, rank={self.rank}, activation_ranks={self.activation_ranks}")

    # ---- forward ------------------------------------------------------------------------------------------------
    def _needs_graph(self, x: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._needs_graph(x):
            return self._plain(x)
        if self.activations == TUCKER:
            as_3d(x)  # a clear error for an input ASI cannot factorise
            core, bases = self.activation.compress(x)
            stored = (core, *bases)
        else:
            stored = (x,)
        if self.weights == "factored":
            return FactoredLinear.apply(x, self.L, self.R, self.bias, self.activations, *stored)
        if self.weights == "master":
            return MasterLinear.apply(x, self.weight, self.L, self.R, self.bias, self.activations, *stored)
        return DenseLinear.apply(x, self.weight, self.bias, self.activations, *stored)

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        if self.weights == "dense":
            return F.linear(x, self.weight, self.bias)
        return F.linear(F.linear(x, self.R), self.L, self.bias)

    # ---- the subspace refresh -----------------------------------------------------------------------------------
    @torch.no_grad()
    def refresh(self) -> None:
        """One WSI step after an optimizer step: from the dense master ("master"), or on L R without forming it
        ("factored"; L made orthonormal again, L R unchanged up to rounding). In place: the optimizer keeps its
        Parameters (their AdamW moments, if any, are carried across this near-identity change of coordinates)."""
        if self.weights == "master":
            l, r = subspace_step(self.weight, self.L)
        elif self.weights == "factored":
            l, r = factored_step(self.L, self.R)
        else:
            return
        self.L.copy_(l)
        self.R.copy_(r)

    def dense_weight(self) -> torch.Tensor:
        """The weight [O, I] the layer computes with: L R for the low-rank forms, W for the dense one."""
        with torch.no_grad():
            return self.weight.detach().clone() if self.weights == "dense" else self.L @ self.R

    def to_linear(self) -> nn.Linear:
        """A plain nn.Linear computing what this layer computes (W = L R for the low-rank forms: the compressed
        model the run validated; the paper's dense master W is not kept)."""
        ref = self.L if self.weights != "dense" else self.weight
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            out.weight.copy_(self.dense_weight())
            if self.bias is not None:
                out.bias.copy_(self.bias)
        out.weight.requires_grad_(ref.requires_grad)
        if self.bias is not None:
            out.bias.requires_grad_(self.bias.requires_grad)
        return out
