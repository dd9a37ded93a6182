"""Heuristic quantized training, the baseline the exact solvers are measured against (card: "Baselines"): a
straight-through estimator (STE).

Each weight and bias has a real latent value w~; the forward pass uses clip(round(w~)) into Z_d, the activations are
ReLU_d (ReLU clipped into Z_d, as the network defines it), and the loss is the mean squared error of the outputs
against the labels. round and clip pass the gradient straight through to w~ (the STE); ReLU_d's own kinks do not.
Adam on the latent values, full batch. `seeds` independent runs train together as one batch of networks.

A run's result is the quantized network of its best checkpoint (the fewest wrong points, checked every
`check_every` steps and at the end), so the heuristic is judged at its best moment rather than its last -- a
baseline as strong as its own log allows. Its error is counted by the exact verifier (`count_errors`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rankwise.algorithms.quantized_relu.network import (QuantizedArchitecture, QuantizedNetwork, check_inputs,
                                                        check_labels, count_errors, z_d)
from rankwise.errors import InvalidInputError


@dataclass(frozen=True)
class STEResult:
    """Per seed: the best quantized network found and its number of wrong points (exact)."""

    networks: list[QuantizedNetwork]
    errors: list[int]

    @property
    def success_rate(self) -> float:
        """The fraction of seeds that reached zero wrong points."""
        return float(np.mean([e == 0 for e in self.errors]))


def _quantize(latent: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """clip(round(latent)) into [lo, hi], with the straight-through gradient (identity) to `latent`."""
    hard = latent.round().clamp(lo, hi)
    return latent + (hard - latent).detach()


def ste_train(arch: QuantizedArchitecture, x: np.ndarray, y: np.ndarray, seeds: int = 20, steps: int = 2000,
              lr: float = 1e-2, check_every: int = 50, seed: int = 0) -> STEResult:
    """Train `seeds` STE runs of `arch` on points x [n, alpha] (integers in Z_d) with labels y [n, omega].

    Latent values start uniform on [min Z_d - 1/2, max Z_d + 1/2], so the first quantized network is uniform over
    Z_d like a random teacher. float64 throughout (the quantized forward is then exact integer arithmetic)."""
    if seeds < 1 or steps < 1 or check_every < 1 or not lr > 0:
        raise InvalidInputError(f"seeds, steps and check_every must be >= 1 and lr > 0, got {seeds}, {steps}, "
                                f"{check_every}, {lr}")
    xs = check_inputs(x, arch)
    ys = check_labels(y, arch, xs.shape[0])
    values = z_d(arch.d)
    lo, hi = int(values[0]), int(values[-1])
    top = float(arch.top)
    g = torch.Generator().manual_seed(seed)
    params = []
    for o, i in arch.layer_shapes:
        for shape in ((seeds, o, i), (seeds, o)):
            params.append((torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo + 1) + (lo - 0.5)).requires_grad_())
    opt = torch.optim.Adam(params, lr=lr)
    inputs = torch.as_tensor(xs, dtype=torch.float64).expand(seeds, *xs.shape)
    target = torch.as_tensor(ys, dtype=torch.float64)
    sign = -1.0 if arch.bias_sign == "subtract" else 1.0

    def forward(quantized: list[torch.Tensor]) -> torch.Tensor:
        a = inputs
        for k in range(0, len(quantized), 2):
            w, b = quantized[k], quantized[k + 1]
            z = a @ w.transpose(1, 2) + sign * b[:, None, :]
            a = z.clamp(0.0, top) if arch.clip else z.clamp_min(0.0)
        return a  # [seeds, n, omega]

    best_errors = [None] * seeds
    best_params: list[list[np.ndarray] | None] = [None] * seeds

    def check() -> None:
        with torch.no_grad():
            hard = [p.round().clamp(lo, hi) for p in params]
            wrong = (forward(hard) != target).any(dim=2).sum(dim=1)
        for s in range(seeds):
            if best_errors[s] is None or int(wrong[s]) < best_errors[s]:
                best_errors[s] = int(wrong[s])
                best_params[s] = [h[s].to(torch.int64).numpy().copy() for h in hard]

    for step in range(1, steps + 1):
        out = forward([_quantize(p, lo, hi) for p in params])
        loss = (out - target).pow(2).mean(dim=(1, 2)).sum()  # each seed's MSE; summed so the seeds do not interact
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % check_every == 0 or step == steps:
            check()
    networks = [QuantizedNetwork(arch, list(p[0::2]), list(p[1::2])) for p in best_params]  # type: ignore[index]
    errors = [count_errors(net, xs, ys) for net in networks]  # the verifier's count, not the batched one
    return STEResult(networks, errors)
