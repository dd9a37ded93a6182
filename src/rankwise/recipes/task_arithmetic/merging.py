"""Scaling and adding task vectors, with the two parametrisations of the card kept apart.

- `scale_sum(base, vectors, lam)`: theta_0 + lam * sum_g tau_g, one global scalar on the **sum** (the paper's
  experiments and the authors' code; lam ~ 1/G is the average of the vectors).
- `merge_per_group(base, vectors, lambdas)`: theta_0 + (1/G) sum_g lambda_g tau_g, per-group coefficients on the
  **mean** (the paper's theory; lambda_g = 1 for every g is the balanced point theta-bar, and its constraint
  sum_g lambda_g = G is the caller's to keep, see `fairness_bound`).
- `inject(state, vector, lam)`: state + lam * tau, e.g. the worst subgroup's vector added to the FFT model.

All three are `add_vectors(state, vectors, coefficients)`: the arithmetic runs in float64 and the result is cast
back to each tensor's dtype; tensors a vector does not cover (integer buffers, un-adapted weights of a LoRA vector)
are copied unchanged, so lam = 0 returns the state exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from rankwise.errors import InvalidInputError
from rankwise.recipes.task_arithmetic.vectors import StateLike, TaskVector, as_state, check_coefficient


def add_vectors(state: StateLike, vectors: Sequence[TaskVector], coefficients: Sequence[float]) -> dict[str, torch.Tensor]:
    """state + sum_i coefficients[i] * vectors[i] -> a new state dict (same keys, shapes and dtypes as `state`)."""
    s = as_state(state)
    vectors, coefficients = list(vectors), [check_coefficient(c, f"coefficient {i}") for i, c in enumerate(coefficients)]
    if not vectors:
        raise InvalidInputError("no task vectors given")
    if len(vectors) != len(coefficients):
        raise InvalidInputError(f"{len(vectors)} task vectors but {len(coefficients)} coefficients; give one each")
    for i, v in enumerate(vectors):
        if not isinstance(v, TaskVector):
            raise InvalidInputError(f"vector {i} is a {type(v).__name__}, not a TaskVector (see task_vector)")
        for k, d in v.deltas.items():
            if k not in s:
                raise InvalidInputError(f"vector {i} has tensor {k!r}, which the state does not have: the vector "
                                        "belongs to another architecture")
            if not s[k].is_floating_point() or s[k].shape != d.shape:
                raise InvalidInputError(f"vector {i}: tensor {k!r} is {tuple(d.shape)}, the state's is "
                                        f"{tuple(s[k].shape)} {s[k].dtype}")
    out: dict[str, torch.Tensor] = {}
    for k, t in s.items():
        terms = [(c, v.deltas[k]) for c, v in zip(coefficients, vectors) if k in v.deltas]
        if not terms:
            out[k] = t.clone()
            continue
        acc = t.double()
        for c, d in terms:
            acc = acc + c * d
        out[k] = acc.to(t.dtype)
    return out


def scale_sum(base: StateLike, vectors: Sequence[TaskVector], lam: float) -> dict[str, torch.Tensor]:
    """theta(lam) = theta_0 + lam * sum_g tau_g (the sum parametrisation)."""
    lam = check_coefficient(lam, "lambda")
    return add_vectors(base, vectors, [lam] * len(list(vectors)))


def merge_per_group(base: StateLike, vectors: Sequence[TaskVector], lambdas: Sequence[float]) -> dict[str, torch.Tensor]:
    """theta(lambda) = theta_0 + (1/G) sum_g lambda_g tau_g (the mean parametrisation; lambda_g = 1: the mean)."""
    vectors, lambdas = list(vectors), list(lambdas)
    if len(vectors) != len(lambdas):
        raise InvalidInputError(f"{len(vectors)} subgroup vectors but {len(lambdas)} lambdas; give one per group")
    g = len(vectors)
    return add_vectors(base, vectors, [check_coefficient(x, f"lambda_{i}") / g for i, x in enumerate(lambdas)])


def inject(state: StateLike, vector: TaskVector, lam: float) -> dict[str, torch.Tensor]:
    """state + lam * tau (worst-subgroup injection: theta_FFT + lam (theta_g - theta_0))."""
    return add_vectors(state, [vector], [check_coefficient(lam, "lambda")])


def fairness_bound(lambdas: Sequence[float], norms: Sequence[float], lipschitz: float = 1.0) -> float:
    """The paper's DPD bound U(lambda) = 2 L sum_g |lambda_g - 1| ||tau_g||_2 in the mean parametrisation: 0 at the
    balanced point (every lambda_g = 1), growing with each |lambda_g - 1| in proportion to that group's norm."""
    lambdas = [check_coefficient(x, f"lambda_{i}") for i, x in enumerate(lambdas)]
    norms = [check_coefficient(x, f"norm_{i}") for i, x in enumerate(norms)]
    lipschitz = check_coefficient(lipschitz, "lipschitz")
    if len(lambdas) != len(norms) or not lambdas:
        raise InvalidInputError(f"{len(lambdas)} lambdas and {len(norms)} norms: give one of each per group")
    if any(n < 0 for n in norms) or lipschitz < 0:
        raise InvalidInputError("norms and the Lipschitz constant are non-negative")
    return 2.0 * lipschitz * sum(abs(x - 1.0) * n for x, n in zip(lambdas, norms))


def load_state(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """Load a merged state into `module` (strict: every tensor present), returning it."""
    module.load_state_dict(state, strict=True)
    return module
