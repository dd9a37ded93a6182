"""Multi-task balancing of one shared LoRA adapter (card multitask-lora-trigger.md, JailbreakLoRA's generic
machinery; the defender-side trigger scan is `rankwise.adapters.trigger_scan`).

  uncertainty.py  UncertaintyWeighting: sum_n L_n / (2 sigma_n^2) + log(1 + sigma_n^2), sigma^2 = softplus(rho)
  pcgrad.py       pcgrad / pcgrad_project (random order per task, original g_m), conflict_stats
  balancer.py     MultiTaskBalancer: per-task gradients of the LoRA factors -> weighting -> aggregator (sum, ours,
                  torchjd's PCGrad / MGDA / CAGrad / UPGrad) -> .grad; warns when UW and an aggregator are stacked
"""

from rankwise.recipes.multitask.balancer import (AGGREGATORS, WEIGHTINGS, MultiTaskBalancer, MultiTaskConfig,
                                                 StackingWarning, StepInfo, lora_parameters, torchjd_aggregator)
from rankwise.recipes.multitask.pcgrad import ConflictStats, conflict_stats, pcgrad, pcgrad_project
from rankwise.recipes.multitask.uncertainty import UncertaintyWeighting, stack_losses, stationary_variance

__all__ = ["AGGREGATORS", "ConflictStats", "MultiTaskBalancer", "MultiTaskConfig", "StackingWarning", "StepInfo",
           "UncertaintyWeighting", "WEIGHTINGS", "conflict_stats", "lora_parameters", "pcgrad", "pcgrad_project",
           "stack_losses", "stationary_variance", "torchjd_aggregator"]
