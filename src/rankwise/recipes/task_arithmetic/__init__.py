"""Task arithmetic and group fairness (card task-arithmetic-fairness.md): task vectors of full fine-tuning and of
LoRA, their scaling and addition with the sum and the mean parametrisations kept apart, subgroup vectors and their
merge, worst-subgroup injection, group fairness metrics, and the lambda sweep selected on validation. Data comes in
as tensors: nothing here loads a dataset or a model.

  vectors.py    TaskVector, task_vector (theta_ft - theta_0 over the float tensors, float64)
  lora.py       lora_task_vector (scaling * B A of a peft LoRA model, keyed like the base state dict)
  merging.py    add_vectors, scale_sum (sum), merge_per_group (mean), inject, fairness_bound (the paper's U)
  subgroups.py  subgroup_task_vectors (one fine-tuning per group from the same theta_0), membership, worst_group
  metrics.py    demographic_parity_difference, equalized_odds_difference, one-vs-rest gaps, fairness_metrics
  sweep.py      lambda_sweep, select_point (fairest point above an accuracy floor), constrained_score
"""

from rankwise.recipes.task_arithmetic.lora import lora_task_vector
from rankwise.recipes.task_arithmetic.merging import (add_vectors, fairness_bound, inject, load_state, merge_per_group,
                                                      scale_sum)
from rankwise.recipes.task_arithmetic.metrics import (FairnessMetrics, demographic_parity_difference,
                                                      equalized_odds_difference, fairness_metrics, one_vs_rest_gaps,
                                                      selection_rates, true_false_positive_rates)
from rankwise.recipes.task_arithmetic.subgroups import membership, subgroup_task_vectors, worst_group
from rankwise.recipes.task_arithmetic.sweep import SweepPoint, constrained_score, lambda_sweep, select_point
from rankwise.recipes.task_arithmetic.vectors import TaskVector, task_vector

__all__ = ["FairnessMetrics", "SweepPoint", "TaskVector", "add_vectors", "constrained_score",
           "demographic_parity_difference", "equalized_odds_difference", "fairness_bound", "fairness_metrics", "inject",
           "lambda_sweep", "load_state", "lora_task_vector", "membership", "merge_per_group", "one_vs_rest_gaps",
           "scale_sum", "select_point", "selection_rates", "subgroup_task_vectors", "task_vector",
           "true_false_positive_rates", "worst_group"]
