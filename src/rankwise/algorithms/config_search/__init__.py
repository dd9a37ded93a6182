"""Search over per-layer quantization configurations (CoA-LoRA): Pareto fronts of (bits, loss), the segmented
Pareto filter, GP + qLogEHVI proposals by integer hill-climbing (BoTorch), and ILP bit allocations for the initial
pool. Configurations are integer vectors; what they mean (knobs per layer) is the caller's business.

    from rankwise.algorithms.config_search import allocation_ladder, propose_configurations, segmented_pareto
"""

from rankwise.algorithms.config_search.allocation import allocate_bits, allocation_ladder
from rankwise.algorithms.config_search.bayesopt import Proposal, propose_configurations
from rankwise.algorithms.config_search.pareto import hypervolume_2d, nondominated, segmented_pareto

__all__ = ["allocate_bits", "allocation_ladder", "Proposal", "propose_configurations", "hypervolume_2d",
           "nondominated", "segmented_pareto"]
