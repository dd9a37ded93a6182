"""The reference solver: enumerate all d^(#weights + #biases) assignments, vectorised over the distinct inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rankwise.algorithms.quantized_relu.dataset import DistinctData, deduplicate
from rankwise.algorithms.quantized_relu.network import (
    QuantizedArchitecture, QuantizedNetwork, network_from_parameters, pre_activation, relu_d, z_d,
)
from rankwise.errors import InvalidInputError

MAX_ASSIGNMENTS = 1 << 22  # ~4.2M assignments: a few seconds of numpy; beyond that brute force is refused
CHUNK = 1 << 14


@dataclass
class Solution:
    """An optimal network and its error (number of wrong points), with the solver's work counters.

    `operations` counts neuron evaluations over all distinct inputs (one unit = one neuron on one distinct input), the
    machine-independent cost the benchmarks fit growth exponents to.
    """

    errors: int
    network: QuantizedNetwork
    p: int
    operations: int
    stats: dict = field(default_factory=dict)


def brute_force_assignments(arch: QuantizedArchitecture) -> int:
    """d^(n_params): the number of assignments brute force enumerates."""
    return int(arch.d) ** arch.n_params


def brute_force(arch: QuantizedArchitecture, x: np.ndarray, y: np.ndarray, max_assignments: int = MAX_ASSIGNMENTS,
                data: DistinctData | None = None) -> Solution:
    """Minimal-error network by exhaustive enumeration (the first optimum in lexicographic order of parameters).

    Refuses up front (InvalidInputError naming the limit) when d^(n_params) > `max_assignments`.
    """
    total = brute_force_assignments(arch)
    if total > max_assignments:
        raise InvalidInputError(f"brute force over d^params = {arch.d}^{arch.n_params} = {total:,} assignments exceeds "
                                f"the limit max_assignments = {max_assignments:,}; use layer_dp or a smaller instance")
    data = deduplicate(arch, x, y) if data is None else data
    values = z_d(arch.d)
    radix = arch.d ** np.arange(arch.n_params - 1, -1, -1, dtype=np.int64)
    best_err, best_index = None, -1
    for start in range(0, total, CHUNK):
        idx = np.arange(start, min(start + CHUNK, total), dtype=np.int64)
        params = values[(idx[:, None] // radix[None, :]) % arch.d]  # [B, P], lexicographic in the parameter order
        err = data.errors(_forward_many(arch, params, data.inputs))
        k = int(np.argmin(err))
        if best_err is None or err[k] < best_err:
            best_err, best_index = int(err[k]), start + k
    params = values[(best_index // radix) % arch.d]
    neurons = sum(o for o, _ in arch.layer_shapes)
    return Solution(best_err, network_from_parameters(arch, params), data.p, total * neurons * data.p,
                    {"assignments": total})


def _forward_many(arch: QuantizedArchitecture, params: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    """Outputs [B, p, omega] of B parameter vectors [B, P] on the distinct inputs [p, alpha]."""
    b = params.shape[0]
    a = np.broadcast_to(inputs, (b, *inputs.shape))
    k = 0
    for o, i in arch.layer_shapes:
        w = params[:, k:k + o * i].reshape(b, o, i)
        k += o * i
        bias = params[:, k:k + o]
        k += o
        a = relu_d(pre_activation(a, w, bias, arch.bias_sign), arch.d, arch.clip)
    return a
