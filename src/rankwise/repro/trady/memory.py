"""What the TraDy reproductions report about memory: the activation elements a step's backward graph really keeps
in the sparse layers, and the per-arm sparsities of the draws against full backprop."""

from __future__ import annotations

import statistics as st
from collections.abc import Mapping
from typing import Any

import torch

from rankwise.recipes.trady import LayerGeometry

SPARSE_NODES = ("_SparseConv2dBackward", "_SparseLinearBackward")


def kept_activation_elements(loss: torch.Tensor) -> int:
    """Elements of the activations saved by the sparse layers' backward nodes in `loss`'s graph (each node saves
    (activation or None, weight); the weight is the layer's own tensor, not a copy)."""
    seen, stack, total = set(), [loss.grad_fn], 0
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if type(fn).__name__ in SPARSE_NODES:
            activation, _ = fn.saved_tensors
            total += 0 if activation is None else activation.numel()
        stack.extend(f for f, _ in fn.next_functions)
    return total


def memory_rows(results: Mapping[str, Mapping[str, list[Any]]], arms: Mapping[str, Any], labels: Mapping[str, str],
                geometries: Mapping[str, LayerGeometry]) -> list[dict[str, str]]:
    """One row per sparse arm: mean units, budgeted cost and its split per draw (per example), sparsities against
    full backprop of every layer (all inputs kept, every weight derivative), dW MACs, coverage."""
    full_act = sum(g.in_channels * g.in_positions for g in geometries.values())
    full_w = sum(g.in_channels * g.weight_cost() for g in geometries.values())
    full_macs = sum(g.dw_flops(g.in_channels) for g in geometries.values())
    rows = []
    for arm in arms:
        draws = [d for runs in results[arm].values() for r in runs for d in r.draws]
        coverage = [r.coverage for runs in results[arm].values() for r in runs if r.draws]
        if not draws:  # every run of the arm diverged: nothing was drawn to report
            rows.append({"arm": labels[arm], "units": "n/a"})
            continue
        mean = lambda key: st.fmean(d[key] for d in draws)  # noqa: E731
        rows.append({"arm": labels[arm], "units": f"{mean('units'):.1f}", "budgeted": f"{mean('budgeted'):,.0f}",
                     "weights": f"{mean('weights'):,.0f}", "activations": f"{mean('activations'):,.0f}",
                     "activation sparsity": f"{1 - mean('activations') / full_act:.2%}",
                     "weight-derivative sparsity": f"{1 - mean('weights') / full_w:.2%}",
                     "dW MACs vs full": f"{mean('dw_macs') / full_macs:.2%}", "coverage": f"{st.fmean(coverage):.1%}"})
    return rows
