"""WASI (card wasi.md): weight-activation subspace iteration, training a transformer's linears in low-rank
subspaces of their weights (WSI) and of their 3-D activations (ASI), refreshed by one warm-started subspace-iteration
step per iteration.

  spectrum.py      the explained-variance rank rule
  subspace.py      WSI: the t = 0 factors W ~ L R and the per-step subspace-iteration refresh (dense and factored)
  tucker.py        ASI: HOSVD factors of [B, N, D] activations, the warm-started power step, the gradient from them
  functions.py     the autograd functions (low-memory factored, paper's dense master, ASI alone): what they save
  layer.py         WasiLinear: an nn.Linear in one of those forms
  rank_search.py   the activation-rank knapsack under a memory budget (calibration + exact Pareto program)
  cost.py          analytic memory and FLOPs per layer
  procedure.py     WasiProcedure, WasiConfig, build: `rankwise finetune --method full --procedure wasi`
"""

from rankwise.recipes.wasi.cost import LinearGeometry, memory_numel, training_flops
from rankwise.recipes.wasi.layer import WasiLinear
from rankwise.recipes.wasi.procedure import WasiConfig, WasiProcedure, build, find_targets
from rankwise.recipes.wasi.rank_search import RankOption, choose_options, measure_options
from rankwise.recipes.wasi.spectrum import explained_variance_rank
from rankwise.recipes.wasi.subspace import factored_step, initial_factors, subspace_step
from rankwise.recipes.wasi.tucker import ActivationSubspace, gradient_against, hosvd_bases, power_step, reconstruct, tucker_core

__all__ = ["ActivationSubspace", "LinearGeometry", "RankOption", "WasiConfig", "WasiLinear", "WasiProcedure", "build",
           "choose_options", "explained_variance_rank", "factored_step", "find_targets", "gradient_against",
           "hosvd_bases", "initial_factors", "measure_options", "memory_numel", "power_step", "reconstruct",
           "subspace_step", "training_flops", "tucker_core"]
