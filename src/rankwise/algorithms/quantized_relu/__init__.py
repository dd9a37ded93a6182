"""Exact training of fully quantized ReLU networks (d-QNNT): verifier, deduplication, brute force, layer DP.

    import numpy as np
    from rankwise.algorithms.quantized_relu import QuantizedArchitecture, layer_dp, planted_instance
    arch = QuantizedArchitecture(inputs=3, hidden=(2,), outputs=1, d=2)
    teacher, x, y = planted_instance(arch, n=10_000, rng=np.random.default_rng(0))
    sol = layer_dp(arch, x, y)            # sol.errors == 0, count_errors(sol.network, x, y) == 0
"""

from rankwise.algorithms.quantized_relu.brute_force import MAX_ASSIGNMENTS, Solution, brute_force, brute_force_assignments
from rankwise.algorithms.quantized_relu.dataset import (
    DistinctData, deduplicate, planted_instance, random_inputs, random_labels_instance, random_network,
)
from rankwise.algorithms.quantized_relu.layer_dp import (
    MAX_CANDIDATES, MAX_EVALUATIONS, DPWork, decide, estimate_dp_work, layer_dp, smallest_sufficient_in_degree,
)
from rankwise.algorithms.quantized_relu.network import (
    QuantizedArchitecture, QuantizedNetwork, count_errors, network_from_parameters, relu_d, z_d,
)

__all__ = [
    "MAX_ASSIGNMENTS", "MAX_CANDIDATES", "MAX_EVALUATIONS", "DPWork", "DistinctData", "QuantizedArchitecture",
    "QuantizedNetwork", "Solution", "brute_force", "brute_force_assignments", "count_errors", "decide",
    "deduplicate", "estimate_dp_work", "layer_dp", "network_from_parameters", "planted_instance", "random_inputs",
    "random_labels_instance", "random_network", "relu_d", "smallest_sufficient_in_degree", "z_d",
]
