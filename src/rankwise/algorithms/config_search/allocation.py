"""LQ-LoRA-style bit allocation: per layer one quantization option, least total error under an average-bits budget.

    minimise   sum_i err[i, o_i]      subject to   sum_i n_i bits[o_i] <= budget * sum_i n_i

a multiple-choice knapsack, solved exactly as an integer linear program (scipy's HiGHS `milp`) with binary
x[i, k] = [layer i takes option k] and sum_k x[i, k] = 1. CoA-LoRA seeds its configuration pool with these
allocations at a ladder of budgets (the authors: 2.5 -> 7.3 bits in steps of 0.05).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rankwise.core.quiet import silence_native_stdout
from rankwise.errors import InvalidInputError


def allocate_bits(errors: np.ndarray, option_bits: Sequence[float], sizes: Sequence[int], budget: float) -> list[int] | None:
    """Option index per layer (errors [N, K] >= 0, option_bits [K], sizes [N] weights per layer), or None when even
    the cheapest options exceed `budget` bits per weight."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    err = np.asarray(errors, dtype=np.float64)
    b = np.asarray(option_bits, dtype=np.float64)
    n = np.asarray(sizes, dtype=np.float64)
    if err.ndim != 2 or err.shape != (n.size, b.size):
        raise InvalidInputError(f"errors must be [layers={n.size}, options={b.size}], got {err.shape}")
    if not (np.all(np.isfinite(err)) and np.all(np.isfinite(b)) and np.all(n > 0)):
        raise InvalidInputError("errors and option bits must be finite and layer sizes positive")
    layers, options = err.shape
    if float(n @ np.full(layers, b.min())) > budget * n.sum() + 1e-9:
        return None
    scale = err.max() if err.max() > 0 else 1.0  # HiGHS is happier with O(1) costs
    one_each = np.kron(np.eye(layers), np.ones(options))  # [N, N*K]
    storage = np.outer(n, b).reshape(1, -1) / n.sum()  # [1, N*K]: average bits per weight
    # disp=False silences HiGHS's log, but HiGHS 1.12 (scipy 1.17) still printf()s a debug line to stdout when it
    # repairs an integer solution of the presolved problem (ERGO-Code/HiGHS, cf. jump-dev/HiGHS.jl#312): the
    # descriptor is silenced around the solve, which changes nothing about the solution.
    with silence_native_stdout():
        res = milp(c=(err / scale).reshape(-1), integrality=np.ones(layers * options),
                   bounds=Bounds(0, 1),
                   constraints=[LinearConstraint(one_each, 1, 1), LinearConstraint(storage, -np.inf, budget + 1e-9)],
                   options={"disp": False})
    if res.x is None:
        return None
    return [int(k) for k in np.round(res.x).reshape(layers, options).argmax(1)]


def allocation_ladder(errors: np.ndarray, option_bits: Sequence[float], sizes: Sequence[int],
                      budgets: Sequence[float]) -> list[list[int]]:
    """Distinct allocations (in budget order) for each feasible budget of the ladder."""
    out, seen = [], set()
    for budget in budgets:
        alloc = allocate_bits(errors, option_bits, sizes, float(budget))
        if alloc is not None and tuple(alloc) not in seen:
            seen.add(tuple(alloc))
            out.append(alloc)
    return out
