"""The activation-rank search: per layer, candidate thresholds eps measured on one calibration batch, and a
knapsack that picks one option per layer under a total memory budget.

For each layer and each eps in the grid (the authors' 0.4 .. 0.9), `measure_options` records on one batch the
Tucker ranks that reach explained variance eps in every mode, the bytes of the core and factors, and the
"perplexity" ||G_tucker - G_exact||_F of the weight gradient G = dY^T A computed from the factors against the exact
one (`linear_measure_perplexity_HOSVD.py`). `choose_options` then minimises the summed perplexity subject to the
summed bytes <= budget (`perplexity_dp.py`'s objective). The authors' dynamic program rounds costs to 1e-3 MB and,
given a budget below the smallest choice, silently raises it to that minimum; here the program is exact (a Pareto
frontier of (bytes, perplexity) over the layers, pruned to the budget) and a budget that fits no choice is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rankwise.errors import InvalidInputError
from rankwise.recipes.wasi.spectrum import check_epsilon
from rankwise.recipes.wasi.tucker import as_3d, gradient_against, hosvd_bases, tucker_core, tucker_numel


@dataclass(frozen=True)
class RankOption:
    """One candidate for one layer: its threshold, the Tucker ranks it gives, their bytes, the gradient error."""

    epsilon: float
    ranks: tuple[int, int, int]
    bytes: int
    perplexity: float


def measure_options(module: nn.Module, layers: Mapping[str, nn.Linear], loss: Callable[[], torch.Tensor],
                    epsilons: Sequence[float]) -> dict[str, list[RankOption]]:
    """Run `loss()` (one forward of `module` on the calibration batch) and its backward once, with hooks on `layers`
    (name -> nn.Linear, still dense) that keep each layer's input and output gradient, and measure every eps.

    The module's gradients are left as they were (None afterwards): calibration is not a training step."""
    eps = [check_epsilon(e, "a searched epsilon") for e in epsilons]
    if not eps:
        raise InvalidInputError("the rank search needs at least one candidate epsilon")
    inputs: dict[str, torch.Tensor] = {}
    grads: dict[str, torch.Tensor] = {}
    handles = []

    def forward_hook(name: str):
        def hook(_m: nn.Module, args: tuple, out: torch.Tensor) -> None:
            inputs[name] = as_3d(args[0].detach())
            if out.requires_grad:
                out.register_hook(lambda g: grads.__setitem__(name, as_3d(g.detach())))
        return hook

    flags = {n: (l.weight.requires_grad) for n, l in layers.items()}
    for name, layer in layers.items():
        layer.weight.requires_grad_(True)  # so every layer's output joins the graph
        handles.append(layer.register_forward_hook(forward_hook(name)))
    try:
        with torch.enable_grad():
            loss().backward()
    finally:
        for h in handles:
            h.remove()
        for name, layer in layers.items():
            layer.weight.requires_grad_(flags[name])
        for p in module.parameters():
            p.grad = None
    missing = [n for n in layers if n not in grads]
    if missing:
        raise InvalidInputError(f"the calibration forward never reached (or never back-propagated through) {missing[:3]}")
    out: dict[str, list[RankOption]] = {}
    for name in layers:
        a, g = inputs[name], grads[name]
        exact = torch.einsum("bno,bni->oi", g.double(), a.double())
        options = []
        for e in eps:
            bases, ranks = hosvd_bases(a, epsilon=e)
            core = tucker_core(a, bases)
            approx = gradient_against(g, core, bases) @ bases[2].t()
            options.append(RankOption(e, tuple(ranks), tucker_numel(a.shape, ranks) * a.element_size(),
                                      float(torch.linalg.matrix_norm(approx.double() - exact))))
        out[name] = options
    return out


def choose_options(options: Sequence[Sequence[RankOption]], budget_bytes: float) -> list[int]:
    """The index of one option per layer minimising the summed perplexity with summed bytes <= `budget_bytes`
    (exact; on equal perplexity the smaller memory). A RankwiseError when even the smallest choices do not fit."""
    if not options or any(not o for o in options):
        raise InvalidInputError("the rank search needs at least one layer and one option per layer")
    smallest = sum(min(o.bytes for o in layer) for layer in options)
    if smallest > budget_bytes:
        raise InvalidInputError(f"the activation budget of {budget_bytes / 2**20:.4g} MB fits no choice of ranks: the "
                                f"smallest options of the {len(options)} layers need {smallest / 2**20:.4g} MB; raise "
                                "the budget or search smaller thresholds")
    frontier: list[tuple[int, float, tuple[int, ...]]] = [(0, 0.0, ())]
    for layer in options:
        grown = [(c + o.bytes, p + o.perplexity, picks + (i,)) for c, p, picks in frontier
                 for i, o in enumerate(layer) if c + o.bytes <= budget_bytes]
        grown.sort(key=lambda t: (t[0], t[1]))
        frontier, best = [], float("inf")
        for item in grown:  # keep only the (bytes, perplexity) pairs no cheaper pair beats
            if item[1] < best:
                frontier.append(item)
                best = item[1]
    cost, _, picks = min(frontier, key=lambda t: (t[1], t[0]))
    return list(picks)
